"""all_gather, broadcast and barrier on the simulator: all or nothing (contract guarantee 3)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from scout.transport.base import DeadlineExceeded, Group, GroupError, PayloadTooLarge
from scout.transport.program import AllGather, Barrier, Broadcast, Now, Sleep
from scout.transport.sim import Crash, Partition, SimContext
from tests.sim.helpers import run


def _outcome(op: Any) -> Generator[Any, Any, Any]:
    try:
        value = yield op
    except DeadlineExceeded as exc:
        return ("deadline", exc.missing, exc.operation)
    return ("ok", value)


def test_all_gather_orders_by_position_in_the_group() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        group = Group((3, 1, 0, 2), "shuffled")
        values = yield AllGather([ctx.rank], timeout_s=1.0, group=group)
        values[0].append("mine")  # mutable values are each receiver's own copy
        return values

    for values in run(program, 4).values():
        assert values == [[3, "mine"], [1], [0], [2]]


def test_broadcast_delivers_the_roots_payload_and_ignores_the_others() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        got = []
        for root in range(3):
            payload = ("root", root) if ctx.rank == root else object()  # never encoded
            got.append((yield Broadcast(payload, root=root, timeout_s=1.0)))
        return got

    assert run(program, 3).values() == [[("root", 0), ("root", 1), ("root", 2)]] * 3


def test_barrier_waits_for_the_last_member() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 2:
            yield Sleep(0.7)
        result = yield Barrier(timeout_s=5.0)
        return result, (yield Now())

    values = run(program, 3).values()
    assert all(result is None for result, _ in values)
    times = {now_s for _, now_s in values}
    assert len(times) == 1 and 0.7 < times.pop() < 0.71


def test_absent_member_is_named_at_each_members_deadline() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 1:
            yield Sleep(5.0)  # never arrives in time, then does not take part at all
            return None
        began_s = yield Now()
        outcome = yield from _outcome(AllGather(ctx.rank, timeout_s=0.5 + ctx.rank))
        return outcome, (yield Now()) - began_s

    values = run(program, 3).values()
    assert values[0] == (("deadline", (1,), "all_gather"), 0.5)
    assert values[2] == (("deadline", (1,), "all_gather"), 2.5)


def test_late_member_completes_the_collective_for_itself() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 2:
            yield Sleep(1.0)
        return (yield from _outcome(AllGather(ctx.rank, timeout_s=0.5)))

    values = run(program, 3).values()
    assert values[0] == values[1] == ("deadline", (2,), "all_gather")
    assert values[2] == ("ok", [0, 1, 2])  # the others' contributions were already made


def test_crash_inside_a_collective_is_named() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        return (yield from _outcome(Barrier(timeout_s=1.0)))

    # The crash hits rank 2 as it is about to run its first op: it never arrives.
    result = run(program, 3, faults=[Crash(rank=2, at_op=1, programs="main")])
    assert result.value(0) == result.value(1) == ("deadline", (2,), "barrier")


def test_crash_after_arriving_still_prevents_completion() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 0:
            yield Sleep(0.2)
        return (yield from _outcome(AllGather(ctx.rank, timeout_s=1.0)))

    # Rank 2 arrived at t=0 and crashes at 0.1, before rank 0 completes the set at 0.2.
    result = run(program, 3, faults=[Crash(rank=2, at_s=0.1)])
    assert result.value(0) == result.value(1) == ("deadline", (2,), "all_gather")


def test_different_collectives_at_one_position_never_complete() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        op = Barrier(timeout_s=1.0) if ctx.rank == 0 else AllGather(ctx.rank, timeout_s=1.0)
        return (yield from _outcome(op))

    values = run(program, 3).values()
    assert values[0] == ("deadline", (1, 2), "barrier")
    assert values[1] == ("deadline", (0,), "all_gather")


def test_partition_stalls_a_collective_until_it_heals() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        first = yield from _outcome(AllGather(ctx.rank, timeout_s=1.0))
        second = yield from _outcome(AllGather(ctx.rank, timeout_s=5.0))
        return first, second, (yield Now())

    result = run(program, 4, faults=[Partition(side_a={0, 1}, side_b={2, 3}, duration_s=2.0)])
    for rank, (first, second, now_s) in enumerate(result.values()):
        across = (2, 3) if rank < 2 else (0, 1)
        assert first == ("deadline", across, "all_gather")
        assert second == ("ok", [0, 1, 2, 3])
        assert 2.0 < now_s < 2.01  # completed once the partition healed


def test_collective_misuse() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        errors = []
        for op in (
            Broadcast(1, root=5, timeout_s=1.0),
            Barrier(timeout_s=1.0, group=Group((1, 2), "others")),
            AllGather(b"x" * 200, timeout_s=1.0),
            Barrier(timeout_s=-1),
        ):
            try:
                yield op
            except (GroupError, PayloadTooLarge, ValueError) as exc:
                errors.append(type(exc).__name__)
        return errors

    result = run(program, 3, max_payload_bytes=100)
    assert result.value(0) == ["GroupError", "GroupError", "PayloadTooLarge", "ValueError"]
    assert result.messages_sent == 0


@pytest.mark.parametrize("ranks", [1, 2, 7])
def test_collectives_at_odd_sizes(ranks: int) -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        gathered = yield AllGather(ctx.rank * 2, timeout_s=1.0)
        value = yield Broadcast(ctx.rank, root=ranks - 1, timeout_s=1.0)
        yield Barrier(timeout_s=1.0)
        return gathered, value

    assert run(program, ranks).values() == [([r * 2 for r in range(ranks)], ranks - 1)] * ranks
