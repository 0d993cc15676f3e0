"""The observer lifecycle: hang, desync and stall localization by consensus among observers.

Table (normative): ``spec/observer.toml``; prose, generated table and diagram:
``spec/observer.md``. This module is the table's Python half -- guards, effects, invariant
predicates -- plus the values they exchange. It is pure: time arrives as ``now_s`` on every
event (a monotonic clock read by the driver); messages and reports leave as effect values.

Theory of operation
-------------------
One observer runs beside each trainer rank and reads the trainer's progress record. While the
trainer publishes progress the observer sends nothing (OBS-1). When the trainer has been idle
for its stage's threshold, the observer opens a *round*: numbered ``(initiator, n)``, it asks
every peer of its group for evidence -- each peer's trainer coordinate ``(step, op)``, the
fingerprint of the collective in flight, the stage and how long the trainer has been idle -- and
closes when every peer answered or the deadline passed, whichever is first (OBS-2, OBS-3). A
peer that did not answer is missing evidence, never a reason to wait longer. Any observer
answers a request at once whatever it is doing (OBS-5), so observers never block each other
(the reference's observers did, W11).

Closing a round assesses the evidence with the one verdict rule, ``classify_exact``:

1. progress coordinates: a strict majority exists and some ranks differ -> those ranks are
   attributed (**behind**; a rank *ahead* of the majority skipped a collective and is attributed
   too, marked ``ahead``);
2. coordinates agree (or agree apart from missing peers) but collective fingerprints differ
   with a strict majority -> the odd ranks entered a different collective (**desync**);
3. coordinates and fingerprints all agree -> the whole group is stuck at one point
   (**group stall**, fabric or a common cause);
4. the answering majority agrees and some peers are silent -> **unresponsive** (names them);
5. no majority -> **inconclusive**.

Evidence only counts once it has *settled*: every answering rank has been idle for at least
its stage's floor (``settle_idle_s``; the data-loading and checkpoint thresholds for those
stages). A rank that is still progressing makes the round **unsettled** -- it is a straggler or
a long phase, not a hang -- and the observer checks again later.

Behind, desync and group stall are reported at once; unresponsive and inconclusive only when
``confirm_rounds`` consecutive rounds agree (one lost message must not produce a report). The
report is emitted by the lowest-positioned peer that answered and is not attributed (OBS-7);
when that is not the deciding observer itself, the decision is *delegated* to it in one
message. Each observer emits at most one report per stuck position -- the majority's
coordinate, or the lowest coordinate when there is none (OBS-6).

Observers that are stuck together would all open rounds; to keep traffic at one round per
recheck interval, an observer that answers a request from a lower-positioned peer defers its
own rounds for one round-and-recheck period: the lowest stuck observer coordinates, and the
next one takes over when it falls silent.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any, ClassVar, Final, TypeAlias

import attrs

from scout.core.machine import Bindings, MachineState
from scout.core.verdict import MISSING, Status, classify_exact

__all__ = [
    "BINDINGS",
    "JOINED_STATES",
    "Answer",
    "Assessment",
    "Attached",
    "Decision",
    "Delegate",
    "EmitReport",
    "Evidence",
    "Failed",
    "Joined",
    "JoinFailed",
    "Noted",
    "ObserverConfig",
    "ObserverContext",
    "ObserverState",
    "OpenRound",
    "Outcome",
    "Progress",
    "ProgressSeen",
    "Reply",
    "Report",
    "ReportKind",
    "Request",
    "RoundClosed",
    "RoundId",
    "RoundRequest",
    "Scope",
    "Send",
    "Stage",
    "Stop",
    "Stopped",
    "Tick",
    "TrainerExit",
    "WakeAt",
    "assess",
    "event_for",
    "initial_context",
    "reporter_for",
]


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


class Stage(enum.IntEnum):
    """What the trainer is doing (the progress record's stage field)."""

    IDLE = 0
    COMPUTE = 1
    COLLECTIVE = 2
    DATA_LOADING = 3
    CHECKPOINT_READ = 4
    CHECKPOINT_WRITE = 5


_CHECKPOINT_STAGES: Final = (Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE)
Coordinate: TypeAlias = tuple[int, int]


@attrs.frozen
class Progress:
    """The trainer's position as its observer last read it."""

    step: int
    op: int
    fingerprint: int = 0  # 0: no collective in flight
    stage: Stage = Stage.COMPUTE

    @property
    def coordinate(self) -> Coordinate:
        return (self.step, self.op)


@attrs.frozen
class Evidence:
    """One peer's answer to a round: its trainer's position and how long it has been idle."""

    step: int
    op: int
    fingerprint: int
    stage: Stage
    idle_s: float

    @property
    def coordinate(self) -> Coordinate:
        return (self.step, self.op)


@attrs.frozen(order=True)
class RoundId:
    """Rounds are numbered per initiator; the pair is unique in the group."""

    initiator: int
    number: int


class Outcome(enum.Enum):
    BEHIND = "behind"
    DESYNC = "desync"
    GROUP_STALL = "group_stall"
    UNRESPONSIVE = "unresponsive"
    INCONCLUSIVE = "inconclusive"
    UNSETTLED = "unsettled"


class ReportKind(enum.Enum):
    HANG = "hang"
    DESYNC = "desync"
    DATA_STALL = "data_stall"
    CHECKPOINT_STALL = "checkpoint_stall"


class Scope(enum.Enum):
    RANK = "rank"
    GROUP = "group"


#: Outcomes reported as soon as one round finds them; the others need ``confirm_rounds``.
_DECISIVE: Final = frozenset({Outcome.BEHIND, Outcome.DESYNC, Outcome.GROUP_STALL})
_CONFIRMED: Final = frozenset({Outcome.UNRESPONSIVE, Outcome.INCONCLUSIVE})


@attrs.frozen
class Assessment:
    """What one round's evidence says (see the module docstring)."""

    outcome: Outcome
    attributed: tuple[int, ...]  # positions
    ahead: tuple[int, ...]  # the attributed positions that are ahead of the majority
    missing: tuple[int, ...]
    key: Coordinate | None  # the stuck position; None when unsettled
    kind: ReportKind
    scope: Scope
    reason: str  # the verdict reason code or a short phrase


@attrs.frozen
class Report:
    """A finding, as the reporting observer emits it. Positions index the peer group."""

    kind: ReportKind
    outcome: Outcome
    scope: Scope
    key: Coordinate
    round: RoundId
    decided_by: int
    reporter: int
    attributed: tuple[int, ...]
    ahead: tuple[int, ...]
    missing: tuple[int, ...]
    evidence: tuple[Evidence | None, ...]
    idle_s: float  # the deciding observer's trainer idle time when the round closed
    reason: str


def _positive_finite(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"ObserverConfig.{name} must be a finite number of seconds > 0, got {value!r}")

    return check


def _count(name: str, minimum: int) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"ObserverConfig.{name} must be an int >= {minimum}, got {value!r}")

    return check


@attrs.frozen
class ObserverConfig:
    """Thresholds and bounds of one observer. Validated at construction; every error names the
    value and the rule."""

    position: int = attrs.field(validator=_count("position", 0))
    group_size: int = attrs.field(validator=_count("group_size", 2))
    stall_threshold_s: float = attrs.field(default=30.0, validator=_positive_finite("stall_threshold_s"))
    data_stall_threshold_s: float = attrs.field(default=30.0, validator=_positive_finite("data_stall_threshold_s"))
    checkpoint_stall_threshold_s: float = attrs.field(
        default=120.0, validator=_positive_finite("checkpoint_stall_threshold_s")
    )
    round_deadline_s: float = attrs.field(default=1.0, validator=_positive_finite("round_deadline_s"))
    recheck_interval_s: float = attrs.field(default=5.0, validator=_positive_finite("recheck_interval_s"))
    settle_idle_s: float = attrs.field(validator=_positive_finite("settle_idle_s"))
    join_deadline_s: float = attrs.field(default=120.0, validator=_positive_finite("join_deadline_s"))
    attach_deadline_s: float = attrs.field(default=120.0, validator=_positive_finite("attach_deadline_s"))
    confirm_rounds: int = attrs.field(default=2, validator=_count("confirm_rounds", 1))
    reported_keys_max: int = attrs.field(default=64, validator=_count("reported_keys_max", 1))

    @settle_idle_s.default
    def _settle_default(self) -> float:
        return self.stall_threshold_s / 2

    def __attrs_post_init__(self) -> None:
        if self.position >= self.group_size:
            raise ValueError(
                f"ObserverConfig.position {self.position} is outside the group of {self.group_size}; "
                "positions run from 0 to group_size - 1"
            )
        if self.settle_idle_s > self.stall_threshold_s:
            raise ValueError(
                f"ObserverConfig.settle_idle_s ({self.settle_idle_s}) must not exceed stall_threshold_s "
                f"({self.stall_threshold_s}): evidence could never settle before a round starts"
            )
        if self.recheck_interval_s < self.round_deadline_s:
            raise ValueError(
                f"ObserverConfig.recheck_interval_s ({self.recheck_interval_s}) must be >= round_deadline_s "
                f"({self.round_deadline_s}), so that a round can end before the next one starts"
            )

    def threshold_for(self, stage: Stage) -> float:
        """How long a trainer in ``stage`` may stay idle before its observer opens a round."""
        if stage is Stage.DATA_LOADING:
            return self.data_stall_threshold_s
        if stage in _CHECKPOINT_STAGES:
            return self.checkpoint_stall_threshold_s
        return self.stall_threshold_s

    def settle_floor(self, stage: Stage) -> float:
        """How long a rank in ``stage`` must have been idle for its evidence to count."""
        if stage is Stage.DATA_LOADING or stage in _CHECKPOINT_STAGES:
            return self.threshold_for(stage)
        return self.settle_idle_s

    @property
    def defer_s(self) -> float:
        return self.round_deadline_s + self.recheck_interval_s

    @property
    def peers(self) -> tuple[int, ...]:
        return tuple(p for p in range(self.group_size) if p != self.position)


# Messages between observers (what ``Send`` carries).


@attrs.frozen
class Request:
    round: RoundId


@attrs.frozen
class Reply:
    round: RoundId
    sender: int
    evidence: Evidence | None  # None: the sender has no record to read yet


@attrs.frozen
class Delegate:
    round: RoundId
    sender: int
    report: Report


Message: TypeAlias = Request | Reply | Delegate


# Events (what a driver feeds in). Every event carries the driver's monotonic time.


@attrs.frozen
class Joined:
    trigger: ClassVar[str] = "joined"
    now_s: float


@attrs.frozen
class JoinFailed:
    trigger: ClassVar[str] = "join_failed"
    now_s: float
    reason: str


@attrs.frozen
class Attached:
    trigger: ClassVar[str] = "attached"
    now_s: float
    progress: Progress


@attrs.frozen
class ProgressSeen:
    trigger: ClassVar[str] = "progress"
    now_s: float
    progress: Progress


@attrs.frozen
class Tick:
    trigger: ClassVar[str] = "tick"
    now_s: float


@attrs.frozen
class RoundRequest:
    trigger: ClassVar[str] = "round_request"
    now_s: float
    round: RoundId


@attrs.frozen
class Answer:
    trigger: ClassVar[str] = "answer"
    now_s: float
    round: RoundId
    sender: int
    evidence: Evidence | None


@attrs.frozen
class Decision:
    trigger: ClassVar[str] = "decision"
    now_s: float
    round: RoundId
    sender: int
    report: Report


@attrs.frozen
class TrainerExit:
    trigger: ClassVar[str] = "trainer_exit"
    now_s: float
    clean: bool


@attrs.frozen
class Stop:
    trigger: ClassVar[str] = "stop"
    now_s: float


ObserverEvent: TypeAlias = (
    Joined | JoinFailed | Attached | ProgressSeen | Tick | RoundRequest | Answer | Decision | TrainerExit | Stop
)


def event_for(message: Message, now_s: float) -> RoundRequest | Answer | Decision:
    """The event a driver feeds in when ``message`` arrives at ``now_s``."""
    if isinstance(message, Request):
        return RoundRequest(now_s, message.round)
    if isinstance(message, Reply):
        return Answer(now_s, message.round, message.sender, message.evidence)
    return Decision(now_s, message.round, message.sender, message.report)


# Effects (what a driver executes).


@attrs.frozen
class Send:
    to: tuple[int, ...]  # positions
    message: Message


@attrs.frozen
class WakeAt:
    """Deliver a Tick at or after ``at_s`` even if nothing else happens."""

    at_s: float


@attrs.frozen
class EmitReport:
    report: Report


@attrs.frozen
class RoundClosed:
    """Diagnostics: a round ended (by answers or deadline) with this assessment."""

    round: RoundId
    assessment: Assessment
    answered: tuple[int, ...]
    by_deadline: bool


@attrs.frozen
class Noted:
    """A counter for the driver's statistics (late replies, aborted rounds, ...)."""

    what: str


@attrs.frozen
class Failed:
    reason: str


@attrs.frozen
class Stopped:
    reason: str


# --------------------------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------------------------


@attrs.frozen
class OpenRound:
    round: RoundId
    opened_s: float
    deadline_s: float
    answered: frozenset[int]
    evidence: tuple[Evidence | None, ...]  # by position; None: not (yet) answered or no record


@attrs.frozen
class ObserverContext:
    config: ObserverConfig = attrs.field(repr=False)
    now_s: float
    started_s: float
    progress: Progress | None = None
    last_progress_s: float = 0.0
    rounds_started: int = 0
    round: OpenRound | None = None
    next_round_at_s: float = 0.0
    deferred_until_s: float = -math.inf
    # Consecutive rounds at this trainer position whose non-decisive finding was the same
    # (outcome, stuck position and missing peers alike): (that assessment, count).
    streak: tuple[Assessment, int] | None = None
    reported: tuple[Coordinate, ...] = ()

    @property
    def idle_s(self) -> float:
        return self.now_s - self.last_progress_s

    def idle_at(self, now_s: float) -> float:
        return now_s - self.last_progress_s

    def own_threshold_s(self) -> float:
        stage = self.progress.stage if self.progress is not None else Stage.COMPUTE
        return self.config.threshold_for(stage)

    def evidence_at(self, now_s: float) -> Evidence | None:
        if self.progress is None:
            return None
        p = self.progress
        return Evidence(p.step, p.op, p.fingerprint, p.stage, max(0.0, now_s - self.last_progress_s))


class ObserverState(enum.Enum):
    """Control states of spec/observer.toml (the names the table uses)."""

    JOINING = "JOINING"
    ATTACHING = "ATTACHING"
    WATCHING = "WATCHING"
    ROUND = "ROUND"
    HOLDING = "HOLDING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


#: States in which the observer is part of its group and answers requests (OBS-5).
JOINED_STATES: Final = frozenset({"ATTACHING", "WATCHING", "ROUND", "HOLDING"})


def initial_context(config: ObserverConfig, now_s: float) -> ObserverContext:
    if not math.isfinite(now_s):
        raise ValueError(f"now_s must be a finite monotonic time, got {now_s!r}")
    return ObserverContext(config=config, now_s=now_s, started_s=now_s)


# --------------------------------------------------------------------------------------------
# The assessment (pure; the one verdict rule does the voting)
# --------------------------------------------------------------------------------------------


def _kind_of(stages: Sequence[Stage]) -> ReportKind:
    if stages and all(stage is Stage.DATA_LOADING for stage in stages):
        return ReportKind.DATA_STALL
    if stages and all(stage in _CHECKPOINT_STAGES for stage in stages):
        return ReportKind.CHECKPOINT_STALL
    return ReportKind.HANG


def assess(evidence: Sequence[Evidence | None], config: ObserverConfig) -> Assessment:
    """Assess one round's evidence, by position (None: missing)."""
    if len(evidence) != config.group_size:
        raise ValueError(f"assess needs one entry per position ({config.group_size}), got {len(evidence)}")
    present = [(p, e) for p, e in enumerate(evidence) if e is not None]
    missing = tuple(p for p, e in enumerate(evidence) if e is None)
    unsettled = [p for p, e in present if e.idle_s < config.settle_floor(e.stage)]
    if unsettled:
        return Assessment(Outcome.UNSETTLED, (), (), missing, None, ReportKind.HANG, Scope.GROUP,
                          f"positions {unsettled} still progressing or within their stage's threshold")
    coordinates = classify_exact([MISSING if e is None else e.coordinate for e in evidence])
    if coordinates.status is Status.ATTRIBUTED:
        healthy: Coordinate = coordinates.healthy_value
        attributed = coordinates.outliers
        ahead = tuple(p for p in attributed if _at(evidence, p).coordinate > healthy)
        kind = _kind_of([_at(evidence, p).stage for p in attributed])
        return Assessment(Outcome.BEHIND, attributed, ahead, missing, healthy, kind, Scope.RANK,
                          "progress differs from the strict majority")
    if coordinates.healthy_value is None:
        lowest = min(e.coordinate for _, e in present) if present else None
        return Assessment(Outcome.INCONCLUSIVE, (), (), missing, lowest, ReportKind.HANG, Scope.GROUP,
                          coordinates.reason.value if coordinates.reason else "no majority")
    healthy = coordinates.healthy_value
    fingerprints = classify_exact([MISSING if e is None else e.fingerprint for e in evidence])
    if fingerprints.status is Status.ATTRIBUTED:
        return Assessment(Outcome.DESYNC, fingerprints.outliers, (), missing, healthy, ReportKind.DESYNC,
                          Scope.RANK, "collective fingerprint differs from the strict majority")
    if coordinates.status is Status.AGREE and fingerprints.status is Status.AGREE:
        kind = _kind_of([e.stage for _, e in present])
        return Assessment(Outcome.GROUP_STALL, (), (), (), healthy, kind, Scope.GROUP,
                          "every rank is stuck at the same point in the same collective")
    if coordinates.status is Status.AGREE:
        return Assessment(Outcome.INCONCLUSIVE, (), (), (), healthy, ReportKind.HANG, Scope.GROUP,
                          "same progress, collective fingerprints without a strict majority")
    return Assessment(Outcome.UNRESPONSIVE, (), (), missing, healthy, ReportKind.HANG, Scope.RANK,
                      "the answering majority is stuck at one point; the missing peers did not answer")


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
# Bindings: guards, effects, predicates named by spec/observer.toml
# --------------------------------------------------------------------------------------------

BINDINGS = Bindings()
ObserverMachineState: TypeAlias = MachineState[ObserverContext]
Outcome_: TypeAlias = tuple[ObserverContext, tuple[object, ...]]


def _now(context: ObserverContext, event: Any) -> float:
    # The driver's clock is monotonic; the machine still never lets its own time run back.
    now: float = event.now_s
    return now if now > context.now_s else context.now_s


# Guards ---------------------------------------------------------------------------------------


@BINDINGS.guard
def join_overdue(context: ObserverContext, event: Tick) -> bool:
    return _now(context, event) - context.started_s >= context.config.join_deadline_s


@BINDINGS.guard
def attach_overdue(context: ObserverContext, event: Tick) -> bool:
    return _now(context, event) - context.started_s >= context.config.attach_deadline_s


@BINDINGS.guard
def stall_detected(context: ObserverContext, event: Tick) -> bool:
    now = _now(context, event)
    return context.idle_at(now) >= context.own_threshold_s() and now >= context.deferred_until_s


@BINDINGS.guard
def recheck_due(context: ObserverContext, event: Tick) -> bool:
    now = _now(context, event)
    return now >= context.next_round_at_s and now >= context.deferred_until_s


@BINDINGS.guard
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


@BINDINGS.guard
def reply_completes_round(context: ObserverContext, event: Answer) -> bool:
    assert context.round is not None
    return _reply_is_new(context, event) and len(context.round.answered) + 1 == context.config.group_size


@BINDINGS.guard
def reply_adds_to_round(context: ObserverContext, event: Answer) -> bool:
    assert context.round is not None
    return _reply_is_new(context, event) and len(context.round.answered) + 1 < context.config.group_size


@BINDINGS.guard
def reply_is_stale(context: ObserverContext, event: Answer) -> bool:
    return not _reply_is_new(context, event)


@BINDINGS.guard
def decision_accepted(context: ObserverContext, event: Decision) -> bool:
    report = event.report
    return report.key not in context.reported and context.config.position not in report.attributed


# Effects --------------------------------------------------------------------------------------


def _advance(context: ObserverContext, event: Any) -> ObserverContext:
    return attrs.evolve(context, now_s=_now(context, event))


@BINDINGS.effect
def on_joined(context: ObserverContext, event: Joined) -> Outcome_:
    context = _advance(context, event)
    return context, (WakeAt(context.started_s + context.config.attach_deadline_s),)


@BINDINGS.effect
def fail_join(context: ObserverContext, event: JoinFailed | Tick) -> Outcome_:
    context = _advance(context, event)
    if isinstance(event, JoinFailed):
        reason = f"rendezvous failed: {event.reason}"
    else:
        reason = f"rendezvous did not complete within join_deadline_s={context.config.join_deadline_s}"
    return context, (Failed(reason),)


@BINDINGS.effect
def fail_attach(context: ObserverContext, event: Tick) -> Outcome_:
    context = _advance(context, event)
    reason = (
        f"the trainer's progress record did not appear within attach_deadline_s="
        f"{context.config.attach_deadline_s} of the observer's start"
    )
    return context, (Failed(reason),)


@BINDINGS.effect
def on_attached(context: ObserverContext, event: Attached) -> Outcome_:
    context = attrs.evolve(_advance(context, event), progress=event.progress, last_progress_s=_now(context, event))
    return context, (WakeAt(context.now_s + context.own_threshold_s()),)


@BINDINGS.effect
def record_progress(context: ObserverContext, event: ProgressSeen) -> Outcome_:
    now = _now(context, event)
    context = attrs.evolve(context, now_s=now, progress=event.progress, last_progress_s=now, streak=None)
    return context, (WakeAt(now + context.own_threshold_s()),)


@BINDINGS.effect
def abort_round(context: ObserverContext, event: ProgressSeen) -> Outcome_:
    context, effects = record_progress(attrs.evolve(context, round=None), event)
    return context, (Noted("round_aborted_by_progress"), *effects)


@BINDINGS.effect
def start_round(context: ObserverContext, event: Tick) -> Outcome_:
    now = _now(context, event)
    config = context.config
    number = context.rounds_started + 1
    round_id = RoundId(config.position, number)
    evidence: list[Evidence | None] = [None] * config.group_size
    evidence[config.position] = context.evidence_at(now)
    opened = OpenRound(round_id, now, now + config.round_deadline_s, frozenset({config.position}), tuple(evidence))
    context = attrs.evolve(context, now_s=now, rounds_started=number, round=opened)
    return context, (Send(config.peers, Request(round_id)), WakeAt(opened.deadline_s))


@BINDINGS.effect
def record_reply(context: ObserverContext, event: Answer) -> Outcome_:
    return _with_reply(_advance(context, event), event), ()


def _with_reply(context: ObserverContext, event: Answer) -> ObserverContext:
    assert context.round is not None
    evidence = list(context.round.evidence)
    evidence[event.sender] = event.evidence
    opened = attrs.evolve(
        context.round, answered=context.round.answered | {event.sender}, evidence=tuple(evidence)
    )
    return attrs.evolve(context, round=opened)


@BINDINGS.effect
def close_round(context: ObserverContext, event: Tick | Answer) -> Outcome_:
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
        report = Report(
            assessment.kind, assessment.outcome, assessment.scope, assessment.key, opened.round,
            config.position, reporter, assessment.attributed, assessment.ahead, assessment.missing,
            tuple(evidence), context.idle_s, assessment.reason,
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


@BINDINGS.effect
def answer(context: ObserverContext, event: RoundRequest) -> Outcome_:
    context = _advance(context, event)
    requester = event.round.initiator
    if requester < context.config.position:
        # The lower-positioned observer coordinates this stall; stand back for one cycle.
        context = attrs.evolve(
            context, deferred_until_s=max(context.deferred_until_s, context.now_s + context.config.defer_s)
        )
    reply = Reply(event.round, context.config.position, context.evidence_at(context.now_s))
    return context, (Send((requester,), reply),)


@BINDINGS.effect
def note_stale_reply(context: ObserverContext, event: Answer) -> Outcome_:
    return _advance(context, event), (Noted("stale_reply_ignored"),)


@BINDINGS.effect
def accept_decision(context: ObserverContext, event: Decision) -> Outcome_:
    context = _advance(context, event)
    report = attrs.evolve(event.report, reporter=context.config.position)
    reported = _remember(context.reported, report.key, context.config.reported_keys_max)
    return attrs.evolve(context, reported=reported), (EmitReport(report),)


@BINDINGS.effect
def stop(context: ObserverContext, event: TrainerExit | Stop) -> Outcome_:
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


def _reports(effects: _Effects) -> list[Report]:
    return [e.report for e in effects if isinstance(e, EmitReport)]


def _decides(event: object, effects: _Effects) -> bool:
    """The step closed a round (a verdict was formed), as opposed to relaying a peer's."""
    return any(isinstance(e, RoundClosed) for e in effects) or (
        not isinstance(event, Decision)
        and (bool(_reports(effects)) or any(isinstance(s.message, Delegate) for s in _sends(effects)))
    )


@BINDINGS.predicate
def quiet_while_healthy(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not _sends(effects) or isinstance(event, RoundRequest):
        return True
    context = previous.context
    now = _now(context, event)
    return context.progress is not None and context.idle_at(now) >= context.own_threshold_s()


@BINDINGS.predicate
def verdict_only_when_due(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not _decides(event, effects):
        return True
    context = previous.context
    opened = context.round
    if previous.control != "ROUND" or opened is None:
        return False
    now = _now(context, event)
    answered = set(opened.answered)
    if isinstance(event, Answer) and event.round == opened.round:
        answered.add(event.sender)
    everyone = len(answered) == context.config.group_size
    return context.idle_at(now) >= context.own_threshold_s() and (everyone or now >= opened.deadline_s)


@BINDINGS.predicate
def round_ends_by_deadline(state: ObserverMachineState) -> bool:
    opened = state.context.round
    if state.control != "ROUND":
        return opened is None
    return (
        opened is not None
        and state.context.now_s < opened.deadline_s
        and opened.deadline_s == opened.opened_s + state.context.config.round_deadline_s
    )


@BINDINGS.predicate
def round_start_sets_its_deadline_timer(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if state.control != "ROUND" or previous.control == "ROUND":
        return True
    opened = state.context.round
    return opened is not None and WakeAt(opened.deadline_s) in effects


@BINDINGS.predicate
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


@BINDINGS.predicate
def one_report_per_stuck_position(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    reports = _reports(effects)
    if not reports:
        return True
    return len(reports) == 1 and reports[0].key not in previous.context.reported and reports[0].key in state.context.reported


@BINDINGS.predicate
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


@BINDINGS.predicate
def stops_at_trainer_exit_and_stays_silent(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if isinstance(event, (TrainerExit, Stop)) and previous.control not in ("STOPPED", "FAILED"):
        return state.control == "STOPPED" and all(isinstance(e, Stopped) for e in effects) and len(effects) == 1
    if previous.control in ("STOPPED", "FAILED"):
        return state == previous and not effects
    return True


@BINDINGS.predicate
def stale_replies_change_nothing_but_a_counter(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    if not isinstance(event, Answer) or previous.control in ("STOPPED", "FAILED"):
        return True
    stale = not _reply_is_new(previous.context, event) if previous.control == "ROUND" else True
    if not stale:
        return True
    unchanged = attrs.evolve(state.context, now_s=previous.context.now_s) == previous.context
    return unchanged and state.control == previous.control and effects == (Noted("stale_reply_ignored"),)


@BINDINGS.predicate
def memory_is_bounded(state: ObserverMachineState) -> bool:
    context = state.context
    opened = context.round
    return len(context.reported) <= context.config.reported_keys_max and (
        opened is None or len(opened.answered) <= context.config.group_size
    )


# Sometimes-witnesses (the exploration must reach each, so no property passes vacuously).


def _closed(effects: _Effects) -> list[RoundClosed]:
    return [e for e in effects if isinstance(e, RoundClosed)]


@BINDINGS.predicate
def round_closes_with_every_answer(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return any(not c.by_deadline and len(c.answered) == previous.context.config.group_size for c in _closed(effects))


@BINDINGS.predicate
def round_closes_by_deadline_with_a_peer_missing(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return any(c.by_deadline and len(c.answered) < previous.context.config.group_size for c in _closed(effects))


def _reported_outcome(effects: _Effects, outcome: Outcome) -> bool:
    """A report of ``outcome`` was emitted or delegated in this step."""
    delegated = [s.message.report for s in _sends(effects) if isinstance(s.message, Delegate)]
    return any(report.outcome is outcome for report in (*_reports(effects), *delegated))


@BINDINGS.predicate
def behind_rank_reported(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Outcome.BEHIND)


@BINDINGS.predicate
def desync_reported(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Outcome.DESYNC)


@BINDINGS.predicate
def group_stall_reported(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Outcome.GROUP_STALL)


@BINDINGS.predicate
def unresponsive_reported_after_confirmation(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return _reported_outcome(effects, Outcome.UNRESPONSIVE)


@BINDINGS.predicate
def decision_delegated(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return any(isinstance(s.message, Delegate) for s in _sends(effects))


@BINDINGS.predicate
def delegated_report_emitted(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return isinstance(event, Decision) and bool(_reports(effects))


@BINDINGS.predicate
def round_aborted_by_progress(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return Noted("round_aborted_by_progress") in effects


@BINDINGS.predicate
def stale_reply_counted(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return Noted("stale_reply_ignored") in effects


@BINDINGS.predicate
def deferred_to_a_lower_peer(
    previous: ObserverMachineState, event: object, state: ObserverMachineState, effects: _Effects
) -> bool:
    return state.context.deferred_until_s > previous.context.deferred_until_s
