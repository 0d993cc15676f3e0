"""The collectives engine alone: matching, completion time, stalls on a cut, and blame.

Built on a program runner, a network and a group table with no fault engine or messaging
wired: link faults are switched on and off directly on the network, as the fault engine does.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from scout.transport.base import DeadlineExceeded, Group
from scout.transport.program import AllGather, Barrier, Now, Sleep
from scout.transport.sim import LatencyModel, Partition, SimContext
from scout.transport.sim.collectives import Collectives
from scout.transport.sim.groups import GroupTable
from scout.transport.sim.network import Network
from scout.transport.sim.runner import ProgramRunner
from tests.sim.helpers import bare_runner, run_programs

STEP_S = 0.01
EXACT = LatencyModel(base_latency_s=0.001, jitter_s=0.0, collective_step_latency_s=STEP_S)


def _engine(ranks: int) -> tuple[ProgramRunner, Network, Collectives]:
    runner = bare_runner(ranks)
    network = Network(
        runner.scheduler, runner.trace, EXACT, max_payload_bytes=1 << 20, trace_messages=False
    )
    return runner, network, Collectives(runner, network, GroupTable(ranks, "seed=0"))


def _gather_after(delay_s: float, timeout_s: float = 5.0) -> Any:
    """Each rank sleeps ``rank * delay_s``, all-gathers its rank, and returns what and when."""

    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Sleep(ctx.rank * delay_s)
        try:
            values = yield AllGather(ctx.rank * 10, timeout_s=timeout_s)
        except DeadlineExceeded as exc:
            values = ("missing", exc.missing)
        return values, (yield Now())

    return program


def test_a_collective_completes_for_all_its_tree_steps_after_the_last_arrival() -> None:
    runner, _, _ = _engine(4)
    runner.spawn(_gather_after(0.5), None, "main", 0.0)
    run_programs(runner)
    done_s = 1.5 + 2 * STEP_S  # the last member arrives at 1.5; log2(4) steps
    assert [process.result for process in runner.processes] == [([0, 10, 20, 30], done_s)] * 4


def test_calls_are_matched_by_order_per_group() -> None:
    runner, _, _ = _engine(4)
    pairs = (Group((0, 1), "a"), Group((2, 3), "b"))

    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        mine = pairs[ctx.rank // 2]
        first = yield AllGather(("first", ctx.rank), group=mine, timeout_s=1.0)
        second = yield AllGather(("second", ctx.rank), group=mine, timeout_s=1.0)
        return first, second

    runner.spawn(program, None, "main", 0.0)
    run_programs(runner)
    first, second = runner.processes[3].result
    assert first == [("first", 2), ("first", 3)] and second == [("second", 2), ("second", 3)]


def test_a_cut_stalls_the_collective_until_the_link_heals() -> None:
    runner, network, collectives = _engine(2)
    network.add_link_fault(0, Partition(side_a={0}, side_b={1}))
    runner.spawn(_gather_after(0.0), None, "main", 0.0)
    run_programs(runner, until_s=1.0)
    assert len(collectives.stalled) == 1 and runner.processes[0].result is None
    network.remove_link_fault(0)
    collectives.retry_stalled()
    run_programs(runner)
    assert [process.result for process in runner.processes] == [([0, 10], 1.0 + STEP_S)] * 2


def test_a_member_blames_whom_a_cut_keeps_from_it_at_its_deadline() -> None:
    runner, network, _ = _engine(3)
    network.add_link_fault(0, Partition(side_a={0, 1}, side_b={2}))
    runner.spawn(_gather_after(0.0, timeout_s=2.0), None, "main", 0.0)
    run_programs(runner)
    results = [process.result for process in runner.processes]
    assert results == [
        (("missing", (2,)), 2.0),
        (("missing", (2,)), 2.0),
        (("missing", (0, 1)), 2.0),
    ]


def test_members_calling_different_collectives_blame_each_other() -> None:
    runner, _, _ = _engine(2)

    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        op = Barrier(timeout_s=1.0) if ctx.rank == 0 else AllGather(1, timeout_s=1.0)
        try:
            yield op
        except DeadlineExceeded as exc:
            return exc.missing
        return ()

    runner.spawn(program, None, "main", 0.0)
    run_programs(runner)
    assert [process.result for process in runner.processes] == [(1,), (0,)]
    assert [record[4] for record in runner.trace if record[3] == "mismatch"] == [
        ("all_gather", "barrier")
    ]
