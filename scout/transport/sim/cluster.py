"""The simulated cluster: N ranks running programs under a virtual clock, with faults.

Each rank hosts one or more named programs (generators, see ``scout.transport.program``). The
cluster executes every op they yield with exactly the guarantees of the transport contract
(``scout.transport.base``). It only wires the simulator's parts together, each a module with
one job (``docs/simulator.md``, "Modules"):

* ``scheduler`` -- virtual time, the event heap, the run bounds, the one seeded generator;
* ``runner`` -- programs: spawn, step through ops, wait, wake, deadlines; ``Sleep``, ``Now``;
* ``network`` -- payload encoding and links: latency, link faults, corruption, message counts;
* ``groups`` -- each group validated once and numbered;
* ``messaging`` -- ``Exchange`` and the simulator's ``Send``/``Receive``;
* ``collectives`` -- ``AllGather``, ``Broadcast``, ``Barrier``: matching, completion, blame;
* ``fault_engine`` -- when faults begin and end and what they do to programs.

Payloads are encoded with the codec and limited on the encoded size; timeouts are validated with
``check_timeout_s``; a rank outside the group or the world is a ``GroupError``. All these errors
are thrown into the program before anything is sent, as on a real binding.

A run is a pure function of the seed, the programs and the faults, and leaves an event trace.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from scout.core.guards import whole_number
from scout.transport.base import DEFAULT_MAX_PAYLOAD_BYTES, Group, TransportStats
from scout.transport.sim.collectives import Collectives
from scout.transport.sim.errors import reproduce_line
from scout.transport.sim.fault_engine import FaultEngine
from scout.transport.sim.faults import Fault
from scout.transport.sim.groups import GroupTable
from scout.transport.sim.latency import LatencyModel
from scout.transport.sim.messaging import Messaging
from scout.transport.sim.network import Network
from scout.transport.sim.process import ProgramState
from scout.transport.sim.runner import ProgramFactory, ProgramRunner
from scout.transport.sim.scheduler import (
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_VIRTUAL_TIME_S,
    Scheduler,
)
from scout.transport.sim.trace import DEFAULT_MAX_TRACE_RECORDS, Trace

__all__ = ["ProgramOutcome", "SimCluster", "SimulationResult", "simulate"]

# Bounds (TIGER_STYLE: a limit on every queue and loop). Each is a default of SimCluster.
DEFAULT_MAX_OPS_WITHOUT_WAIT = 1_000_000  # ops one program may run before virtual time passes
DEFAULT_MAX_ROUNDS_BUFFERED = 64  # future exchange rounds a program holds answers for, per group
DEFAULT_MAILBOX_LIMIT = 100_000  # queued Send messages per program


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
        if not whole_number(ranks) or ranks < 1:
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
        self.pause_gc = pause_gc
        self.scheduler = Scheduler(
            seed, max_events=max_events, max_virtual_time_s=max_virtual_time_s
        )
        self.reproduce = reproduce_line(seed, scenario, ranks)
        self.scheduler.reproduce = self.reproduce
        self.trace = Trace(max_trace_records)
        self.wall_s = 0.0

        # The parts, each given only what it uses. Every part registers the events it handles
        # with the scheduler and the ops it runs with the runner.
        self.groups = GroupTable(ranks, self.reproduce)
        self.world: Group = self.groups.world
        self.network = Network(
            self.scheduler,
            self.trace,
            self.latency,
            max_payload_bytes=max_payload_bytes,
            trace_messages=trace_messages,
        )
        self.runner = ProgramRunner(
            self.scheduler,
            self.trace,
            self.world,
            max_ops_without_wait=max_ops_without_wait,
            max_payload_bytes=max_payload_bytes,
            reproduce=self.reproduce,
        )
        self.messaging = Messaging(
            self.runner,
            self.network,
            self.groups,
            max_rounds_buffered=max_rounds_buffered,
            mailbox_limit=mailbox_limit,
        )
        self.collectives = Collectives(self.runner, self.network, self.groups)
        self.faults = FaultEngine(self.runner, self.network)
        self.faults.on_links_healed = self.collectives.retry_stalled
        self._ev_call = self.scheduler.register(self._on_call)

    # ---------------------------------------------------------------- public API

    @property
    def now_s(self) -> float:
        return self.scheduler.clock.now_s

    @property
    def random(self) -> Any:
        """The run's single seeded ``random.Random``: draw scenario choices from it."""
        return self.scheduler.rng

    @property
    def events(self) -> int:
        return self.scheduler.events

    def shared(self, rank: int) -> dict[str, Any]:
        """Rank ``rank``'s shared memory (the dict its programs see as ``ctx.shared``)."""
        return self.runner.shared[self.runner.check_rank(rank, "shared")]

    def stats(self, rank: int, program: str = "main") -> TransportStats:
        return self.runner.process(rank, program).stats

    def state(self, rank: int, program: str = "main") -> ProgramState:
        return self.runner.process(rank, program).state

    def spawn(
        self,
        program: ProgramFactory,
        *,
        ranks: Iterable[int] | None = None,
        name: str = "main",
        start_s: float = 0.0,
    ) -> None:
        """Start ``program(ctx)`` as program ``name`` on ``ranks`` (default: every rank)."""
        self.faults.attach(self.runner.spawn(program, ranks, name, start_s))

    def inject(self, *faults: Fault) -> None:
        """Schedule faults; each is recorded in the trace when it begins and ends."""
        self.faults.inject(*faults)

    def call_at(self, time_s: float, action: Callable[[], None]) -> None:
        """Run ``action()`` at virtual ``time_s`` (scenario hooks: flip a flag, take a sample)."""
        if not callable(action):
            raise TypeError(f"action must be callable, got {action!r}")
        if not (math.isfinite(time_s) and time_s >= self.now_s):
            raise ValueError(f"time_s must be finite and >= now ({self.now_s}), got {time_s!r}")
        self.scheduler.at(time_s, self._ev_call, action)

    def _on_call(self, action: Callable[[], None], _: Any) -> None:
        action()

    def run(self, *, until_s: float | None = None) -> SimulationResult:
        """Run until nothing is left to do (or virtual ``until_s``). Can be called again."""
        # Programs start only now, after every fault injected before the run: a fault at time t
        # then acts before any program event at time t (ties go by scheduling order).
        self.runner.start()
        # The cyclic garbage collector pauses while the simulation runs: a large run holds
        # millions of long-lived objects that each collection would traverse (half the run time
        # at 4096 ranks), and the run itself makes little cyclic garbage. It is collected when
        # the collector resumes.
        collecting = gc.isenabled() and self.pause_gc
        if collecting:
            gc.disable()
        started = time.perf_counter()
        try:
            self.scheduler.run(until_s)
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
            for process in self.runner.processes
        }
        network = self.network
        return SimulationResult(
            seed=self.seed,
            ranks=self.size,
            events=self.scheduler.events,
            virtual_time_s=self.scheduler.active_s,
            wall_s=self.wall_s,
            messages_sent=network.messages_sent,
            messages_delivered=network.messages_delivered,
            messages_dropped=network.messages_dropped,
            outcomes=outcomes,
            trace=self.trace,
            reproduce=self.reproduce,
        )


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
