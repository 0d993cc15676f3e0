"""The fault engine: when each injected fault begins and ends, and what it does to programs.

Fault *values* live in :mod:`scout.transport.sim.faults`; this module schedules them and applies
their effects:

* ``Freeze`` holds a program back (SIGSTOP): a wake-up, a deadline or the op it froze at waits in
  the program's state until the last overlapping freeze ends, then runs.
* ``Crash`` stops a program for ever; its pending waits, held op and messages are dropped.
* ``Delay``, ``Drop`` and ``Partition`` become active links faults of the network; when a
  ``Drop`` or ``Partition`` ends, ``on_links_healed`` lets the collectives it held back complete.
* ``Corrupt`` becomes an active rewrite of the rank's outgoing payloads.

A ``Freeze`` or ``Crash`` with ``at_op`` strikes when its program is about to run its k-th op.
Every fault is recorded in the trace when it begins (``fault``) and ends (``fault-end``), and so
are its effects (``freeze``, ``thaw``, ``crash``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

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
from scout.transport.sim.network import Network
from scout.transport.sim.process import NO_OP, WAIT_NONE, Process, ProgramState
from scout.transport.sim.runner import ProgramRunner

__all__ = ["FaultEngine"]

OpFaults = dict[int, list[tuple[int, Any]]]  # op number -> [(injection index, fault)]


def _nothing() -> None:
    return None


class FaultEngine:
    """Every fault injected into a run, by injection index, and the ones in force."""

    __slots__ = (
        "_at",
        "_clock",
        "_ev_begin",
        "_ev_end",
        "faults",
        "frozen_by",
        "network",
        "on_links_healed",
        "op_faults",
        "runner",
        "trace",
    )

    def __init__(self, runner: ProgramRunner, network: Network) -> None:
        self.runner = runner
        self.network = network
        self.trace = runner.trace
        self._clock = runner.scheduler.clock
        self._at = runner.scheduler.at
        self.faults: list[Fault] = []  # by injection index
        self.frozen_by: dict[int, list[Process]] = {}  # index of a Freeze -> programs it froze
        self.op_faults: dict[tuple[int, str], OpFaults] = {}  # (rank, program) -> at_op faults
        self.on_links_healed: Callable[[], None] = _nothing
        self._ev_begin = runner.scheduler.register(self._on_fault_begin)
        self._ev_end = runner.scheduler.register(self._on_fault_end)
        runner.op_fault_hits = self._op_fault_hits

    def attach(self, processes: Iterable[Process]) -> None:
        """Give newly spawned programs the ``at_op`` faults already injected for them."""
        for process in processes:
            process.op_faults = self.op_faults.get((process.rank, process.name))

    def inject(self, *faults: Fault) -> None:
        """Schedule each fault's beginning and end (or arm it at its program's ``at_op``)."""
        for fault in faults:
            self._inject(fault)

    def _inject(self, fault: Fault) -> None:
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
        size = self.runner.size
        outside = [rank for rank in named if rank >= size]
        if outside:
            raise ValueError(
                f"inject: {fault.describe()} names ranks {describe_ranks(outside)} outside the "
                f"world of {size} ranks"
            )
        index = len(self.faults)
        self.faults.append(fault)
        if isinstance(fault, (Freeze, Crash)) and fault.at_op is not None:
            assert fault.programs is not None  # checked by the fault itself
            key = (fault.rank, fault.programs[0])
            by_op = self.op_faults.setdefault(key, {})
            by_op.setdefault(fault.at_op, []).append((index, fault))
            column = self.runner.by_name.get(key[1])
            process = column[key[0]] if column is not None else None
            if process is not None:
                process.op_faults = by_op
            return
        start_s = fault.at_s if isinstance(fault, Crash) else fault.start_s
        assert start_s is not None
        start_s = max(start_s, self._clock.now_s)
        self._at(start_s, self._ev_begin, index, None)
        if not isinstance(fault, Crash) and math.isfinite(fault.duration_s):
            self._at(start_s + fault.duration_s, self._ev_end, index, None)

    # ---------------------------------------------------------------- beginnings and ends

    def _targets(self, rank: int, programs: tuple[str, ...] | None) -> list[Process]:
        return [
            process
            for process in self.runner.by_rank[rank]
            if programs is None or process.name in programs
        ]

    def _on_fault_begin(self, index: int, _: Any) -> None:
        fault = self.faults[index]
        self.trace.add(self._clock.now_s, _fault_rank(fault), "", "fault", fault.describe())
        if isinstance(fault, Freeze):
            self.frozen_by[index] = frozen = []
            for process in self._targets(fault.rank, fault.programs):
                if self._freeze(process):
                    frozen.append(process)
        elif isinstance(fault, Crash):
            for process in self._targets(fault.rank, fault.programs):
                self._crash(process)
        elif isinstance(fault, Corrupt):
            self.network.add_corruption(fault)
        else:
            self.network.add_link_fault(index, fault)

    def _on_fault_end(self, index: int, _: Any) -> None:
        fault = self.faults[index]
        self.trace.add(self._clock.now_s, _fault_rank(fault), "", "fault-end", fault.describe())
        if isinstance(fault, Freeze):
            for process in self.frozen_by.pop(index, []):
                self._thaw(process)
        elif isinstance(fault, Corrupt):
            self.network.remove_corruption(fault)
        else:
            self.network.remove_link_fault(index)
            if isinstance(fault, (Drop, Partition)):
                self.on_links_healed()

    def _op_fault_hits(self, process: Process, op: Any) -> bool:
        """Apply faults triggered by this op; True if the program stopped before running it."""
        assert process.op_faults is not None
        stopped = False
        for index, fault in process.op_faults.pop(process.ops, []):
            now_s = self._clock.now_s
            self.trace.add(now_s, process.rank, process.name, "fault", fault.describe())
            if isinstance(fault, Crash):
                self._crash(process)
                return True
            if self._freeze(process):
                process.held_op = op
                stopped = True
                if math.isfinite(fault.duration_s):
                    self.frozen_by[index] = [process]
                    self._at(now_s + fault.duration_s, self._ev_end, index, None)
        return stopped

    # ---------------------------------------------------------------- effects on programs

    def _freeze(self, process: Process) -> bool:
        if process.state is ProgramState.DONE or process.state is ProgramState.CRASHED:
            return False
        process.frozen += 1
        self.trace.add(self._clock.now_s, process.rank, process.name, "freeze", process.frozen)
        return True

    def _thaw(self, process: Process) -> None:
        if process.frozen == 0:
            return
        process.frozen -= 1
        self.trace.add(self._clock.now_s, process.rank, process.name, "thaw", process.frozen)
        if process.frozen or process.state is not ProgramState.RUNNING:
            return
        if process.held_op is not NO_OP:
            op, process.held_op = process.held_op, NO_OP
            self.runner.run_process(process, None, None, op)
        elif process.pending is not None:
            (value, error), process.pending = process.pending, None
            self.runner.run_process(process, value, error)
        elif process.deadline_due:
            process.deadline_due = False
            self.runner.expire(process)

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
        self.trace.add(self._clock.now_s, process.rank, process.name, "crash", process.ops)


def _fault_rank(fault: Fault) -> int:
    """The rank a fault's trace records name; -1 (the cluster) for faults that span ranks."""
    return fault.rank if isinstance(fault, (Freeze, Crash, Corrupt)) else -1
