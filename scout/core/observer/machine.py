"""The observer machine's actions: the assessment of a round's evidence, and the guards, effects
and invariant predicates that ``spec/observer.toml`` names (values: :mod:`.model`).

Pure: time arrives as ``now_s`` on every event; messages and reports leave as effect values.
The theory of operation is in :mod:`scout.core.observer.model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeAlias

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
    Completion,
    Coordinate,
    Decision,
    Delegate,
    EmitReport,
    Evidence,
    Failed,
    Finding,
    FindingCode,
    HostContract,
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

__all__ = ["ACTIONS", "HOST_PROGRESS_ONLY", "WAITING_ELSEWHERE", "assess", "block_states", "pending_groups",
           "reporter_for", "voters", "waits_elsewhere"]

# --------------------------------------------------------------------------------------------
# The assessment (pure; the one verdict rule does the voting)
# --------------------------------------------------------------------------------------------


def _kind_of(stages: Sequence[Stage]) -> StallKind:
    if stages and all(stage is Stage.DATA_LOADING for stage in stages):
        return StallKind.DATA_STALL
    if stages and all(stage in _CHECKPOINT_STAGES for stage in stages):
        return StallKind.CHECKPOINT_STALL
    return StallKind.HANG


#: COMPLETION-9: the code of a round whose only evidence against a rank was its host coordinate,
#: where collectives return at enqueue.
HOST_PROGRESS_ONLY: Final = FindingCode.HOST_PROGRESS_ONLY
#: COMPLETION-10: the code of a round whose only candidate waits in another group's collective.
WAITING_ELSEWHERE: Final = FindingCode.WAITING_ELSEWHERE


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
    return _assess_host(evidence, missing, coordinates, waiting)


def _convictable(evidence: Sequence[Evidence | None]) -> frozenset[int]:
    """COMPLETION-9: the positions whose host coordinate is evidence against them -- every one
    where every answering rank's calls block until their collective completed; where some
    return at enqueue, only the ranks whose process stopped (a stale completion section,
    PROGRESS-10: its host coordinate is where it stopped)."""
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    if all(e.contract is HostContract.BLOCKING for _, e in present):
        return frozenset(p for p, _ in present)
    return frozenset(p for p, e in present if e.completion_stale)


def _without_host_evidence(evidence: Sequence[Evidence | None], named: tuple[int, ...]) -> str:
    """COMPLETION-9: what a round lacked to name ``named`` -- said in the report's detail."""
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    ahead = sorted(p for p, e in present if e.contract is HostContract.ENQUEUE)
    untracked = sorted(p for p, e in present if not e.completions)
    said = (f"positions {list(named)} differ only in their host coordinates, which are no evidence where "
            f"collectives return at enqueue (positions {ahead} run ahead of their devices)")
    if untracked:
        return said + (f"; positions {untracked} publish no completion evidence (is completion tracking off, or "
                       "withdrawn? see docs/observer.md)")
    return said + ("; no tracked group has a collective pending: the stall is outside every tracked group "
                   "(a group created after the tracker's limit, or collectives no source sees; set "
                   "TORCH_FR_BUFFER_SIZE before init_process_group to see C++-issued ones)")


def _assess_host(evidence: Sequence[Evidence | None], missing: tuple[int, ...], coordinates: Any,
                 waiting: frozenset[int]) -> Assessment:
    """Rows 1-6 of the host-coordinate table (spec/observer.md), under COMPLETION-8 and COMPLETION-9."""
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    convictable = _convictable(evidence)
    if coordinates.status is Status.ATTRIBUTED:
        healthy: Coordinate = coordinates.healthy_value
        candidates = tuple(p for p in coordinates.outliers if p not in waiting)
        if not candidates:
            return Assessment(Finding.INCONCLUSIVE, (), (), missing, healthy, StallKind.HANG, Scope.GROUP,
                              "the ranks past the majority wait in a collective the majority has not enqueued")
        attributed = tuple(p for p in candidates if p in convictable)
        if not attributed:
            return Assessment(Finding.INCONCLUSIVE, (), (), missing, healthy, StallKind.HANG, Scope.GROUP,
                              _without_host_evidence(evidence, candidates), code=HOST_PROGRESS_ONLY)
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
        candidates = tuple(p for p in fingerprints.outliers if p not in waiting)
        if not candidates:
            return Assessment(Finding.INCONCLUSIVE, (), (), missing, healthy, StallKind.HANG, Scope.GROUP,
                              "the ranks that differ wait in a collective the majority has not enqueued")
        differing = tuple(p for p in candidates if p in convictable)
        if not differing:
            return Assessment(Finding.INCONCLUSIVE, (), (), missing, healthy, StallKind.HANG, Scope.GROUP,
                              _without_host_evidence(evidence, candidates), code=HOST_PROGRESS_ONLY)
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


def pending_groups(evidence: Sequence[Evidence | None]) -> tuple[int, ...]:
    """COMPLETION-1, COMPLETION-11: the groups (source keys) with a collective pending on some
    answering rank, in the order the positions list them; point-to-point coordinates never vote."""
    found: dict[int, None] = {}
    for item in evidence:
        if item is not None:
            for completion in item.completions:
                if completion.pending and not completion.point_to_point:
                    found.setdefault(completion.source)
    return tuple(found)


def voters(evidence: Sequence[Evidence | None], source: int) -> tuple[int, ...]:
    """COMPLETION-1: the positions that vote on group ``source``: all but the answering ranks that
    track completion and not this group (they are not its members). A silent position, and an
    answering rank without completion evidence, votes as missing."""
    return tuple(p for p, e in enumerate(evidence)
                 if e is None or not e.completions or e.completion_of(source) is not None)


def block_states(evidence: Sequence[Evidence | None],
                 source: int | None = None) -> tuple[int, tuple[BlockState | None, ...]] | None:
    """The blocking collective ``b`` of group ``source`` and each position's state of it
    (COMPLETION-1, COMPLETION-2; None: missing, or not a voter of the group). ``source`` None:
    the one group with a collective pending, if there is exactly one. None when nothing of the
    group is pending anywhere."""
    if source is None:
        groups = pending_groups(evidence)
        if len(groups) != 1:
            return None
        source = groups[0]
    voting = voters(evidence, source)
    own = {p: (None if evidence[p] is None else evidence[p].completion_of(source)) for p in voting}  # type: ignore[union-attr]
    pending = [c.oldest_pending for c in own.values() if c is not None and c.pending]
    if not pending:
        return None
    blocking = min(p for p in pending if p is not None)
    states: list[BlockState | None] = []
    for position in range(len(evidence)):
        completion = own.get(position)
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


def _fingerprint_of(completion: Completion | None, state: BlockState | None, blocking: int) -> Any:
    """A rank's fingerprint of collective ``blocking`` (COMPLETION-4), or MISSING where unknown:
    it is that rank's oldest pending one, or the last one it completed."""
    if completion is None or state is None:
        return MISSING
    if state in _AT_BLOCK:
        found = completion.pending_fingerprint
    elif state is BlockState.COMPLETED and completion.completed == blocking:
        found = completion.completed_fingerprint
    else:
        return MISSING
    return found if found != 0 else MISSING


def waits_elsewhere(item: Evidence | None, source: int) -> bool:
    """COMPLETION-10: the rank has a collective (or a send or receive) pending in another group
    than ``source`` that its device started or that is under way on a blocking backend: it waits
    for its peers there."""
    return item is not None and any(c.source != source and c.pending and c.waiting for c in item.completions)


def _assess_completion(
    evidence: Sequence[Evidence | None], missing: tuple[int, ...], majority_coordinate: Coordinate | None
) -> Assessment | frozenset[int] | None:
    """COMPLETION-1..12: judge a settled round on the groups with a collective pending, each on
    its own blocking collective; or leave it to the host coordinates -- None, or (COMPLETION-8)
    the positions the host rules must not attribute because they wait in a collective the
    majority has not enqueued."""
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    if any(e.completion_stale for _, e in present):
        return None  # PROGRESS-10: a stopped rank's section lags it; its host coordinate says where it stopped
    groups = pending_groups(evidence)
    if not groups:
        return None
    key = majority_coordinate if majority_coordinate is not None else min(e.coordinate for _, e in present)
    handed_back: set[int] = set()
    judged: list[tuple[float, int, Assessment]] = []
    for index, source in enumerate(groups):
        found = _assess_group(evidence, source, key)
        if isinstance(found, Assessment):
            judged.append((_age_of_block(evidence, source, found.blocking), -index, found))
        elif found is not None:
            handed_back |= found
    if not judged:
        return frozenset(handed_back)
    # COMPLETION-12: an attribution first, then any other finding; the oldest blocking collective first.
    naming = [item for item in judged if item[2].attributed]
    chosen = max(naming or judged, key=lambda item: (item[0], item[1]))[2]
    return chosen


def _age_of_block(evidence: Sequence[Evidence | None], source: int, blocking: int) -> float:
    """How long the group's blocking collective has been pending on the voters that have it pending."""
    ages = [e.age_of(source) for e in evidence if e is not None
            and (c := e.completion_of(source)) is not None and c.oldest_pending == blocking]
    return max(ages, default=0.0)


def _assess_group(evidence: Sequence[Evidence | None], source: int,
                  key: Coordinate) -> Assessment | frozenset[int] | None:
    """COMPLETION-2..8, COMPLETION-10 for one group. Every vote is ``classify_exact`` over the
    group's voters (COMPLETION-1)."""
    found = block_states(evidence, source)
    if found is None:
        return None
    blocking, states = found
    voting = voters(evidence, source)
    gone = tuple(p for p in voting if evidence[p] is None)
    untracked = tuple(p for p in voting if evidence[p] is not None and states[p] is None)

    def own(position: int) -> Completion | None:
        item = evidence[position]
        return None if item is None else item.completion_of(source)

    def vote(values: Sequence[Any]) -> Any:
        return classify_exact(list(values))

    def outliers(verdict: Any) -> tuple[int, ...]:
        return tuple(voting[i] for i in verdict.outliers)

    def finding(outcome: Finding, attributed: tuple[int, ...], kind: StallKind, scope: Scope, reason: str,
                missing: tuple[int, ...] = gone, code: FindingCode = FindingCode.NONE) -> Assessment:
        return Assessment(outcome, attributed, (), missing, key, kind, scope, f"{reason} (collective #{blocking})",
                          blocking, source, code)

    def named(outcome: Finding, candidates: tuple[int, ...], kind: StallKind, reason: str) -> Assessment:
        # COMPLETION-10: a rank that waits for its peers in another group is not the cause here.
        attributed = tuple(p for p in candidates if not waits_elsewhere(evidence[p], source))
        if not attributed:
            return finding(Finding.INCONCLUSIVE, (), StallKind.HANG, Scope.GROUP,
                           f"positions {list(candidates)} {reason}, but each waits in another group's collective",
                           code=WAITING_ELSEWHERE)
        return finding(outcome, attributed, kind, Scope.RANK, reason)

    # COMPLETION-3: a rank that never enqueued b, which a strict majority enqueued, is behind.
    enqueued = vote([MISSING if states[p] is None else states[p] is not BlockState.NOT_ENQUEUED for p in voting])
    if enqueued.healthy_value is False:
        # COMPLETION-8: the majority has not reached b; the host coordinates say where it is, and
        # the ranks that enqueued b wait for it -- they are not evidence of a fault.
        return frozenset(p for p in voting if states[p] is not None and states[p] is not BlockState.NOT_ENQUEUED)
    if enqueued.healthy_value is None:
        return finding(Finding.INCONCLUSIVE, (), StallKind.HANG, Scope.GROUP,
                       "no strict majority has enqueued the blocking collective")
    if enqueued.status is Status.ATTRIBUTED:
        kind = _kind_of([_at(evidence, p).stage for p in outliers(enqueued)])
        return named(Finding.BEHIND, outliers(enqueued), kind,
                     "never enqueued the collective the strict majority has enqueued")
    # COMPLETION-4: the fingerprints of b, where known, with a strict majority.
    fingerprints = vote([_fingerprint_of(own(p), states[p], blocking) for p in voting])
    if fingerprints.status is Status.ATTRIBUTED:
        return named(Finding.DESYNC, outliers(fingerprints), StallKind.DESYNC,
                     "pending collective fingerprint differs from the strict majority")
    # COMPLETION-5, COMPLETION-6: started (or beyond) against enqueued and not started.
    started_values = [
        MISSING if states[p] is None or states[p] is BlockState.UNKNOWN
        else states[p] in (BlockState.STARTED, BlockState.COMPLETED)
        for p in voting
    ]
    if any(v is not MISSING for v in started_values):
        started = vote(started_values)
        if started.status is Status.ATTRIBUTED and started.healthy_value is True:
            kind = _kind_of([_at(evidence, p).stage for p in outliers(started)])
            return named(Finding.BEHIND, outliers(started), kind,
                         "enqueued the collective but its device never started it, while the strict majority's did")
        if started.healthy_value is False and started.status is Status.AGREE:
            return finding(Finding.GROUP_STALL, (), StallKind.HANG, Scope.GROUP,
                           "every rank enqueued the blocking collective and no rank's device started it", ())
        if started.healthy_value is not True and started.reason is not Reason.MISSING_EVIDENCE:
            return finding(Finding.INCONCLUSIVE, (), StallKind.HANG, Scope.GROUP,
                           "no strict majority of devices has started the blocking collective")
    # COMPLETION-7: b enqueued everywhere, nobody differs.
    if gone:
        return finding(Finding.UNRESPONSIVE, (), StallKind.HANG, Scope.RANK,
                       "the answering majority waits in the blocking collective; the missing peers did not answer")
    if untracked:
        return finding(Finding.INCONCLUSIVE, (), StallKind.HANG, Scope.GROUP,
                       f"the answering majority waits in the blocking collective; positions {list(untracked)} "
                       "publish no completion evidence for its group")
    return finding(Finding.GROUP_STALL, (), _kind_of([e.stage for e in evidence if e is not None]), Scope.GROUP,
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
        # A report carries each rank's coordinate of the deciding group only (COMPLETION-12), so
        # that a delegated one fits a datagram whatever the number of groups tracked.
        kept = tuple(None if e is None else e.only(assessment.source) for e in evidence)
        report = StallReport(
            assessment.kind, assessment.outcome, assessment.scope, assessment.key, opened.round,
            config.position, reporter, assessment.attributed, assessment.ahead, assessment.missing,
            kept, context.idle_s, assessment.reason, assessment.blocking, assessment.source, assessment.code,
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
