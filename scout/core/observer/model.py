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
(the reference's observers did: docs/prior-art.md R11).

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

*Completion.* On NCCL a collective returns at enqueue and completes later on a stream, so the
host coordinate alone says where the Python thread is, not what the device finished: a rank whose
stream never reaches a collective blocks at the same sync point as its peers. Where the trainer
tracks completion (spec/observer.md INSTR-9..13), each piece of evidence also carries a
:class:`Completion`: how many collectives of the tracked process group were enqueued, how many
have completed (a contiguous prefix), and the state and fingerprint of the oldest pending one.
When every answering rank has comparable completion evidence and some collective is pending,
the round is judged on the *blocking collective* ``b`` -- the lowest pending sequence number --
before the host coordinates (COMPLETION-1..8 in spec/observer.md): a rank that never enqueued
``b`` is behind; a pending fingerprint that differs is a desync; a rank whose ``b`` is enqueued
but not started while its peers' started is behind (a GPU-side hang, a kernel never launched);
a ``b`` enqueued everywhere with nobody differing is a group stall. Every vote is
``classify_exact``.

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
from typing import Any, ClassVar, Final, TypeAlias

import attrs

from scout.core.finite import finite_number
from scout.core.guards import whole_number

__all__ = [
    "JOINED_STATES",
    "Answer",
    "Assessment",
    "Attached",
    "BlockState",
    "Completion",
    "Decision",
    "Delegate",
    "EmitReport",
    "Evidence",
    "Failed",
    "FINAL_STATES",
    "Finding",
    "Joined",
    "JoinFailed",
    "Message",
    "Noted",
    "ObserverConfig",
    "ObserverContext",
    "ObserverEffect",
    "ObserverEvent",
    "ObserverState",
    "OpenRound",
    "PendingState",
    "Progress",
    "ProgressSeen",
    "Reply",
    "Request",
    "RoundClosed",
    "RoundId",
    "RoundRequest",
    "Scope",
    "Send",
    "Stage",
    "StallKind",
    "StallReport",
    "Stop",
    "Stopped",
    "Tick",
    "TrainerExit",
    "WakeAt",
    "event_for",
    "initial_context",
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


class PendingState(enum.IntEnum):
    """What the trainer's completion source knows of its oldest pending collective (INSTR-11)."""

    NONE = 0  # nothing pending
    ENQUEUED = 1  # issued by the host; the device has not started it
    STARTED = 2  # the device started it (the stream reached it, its kernel runs)
    UNKNOWN = 3  # pending; the source cannot tell whether it started (gloo, Flight Recorder without timing)


def _sequence_number(_instance: object, attribute: Any, value: Any) -> None:
    if not whole_number(value) or not 0 <= value < 2**63:
        raise ValueError(f"Completion.{attribute.name} must be an int in [0, 2**63), got {value!r}")


def _source_key(_instance: object, _attribute: Any, value: Any) -> None:
    if not whole_number(value) or not 0 < value < 2**64:
        raise ValueError(f"Completion.source must be an int in [1, 2**64) (0 means no tracking), got {value!r}")


@attrs.frozen
class Completion:
    """A rank's completion coordinate for one tracked process group (PROGRESS-9, COMPLETION-1):
    ``enqueued`` collectives were issued, every one numbered ``<= completed`` has completed, and
    when ``enqueued > completed`` the oldest pending one is number ``completed + 1`` with
    ``pending_fingerprint`` (0: not seen, so unknown) in ``pending_state``; the last completed
    one has ``completed_fingerprint``. ``source`` names the
    tracked group and how its collectives are numbered: two ranks' coordinates are comparable
    only when their sources are equal."""

    source: int = attrs.field(validator=_source_key)
    enqueued: int = attrs.field(validator=_sequence_number)
    completed: int = attrs.field(validator=_sequence_number)
    pending_fingerprint: int = 0
    pending_state: PendingState = PendingState.NONE
    completed_fingerprint: int = 0  # of collective number ``completed`` (0: none or not seen)

    def __attrs_post_init__(self) -> None:
        if self.completed > self.enqueued:
            raise ValueError(
                f"Completion.completed ({self.completed}) exceeds enqueued ({self.enqueued}): a collective "
                "cannot complete before it is enqueued"
            )
        pending = self.enqueued > self.completed
        if pending == (self.pending_state is PendingState.NONE):
            raise ValueError(
                f"Completion.pending_state {self.pending_state.name} contradicts enqueued={self.enqueued}, "
                f"completed={self.completed}: it is NONE exactly when nothing is pending"
            )
        if not pending and self.pending_fingerprint != 0:
            raise ValueError("Completion.pending_fingerprint must be 0 when nothing is pending")

    @property
    def pending(self) -> bool:
        return self.enqueued > self.completed

    @property
    def oldest_pending(self) -> int | None:
        """The sequence number of the oldest pending collective, or None."""
        return self.completed + 1 if self.pending else None


class BlockState(enum.IntEnum):
    """A rank's state of the blocking collective ``b`` of a round (COMPLETION-2)."""

    NOT_ENQUEUED = 0
    ENQUEUED = 1
    STARTED = 2
    UNKNOWN = 3  # pending, started or not cannot be told
    COMPLETED = 4


@attrs.frozen
class Progress:
    """The trainer's position as its observer last read it. ``completion`` is None where the
    trainer tracks no completion (an older record, an MPI program, tracking switched off);
    ``pending_since_s`` is when its oldest pending collective was enqueued, on the driver's
    monotonic clock (0 when nothing is pending)."""

    step: int
    op: int
    fingerprint: int = 0  # 0: no collective in flight
    stage: Stage = Stage.COMPUTE
    completion: Completion | None = None
    # Not part of equality: a re-estimate of the same enqueue time is not progress (PROGRESS-9).
    pending_since_s: float = attrs.field(default=0.0, eq=False)

    @property
    def coordinate(self) -> Coordinate:
        return (self.step, self.op)


@attrs.frozen
class Evidence:
    """One peer's answer to a round: its trainer's position and how long it has been idle, and
    its completion coordinate with the age of its oldest pending collective (when tracked)."""

    step: int
    op: int
    fingerprint: int
    stage: Stage
    idle_s: float
    completion: Completion | None = None
    pending_age_s: float = 0.0

    @property
    def coordinate(self) -> Coordinate:
        return (self.step, self.op)


@attrs.frozen(order=True)
class RoundId:
    """Rounds are numbered per initiator; the pair is unique in the group."""

    initiator: int
    number: int


class Finding(enum.Enum):
    BEHIND = "behind"
    DESYNC = "desync"
    GROUP_STALL = "group_stall"
    UNRESPONSIVE = "unresponsive"
    INCONCLUSIVE = "inconclusive"
    UNSETTLED = "unsettled"


class StallKind(enum.Enum):
    HANG = "hang"
    DESYNC = "desync"
    DATA_STALL = "data_stall"
    CHECKPOINT_STALL = "checkpoint_stall"


class Scope(enum.Enum):
    RANK = "rank"
    GROUP = "group"


#: Outcomes reported as soon as one round finds them; the others need ``confirm_rounds``.
_DECISIVE: Final = frozenset({Finding.BEHIND, Finding.DESYNC, Finding.GROUP_STALL})
_CONFIRMED: Final = frozenset({Finding.UNRESPONSIVE, Finding.INCONCLUSIVE})


@attrs.frozen
class Assessment:
    """What one round's evidence says (see the module docstring)."""

    outcome: Finding
    attributed: tuple[int, ...]  # positions
    ahead: tuple[int, ...]  # the attributed positions that are ahead of the majority
    missing: tuple[int, ...]
    key: Coordinate | None  # the stuck position; None when unsettled
    kind: StallKind
    scope: Scope
    reason: str  # the verdict reason code or a short phrase
    # The blocking collective's sequence number when completion evidence decided (COMPLETION-1),
    # 0 when the host coordinates did.
    blocking: int = 0


@attrs.frozen
class StallReport:
    """A finding, as the reporting observer emits it. Positions index the peer group."""

    kind: StallKind
    outcome: Finding
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
    blocking: int = 0  # as Assessment.blocking


def _positive_finite(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not finite_number(value) or value <= 0:
            raise ValueError(f"ObserverConfig.{name} must be a finite number of seconds > 0, got {value!r}")

    return check


def _count(name: str, minimum: int) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not whole_number(value) or value < minimum:
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
        # A bad stall threshold is refused by its own validator, which names it; halving an int
        # too large for a float here would raise OverflowError first.
        if not finite_number(self.stall_threshold_s):
            return self.stall_threshold_s
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
    report: StallReport


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
    report: StallReport


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
    report: StallReport


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


#: Every effect the observer machine emits: a driver dispatches on this closed union and ends
#: with ``typing.assert_never``, so an effect added here cannot be dropped silently.
ObserverEffect: TypeAlias = Send | WakeAt | EmitReport | RoundClosed | Noted | Failed | Stopped


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
        age = max(0.0, now_s - p.pending_since_s) if p.completion is not None and p.completion.pending else 0.0
        return Evidence(p.step, p.op, p.fingerprint, p.stage, max(0.0, now_s - self.last_progress_s), p.completion, age)


class ObserverState(str, enum.Enum):
    """Control states of spec/observer.toml (the names the table uses; the loader checks both
    name the same states)."""

    JOINING = "JOINING"
    ATTACHING = "ATTACHING"
    WATCHING = "WATCHING"
    ROUND = "ROUND"
    HOLDING = "HOLDING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


#: States in which the observer is part of its group and answers requests (OBS-5).
JOINED_STATES: Final = frozenset(
    {ObserverState.ATTACHING, ObserverState.WATCHING, ObserverState.ROUND, ObserverState.HOLDING}
)
#: States after which the observer does nothing more.
FINAL_STATES: Final = frozenset({ObserverState.STOPPED, ObserverState.FAILED})


def initial_context(config: ObserverConfig, now_s: float) -> ObserverContext:
    if not math.isfinite(now_s):
        raise ValueError(f"now_s must be a finite monotonic time, got {now_s!r}")
    return ObserverContext(config=config, now_s=now_s, started_s=now_s)
