"""The simulated cluster: N ranks running programs under a virtual clock, with faults.

Each rank hosts one or more named programs (generators, see ``scout.transport.program``). The
cluster executes every op they yield with exactly the guarantees of the transport contract
(``scout.transport.base``):

* ``Exchange`` sends the payload to every group member as one message each; it returns as soon
  as every member's answer for this ``round_id`` arrived, or at ``start + timeout_s`` with the
  silent members in ``missing``. Answers for an earlier round are dropped and counted in
  ``stats.late_or_wrong_round_dropped``; answers for a later round wait (a bounded number of
  rounds) until the receiver gets there, as MPI's matching would. Round ids must increase on a
  group.
* ``AllGather``, ``Broadcast``, ``Barrier`` are matched by call order per group (the k-th call
  of each member, as in MPI). They complete, all or nothing, ``LatencyModel.collective_latency_s``
  after the last member arrives; a member whose deadline passes first gets ``DeadlineExceeded``
  naming the members that did not arrive (or crashed, or sit across a partition, or called a
  different collective). A contribution once made stays made, as a collective in flight cannot
  be cancelled: a late member still completes the operation for itself.
* Payloads are encoded with the codec and limited on the encoded size; timeouts are validated
  with ``check_timeout_s``; a rank outside the group or the world is a ``GroupError``. All
  these errors are thrown into the program before anything is sent, as on a real binding.
* ``Sleep`` lets virtual time pass, ``Now`` reads it; ``Send``/``Receive`` (``sim.ops``) carry
  one-way messages for message-driven drivers.

Everything is driven by one :class:`~scout.transport.sim.scheduler.Scheduler`; a run is a pure
function of the seed, the programs and the faults, and leaves an event trace.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

import attrs

from scout.transport.base import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DeadlineExceeded,
    ExchangeResult,
    Group,
    GroupError,
    PayloadTooLarge,
    TransportError,
    TransportStats,
    check_timeout_s,
)
from scout.transport.codec import DecodeError, decode, encode
from scout.transport.program import AllGather, Barrier, Broadcast, Exchange, Now, Sleep
from scout.transport.sim.errors import ProgramFailed, SimulationLimitExceeded, reproduce_line
from scout.transport.sim.faults import (
    Corrupt,
    Crash,
    Delay,
    Drop,
    Fault,
    Freeze,
    Partition,
    describe_ranks,
)
from scout.transport.sim.latency import LatencyModel
from scout.transport.sim.ops import Delivered, Receive, Send
from scout.transport.sim.process import (
    NO_OP,
    WAIT_COLLECTIVE,
    WAIT_EXCHANGE,
    WAIT_NONE,
    WAIT_RECEIVE,
    WAIT_SLEEP,
    Process,
    ProgramState,
    SimContext,
)
from scout.transport.sim.scheduler import (
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_VIRTUAL_TIME_S,
    STALE,
    Scheduler,
)
from scout.transport.sim.trace import DEFAULT_MAX_TRACE_RECORDS, Trace

__all__ = ["ProgramOutcome", "SimCluster", "SimulationResult", "simulate"]

ProgramFactory = Callable[[SimContext], Generator[Any, Any, Any]]

# Bounds (TIGER_STYLE: a limit on every queue and loop). Each is a default of SimCluster.
DEFAULT_MAX_OPS_WITHOUT_WAIT = 1_000_000  # ops one program may run before virtual time passes
DEFAULT_MAX_ROUNDS_BUFFERED = 64  # future exchange rounds a program holds answers for, per group
DEFAULT_MAILBOX_LIMIT = 100_000  # queued Send messages per program
_GROUP_CACHE_LIMIT = 65_536
MAX_GROUPS = 1_000_000  # distinct groups (channels) one run may use

# Event kinds: indexes into the handler table given to the scheduler.
_EV_START = 0
_EV_WAKE = 1
_EV_EXCHANGE_MESSAGE = 2
_EV_DEADLINE = 3
_EV_COLLECTIVE_DONE = 4
_EV_MAIL = 5
_EV_FAULT_BEGIN = 6
_EV_FAULT_END = 7
_EV_CALL = 8

_BLOCKED: Any = object()  # an op handler's "the program waits; it is woken later"
_UNDECODED: Any = object()  # "each receiver decodes its own copy" (the value is mutable)
_IMMUTABLE_LEAVES = (int, float, str, bytes, bool, type(None))
_DONE = ProgramState.DONE
_CRASHED = ProgramState.CRASHED


def _immutable(value: Any) -> bool:
    """True if a decoded value can be shared by every receiver without aliasing surprises."""
    kind = type(value)
    if kind in _IMMUTABLE_LEAVES:
        return True
    if kind is tuple:
        return all(_immutable(item) for item in value)
    return False


class _GroupInfo:
    """A validated group, interned: ``gid`` is a small int carried by every message."""

    __slots__ = ("gid", "group", "label", "members", "positions", "ranks", "size")

    def __init__(self, gid: int, group: Group) -> None:
        self.gid = gid
        self.group = group
        self.ranks = group.ranks
        self.size = len(group.ranks)
        self.positions = {rank: position for position, rank in enumerate(group.ranks)}
        self.members = frozenset(group.ranks)
        self.label = group.name


class _Collective:
    """One matched collective call: the k-th all_gather/broadcast/barrier on a group."""

    __slots__ = (
        "arrived",
        "broken",
        "done_at_s",
        "info",
        "key",
        "kind",
        "program",
        "root",
        "signatures",
        "values",
    )

    def __init__(self, key: tuple[str, int, int], program: str, info: _GroupInfo) -> None:
        self.key = key
        self.program = program
        self.info = info
        self.kind = ""  # of the first arrival; a member calling something else is a mismatch
        self.root = -1
        self.arrived = 0
        self.values: list[Any] = [None] * info.size  # (data, value) by position
        self.signatures: list[tuple[str, int] | None] = [None] * info.size
        self.done_at_s: float | None = None
        self.broken = ""  # why it can never complete, once it cannot


@attrs.frozen
class ProgramOutcome:
    rank: int
    program: str
    state: ProgramState
    value: Any  # the program's return value when state is DONE
    ops: int
    stats: TransportStats


@attrs.frozen(eq=False)
class SimulationResult:
    """What a run produced. ``outcomes`` is keyed by ``(rank, program)``."""

    seed: int
    ranks: int
    events: int
    virtual_time_s: float  # when the last event that did something happened
    wall_s: float
    messages_sent: int
    messages_delivered: int
    messages_dropped: int
    outcomes: dict[tuple[int, str], ProgramOutcome]
    trace: Trace
    reproduce: str

    def value(self, rank: int, program: str = "main") -> Any:
        outcome = self.outcomes.get((rank, program))
        if outcome is None:
            raise KeyError(f"no program {program!r} ran on rank {rank}")
        if outcome.state is not ProgramState.DONE:
            raise AssertionError(
                f"rank {rank} program {program!r} did not finish: it is {outcome.state.value}; "
                f"{self.reproduce}"
            )
        return outcome.value

    def values(self, program: str = "main") -> list[Any]:
        """Every rank's return value of ``program``, by rank; fails if one did not finish."""
        return [self.value(rank, program) for rank in range(self.ranks)]

    def unfinished(self, program: str | None = None) -> list[ProgramOutcome]:
        return [
            outcome
            for outcome in self.outcomes.values()
            if outcome.state is not ProgramState.DONE
            and (program is None or outcome.program == program)
        ]


class SimCluster:
    """A deterministic simulated cluster of ``ranks`` ranks.

    Usage::

        cluster = SimCluster(8, seed=7)
        cluster.spawn(my_program)                     # on every rank, named "main"
        cluster.inject(Freeze(rank=3, start_s=1.0, duration_s=2.0))
        result = cluster.run()
        result.values()                               # each rank's return value
    """

    def __init__(
        self,
        ranks: int,
        *,
        seed: int,
        latency: LatencyModel | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_virtual_time_s: float = DEFAULT_MAX_VIRTUAL_TIME_S,
        max_trace_records: int = DEFAULT_MAX_TRACE_RECORDS,
        max_ops_without_wait: int = DEFAULT_MAX_OPS_WITHOUT_WAIT,
        max_rounds_buffered: int = DEFAULT_MAX_ROUNDS_BUFFERED,
        mailbox_limit: int = DEFAULT_MAILBOX_LIMIT,
        trace_messages: bool = False,
        pause_gc: bool = True,
        scenario: str | None = None,
    ) -> None:
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
        if max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be >= 1, got {max_payload_bytes}")
        for name, bound in (
            ("max_ops_without_wait", max_ops_without_wait),
            ("max_rounds_buffered", max_rounds_buffered),
            ("mailbox_limit", mailbox_limit),
        ):
            if bound < 1:
                raise ValueError(f"{name} must be >= 1, got {bound}")
        self.size = ranks
        self.seed = seed
        self.latency = latency if latency is not None else LatencyModel()
        self.max_payload_bytes = max_payload_bytes
        self.max_ops_without_wait = max_ops_without_wait
        self.max_rounds_buffered = max_rounds_buffered
        self.mailbox_limit = mailbox_limit
        self.trace_messages = trace_messages
        self.pause_gc = pause_gc
        self.scheduler = Scheduler(
            seed, max_events=max_events, max_virtual_time_s=max_virtual_time_s
        )
        self.reproduce = reproduce_line(seed, scenario, ranks)
        self.scheduler.reproduce = self.reproduce
        self.trace = Trace(max_trace_records)
        self.world = Group(tuple(range(ranks)), "world")

        self._clock = self.scheduler.clock
        self._at = self.scheduler.at
        self._rng = self.scheduler.rng
        self._random = self._rng.random
        self._base_latency_s = self.latency.base_latency_s
        self._jitter_s = self.latency.jitter_s

        self._shared: list[dict[str, Any]] = [{} for _ in range(ranks)]
        self._processes: list[Process] = []  # in spawn order: outcomes are listed in it
        self._by_name: dict[str, list[Process | None]] = {}
        self._by_rank: list[list[Process]] = [[] for _ in range(ranks)]
        self._absent: dict[str, int] = {}  # program name -> ranks it does not run on
        self._running = False  # run() was called: spawn() then schedules starts at once
        self._unstarted: list[tuple[float, Process]] = []

        self._groups: dict[Group, _GroupInfo] = {}
        self._group_cache: dict[int, tuple[Group, _GroupInfo]] = {}
        self._world_info = self._intern(self.world, "world")
        self._collectives: dict[tuple[str, int, int], _Collective] = {}
        self._stalled: list[_Collective] = []

        self._faults: list[Fault] = []  # by injection index
        self._frozen_by: dict[int, list[Process]] = {}
        self._link_faults: list[tuple[int, Delay | Drop | Partition]] = []
        self._corrupting: dict[int, list[Corrupt]] = {}  # rank -> active Corrupt faults
        self._op_faults: dict[tuple[int, str], dict[int, list[tuple[int, Any]]]] = {}

        self.messages_sent = 0
        self.messages_delivered = 0
        self.messages_dropped = 0  # by a fault, or a full mailbox
        self.messages_discarded = 0  # to a program that is not there, ended, or crashed
        self.wall_s = 0.0

        self._handlers: list[Callable[[Any, Any], object]] = [
            self._on_start,
            self._on_wake,
            self._on_exchange_message,
            self._on_deadline,
            self._on_collective_done,
            self._on_mail,
            self._on_fault_begin,
            self._on_fault_end,
            self._on_call,
        ]
        self._op_handlers: dict[type, Callable[[Process, Any], Any]] = {
            Exchange: self._op_exchange,
            AllGather: self._op_all_gather,
            Broadcast: self._op_broadcast,
            Barrier: self._op_barrier,
            Sleep: self._op_sleep,
            Now: self._op_now,
            Send: self._op_send,
            Receive: self._op_receive,
        }

    # ---------------------------------------------------------------- public API

    @property
    def now_s(self) -> float:
        return self._clock.now_s

    @property
    def random(self) -> Any:
        """The run's single seeded ``random.Random``: draw scenario choices from it."""
        return self._rng

    @property
    def events(self) -> int:
        return self.scheduler.events

    def shared(self, rank: int) -> dict[str, Any]:
        """Rank ``rank``'s shared memory (the dict its programs see as ``ctx.shared``)."""
        return self._shared[self._check_rank(rank, "shared")]

    def stats(self, rank: int, program: str = "main") -> TransportStats:
        return self._process(rank, program).stats

    def state(self, rank: int, program: str = "main") -> ProgramState:
        return self._process(rank, program).state

    def spawn(
        self,
        program: ProgramFactory,
        *,
        ranks: Iterable[int] | None = None,
        name: str = "main",
        start_s: float = 0.0,
    ) -> None:
        """Start ``program(ctx)`` as program ``name`` on ``ranks`` (default: every rank)."""
        if not callable(program):
            raise TypeError(f"program must be a generator function, got {program!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a program needs a non-empty name, got {name!r}")
        if not (math.isfinite(start_s) and start_s >= self.now_s):
            raise ValueError(f"start_s must be finite and >= now ({self.now_s}), got {start_s!r}")
        targets = list(range(self.size)) if ranks is None else list(ranks)
        if len(set(targets)) != len(targets):
            raise ValueError(f"spawn: ranks lists a rank twice: {targets}")
        if name not in self._by_name:
            self._by_name[name] = [None] * self.size
            self._absent[name] = self.size
        column = self._by_name[name]
        for rank in targets:
            self._check_rank(rank, "spawn")
            if column[rank] is not None:
                raise ValueError(f"rank {rank} already runs a program named {name!r}")
        spawned = []
        for rank in targets:
            ctx = SimContext(
                rank=rank,
                size=self.size,
                world=self.world,
                max_payload_bytes=self.max_payload_bytes,
                program=name,
                shared=self._shared[rank],
                random=self._rng,
            )
            gen = program(ctx)
            if not isinstance(gen, Generator):
                raise TypeError(
                    f"program {name!r} returned {type(gen).__name__}, not a generator: "
                    "a rank program must yield ops"
                )
            spawned.append(Process(rank, name, ctx, gen))
        # Registered only once every program(ctx) returned a generator: a failed spawn leaves
        # the cluster as it was.
        for process in spawned:
            rank = process.rank
            process.op_faults = self._op_faults.get((rank, name))
            column[rank] = process
            self._absent[name] -= 1
            self._by_rank[rank].append(process)
            self._processes.append(process)
            if self._running:
                self._at(start_s, _EV_START, process)
            else:
                self._unstarted.append((start_s, process))

    def inject(self, *faults: Fault) -> None:
        """Schedule faults; each is recorded in the trace when it begins and ends."""
        for fault in faults:
            self._schedule_fault(fault)

    def call_at(self, time_s: float, action: Callable[[], None]) -> None:
        """Run ``action()`` at virtual ``time_s`` (scenario hooks: flip a flag, take a sample)."""
        if not callable(action):
            raise TypeError(f"action must be callable, got {action!r}")
        if not (math.isfinite(time_s) and time_s >= self.now_s):
            raise ValueError(f"time_s must be finite and >= now ({self.now_s}), got {time_s!r}")
        self._at(time_s, _EV_CALL, action)

    def run(self, *, until_s: float | None = None) -> SimulationResult:
        """Run until nothing is left to do (or virtual ``until_s``). Can be called again."""
        if not self._running:
            # Programs start only now, after every fault injected before the run: a fault at
            # time t then acts before any program event at time t (ties go by scheduling order).
            self._running = True
            for start_s, process in self._unstarted:
                self._at(start_s, _EV_START, process)
            self._unstarted.clear()
        # The cyclic garbage collector pauses while the simulation runs: a large run holds
        # millions of long-lived objects that each collection would traverse (half the run time
        # at 4096 ranks), and the run itself makes little cyclic garbage. It is collected when
        # the collector resumes.
        collecting = gc.isenabled() and self.pause_gc
        if collecting:
            gc.disable()
        started = time.perf_counter()
        try:
            self.scheduler.run(self._handlers, until_s)
        finally:
            self.wall_s += time.perf_counter() - started
            if collecting:
                gc.enable()
        return self.result()

    def result(self) -> SimulationResult:
        outcomes = {
            (process.rank, process.name): ProgramOutcome(
                rank=process.rank,
                program=process.name,
                state=process.state,
                value=process.result,
                ops=process.ops,
                stats=attrs.evolve(process.stats),
            )
            for process in self._processes
        }
        return SimulationResult(
            seed=self.seed,
            ranks=self.size,
            events=self.scheduler.events,
            virtual_time_s=self.scheduler.active_s,
            wall_s=self.wall_s,
            messages_sent=self.messages_sent,
            messages_delivered=self.messages_delivered,
            messages_dropped=self.messages_dropped,
            outcomes=outcomes,
            trace=self.trace,
            reproduce=self.reproduce,
        )

    # ---------------------------------------------------------------- helpers

    def _check_rank(self, rank: int, what: str) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ValueError(f"{what}: rank {rank!r} is not in the world of {self.size} ranks")
        return rank

    def _process(self, rank: int, program: str) -> Process:
        column = self._by_name.get(program)
        process = column[self._check_rank(rank, "program")] if column else None
        if process is None:
            raise KeyError(f"no program {program!r} runs on rank {rank}")
        return process

    def _intern(self, group: Any, op_name: str) -> _GroupInfo:
        if not isinstance(group, Group):
            raise GroupError(
                f"{op_name}: group must be a scout.transport.base.Group, got {group!r}"
            )
        info = self._groups.get(group)
        if info is None:
            if len(self._groups) >= MAX_GROUPS:
                raise SimulationLimitExceeded(
                    f"{op_name}: programs used more than MAX_GROUPS={MAX_GROUPS} distinct "
                    "groups; build each group once and reuse it",
                    self.reproduce,
                )
            outside = [rank for rank in group.ranks if rank >= self.size]
            if outside:
                raise GroupError(
                    f"{op_name}: group {group.name!r} names ranks {describe_ranks(outside)} "
                    f"outside the world of {self.size} ranks (0..{self.size - 1})"
                )
            info = _GroupInfo(len(self._groups), group)
            self._groups[group] = info
        if len(self._group_cache) >= _GROUP_CACHE_LIMIT:
            self._group_cache.clear()
        # Keyed by id() for speed: programs pass the same Group object round after round. The
        # entry holds the object, so its id cannot be reused while the entry exists.
        self._group_cache[id(group)] = (group, info)
        return info

    def _member_group(self, process: Process, group: Group | None, op_name: str) -> _GroupInfo:
        if group is None:
            info = self._world_info
        else:
            cached = self._group_cache.get(id(group))
            info = (
                cached[1]
                if cached is not None and cached[0] is group
                else self._intern(group, op_name)
            )
        if process.rank not in info.positions:
            raise GroupError(
                f"{op_name}: rank {process.rank} is not a member of group {info.label!r} "
                f"{describe_ranks(info.ranks)}"
            )
        return info

    def _outgoing(
        self, process: Process, payload: Any, op_name: str
    ) -> tuple[bytes, Any, bytes, Any]:
        """Encode a payload for sending: ``(data, value, wire_data, wire_value)``.

        ``value`` is the decoded payload when receivers may share it, else ``_UNDECODED``.
        ``wire_*`` is what peers get (different from ``data`` under a wire-layer Corrupt).
        """
        corrupting = self._corrupting.get(process.rank) if self._corrupting else None
        if corrupting:
            for fault in corrupting:
                if fault.layer == "value" and (
                    fault.programs is None or process.name in fault.programs
                ):
                    before = payload
                    payload = fault.rewrite(payload)
                    self.trace.add(
                        self.now_s,
                        process.rank,
                        process.name,
                        "corrupt",
                        (op_name, "value", repr(before), repr(payload)),
                    )
        data = encode(payload)
        if len(data) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"{op_name}: payload encodes to {len(data)} bytes, more than "
                f"max_payload_bytes={self.max_payload_bytes}; send a digest or split it"
            )
        if _immutable(payload):
            value = payload  # decode(encode(x)) == x for these exact types: skip the round trip
        else:
            value = decode(data)
            if not _immutable(value):
                value = _UNDECODED
        wire_data, wire_value = data, value
        if corrupting:
            for fault in corrupting:
                if fault.layer == "wire" and (
                    fault.programs is None or process.name in fault.programs
                ):
                    wire_data = bytes(fault.rewrite(wire_data))
                    wire_value = _UNDECODED
                    self.trace.add(
                        self.now_s,
                        process.rank,
                        process.name,
                        "corrupt",
                        (op_name, "wire", data.hex(), wire_data.hex()),
                    )
        return data, value, wire_data, wire_value

    def _value_of(self, process: Process, data: bytes, value: Any) -> Any:
        """The receiver's copy of a payload, or ``_UNDECODED`` if it does not decode."""
        if value is not _UNDECODED:
            return value
        try:
            return decode(data)
        except DecodeError:
            process.stats.undecodable_dropped += 1
            return _UNDECODED

    def _delivery_time_s(self, src: int, dst: int, send_s: float) -> float | None:
        """Arrival time of a message sent now from ``src`` to ``dst``; None if a fault drops it."""
        arrive_s = send_s + self._base_latency_s + self._random() * self._jitter_s
        if not self._link_faults:
            return arrive_s
        for _, fault in self._link_faults:
            if isinstance(fault, Delay):
                touches_from = src in fault.ranks and fault.direction != "to"
                touches_to = dst in fault.ranks and fault.direction != "from"
                if touches_from or touches_to:
                    arrive_s += fault.extra_latency_s
            elif isinstance(fault, Partition):
                if (src in fault.side_a and dst in fault.side_b) or (
                    src in fault.side_b and dst in fault.side_a
                ):
                    return None
            elif (
                src in fault.src_ranks
                and dst in fault.dst_ranks
                and (fault.probability >= 1.0 or self._random() < fault.probability)
            ):
                return None
        return arrive_s

    def _send(self, kind: int, src: int, target: Process | None, dst: int, message: Any) -> None:
        self.messages_sent += 1
        if target is None:
            self.messages_discarded += 1
            return
        arrive_s = self._delivery_time_s(src, dst, self._clock.now_s)
        if arrive_s is None:
            self.messages_dropped += 1
            if self.trace_messages:
                self.trace.add(self.now_s, src, target.name, "dropped", (dst,))
            return
        self._at(arrive_s, kind, target, message)

    def _cut(self, members: frozenset[int]) -> bool:
        """True if an active link fault cuts a set of ranks in two (their collective stalls).

        Drops with a probability below 1 do not count: a collective's transport retransmits.
        """
        for _, fault in self._link_faults:
            if isinstance(fault, Partition):
                if members & fault.side_a and members & fault.side_b:
                    return True
            elif isinstance(fault, Drop) and fault.probability >= 1.0:
                sources = members & fault.src_ranks
                targets = members & fault.dst_ranks
                if sources and targets and len(sources | targets) > 1:
                    return True
        return False

    # ---------------------------------------------------------------- running programs

    def _run_process(
        self, process: Process, value: Any, error: BaseException | None, op: Any = NO_OP
    ) -> None:
        """Advance a program until it blocks on an op, ends, or is stopped by a fault."""
        gen = process.gen
        handlers = self._op_handlers
        budget = self.max_ops_without_wait
        while True:
            if op is NO_OP:
                try:
                    op = gen.send(value) if error is None else gen.throw(error)
                except StopIteration as stop:
                    self._finish(process, stop.value)
                    return
                except Exception as exc:
                    raise ProgramFailed(
                        f"rank {process.rank} program {process.name!r} raised "
                        f"{type(exc).__name__}: {exc} at virtual time {self.now_s:.6f} s",
                        self.reproduce,
                        process.rank,
                        process.name,
                    ) from exc
                process.ops += 1
                if (
                    process.op_faults is not None
                    and process.ops in process.op_faults
                    and self._op_fault_hits(process, op)
                ):
                    return
            handler = handlers.get(op.__class__)
            error = None
            if handler is None:
                value = None
                error = TypeError(
                    f"rank {process.rank} program {process.name!r} yielded {op!r}, which is "
                    "not an op the simulator knows"
                )
            else:
                try:
                    value = handler(process, op)
                except (TransportError, ValueError, TypeError) as exc:
                    # Misuse (bad group, timeout, payload): the op did nothing; the program
                    # gets the exception, exactly as run_blocking delivers it.
                    value, error = None, exc
                else:
                    if value is _BLOCKED:
                        return
            op = NO_OP
            budget -= 1
            if budget <= 0:
                raise SimulationLimitExceeded(
                    f"rank {process.rank} program {process.name!r} ran "
                    f"max_ops_without_wait={self.max_ops_without_wait} ops without waiting at "
                    f"virtual time {self.now_s:.6f} s: a loop that never sleeps or waits?",
                    self.reproduce,
                )

    def _finish(self, process: Process, value: Any) -> None:
        process.state = ProgramState.DONE
        process.result = value
        process.wait = WAIT_NONE
        process.token += 1
        process.mailbox.clear()
        process.boxes.clear()
        self.trace.add(self.now_s, process.rank, process.name, "exit", process.ops)

    def _block(self, process: Process, wait: int, timeout_s: float, op_name: str) -> None:
        process.wait = wait
        process.w_op = op_name
        process.w_timeout_s = timeout_s
        process.w_deadline_s = deadline_s = self._clock.now_s + timeout_s
        self._at(deadline_s, _EV_DEADLINE, process, process.token)

    def _wake(self, process: Process, value: Any, error: BaseException | None) -> None:
        """End the current wait with ``value`` (or ``error``); held while the program is frozen."""
        process.token += 1
        process.wait = WAIT_NONE
        process.deadline_due = False
        process.w_answers = {}
        process.w_collective = None
        if process.frozen:
            process.pending = (value, error)
            return
        self._run_process(process, value, error)

    # ---------------------------------------------------------------- event handlers

    def _on_start(self, process: Process, _: Any) -> None:
        if process.state is not ProgramState.READY:
            return  # crashed before it started
        process.state = ProgramState.RUNNING
        self.trace.add(self.now_s, process.rank, process.name, "start", ())
        if process.frozen:
            process.pending = (None, None)
            return
        self._run_process(process, None, None)

    def _on_wake(self, process: Process, token: int) -> object:
        if token != process.token:
            return STALE
        self._wake(process, None, None)
        return None

    def _on_deadline(self, process: Process, token: int) -> object:
        if token != process.token:
            return STALE  # the wait it was set for already ended
        if process.frozen:
            process.deadline_due = True  # seen when the program runs again
            return None
        self._expire(process)
        return None

    def _expire(self, process: Process) -> None:
        wait = process.wait
        if wait == WAIT_EXCHANGE:
            self._finish_exchange(process)
        elif wait == WAIT_COLLECTIVE:
            collective = process.w_collective
            if (
                collective.done_at_s is not None
                and collective.done_at_s <= self.now_s
                and not collective.broken
            ):
                return  # completes at this very instant; its completion event wakes us
            missing = self._collective_missing(process, collective)
            process.stats.deadlines_exceeded += 1
            self.trace.add(
                self.now_s,
                process.rank,
                process.name,
                "deadline",
                (collective.kind, tuple(missing)),
            )
            self._wake(process, None, DeadlineExceeded(process.w_op, process.w_timeout_s, missing))
        elif wait == WAIT_RECEIVE:
            self._wake(process, None, None)
        elif wait == WAIT_SLEEP:
            raise AssertionError(f"{process!r}: a sleep has no deadline event")

    def _on_call(self, action: Callable[[], None], _: Any) -> None:
        action()

    # ---------------------------------------------------------------- ops: time

    def _op_now(self, process: Process, op: Now) -> float:
        return self._clock.now_s

    def _op_sleep(self, process: Process, op: Sleep) -> Any:
        duration_s = op.duration_s
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)):
            raise TypeError(f"Sleep.duration_s must be seconds, got {duration_s!r}")
        if not (duration_s >= 0 and math.isfinite(duration_s)):
            raise ValueError(f"Sleep.duration_s must be finite and >= 0, got {duration_s!r}")
        process.wait = WAIT_SLEEP
        self._at(self._clock.now_s + duration_s, _EV_WAKE, process, process.token)
        return _BLOCKED

    # ---------------------------------------------------------------- ops: exchange

    def _op_exchange(self, process: Process, op: Exchange) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "exchange")
        round_id = op.round_id
        if isinstance(round_id, bool) or not isinstance(round_id, int):
            raise TypeError(f"exchange: round_id must be an int, got {round_id!r}")
        info = self._member_group(process, op.group, "exchange")
        data, value, wire_data, wire_value = self._outgoing(process, op.payload, "exchange")
        rank = process.rank
        gid = info.gid
        process.stats.exchanges += 1
        self.trace.add(self.now_s, rank, process.name, "exchange", (round_id, info.label))

        if info.size > 1:
            message = (rank, gid, round_id, wire_data, wire_value)
            targets = self._by_name[process.name]
            if self._link_faults or self._absent[process.name]:
                send = self._send
                for dst in info.ranks:
                    if dst != rank:
                        send(_EV_EXCHANGE_MESSAGE, rank, targets[dst], dst, message)
            else:
                # Fast path (no link fault active, the program runs on every rank): the same
                # arithmetic as _delivery_time_s, in one batch.
                sent_s = self._clock.now_s + self._base_latency_s
                jitter_s = self._jitter_s
                draw = self._random
                deliveries = [
                    (sent_s + draw() * jitter_s, targets[dst]) for dst in info.ranks if dst != rank
                ]
                self.messages_sent += len(deliveries)
                self.scheduler.fan_out(_EV_EXCHANGE_MESSAGE, deliveries, message)

        answers: dict[int, tuple[bytes, Any]] = {rank: (data, value)}
        box = process.boxes.get(gid)
        if box:
            for buffered_round in sorted(box):
                if buffered_round < round_id:
                    process.stats.late_or_wrong_round_dropped += len(box.pop(buffered_round))
                elif buffered_round == round_id:
                    answers.update(box.pop(buffered_round))
        process.w_info = info
        process.w_group = op.group if op.group is not None else self.world
        process.w_gid = gid
        process.w_round = round_id
        process.w_answers = answers
        process.w_expected = info.size
        if len(answers) == info.size:
            return self._exchange_result(process)
        self._block(process, WAIT_EXCHANGE, timeout_s, "exchange")
        return _BLOCKED

    def _on_exchange_message(
        self, process: Process, message: tuple[int, int, int, bytes, Any]
    ) -> None:
        state = process.state
        if state is _DONE or state is _CRASHED:
            self.messages_discarded += 1
            return
        self.messages_delivered += 1
        src, gid, round_id, data, value = message
        if self.trace_messages:
            self.trace.add(self.now_s, process.rank, process.name, "deliver", (src, round_id))
        if process.w_gid == gid and process.wait == WAIT_EXCHANGE:
            waiting_round = process.w_round
            if round_id == waiting_round:
                answers = process.w_answers
                if src in answers:  # a second answer from one sender: not used (as on MPI)
                    process.stats.late_or_wrong_round_dropped += 1
                    return
                answers[src] = (data, value)
                if len(answers) == process.w_expected:
                    self._finish_exchange(process)
                return
            if round_id < waiting_round:
                process.stats.late_or_wrong_round_dropped += 1
                return
        else:
            last = process.last_round.get(gid)
            if last is not None and round_id <= last:
                process.stats.late_or_wrong_round_dropped += 1
                return
        # An answer for a round this program has not reached yet: hold it (bounded).
        boxes = process.boxes
        box = boxes.get(gid)
        if box is None:
            box = boxes[gid] = {}
        held = box.get(round_id)
        if held is None:
            if len(box) >= self.max_rounds_buffered:
                process.stats.late_or_wrong_round_dropped += 1
                return
            held = box[round_id] = {}
        elif src in held:
            process.stats.late_or_wrong_round_dropped += 1
            return
        held[src] = (data, value)

    def _exchange_result(self, process: Process) -> ExchangeResult:
        info = process.w_info
        answers = process.w_answers
        values: dict[int, Any] = {}
        missing: list[int] = []
        for rank in info.ranks:
            got = answers.get(rank)
            if got is None:
                missing.append(rank)
                continue
            value = self._value_of(process, got[0], got[1])
            if value is _UNDECODED:
                missing.append(rank)
            else:
                values[rank] = value
        round_id = process.w_round
        last = process.last_round.get(info.gid)
        if last is None or round_id > last:
            process.last_round[info.gid] = round_id
        missing.sort()
        if missing:
            process.stats.deadlines_exceeded += 1
        self.trace.add(
            self.now_s, process.rank, process.name, "exchange-done", (round_id, tuple(missing))
        )
        process.w_answers = {}
        return ExchangeResult(
            round_id=round_id, group=process.w_group, answers=values, missing=tuple(missing)
        )

    def _finish_exchange(self, process: Process) -> None:
        self._wake(process, self._exchange_result(process), None)

    # ---------------------------------------------------------------- ops: collectives

    def _op_all_gather(self, process: Process, op: AllGather) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "all_gather")
        info = self._member_group(process, op.group, "all_gather")
        data, value, _, _ = self._outgoing(process, op.payload, "all_gather")
        return self._join(process, "all_gather", info, -1, (data, value), timeout_s)

    def _op_broadcast(self, process: Process, op: Broadcast) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "broadcast")
        info = self._member_group(process, op.group, "broadcast")
        root = op.root
        if isinstance(root, bool) or not isinstance(root, int) or root not in info.positions:
            raise GroupError(
                f"broadcast: root {root!r} is not a member of group {info.label!r} "
                f"{describe_ranks(info.ranks)}"
            )
        contribution = None
        if process.rank == root:
            data, value, _, _ = self._outgoing(process, op.payload, "broadcast")
            contribution = (data, value)
        return self._join(process, "broadcast", info, root, contribution, timeout_s)

    def _op_barrier(self, process: Process, op: Barrier) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "barrier")
        info = self._member_group(process, op.group, "barrier")
        return self._join(process, "barrier", info, -1, None, timeout_s)

    def _join(
        self,
        process: Process,
        kind: str,
        info: _GroupInfo,
        root: int,
        contribution: Any,
        timeout_s: float,
    ) -> Any:
        gid = info.gid
        sequence = process.sequence.get(gid, 0)
        process.sequence[gid] = sequence + 1
        key = (process.name, gid, sequence)
        collective = self._collectives.get(key)
        if collective is None:
            collective = self._collectives[key] = _Collective(key, process.name, info)
            collective.kind = kind
            collective.root = root
        position = info.positions[process.rank]
        collective.signatures[position] = (kind, root)
        collective.values[position] = contribution
        collective.arrived += 1
        self.trace.add(self.now_s, process.rank, process.name, kind, (info.label, sequence))
        process.w_collective = collective
        process.w_info = info
        if kind != collective.kind or root != collective.root:
            collective.broken = (
                f"rank {process.rank} called {kind} where rank "
                f"{info.ranks[collective.signatures.index((collective.kind, collective.root))]} "
                f"called {collective.kind}"
            )
            self.trace.add(
                self.now_s, process.rank, process.name, "mismatch", (kind, collective.kind)
            )
        if collective.arrived == info.size:
            self._try_complete(collective)
        self._block(process, WAIT_COLLECTIVE, timeout_s, kind)
        return _BLOCKED

    def _crashed_members(self, collective: _Collective) -> list[int]:
        column = self._by_name[collective.program]
        crashed = []
        for rank in collective.info.ranks:
            member = column[rank]
            if member is None or member.state is ProgramState.CRASHED:
                crashed.append(rank)
        return crashed

    def _try_complete(self, collective: _Collective) -> None:
        """Every member arrived: schedule completion, unless something prevents it."""
        if collective.done_at_s is not None or collective.broken:
            return
        crashed = self._crashed_members(collective)
        if crashed:
            collective.broken = f"ranks {describe_ranks(crashed)} crashed"
            return
        info = collective.info
        extra_s = 0.0
        if self._link_faults:
            if self._cut(info.members):
                self._stalled.append(collective)  # retried when a link fault ends
                return
            for _, fault in self._link_faults:
                if isinstance(fault, Delay) and fault.ranks & info.members:
                    extra_s = max(extra_s, fault.extra_latency_s)
        latency_s = self.latency.collective_latency_s(self._rng, info.size) + extra_s
        collective.done_at_s = self.now_s + latency_s
        self._at(collective.done_at_s, _EV_COLLECTIVE_DONE, collective)

    def _on_collective_done(self, collective: _Collective, _: Any) -> None:
        info = collective.info
        column = self._by_name[collective.program]
        stalled = False
        if not collective.broken:
            crashed = self._crashed_members(collective)
            if crashed:
                collective.broken = f"ranks {describe_ranks(crashed)} crashed"
            elif self._link_faults and self._cut(info.members):
                # A partition began while the collective was in flight: it waits for the heal.
                collective.done_at_s = None
                self._stalled.append(collective)
                stalled = True
        if collective.broken or stalled:
            # Deadlines that fell at the completion instant were deferred to this event.
            for rank in info.ranks:
                member = column[rank]
                if (
                    member is not None
                    and member.wait == WAIT_COLLECTIVE
                    and member.w_collective is collective
                    and member.w_deadline_s <= self.now_s
                    and not member.frozen
                ):
                    self._expire(member)
            return
        del self._collectives[collective.key]
        kind = collective.kind
        shared: Any = None
        private: list[int] = []  # positions whose value each member decodes for itself
        if kind == "all_gather":
            shared = []
            for position, (data, value) in enumerate(collective.values):
                shared.append(value if value is not _UNDECODED else data)
                if value is _UNDECODED:
                    private.append(position)
        elif kind == "broadcast":
            data, value = collective.values[info.positions[collective.root]]
            shared = value if value is not _UNDECODED else data
            if value is _UNDECODED:
                private.append(0)
        for rank in info.ranks:
            member = column[rank]
            if (
                member is None
                or member.wait != WAIT_COLLECTIVE
                or member.w_collective is not collective
            ):
                continue  # gave up at its deadline (its contribution still counted)
            if kind == "all_gather":
                result: Any = list(shared)
                for position in private:
                    result[position] = decode(shared[position])
            elif kind == "broadcast":
                result = decode(shared) if private else shared
            else:
                result = None
            self.trace.add(self.now_s, rank, member.name, f"{kind}-done", (info.label,))
            self._wake(member, result, None)

    def _collective_missing(self, process: Process, collective: _Collective) -> list[int]:
        """Whom a member blames when its deadline passes: absent, crashed, mismatched or cut off."""
        info = collective.info
        mine = collective.signatures[info.positions[process.rank]]
        column = self._by_name[collective.program]
        missing = []
        for position, rank in enumerate(info.ranks):
            if rank == process.rank:
                continue
            signature = collective.signatures[position]
            member = column[rank]
            if (
                signature is None
                or signature != mine
                or member is None
                or member.state is ProgramState.CRASHED
            ):
                missing.append(rank)
            elif collective.done_at_s is None and self._link_faults:
                arrive_s = self._delivery_time_probe(rank, process.rank)
                if arrive_s is None:
                    missing.append(rank)
        return missing

    def _delivery_time_probe(self, src: int, dst: int) -> float | None:
        """Like _delivery_time_s for certain faults only, without drawing random numbers."""
        for _, fault in self._link_faults:
            if isinstance(fault, Partition):
                if (src in fault.side_a and dst in fault.side_b) or (
                    src in fault.side_b and dst in fault.side_a
                ):
                    return None
            elif (
                isinstance(fault, Drop)
                and fault.probability >= 1.0
                and src in fault.src_ranks
                and dst in fault.dst_ranks
            ):
                return None
        return 0.0

    # ---------------------------------------------------------------- ops: messages

    def _op_send(self, process: Process, op: Send) -> None:
        dst = op.dst
        if isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < self.size:
            raise GroupError(f"send: rank {dst!r} is not in the world of {self.size} ranks")
        tag = op.tag
        if isinstance(tag, bool) or not isinstance(tag, int):
            raise TypeError(f"send: tag must be an int, got {tag!r}")
        program = process.name if op.program is None else op.program
        _, _, wire_data, wire_value = self._outgoing(process, op.payload, "send")
        column = self._by_name.get(program)
        target = column[dst] if column is not None else None
        message = (process.rank, process.name, tag, wire_data, wire_value)
        self._send(_EV_MAIL, process.rank, target, dst, message)
        return None

    def _op_receive(self, process: Process, op: Receive) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "receive")
        tag = op.tag
        mailbox = process.mailbox
        for index, delivered in enumerate(mailbox):
            if tag is None or delivered.tag == tag:
                del mailbox[index]
                return delivered
        process.w_tag = tag
        self._block(process, WAIT_RECEIVE, timeout_s, "receive")
        return _BLOCKED

    def _on_mail(self, process: Process, message: tuple[int, str, int, bytes, Any]) -> None:
        if process.state is ProgramState.DONE or process.state is ProgramState.CRASHED:
            self.messages_discarded += 1
            return
        self.messages_delivered += 1
        src, program, tag, data, value = message
        value = self._value_of(process, data, value)
        if value is _UNDECODED:
            return
        delivered = Delivered(src=src, program=program, tag=tag, payload=value)
        if self.trace_messages:
            self.trace.add(self.now_s, process.rank, process.name, "deliver", (src, tag))
        if process.wait == WAIT_RECEIVE and (process.w_tag is None or process.w_tag == tag):
            self._wake(process, delivered, None)
            return
        if len(process.mailbox) >= self.mailbox_limit:
            self.messages_dropped += 1
            self.trace.add(self.now_s, process.rank, process.name, "mailbox-full", (src, tag))
            return
        process.mailbox.append(delivered)

    # ---------------------------------------------------------------- faults

    def _schedule_fault(self, fault: Fault) -> None:
        if not isinstance(fault, (Delay, Freeze, Crash, Drop, Partition, Corrupt)):
            raise TypeError(f"inject: {fault!r} is not a fault")
        named: Sequence[int]
        if isinstance(fault, (Freeze, Crash, Corrupt)):
            named = [fault.rank]
        elif isinstance(fault, Delay):
            named = sorted(fault.ranks)
        elif isinstance(fault, Drop):
            named = sorted(fault.src_ranks | fault.dst_ranks)
        else:
            named = sorted(fault.side_a | fault.side_b)
        outside = [rank for rank in named if rank >= self.size]
        if outside:
            raise ValueError(
                f"inject: {fault.describe()} names ranks {describe_ranks(outside)} outside the "
                f"world of {self.size} ranks"
            )
        index = len(self._faults)
        self._faults.append(fault)
        if isinstance(fault, (Freeze, Crash)) and fault.at_op is not None:
            assert fault.programs is not None  # checked by the fault itself
            key = (fault.rank, fault.programs[0])
            by_op = self._op_faults.setdefault(key, {})
            by_op.setdefault(fault.at_op, []).append((index, fault))
            column = self._by_name.get(key[1])
            process = column[key[0]] if column is not None else None
            if process is not None:
                process.op_faults = by_op
            return
        start_s = fault.at_s if isinstance(fault, Crash) else fault.start_s
        assert start_s is not None
        start_s = max(start_s, self.now_s)
        self._at(start_s, _EV_FAULT_BEGIN, index, None)
        if not isinstance(fault, Crash) and math.isfinite(fault.duration_s):
            self._at(start_s + fault.duration_s, _EV_FAULT_END, index, None)

    def _fault_rank(self, fault: Fault) -> int:
        return fault.rank if isinstance(fault, (Freeze, Crash, Corrupt)) else -1

    def _targets(self, rank: int, programs: tuple[str, ...] | None) -> list[Process]:
        return [
            process
            for process in self._by_rank[rank]
            if programs is None or process.name in programs
        ]

    def _on_fault_begin(self, index: int, _: Any) -> None:
        fault = self._faults[index]
        self.trace.add(self.now_s, self._fault_rank(fault), "", "fault", fault.describe())
        if isinstance(fault, Freeze):
            self._frozen_by[index] = frozen = []
            for process in self._targets(fault.rank, fault.programs):
                if self._freeze(process):
                    frozen.append(process)
        elif isinstance(fault, Crash):
            for process in self._targets(fault.rank, fault.programs):
                self._crash(process)
        elif isinstance(fault, Corrupt):
            self._corrupting.setdefault(fault.rank, []).append(fault)
        else:
            self._link_faults.append((index, fault))

    def _on_fault_end(self, index: int, _: Any) -> None:
        fault = self._faults[index]
        self.trace.add(self.now_s, self._fault_rank(fault), "", "fault-end", fault.describe())
        if isinstance(fault, Freeze):
            for process in self._frozen_by.pop(index, []):
                self._thaw(process)
        elif isinstance(fault, Corrupt):
            active = self._corrupting[fault.rank]
            active.remove(fault)
            if not active:
                del self._corrupting[fault.rank]
        else:
            self._link_faults = [entry for entry in self._link_faults if entry[0] != index]
            if self._stalled and isinstance(fault, (Drop, Partition)):
                stalled, self._stalled = self._stalled, []
                for collective in stalled:
                    self._try_complete(collective)

    def _op_fault_hits(self, process: Process, op: Any) -> bool:
        """Apply faults triggered by this op; True if the program stopped before running it."""
        assert process.op_faults is not None
        stopped = False
        for index, fault in process.op_faults.pop(process.ops, []):
            self.trace.add(self.now_s, process.rank, process.name, "fault", fault.describe())
            if isinstance(fault, Crash):
                self._crash(process)
                return True
            if self._freeze(process):
                process.held_op = op
                stopped = True
                if math.isfinite(fault.duration_s):
                    self._frozen_by[index] = [process]
                    self._at(self.now_s + fault.duration_s, _EV_FAULT_END, index, None)
        return stopped

    def _freeze(self, process: Process) -> bool:
        if process.state is ProgramState.DONE or process.state is ProgramState.CRASHED:
            return False
        process.frozen += 1
        self.trace.add(self.now_s, process.rank, process.name, "freeze", process.frozen)
        return True

    def _thaw(self, process: Process) -> None:
        if process.frozen == 0:
            return
        process.frozen -= 1
        self.trace.add(self.now_s, process.rank, process.name, "thaw", process.frozen)
        if process.frozen or process.state is not ProgramState.RUNNING:
            return
        if process.held_op is not NO_OP:
            op, process.held_op = process.held_op, NO_OP
            self._run_process(process, None, None, op)
        elif process.pending is not None:
            (value, error), process.pending = process.pending, None
            self._run_process(process, value, error)
        elif process.deadline_due:
            process.deadline_due = False
            self._expire(process)

    def _crash(self, process: Process) -> None:
        if process.state is ProgramState.DONE or process.state is ProgramState.CRASHED:
            return
        process.state = ProgramState.CRASHED
        process.token += 1
        process.wait = WAIT_NONE
        process.pending = None
        process.held_op = NO_OP
        process.mailbox.clear()
        process.boxes.clear()
        self.trace.add(self.now_s, process.rank, process.name, "crash", process.ops)


def simulate(
    program: ProgramFactory,
    ranks: int,
    *,
    seed: int,
    faults: Sequence[Fault] = (),
    name: str = "main",
    **options: Any,
) -> SimulationResult:
    """Run ``program`` on every rank of a fresh cluster with ``faults``; return the result."""
    cluster = SimCluster(ranks, seed=seed, **options)
    cluster.spawn(program, name=name)
    cluster.inject(*faults)
    return cluster.run()
