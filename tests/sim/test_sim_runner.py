"""The program runner alone: spawn, step through ops, wait, wake, deadlines, bounds.

Built on a bare scheduler with no network, messaging or collectives: the ops and waits here are
the runner's own (``Sleep``, ``Now``) or a toy part registered the way real parts register.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from scout.transport.program import Now, Sleep
from scout.transport.sim import ProgramFailed, ProgramState, SimContext, SimulationLimitExceeded
from tests.sim.helpers import ToyPart, Wait, bare_runner, run_programs


def test_sleep_lets_virtual_time_pass_and_now_reads_it() -> None:
    runner = bare_runner()

    def program(ctx: SimContext) -> Generator[Any, Any, float]:
        yield Sleep(1.5 + ctx.rank)
        return (yield Now())

    runner.spawn(program, None, "main", 0.0)
    run_programs(runner)
    assert [process.result for process in runner.processes] == [1.5, 2.5]
    assert [record[3] for record in runner.trace if record[1] == 0] == ["start", "exit"]


def test_programs_start_only_once_the_run_starts() -> None:
    runner = bare_runner()
    runner.spawn(lambda ctx: (yield Now()), [1], "main", 0.25)
    runner.scheduler.run()
    assert runner.process(1, "main").state is ProgramState.READY
    run_programs(runner)
    assert runner.process(1, "main").result == 0.25


def test_a_part_wakes_its_waiter_and_the_old_deadline_goes_stale() -> None:
    runner = bare_runner(1)
    part = ToyPart(runner)
    runner.spawn(lambda ctx: (yield Wait(timeout_s=5.0)), None, "main", 0.0)
    runner.start()
    runner.scheduler.run(until_s=1.0)
    runner.wake(part.waiting[0], "woken", None)
    runner.scheduler.run()
    assert runner.processes[0].result == "woken" and part.expired == []


def test_a_wait_past_its_deadline_goes_to_the_part_that_owns_it() -> None:
    runner = bare_runner(2)
    part = ToyPart(runner)
    runner.spawn(lambda ctx: (yield Wait(timeout_s=2.0 + ctx.rank)), None, "main", 0.0)
    run_programs(runner)
    assert part.expired == [(2.0, 0), (3.0, 1)]
    assert [process.result for process in runner.processes] == ["expired", "expired"]


def test_an_unknown_op_is_a_type_error_thrown_into_the_program() -> None:
    runner = bare_runner(1)

    def program(ctx: SimContext) -> Generator[Any, Any, str]:
        try:
            yield "not an op"
        except TypeError as exc:
            return str(exc)
        return "no error"

    runner.spawn(program, None, "main", 0.0)
    run_programs(runner)
    assert "not an op the simulator knows" in runner.processes[0].result


def test_a_program_that_raises_fails_the_run_with_the_reproduce_line() -> None:
    runner = bare_runner(1)

    def program(ctx: SimContext) -> Generator[Any, Any, None]:
        yield Sleep(1.0)
        raise KeyError("boom")

    runner.spawn(program, None, "main", 0.0)
    with pytest.raises(ProgramFailed, match="seed=0") as raised:
        run_programs(runner)
    assert isinstance(raised.value.__cause__, KeyError) and raised.value.rank == 0


def test_a_program_that_never_waits_hits_the_bound() -> None:
    runner = bare_runner(1, max_ops_without_wait=50)

    def spin(ctx: SimContext) -> Generator[Any, Any, None]:
        while True:
            yield Now()

    runner.spawn(spin, None, "main", 0.0)
    with pytest.raises(SimulationLimitExceeded, match="max_ops_without_wait=50"):
        run_programs(runner)


def test_a_spawn_that_fails_on_one_rank_registers_nothing() -> None:
    runner = bare_runner(3)

    def program(ctx: SimContext) -> Any:
        if ctx.rank == 2:
            return None
        return (item for item in ())

    with pytest.raises(TypeError, match="not a generator"):
        runner.spawn(program, None, "main", 0.0)
    assert runner.processes == [] and runner.by_rank == [[], [], []]
    with pytest.raises(ValueError, match="twice"):
        runner.spawn(program, [0, 0], "main", 0.0)
    with pytest.raises(KeyError, match="no program 'main' runs on rank 1"):
        runner.process(1, "main")
