"""The fault engine alone: when faults begin and end, and what they do to programs and links.

Built on a program runner and a network with no messaging or collectives wired: programs here
only sleep, read the clock, or wait on a toy part, so every effect seen is the engine's.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from scout.transport.program import Now, Sleep
from scout.transport.sim import (
    Corrupt,
    Crash,
    Delay,
    Drop,
    Freeze,
    LatencyModel,
    Partition,
    ProgramState,
    SimContext,
)
from scout.transport.sim.fault_engine import FaultEngine
from scout.transport.sim.network import Network
from scout.transport.sim.runner import ProgramRunner
from tests.sim.helpers import ToyPart, Wait, bare_runner, run_programs


def _engine(ranks: int = 2) -> tuple[ProgramRunner, Network, FaultEngine]:
    runner = bare_runner(ranks)
    network = Network(
        runner.scheduler,
        runner.trace,
        LatencyModel(),
        max_payload_bytes=1 << 20,
        trace_messages=False,
    )
    return runner, network, FaultEngine(runner, network)


def _sleep_then_now(duration_s: float) -> Any:
    def program(ctx: SimContext) -> Generator[Any, Any, float]:
        yield Sleep(duration_s)
        return (yield Now())

    return program


def _events(runner: ProgramRunner, rank: int) -> list[str]:
    return [record[3] for record in runner.trace if record[1] == rank]


def test_a_freeze_holds_a_wake_up_until_it_ends() -> None:
    runner, _, engine = _engine()
    runner.spawn(_sleep_then_now(1.0), None, "main", 0.0)
    engine.inject(Freeze(rank=1, start_s=0.5, duration_s=1.5))
    run_programs(runner)
    assert [process.result for process in runner.processes] == [1.0, 2.0]
    assert _events(runner, 1) == ["start", "fault", "freeze", "fault-end", "thaw", "exit"]


def test_overlapping_freezes_nest() -> None:
    runner, _, engine = _engine(1)
    runner.spawn(_sleep_then_now(1.0), None, "main", 0.0)
    engine.inject(Freeze(rank=0, start_s=0.5, duration_s=1.5))
    engine.inject(Freeze(rank=0, start_s=1.0, duration_s=2.0))
    run_programs(runner)
    assert runner.processes[0].result == 3.0


def test_a_freeze_at_an_op_holds_that_op_and_one_spawned_later_is_armed_too() -> None:
    runner, _, engine = _engine(1)
    engine.inject(Freeze(rank=0, at_op=2, duration_s=0.75, programs="main"))

    def program(ctx: SimContext) -> Generator[Any, Any, tuple[float, float]]:
        first = yield Now()
        return first, (yield Now())

    engine.attach(runner.spawn(program, None, "main", 0.0))
    run_programs(runner)
    assert runner.processes[0].result == (0.0, 0.75)


def test_a_deadline_that_passes_while_frozen_is_handled_when_it_thaws() -> None:
    runner, _, engine = _engine(1)
    part = ToyPart(runner)
    runner.spawn(lambda ctx: (yield Wait(timeout_s=1.0)), None, "main", 0.0)
    engine.inject(Freeze(rank=0, start_s=0.5, duration_s=2.0))
    run_programs(runner)
    assert part.expired == [(2.5, 0)] and runner.processes[0].result == "expired"


def test_a_crash_stops_a_program_for_ever_and_later_faults_leave_it_alone() -> None:
    runner, _, engine = _engine(2)
    runner.spawn(_sleep_then_now(1.0), None, "main", 0.0)
    engine.inject(Crash(rank=0, at_s=0.5), Freeze(rank=0, start_s=0.75, duration_s=1.0))
    run_programs(runner)
    crashed, other = runner.processes
    assert crashed.state is ProgramState.CRASHED and crashed.result is None
    assert other.state is ProgramState.DONE
    assert _events(runner, 0) == ["start", "fault", "crash", "fault", "fault-end"]


def test_link_and_corruption_faults_are_in_force_for_their_span_only() -> None:
    runner, network, engine = _engine(3)
    healed: list[float] = []
    engine.on_links_healed = lambda: healed.append(runner.scheduler.now_s)
    drop = Drop(src_ranks={0}, dst_ranks={1}, start_s=1.0, duration_s=1.0)
    delay = Delay(ranks={2}, extra_latency_s=0.1, start_s=1.0, duration_s=2.0)
    partition = Partition(side_a={0}, side_b={2}, start_s=1.5, duration_s=2.0)
    corrupt = Corrupt(rank=1, rewrite=lambda value: value, start_s=1.0, duration_s=0.5)
    engine.inject(drop, delay, partition, corrupt)
    in_force = {}
    for time_s in (0.5, 1.25, 1.75, 2.5, 4.0):
        run_programs(runner, until_s=time_s)
        in_force[time_s] = (
            [fault for _, fault in network.link_faults],
            list(network.corrupting),
        )
    assert in_force == {
        0.5: ([], []),
        1.25: ([drop, delay], [1]),
        1.75: ([drop, delay, partition], []),
        2.5: ([delay, partition], []),
        4.0: ([], []),
    }
    assert healed == [2.0, 3.5]  # a Delay's end releases no stalled collective


def test_a_fault_naming_a_rank_outside_the_world_is_refused() -> None:
    _, _, engine = _engine(2)
    with pytest.raises(ValueError, match="outside the world of 2 ranks"):
        engine.inject(Crash(rank=2, at_s=0.0))
    with pytest.raises(TypeError, match="is not a fault"):
        engine.inject("a crash")  # type: ignore[arg-type]
    assert engine.faults == []
