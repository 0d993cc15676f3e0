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
    "COMPLETION_GROUPS_MAX",
    "CHECKPOINT_STALL_THRESHOLD_S_DEFAULT",
    "DATA_STALL_THRESHOLD_S_DEFAULT",
    "JOINED_STATES",
    "RECHECK_INTERVAL_S_DEFAULT",
    "ROUND_DEADLINE_S_DEFAULT",
    "STALL_THRESHOLD_S_DEFAULT",
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
    "FindingCode",
    "HostContract",
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


class HostContract(enum.IntEnum):
    """What a returned collective call tells of a rank's device (PROGRESS-13, COMPLETION-9)."""

    BLOCKING = 0  # every group's calls return once their collective completed (gloo, MPI): the host is where the work is
    ENQUEUE = 1  # some group's calls return at enqueue (NCCL, the emulated backend): the host runs ahead of its device


@attrs.frozen
class Completion:
    """A rank's completion coordinate for one tracked process group (PROGRESS-9, COMPLETION-1):
    ``enqueued`` collectives were issued, every one numbered ``<= completed`` has completed, and
    when ``enqueued > completed`` the oldest pending one is number ``completed + 1`` with
    ``pending_fingerprint`` (0: not seen, so unknown) in ``pending_state``; the last completed
    one has ``completed_fingerprint``. ``source`` names the
    tracked group and how its collectives are numbered: two ranks' coordinates are comparable
    only when their sources are equal. ``point_to_point``: the coordinate counts this rank's own
    sends and receives on the group (COMPLETION-11): never compared with a peer's, it only says
    whether the rank waits for one."""

    source: int = attrs.field(validator=_source_key)
    enqueued: int = attrs.field(validator=_sequence_number)
    completed: int = attrs.field(validator=_sequence_number)
    pending_fingerprint: int = 0
    pending_state: PendingState = PendingState.NONE
    completed_fingerprint: int = 0  # of collective number ``completed`` (0: none or not seen)
    point_to_point: bool = False

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

    @property
    def waiting(self) -> bool:
        """COMPLETION-10: the rank's device is inside a collective of this group that waits for
        its peers (started, or pending where the source cannot tell -- a blocking call under way)."""
        return self.pending_state in (PendingState.STARTED, PendingState.UNKNOWN)


#: PROGRESS-9: completion coordinates one rank publishes at once (the groups it tracks beyond
#: that are left out of a publish, INSTR-9).
COMPLETION_GROUPS_MAX: Final = 16


def _completions(value: Any) -> tuple[Completion, ...]:
    """One coordinate per tracked group; a single one or None is accepted for brevity."""
    if value is None or value == ():
        return ()
    if type(value) is Completion:
        return (value,)
    found = tuple(value)
    if not all(isinstance(item, Completion) for item in found):
        raise ValueError(f"completions must be Completion values, got {found!r}")
    if len(found) > COMPLETION_GROUPS_MAX:
        raise ValueError(f"{len(found)} completion coordinates exceed COMPLETION_GROUPS_MAX={COMPLETION_GROUPS_MAX}")
    if len({item.source for item in found}) != len(found):
        raise ValueError(f"completions name one group twice: sources {[hex(item.source) for item in found]}")
    return found


def _per_completion(values: Any, count: int, what: str) -> tuple[float, ...]:
    """A number per completion coordinate (one number given, or none: the same for each)."""
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        return (float(values),) * count
    if values == () and count:
        return (0.0,) * count
    found = tuple(float(v) for v in values)
    if len(found) != count:
        raise ValueError(f"{what} needs one value per completion coordinate ({count}), got {len(found)}")
    return found


class BlockState(enum.IntEnum):
    """A rank's state of the blocking collective ``b`` of a round (COMPLETION-2)."""

    NOT_ENQUEUED = 0
    ENQUEUED = 1
    STARTED = 2
    UNKNOWN = 3  # pending, started or not cannot be told
    COMPLETED = 4


@attrs.frozen
class Progress:
    """The trainer's position as its observer last read it. ``completions`` holds one coordinate
    per tracked process group, empty where the trainer tracks no completion (an MPI program,
    tracking switched off or withdrawn); ``pending_since_s`` gives, per coordinate, when its
    oldest pending collective was enqueued, on the driver's monotonic clock (0 when nothing is
    pending). ``contract`` is the rank's host contract (PROGRESS-13); ``completion_stale``: the
    section exists but its watcher stopped publishing (PROGRESS-10): the process is not running."""

    step: int
    op: int
    fingerprint: int = 0  # 0: no collective in flight
    stage: Stage = Stage.COMPUTE
    completions: tuple[Completion, ...] = attrs.field(default=(), converter=_completions)
    # Not part of equality: a re-estimate of the same enqueue time is not progress (PROGRESS-9).
    pending_since_s: tuple[float, ...] = attrs.field(default=(), eq=False)
    contract: HostContract = HostContract.BLOCKING
    completion_stale: bool = False

    def __attrs_post_init__(self) -> None:
        if self.completions or self.pending_since_s != ():
            object.__setattr__(self, "pending_since_s",
                               _per_completion(self.pending_since_s, len(self.completions), "pending_since_s"))

    @property
    def coordinate(self) -> Coordinate:
        return (self.step, self.op)

    @property
    def completion(self) -> Completion | None:
        """The first tracked group's coordinate (the default group's, where it is tracked)."""
        return self.completions[0] if self.completions else None


@attrs.frozen
class Evidence:
    """One peer's answer to a round: its trainer's position and how long it has been idle, its
    completion coordinates (one per tracked group) with the age of each one's oldest pending
    collective, its host contract and whether its completion section went stale (see
    :class:`Progress`)."""

    step: int
    op: int
    fingerprint: int
    stage: Stage
    idle_s: float
    completions: tuple[Completion, ...] = attrs.field(default=(), converter=_completions)
    pending_age_s: tuple[float, ...] = ()
    contract: HostContract = HostContract.BLOCKING
    completion_stale: bool = False

    def __attrs_post_init__(self) -> None:
        if self.completions or self.pending_age_s != ():
            object.__setattr__(self, "pending_age_s",
                               _per_completion(self.pending_age_s, len(self.completions), "pending_age_s"))

    @property
    def coordinate(self) -> Coordinate:
        return (self.step, self.op)

    @property
    def completion(self) -> Completion | None:
        """The first tracked group's coordinate (the default group's, where it is tracked)."""
        return self.completions[0] if self.completions else None

    def completion_of(self, source: int) -> Completion | None:
        """This rank's coordinate of the group ``source`` names, or None (not a member, or not tracked)."""
        for item in self.completions:
            if item.source == source:
                return item
        return None

    def age_of(self, source: int) -> float:
        for item, age in zip(self.completions, self.pending_age_s, strict=True):
            if item.source == source:
                return age
        return 0.0

    def only(self, source: int | None) -> Evidence:
        """This evidence with only the coordinate of ``source`` (a delegated report carries the
        deciding group's, so that it fits one datagram; OBS-AUTH-2)."""
        kept = [(c, a) for c, a in zip(self.completions, self.pending_age_s, strict=True) if c.source == source]
        return attrs.evolve(self, completions=tuple(c for c, _ in kept), pending_age_s=tuple(a for _, a in kept))


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


class FindingCode(enum.IntEnum):
    """Why a finding names nobody although a rule would have (COMPLETION-9, COMPLETION-10); the
    report's reason code comes from it (scout.reports.kinds.observer_reason)."""

    NONE = 0
    HOST_PROGRESS_ONLY = 1  # COMPLETION-9: only host coordinates, which are no evidence here
    WAITING_ELSEWHERE = 2  # COMPLETION-10: the candidate waits in another group's collective


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
    # 0 when the host coordinates did; and the group it belongs to (its source key; COMPLETION-12).
    blocking: int = 0
    source: int = 0
    # Why the finding names nobody where a rule would have (COMPLETION-9, COMPLETION-10); NONE:
    # the finding's usual reason.
    code: FindingCode = FindingCode.NONE


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
    source: int = 0  # as Assessment.source
    code: FindingCode = FindingCode.NONE  # as Assessment.code


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


#: The observer's timing defaults: one home for every way of starting observers -- ``scout.attach``
#: (``scout.job.config.Config`` takes these), ``start_observer`` and ``start_mpi_observer``
#: (``ObserverConfig``) -- so a hang is reported after the same idle time whichever is used.
#: 10 s: a step of a large job takes seconds, a healthy rank's publishes (layers, DDP buckets,
#: collectives) come far more often than that, and start-up, checkpoint I/O and data loading
#: have thresholds of their own (docs/attach.md).
STALL_THRESHOLD_S_DEFAULT: Final = 10.0
DATA_STALL_THRESHOLD_S_DEFAULT: Final = 60.0
#: Checkpoint reads and writes, and a job's start-up (published as a checkpoint read).
CHECKPOINT_STALL_THRESHOLD_S_DEFAULT: Final = 300.0
ROUND_DEADLINE_S_DEFAULT: Final = 1.0
RECHECK_INTERVAL_S_DEFAULT: Final = 5.0


@attrs.frozen
class ObserverConfig:
    """Thresholds and bounds of one observer. Validated at construction; every error names the
    value and the rule. The timing defaults are ``*_DEFAULT`` above (one home)."""

    position: int = attrs.field(validator=_count("position", 0))
    group_size: int = attrs.field(validator=_count("group_size", 2))
    stall_threshold_s: float = attrs.field(default=STALL_THRESHOLD_S_DEFAULT,
                                           validator=_positive_finite("stall_threshold_s"))
    data_stall_threshold_s: float = attrs.field(default=DATA_STALL_THRESHOLD_S_DEFAULT,
                                                validator=_positive_finite("data_stall_threshold_s"))
    checkpoint_stall_threshold_s: float = attrs.field(
        default=CHECKPOINT_STALL_THRESHOLD_S_DEFAULT, validator=_positive_finite("checkpoint_stall_threshold_s")
    )
    round_deadline_s: float = attrs.field(default=ROUND_DEADLINE_S_DEFAULT,
                                          validator=_positive_finite("round_deadline_s"))
    recheck_interval_s: float = attrs.field(default=RECHECK_INTERVAL_S_DEFAULT,
                                            validator=_positive_finite("recheck_interval_s"))
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
        ages = tuple(max(0.0, now_s - since) if c.pending else 0.0 for c, since in zip(p.completions, p.pending_since_s, strict=True))
        return Evidence(p.step, p.op, p.fingerprint, p.stage, max(0.0, now_s - self.last_progress_s), p.completions,
                        ages, p.contract, p.completion_stale)


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
