"""Running rank programs in virtual time: spawn, step a generator through its ops, wait, wake.

A program runs until it yields an op that waits (the op's handler returns :data:`BLOCKED`), ends,
or is stopped by a fault. A wait ends in exactly one of two ways: its part wakes the program with
a value or an error (:meth:`ProgramRunner.wake`), or the wait's deadline passes and the part that
owns that kind of wait handles it (``expirers``, by ``Process.wait``). ``Process.token`` changes
whenever a wait ends, so a timer scheduled for an earlier wait recognises itself as stale.

The ops of time (``Sleep``, ``Now``) are handled here; messaging and collectives register theirs
in ``op_handlers``; the fault engine sets ``op_fault_hits`` (faults that strike at a program's
k-th op) and holds frozen programs back: a wake-up of a frozen program is kept in
``Process.pending`` until it thaws.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable
from typing import Any

from scout.core.guards import whole_number
from scout.transport.base import Group, TransportError
from scout.transport.program import Now, Sleep
from scout.transport.sim.errors import ProgramFailed, SimulationLimitExceeded
from scout.transport.sim.process import (
    NO_OP,
    WAIT_NONE,
    WAIT_SLEEP,
    Process,
    ProgramState,
    SimContext,
)
from scout.transport.sim.scheduler import STALE, Scheduler
from scout.transport.sim.trace import Trace

__all__ = ["BLOCKED", "OpHandler", "ProgramFactory", "ProgramRunner"]

ProgramFactory = Callable[[SimContext], Generator[Any, Any, Any]]
OpHandler = Callable[[Process, Any], Any]

BLOCKED: Any = object()  # an op handler's "the program waits; it is woken later"


def _no_op_faults(process: Process, op: Any) -> bool:
    raise AssertionError(f"{process!r} has op faults but no fault engine is wired")


class ProgramRunner:
    """Every program of a run, by spawn order, by name and by rank; steps them through ops."""

    __slots__ = (
        "_at",
        "_clock",
        "_ev_deadline",
        "_ev_start",
        "_ev_wake",
        "_running",
        "_unstarted",
        "absent",
        "by_name",
        "by_rank",
        "expirers",
        "max_ops_without_wait",
        "max_payload_bytes",
        "op_fault_hits",
        "op_handlers",
        "processes",
        "reproduce",
        "scheduler",
        "shared",
        "size",
        "trace",
        "world",
    )

    def __init__(
        self,
        scheduler: Scheduler,
        trace: Trace,
        world: Group,
        *,
        max_ops_without_wait: int,
        max_payload_bytes: int,
        reproduce: str,
    ) -> None:
        self.scheduler = scheduler
        self.trace = trace
        self.world = world
        self.size = len(world.ranks)
        self.max_ops_without_wait = max_ops_without_wait
        self.max_payload_bytes = max_payload_bytes
        self.reproduce = reproduce
        self._clock = scheduler.clock
        self._at = scheduler.at
        self.shared: list[dict[str, Any]] = [{} for _ in range(self.size)]
        self.processes: list[Process] = []  # in spawn order: outcomes are listed in it
        self.by_name: dict[str, list[Process | None]] = {}
        self.by_rank: list[list[Process]] = [[] for _ in range(self.size)]
        self.absent: dict[str, int] = {}  # program name -> ranks it does not run on
        self._running = False  # start() was called: spawn() then schedules starts at once
        self._unstarted: list[tuple[float, Process]] = []
        self.op_handlers: dict[type, OpHandler] = {Sleep: self._op_sleep, Now: self._op_now}
        self.expirers: dict[int, Callable[[Process], None]] = {WAIT_SLEEP: self._expire_sleep}
        self.op_fault_hits: Callable[[Process, Any], bool] = _no_op_faults
        self._ev_start = scheduler.register(self._on_start)
        self._ev_wake = scheduler.register(self._on_wake)
        self._ev_deadline = scheduler.register(self._on_deadline)

    # ---------------------------------------------------------------- programs

    def check_rank(self, rank: int, what: str) -> int:
        if not whole_number(rank) or not 0 <= rank < self.size:
            raise ValueError(f"{what}: rank {rank!r} is not in the world of {self.size} ranks")
        return rank

    def process(self, rank: int, program: str) -> Process:
        column = self.by_name.get(program)
        process = column[self.check_rank(rank, "program")] if column else None
        if process is None:
            raise KeyError(f"no program {program!r} runs on rank {rank}")
        return process

    def spawn(
        self, program: ProgramFactory, ranks: Iterable[int] | None, name: str, start_s: float
    ) -> list[Process]:
        """Create ``program(ctx)`` as ``name`` on ``ranks`` (default: every rank); it starts at
        ``start_s`` once the run started. Nothing is registered unless every rank's call returned
        a generator."""
        if not callable(program):
            raise TypeError(f"program must be a generator function, got {program!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a program needs a non-empty name, got {name!r}")
        now_s = self._clock.now_s
        if not (math.isfinite(start_s) and start_s >= now_s):
            raise ValueError(f"start_s must be finite and >= now ({now_s}), got {start_s!r}")
        targets = list(range(self.size)) if ranks is None else list(ranks)
        if len(set(targets)) != len(targets):
            raise ValueError(f"spawn: ranks lists a rank twice: {targets}")
        if name not in self.by_name:
            self.by_name[name] = [None] * self.size
            self.absent[name] = self.size
        column = self.by_name[name]
        for rank in targets:
            self.check_rank(rank, "spawn")
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
                shared=self.shared[rank],
                random=self.scheduler.rng,
            )
            gen = program(ctx)
            if not isinstance(gen, Generator):
                raise TypeError(
                    f"program {name!r} returned {type(gen).__name__}, not a generator: "
                    "a rank program must yield ops"
                )
            spawned.append(Process(rank, name, ctx, gen))
        for process in spawned:
            rank = process.rank
            column[rank] = process
            self.absent[name] -= 1
            self.by_rank[rank].append(process)
            self.processes.append(process)
            if self._running:
                self._at(start_s, self._ev_start, process)
            else:
                self._unstarted.append((start_s, process))
        return spawned

    def start(self) -> None:
        """Schedule the start of every program spawned so far; later ones start as spawned.

        Called once the faults injected before the run are scheduled: a fault at time t then acts
        before any program event at time t (ties go by scheduling order).
        """
        if self._running:
            return
        self._running = True
        for start_s, process in self._unstarted:
            self._at(start_s, self._ev_start, process)
        self._unstarted.clear()

    # ---------------------------------------------------------------- stepping and waiting

    def run_process(
        self, process: Process, value: Any, error: BaseException | None, op: Any = NO_OP
    ) -> None:
        """Advance a program until it blocks on an op, ends, or is stopped by a fault."""
        gen = process.gen
        handlers = self.op_handlers
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
                        f"{type(exc).__name__}: {exc} at virtual time {self._clock.now_s:.6f} s",
                        self.reproduce,
                        process.rank,
                        process.name,
                    ) from exc
                process.ops += 1
                if (
                    process.op_faults is not None
                    and process.ops in process.op_faults
                    and self.op_fault_hits(process, op)
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
                    if value is BLOCKED:
                        return
            op = NO_OP
            budget -= 1
            if budget <= 0:
                raise SimulationLimitExceeded(
                    f"rank {process.rank} program {process.name!r} ran "
                    f"max_ops_without_wait={self.max_ops_without_wait} ops without waiting at "
                    f"virtual time {self._clock.now_s:.6f} s: a loop that never sleeps or waits?",
                    self.reproduce,
                )

    def _finish(self, process: Process, value: Any) -> None:
        process.state = ProgramState.DONE
        process.result = value
        process.wait = WAIT_NONE
        process.token += 1
        process.mailbox.clear()
        process.boxes.clear()
        self.trace.add(self._clock.now_s, process.rank, process.name, "exit", process.ops)

    def block(self, process: Process, wait: int, timeout_s: float, op_name: str) -> None:
        """``process`` waits (``wait``: a ``WAIT_*``) for at most ``timeout_s``."""
        process.wait = wait
        process.w_op = op_name
        process.w_timeout_s = timeout_s
        process.w_deadline_s = deadline_s = self._clock.now_s + timeout_s
        self._at(deadline_s, self._ev_deadline, process, process.token)

    def wake(self, process: Process, value: Any, error: BaseException | None) -> None:
        """End the current wait with ``value`` (or ``error``); held while the program is frozen."""
        process.token += 1
        process.wait = WAIT_NONE
        process.deadline_due = False
        process.w_answers = {}
        process.w_collective = None
        if process.frozen:
            process.pending = (value, error)
            return
        self.run_process(process, value, error)

    def expire(self, process: Process) -> None:
        """The deadline of ``process``'s wait passed: the part that owns the wait handles it."""
        expirer = self.expirers.get(process.wait)
        if expirer is not None:
            expirer(process)

    def _expire_sleep(self, process: Process) -> None:
        raise AssertionError(f"{process!r}: a sleep has no deadline event")

    # ---------------------------------------------------------------- events

    def _on_start(self, process: Process, _: Any) -> None:
        if process.state is not ProgramState.READY:
            return  # crashed before it started
        process.state = ProgramState.RUNNING
        self.trace.add(self._clock.now_s, process.rank, process.name, "start", ())
        if process.frozen:
            process.pending = (None, None)
            return
        self.run_process(process, None, None)

    def _on_wake(self, process: Process, token: int) -> object:
        if token != process.token:
            return STALE
        self.wake(process, None, None)
        return None

    def _on_deadline(self, process: Process, token: int) -> object:
        if token != process.token:
            return STALE  # the wait it was set for already ended
        if process.frozen:
            process.deadline_due = True  # seen when the program runs again
            return None
        self.expire(process)
        return None

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
        self._at(self._clock.now_s + duration_s, self._ev_wake, process, process.token)
        return BLOCKED
