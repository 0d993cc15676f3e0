"""The observer machine's actions: the assessment of a round's evidence, and the guards, effects
and invariant predicates that ``spec/observer.toml`` names (values: :mod:`.model`).

Pure: time arrives as ``now_s`` on every event; messages and reports leave as effect values.
The theory of operation is in :mod:`scout.core.observer.model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import attrs

from scout.core.machine import Actions, MachineState
from scout.core.observer.model import (
    _CHECKPOINT_STAGES,
    _CONFIRMED,
    _DECISIVE,
    FINAL_STATES,
    JOINED_STATES,
    Answer,
    Assessment,
    Attached,
    BlockState,
    Coordinate,
    Decision,
    Delegate,
    EmitReport,
    Evidence,
    Failed,
    Finding,
    Joined,
    JoinFailed,
    Noted,
    ObserverConfig,
    ObserverContext,
    ObserverState,
    OpenRound,
    PendingState,
    ProgressSeen,
    Reply,
    Request,
    RoundClosed,
    RoundId,
    RoundRequest,
    Scope,
    Send,
    Stage,
    StallKind,
    StallReport,
    Stop,
    Stopped,
    Tick,
    TrainerExit,
    WakeAt,
)
from scout.core.verdict import MISSING, Reason, Status, classify_exact

__all__ = ["ACTIONS", "assess", "block_states", "reporter_for"]

# --------------------------------------------------------------------------------------------
# The assessment (pure; the one verdict rule does the voting)
# --------------------------------------------------------------------------------------------


def _kind_of(stages: Sequence[Stage]) -> StallKind:
    if stages and all(stage is Stage.DATA_LOADING for stage in stages):
        return StallKind.DATA_STALL
    if stages and all(stage in _CHECKPOINT_STAGES for stage in stages):
        return StallKind.CHECKPOINT_STALL
    return StallKind.HANG


def assess(evidence: Sequence[Evidence | None], config: ObserverConfig) -> Assessment:
    """Assess one round's evidence, by position (None: missing)."""
    if len(evidence) != config.group_size:
        raise ValueError(f"assess needs one entry per position ({config.group_size}), got {len(evidence)}")
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    missing = tuple(p for p, e in enumerate(evidence) if e is None)
    unsettled = [p for p, e in present if e.idle_s < config.settle_floor(e.stage)]
    if unsettled:
        return Assessment(Finding.UNSETTLED, (), (), missing, None, StallKind.HANG, Scope.GROUP,
                          f"positions {unsettled} still progressing or within their stage's threshold")
    coordinates = classify_exact([MISSING if e is None else e.coordinate for e in evidence])
    by_completion = _assess_completion(evidence, missing, coordinates.healthy_value)
    if isinstance(by_completion, Assessment):
        return by_completion
    waiting = by_completion or frozenset()  # COMPLETION-8: never attributed by the host rules
    if coordinates.status is Status.ATTRIBUTED:
        healthy: Coordinate = coordinates.healthy_value
        attributed = tuple(p for p in coordinates.outliers if p not in waiting)
        if not attributed:
            return Assessment(Finding.INCONCLUSIVE, (), (), missing, healthy, StallKind.HANG, Scope.GROUP,
                              "the ranks past the majority wait in a collective the majority has not enqueued")
        ahead = tuple(p for p in attributed if _at(evidence, p).coordinate > healthy)
        kind = _kind_of([_at(evidence, p).stage for p in attributed])
        return Assessment(Finding.BEHIND, attributed, ahead, missing, healthy, kind, Scope.RANK,
                          "progress differs from the strict majority")
    if coordinates.healthy_value is None:
        lowest = min(e.coordinate for _, e in present) if present else None
        return Assessment(Finding.INCONCLUSIVE, (), (), missing, lowest, StallKind.HANG, Scope.GROUP,
                          coordinates.reason.value if coordinates.reason else "no majority")
    healthy = coordinates.healthy_value
    fingerprints = classify_exact([MISSING if e is None else e.fingerprint for e in evidence])
    if fingerprints.status is Status.ATTRIBUTED:
        differing = tuple(p for p in fingerprints.outliers if p not in waiting)
        if not differing:
            return Assessment(Finding.INCONCLUSIVE, (), (), missing, healthy, StallKind.HANG, Scope.GROUP,
                              "the ranks that differ wait in a collective the majority has not enqueued")
        return Assessment(Finding.DESYNC, differing, (), missing, healthy, StallKind.DESYNC,
                          Scope.RANK, "collective fingerprint differs from the strict majority")
    if coordinates.status is Status.AGREE and fingerprints.status is Status.AGREE:
        kind = _kind_of([e.stage for _, e in present])
        return Assessment(Finding.GROUP_STALL, (), (), (), healthy, kind, Scope.GROUP,
                          "every rank is stuck at the same point in the same collective")
    if coordinates.status is Status.AGREE:
        return Assessment(Finding.INCONCLUSIVE, (), (), (), healthy, StallKind.HANG, Scope.GROUP,
                          "same progress, collective fingerprints without a strict majority")
    return Assessment(Finding.UNRESPONSIVE, (), (), missing, healthy, StallKind.HANG, Scope.RANK,
                      "the answering majority is stuck at one point; the missing peers did not answer")


def block_states(evidence: Sequence[Evidence | None]) -> tuple[int, tuple[BlockState | None, ...]] | None:
    """The blocking collective ``b`` of a round and each position's state of it (COMPLETION-1,
    COMPLETION-2); None when the completion rules do not apply: some answering rank has no
    completion evidence, the sources differ, or nothing is pending anywhere."""
    present = [e for e in evidence if e is not None]
    if not present or any(e.completion is None for e in present):
        return None
    if len({e.completion.source for e in present if e.completion is not None}) != 1:
        return None
    pending = [e.completion.oldest_pending for e in present if e.completion is not None and e.completion.pending]
    if not pending:
        return None
    blocking = min(p for p in pending if p is not None)
    states: list[BlockState | None] = []
    for item in evidence:
        completion = None if item is None else item.completion
        if completion is None:
            states.append(None)
        elif completion.enqueued < blocking:
            states.append(BlockState.NOT_ENQUEUED)
        elif completion.completed >= blocking:
            states.append(BlockState.COMPLETED)
        else:
            # completed < b <= enqueued, and b is the lowest oldest-pending: this rank's oldest
            # pending collective is b itself.
            states.append(_PENDING_AS_BLOCK[completion.pending_state])
    return blocking, tuple(states)


_PENDING_AS_BLOCK = {
    PendingState.ENQUEUED: BlockState.ENQUEUED,
    PendingState.STARTED: BlockState.STARTED,
    PendingState.UNKNOWN: BlockState.UNKNOWN,
    PendingState.NONE: BlockState.UNKNOWN,  # unreachable: a rank with nothing pending has completed b or not enqueued it
}
_AT_BLOCK = frozenset({BlockState.ENQUEUED, BlockState.STARTED, BlockState.UNKNOWN})


def _fingerprint_of(item: Evidence | None, state: BlockState | None, blocking: int) -> Any:
    """A rank's fingerprint of collective ``blocking`` (COMPLETION-4), or MISSING where unknown:
    it is that rank's oldest pending one, or the last one it completed."""
    completion = None if item is None else item.completion
    if completion is None or state is None:
        return MISSING
    if state in _AT_BLOCK:
        found = completion.pending_fingerprint
    elif state is BlockState.COMPLETED and completion.completed == blocking:
        found = completion.completed_fingerprint
    else:
        return MISSING
    return found if found != 0 else MISSING


def _assess_completion(
    evidence: Sequence[Evidence | None], missing: tuple[int, ...], majority_coordinate: Coordinate | None
) -> Assessment | frozenset[int] | None:
    """COMPLETION-3..8: judge a settled round on the blocking collective; or leave it to the host
    coordinates -- None, or (COMPLETION-8) the positions the host rules must not attribute
    because they wait in a collective the majority has not enqueued. Every vote is
    ``classify_exact`` over per-position values."""
    found = block_states(evidence)
    if found is None:
        return None
    blocking, states = found
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    key = majority_coordinate if majority_coordinate is not None else min(e.coordinate for _, e in present)

    def finding(outcome: Finding, attributed: tuple[int, ...], kind: StallKind, scope: Scope, reason: str,
                gone: tuple[int, ...] = missing) -> Assessment:
        return Assessment(outcome, attributed, (), gone, key, kind, scope, f"{reason} (collective #{blocking})",
                          blocking)

    # COMPLETION-3: a rank that never enqueued b, which a strict majority enqueued, is behind.
    enqueued = classify_exact([MISSING if s is None else s is not BlockState.NOT_ENQUEUED for s in states])
    if enqueued.healthy_value is False:
        # COMPLETION-8: the majority has not reached b; the host coordinates say where it is, and
        # the ranks that enqueued b wait for it -- they are not evidence of a fault.
        return frozenset(p for p, s in enumerate(states) if s is not None and s is not BlockState.NOT_ENQUEUED)
    if enqueued.healthy_value is None:
        return finding(Finding.INCONCLUSIVE, (), StallKind.HANG, Scope.GROUP,
                       "no strict majority has enqueued the blocking collective")
    if enqueued.status is Status.ATTRIBUTED:
        kind = _kind_of([_at(evidence, p).stage for p in enqueued.outliers])
        return finding(Finding.BEHIND, enqueued.outliers, kind, Scope.RANK,
                       "never enqueued the collective the strict majority has enqueued")
    # COMPLETION-4: the fingerprints of b, where known, with a strict majority.
    fingerprints = classify_exact([_fingerprint_of(evidence[p], s, blocking) for p, s in enumerate(states)])
    if fingerprints.status is Status.ATTRIBUTED:
        return finding(Finding.DESYNC, fingerprints.outliers, StallKind.DESYNC, Scope.RANK,
                       "pending collective fingerprint differs from the strict majority")
    # COMPLETION-5, COMPLETION-6: started (or beyond) against enqueued and not started.
    started_values = [
        MISSING if s is None or s is BlockState.UNKNOWN else s in (BlockState.STARTED, BlockState.COMPLETED)
        for s in states
    ]
    if any(v is not MISSING for v in started_values):
        started = classify_exact(started_values)
        if started.status is Status.ATTRIBUTED and started.healthy_value is True:
            kind = _kind_of([_at(evidence, p).stage for p in started.outliers])
            return finding(Finding.BEHIND, started.outliers, kind, Scope.RANK,
                           "enqueued the collective but its device never started it, while the strict majority's did")
        if started.healthy_value is False and started.status is Status.AGREE:
            return finding(Finding.GROUP_STALL, (), StallKind.HANG, Scope.GROUP,
                           "every rank enqueued the blocking collective and no rank's device started it", ())
        if started.healthy_value is not True and started.reason is not Reason.MISSING_EVIDENCE:
            return finding(Finding.INCONCLUSIVE, (), StallKind.HANG, Scope.GROUP,
                           "no strict majority of devices has started the blocking collective")
    # COMPLETION-7: b enqueued everywhere, nobody differs.
    if missing:
        return finding(Finding.UNRESPONSIVE, (), StallKind.HANG, Scope.RANK,
                       "the answering majority waits in the blocking collective; the missing peers did not answer")
    return finding(Finding.GROUP_STALL, (), _kind_of([e.stage for _, e in present]), Scope.GROUP,
                   "every rank enqueued the blocking collective and none differs")


def _at(evidence: Sequence[Evidence | None], position: int) -> Evidence:
    item = evidence[position]
    assert item is not None, f"position {position} has no evidence"
    return item


def reporter_for(assessment: Assessment, evidence: Sequence[Evidence | None]) -> int:
    """The observer that emits the report: the lowest-positioned one that gave evidence and is
    not attributed (OBS-7). Exists whenever the assessment is reportable: the deciding observer
    gave its own evidence, and attributed positions are a minority."""
    candidates = [p for p, e in enumerate(evidence) if e is not None and p not in assessment.attributed]
    if not candidates:
        raise ValueError(f"no responsive, non-attributed observer in {list(evidence)} for {assessment}")
    return candidates[0]


# --------------------------------------------------------------------------------------------
# Actions: guards, effects, predicates named by spec/observer.toml
# --------------------------------------------------------------------------------------------

ACTIONS = Actions(states=ObserverState)
ObserverMachineState: TypeAlias = MachineState[ObserverContext]
Stepped: TypeAlias = tuple[ObserverContext, tuple[object, ...]]


def _now(context: ObserverContext, event: Any) -> float:
    # The driver's clock is monotonic; the machine still never lets its own time run back.
    now: float = event.now_s
    return now if now > context.now_s else context.now_s


# Guards ---------------------------------------------------------------------------------------


@ACTIONS.guard
def join_overdue(context: ObserverContext, event: Tick) -> bool:
    return _now(context, event) - context.started_s >= context.config.join_deadline_s


@ACTIONS.guard
def attach_overdue(context: ObserverContext, event: Tick) -> bool:
    return _now(context, event) - context.started_s >= context.config.attach_deadline_s


@ACTIONS.guard
def stall_detected(context: ObserverContext, event: Tick) -> bool:
    now = _now(context, event)
    return context.idle_at(now) >= context.own_threshold_s() and now >= context.deferred_until_s


@ACTIONS.guard
def recheck_due(context: ObserverContext, event: Tick) -> bool:
    now = _now(context, event)
    return now >= context.next_round_at_s and now >= context.deferred_until_s


@ACTIONS.guard
def round_expired(context: ObserverContext, event: Tick) -> bool:
    assert context.round is not None
    return _now(context, event) >= context.round.deadline_s


def _reply_is_new(context: ObserverContext, event: Answer) -> bool:
    open_round = context.round
    return (
        open_round is not None
        and event.round == open_round.round
        and 0 <= event.sender < context.config.group_size
        and event.sender not in open_round.answered
    )


@ACTIONS.guard
def reply_completes_round(context: ObserverContext, event: Answer) -> bool:
    assert context.round is not None
    return _reply_is_new(context, event) and len(context.round.answered) + 1 == context.config.group_size


@ACTIONS.guard
def reply_adds_to_round(context: ObserverContext, event: Answer) -> bool:
    assert context.round is not None
    return _reply_is_new(context, event) and len(context.round.answered) + 1 < context.config.group_size


@ACTIONS.guard
def reply_is_stale(context: ObserverContext, event: Answer) -> bool:
    return not _reply_is_new(context, event)


@ACTIONS.guard
def decision_accepted(context: ObserverContext, event: Decision) -> bool:
    report = event.report
    return report.key not in context.reported and context.config.position not in report.attributed


# Effects --------------------------------------------------------------------------------------


def _advance(context: ObserverContext, event: Any) -> ObserverContext:
    return attrs.evolve(context, now_s=_now(context, event))


@ACTIONS.effect
def on_joined(context: ObserverContext, event: Joined) -> Stepped:
    context = _advance(context, event)
    return context, (WakeAt(context.started_s + context.config.attach_deadline_s),)


@ACTIONS.effect
def fail_join(context: ObserverContext, event: JoinFailed | Tick) -> Stepped:
    context = _advance(context, event)
    if isinstance(event, JoinFailed):
        reason = f"rendezvous failed: {event.reason}"
    else:
        reason = f"rendezvous did not complete within join_deadline_s={context.config.join_deadline_s}"
    return context, (Failed(reason),)


@ACTIONS.effect
def fail_attach(context: ObserverContext, event: Tick) -> Stepped:
    context = _advance(context, event)
    reason = (
        f"the trainer's progress record did not appear within attach_deadline_s="
        f"{context.config.attach_deadline_s} of the observer's start"
    )
    return context, (Failed(reason),)


@ACTIONS.effect
def on_attached(context: ObserverContext, event: Attached) -> Stepped:
    context = attrs.evolve(_advance(context, event), progress=event.progress, last_progress_s=_now(context, event))
    return context, (WakeAt(context.now_s + context.own_threshold_s()),)


@ACTIONS.effect
def record_progress(context: ObserverContext, event: ProgressSeen) -> Stepped:
    now = _now(context, event)
    context = attrs.evolve(context, now_s=now, progress=event.progress, last_progress_s=now, streak=None)
    return context, (WakeAt(now + context.own_threshold_s()),)


@ACTIONS.effect
def abort_round(context: ObserverContext, event: ProgressSeen) -> Stepped:
    context, effects = record_progress(attrs.evolve(context, round=None), event)
    return context, (Noted("round_aborted_by_progress"), *effects)


@ACTIONS.effect
def start_round(context: ObserverContext, event: Tick) -> Stepped:
    now = _now(context, event)
    config = context.config
    number = context.rounds_started + 1
    round_id = RoundId(config.position, number)
    evidence: list[Evidence | None] = [None] * config.group_size
    evidence[config.position] = context.evidence_at(now)
    opened = OpenRound(round_id, now, now + config.round_deadline_s, frozenset({config.position}), tuple(evidence))
    context = attrs.evolve(context, now_s=now, rounds_started=number, round=opened)
    return context, (Send(config.peers, Request(round_id)), WakeAt(opened.deadline_s))


@ACTIONS.effect
def record_reply(context: ObserverContext, event: Answer) -> Stepped:
    return _with_reply(_advance(context, event), event), ()


def _with_reply(context: ObserverContext, event: Answer) -> ObserverContext:
    assert context.round is not None
    evidence = list(context.round.evidence)
    evidence[event.sender] = event.evidence
    opened = attrs.evolve(
        context.round, answered=context.round.answered | {event.sender}, evidence=tuple(evidence)
    )
    return attrs.evolve(context, round=opened)


@ACTIONS.effect
def close_round(context: ObserverContext, event: Tick | Answer) -> Stepped:
    context = _advance(context, event)
    by_deadline = isinstance(event, Tick)
    if isinstance(event, Answer):
        context = _with_reply(context, event)
    opened = context.round
    assert opened is not None
    config = context.config
    # Our own evidence is refreshed at close: still the same position (progress aborts a round).
    evidence = list(opened.evidence)
    evidence[config.position] = context.evidence_at(context.now_s)
    assessment = assess(evidence, config)
    effects: list[object] = [RoundClosed(opened.round, assessment, tuple(sorted(opened.answered)), by_deadline)]
    streak = _next_streak(context.streak, assessment)
    reportable = assessment.outcome in _DECISIVE or (
        assessment.outcome in _CONFIRMED and streak is not None and streak[1] >= config.confirm_rounds
    )
    reported = context.reported
    if reportable and assessment.key is not None:
        reporter = reporter_for(assessment, evidence)
        report = StallReport(
            assessment.kind, assessment.outcome, assessment.scope, assessment.key, opened.round,
            config.position, reporter, assessment.attributed, assessment.ahead, assessment.missing,
            tuple(evidence), context.idle_s, assessment.reason, assessment.blocking,
        )
        if reporter != config.position:
            effects.append(Send((reporter,), Delegate(opened.round, config.position, report)))
        elif assessment.key not in reported:
            effects.append(EmitReport(report))
            reported = _remember(reported, assessment.key, config.reported_keys_max)
    next_round_at = context.now_s + config.recheck_interval_s
    effects.append(WakeAt(next_round_at))
    context = attrs.evolve(context, round=None, next_round_at_s=next_round_at, streak=streak, reported=reported)
    return context, tuple(effects)


def _next_streak(streak: tuple[Assessment, int] | None, assessment: Assessment) -> tuple[Assessment, int] | None:
    if assessment.outcome not in _CONFIRMED:
        return None
    if streak is not None and streak[0] == assessment:
        return (assessment, streak[1] + 1)
    return (assessment, 1)


def _remember(reported: tuple[Coordinate, ...], key: Coordinate, limit: int) -> tuple[Coordinate, ...]:
    return (*reported, key)[-limit:]


@ACTIONS.effect
def answer(context: ObserverContext, event: RoundRequest) -> Stepped:
    context = _advance(context, event)
    requester = event.round.initiator
    if requester < context.config.position:
        # The lower-positioned observer coordinates this stall; stand back for one cycle.
        context = attrs.evolve(
            context, deferred_until_s=max(context.deferred_until_s, context.now_s + context.config.defer_s)
        )
    reply = Reply(event.round, context.config.position, context.evidence_at(context.now_s))
    return context, (Send((requester,), reply),)


@ACTIONS.effect
def note_stale_reply(context: ObserverContext, event: Answer) -> Stepped:
    return _advance(context, event), (Noted("stale_reply_ignored"),)


@ACTIONS.effect
def accept_decision(context: ObserverContext, event: Decision) -> Stepped:
    context = _advance(context, event)
    report = attrs.evolve(event.report, reporter=context.config.position)
    reported = _remember(context.reported, report.key, context.config.reported_keys_max)
    return attrs.evolve(context, reported=reported), (EmitReport(report),)


@ACTIONS.effect
def stop(context: ObserverContext, event: TrainerExit | Stop) -> Stepped:
    context = _advance(context, event)
    if isinstance(event, TrainerExit):
        reason = "trainer exited cleanly" if event.clean else "trainer died"
    else:
        reason = "stop requested"
    return attrs.evolve(context, round=None), (Stopped(reason),)


# Predicates -----------------------------------------------------------------------------------

_Effects: TypeAlias = tuple[object, ...]


def _sends(effects: _Effects) -> list[Send]:
    return [e for e in effects if isinstance(e, Send)]


def _reports(effects: _Effects) -> list[StallReport]:
    return [e.report for e in effects if isinstance(e, EmitReport)]


def _decides(event: object, effects: _Effects) -> bool:
    """The step closed a round (a verdict was formed), as opposed to relaying a peer's."""
    return any(isinstance(e, RoundClosed) for e in effects) or (
        not isinstance(event, Decision)
        and (bool(_reports(effects)) or any(isinstance(s.message, Delegate) for s in _sends(effects)))
    )


@ACTIONS.predicate
def quiet_while_healthy(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not _sends(effects) or isinstance(event, RoundRequest):
        return True
    context = previous.context
    now = _now(context, event)
    return context.progress is not None and context.idle_at(now) >= context.own_threshold_s()


@ACTIONS.predicate
def verdict_only_when_due(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not _decides(event, effects):
        return True
    context = previous.context
    opened = context.round
    if previous.control is not ObserverState.ROUND or opened is None:
        return False
    now = _now(context, event)
    answered = set(opened.answered)
    if isinstance(event, Answer) and event.round == opened.round:
        answered.add(event.sender)
    everyone = len(answered) == context.config.group_size
    return context.idle_at(now) >= context.own_threshold_s() and (everyone or now >= opened.deadline_s)


@ACTIONS.predicate
def round_ends_by_deadline(state: ObserverMachineState) -> bool:
    opened = state.context.round
    if state.control is not ObserverState.ROUND:
        return opened is None
    return (
        opened is not None
        and state.context.now_s < opened.deadline_s
        and opened.deadline_s == opened.opened_s + state.context.config.round_deadline_s
    )


@ACTIONS.predicate
def round_start_sets_its_deadline_timer(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if state.control is not ObserverState.ROUND or previous.control is ObserverState.ROUND:
        return True
    opened = state.context.round
    return opened is not None and WakeAt(opened.deadline_s) in effects


@ACTIONS.predicate
def requests_answered_in_every_joined_state(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not isinstance(event, RoundRequest) or previous.control not in JOINED_STATES:
        return True
    replies = [s for s in _sends(effects) if isinstance(s.message, Reply)]
    return (
        len(effects) == 1
        and len(replies) == 1
        and replies[0].to == (event.round.initiator,)
        and replies[0].message.round == event.round
        and state.control == previous.control
    )


@ACTIONS.predicate
def one_report_per_stuck_position(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    reports = _reports(effects)
    if not reports:
        return True
    return len(reports) == 1 and reports[0].key not in previous.context.reported and reports[0].key in state.context.reported


@ACTIONS.predicate
def reporter_is_responsive_and_not_attributed(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    position = previous.context.config.position
    for report in _reports(effects):
        if report.reporter != position or position in report.attributed or position in report.missing:
            return False
    for send in _sends(effects):
        if isinstance(send.message, Delegate):
            report = send.message.report
            if send.to != (report.reporter,) or report.reporter in report.attributed or report.reporter in report.missing:
                return False
    return True


@ACTIONS.predicate
def stops_at_trainer_exit_and_stays_silent(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if isinstance(event, (TrainerExit, Stop)) and previous.control not in FINAL_STATES:
        return state.control is ObserverState.STOPPED and all(isinstance(e, Stopped) for e in effects) and len(effects) == 1
    if previous.control in FINAL_STATES:
        return state == previous and not effects
    return True


@ACTIONS.predicate
def stale_replies_change_nothing_but_a_counter(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not isinstance(event, Answer) or previous.control in FINAL_STATES:
        return True
    stale = not _reply_is_new(previous.context, event) if previous.control is ObserverState.ROUND else True
    if not stale:
        return True
    unchanged = attrs.evolve(state.context, now_s=previous.context.now_s) == previous.context
    return unchanged and state.control == previous.control and effects == (Noted("stale_reply_ignored"),)


@ACTIONS.predicate
def memory_is_bounded(state: ObserverMachineState) -> bool:
    context = state.context
    opened = context.round
    return len(context.reported) <= context.config.reported_keys_max and (
        opened is None or len(opened.answered) <= context.config.group_size
    )


# Sometimes-witnesses (the exploration must reach each, so no property passes vacuously).


def _closed(effects: _Effects) -> list[RoundClosed]:
    return [e for e in effects if isinstance(e, RoundClosed)]


@ACTIONS.predicate
def round_closes_with_every_answer(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return any(not c.by_deadline and len(c.answered) == previous.context.config.group_size for c in _closed(effects))


@ACTIONS.predicate
def round_closes_by_deadline_with_a_peer_missing(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return any(c.by_deadline and len(c.answered) < previous.context.config.group_size for c in _closed(effects))


def _reported_outcome(effects: _Effects, outcome: Finding) -> bool:
    """A report of ``outcome`` was emitted or delegated in this step."""
    delegated = [s.message.report for s in _sends(effects) if isinstance(s.message, Delegate)]
    return any(report.outcome is outcome for report in (*_reports(effects), *delegated))


@ACTIONS.predicate
def behind_rank_reported(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Finding.BEHIND)


@ACTIONS.predicate
def desync_reported(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Finding.DESYNC)


@ACTIONS.predicate
def group_stall_reported(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Finding.GROUP_STALL)


@ACTIONS.predicate
def unresponsive_reported_after_confirmation(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Finding.UNRESPONSIVE)


@ACTIONS.predicate
def decision_delegated(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return any(isinstance(s.message, Delegate) for s in _sends(effects))


@ACTIONS.predicate
def delegated_report_emitted(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return isinstance(event, Decision) and bool(_reports(effects))


@ACTIONS.predicate
def round_aborted_by_progress(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return Noted("round_aborted_by_progress") in effects


@ACTIONS.predicate
def stale_reply_counted(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return Noted("stale_reply_ignored") in effects


@ACTIONS.predicate
def rank_named_by_completion(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    delegated = [s.message.report for s in _sends(effects) if isinstance(s.message, Delegate)]
    return any(report.blocking and report.attributed for report in (*_reports(effects), *delegated))


@ACTIONS.predicate
def deferred_to_a_lower_peer(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return state.context.deferred_until_s > previous.context.deferred_until_s
