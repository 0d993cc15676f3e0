"""Each fault kind, its effect, and its record in the trace."""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import pytest

from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim import (
    Corrupt,
    Crash,
    Delay,
    Drop,
    FlipBit,
    Freeze,
    LatencyModel,
    Partition,
    ProgramState,
    SimCluster,
    SimContext,
)
from tests.sim.helpers import exchange_rounds, run

EXACT = LatencyModel(base_latency_s=0.001, jitter_s=0.0, collective_step_latency_s=0.001)


def _fault_records(result: Any) -> list[str]:
    return [record[4] for record in result.trace.records if record[3] in ("fault", "fault-end")]


def test_delay_adds_latency_in_the_named_direction() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        result = yield Exchange(ctx.rank, round_id=1, timeout_s=1.0)
        return result.missing, (yield Now())

    result = run(
        program, 3, latency=EXACT, faults=[Delay(ranks={0}, extra_latency_s=0.25, direction="from")]
    )
    assert result.value(0) == ((), pytest.approx(0.001))  # rank 0 hears everyone on time
    assert result.value(1) == ((), pytest.approx(0.251))  # rank 0's answer is late
    assert _fault_records(result) == [
        "delay messages from ranks [0] by 0.250000 s from 0.000000 s on"
    ]


def test_freeze_stops_progress_but_messages_queue() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Sleep(1.0)
        began_s = yield Now()
        result = yield Exchange(ctx.rank, round_id=1, timeout_s=0.5)
        return began_s, result.missing, (yield Now())

    freeze = Freeze(rank=1, start_s=0.5, duration_s=2.0)
    result = run(program, 3, latency=EXACT, faults=[freeze])
    # The frozen rank's timer fired late: it starts its round at the thaw, 2.5 s ...
    began_s, missing, ended_s = result.value(1)
    assert began_s == pytest.approx(2.5)
    # ... and finds the answers that queued while it was stopped: none is lost.
    assert missing == () and ended_s == pytest.approx(2.5)
    # Its peers waited for it until their deadline only.
    assert result.value(0) == (1.0, (1,), 1.5)
    assert [r[3] for r in result.trace.records if r[1] == 1 and r[3] in ("freeze", "thaw")] == [
        "freeze",
        "thaw",
    ]
    assert _fault_records(result) == [freeze.describe()] * 2


def test_freeze_of_one_program_leaves_the_other_running() -> None:
    """A SIGSTOPped trainer does not stop its observer: they share memory, not a fate."""

    def trainer(ctx: SimContext) -> Generator[Any, Any, Any]:
        for step in range(1, 11):
            yield Sleep(0.1)
            ctx.shared["step"] = step
        return ctx.shared["step"]

    def observer(ctx: SimContext) -> Generator[Any, Any, Any]:
        seen = []
        for _ in range(12):
            yield Sleep(0.1)
            seen.append(ctx.shared.get("step", 0))
        return seen

    cluster = SimCluster(2, seed=0)
    cluster.spawn(trainer, name="trainer")
    cluster.spawn(observer, name="observer", start_s=0.05)
    cluster.inject(Freeze(rank=1, start_s=0.32, duration_s=0.5, programs=("trainer",)))
    result = cluster.run()
    assert result.value(0, "observer") == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10]
    stalled = result.value(1, "observer")
    # Reads at 0.45 .. 0.75 s see no progress while the trainer is stopped; the observer reads on.
    assert stalled[:3] == [1, 2, 3] and stalled[3:7] == [3] * 4 and stalled[7] == 4
    assert result.value(1, "trainer") == 10


def test_freeze_at_an_op_holds_the_program_inside_it() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Sleep(0.1)  # op 1
        now_s = yield Now()  # op 2: rank 0 is frozen here for 1 s
        return now_s

    result = run(program, 2, faults=[Freeze(rank=0, at_op=2, duration_s=1.0, programs="main")])
    assert result.value(0) == pytest.approx(1.1)
    assert result.value(1) == pytest.approx(0.1)


def test_crash_stops_the_program_for_ever() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        out = []
        for round_id in (1, 2):
            yield Sleep(1.0)
            out.append((yield Exchange(ctx.rank, round_id=round_id, timeout_s=0.5)).missing)
        return out

    result = run(program, 3, faults=[Crash(rank=2, at_s=1.5)])
    assert result.value(0) == [(), (2,)]
    assert result.outcomes[(2, "main")].state is ProgramState.CRASHED
    assert [r[3] for r in result.trace.records if r[1] == 2][-1] == "crash"


def test_drop_is_one_way_and_partition_both_ways() -> None:
    program = exchange_rounds(1, timeout_s=0.5)
    dropped = run(program, 3, faults=[Drop(src_ranks={0}, dst_ranks={1})])
    assert [v[0][1] for v in dropped.values()] == [(), (0,), ()]
    assert dropped.messages_dropped == 1
    cut = run(program, 3, faults=[Partition(side_a={0}, side_b={1, 2})])
    assert [v[0][1] for v in cut.values()] == [(1, 2), (0,), (0,)]
    assert cut.messages_dropped == 4


def test_drop_with_a_probability_is_seeded() -> None:
    program = exchange_rounds(20, timeout_s=0.1)
    faults = [Drop(src_ranks=range(4), dst_ranks=range(4), probability=0.3)]
    first = run(program, 4, seed=9, faults=faults)
    again = run(program, 4, seed=9, faults=faults)
    assert first.messages_dropped == again.messages_dropped
    assert 0.15 * 240 < first.messages_dropped < 0.45 * 240  # 20 rounds x 12 messages


def test_link_faults_end_when_their_span_ends() -> None:
    program = exchange_rounds(3, timeout_s=0.5, period_s=1.0)
    result = run(
        program, 2, faults=[Partition(side_a={0}, side_b={1}, start_s=1.5, duration_s=1.0)]
    )
    assert [missing for _, missing, _ in result.value(0)] == [(), (1,), ()]
    assert len(_fault_records(result)) == 2


def test_corrupt_value_is_what_the_rank_and_its_peers_see() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        result = yield Exchange((ctx.rank, 1.0, b"\x00"), round_id=1, timeout_s=1.0)
        return result.answers[0]

    corrupt = Corrupt(rank=0, rewrite=FlipBit(bit=1))
    result = run(program, 3, faults=[corrupt])
    assert result.values() == [(2, 1.0000000000000004, b"\x02")] * 3  # bit 1 of each leaf
    records = result.trace.where("corrupt")
    assert len(records) == 1 and records[0][1] == 0


def test_corrupt_on_the_wire_can_make_answers_undecodable() -> None:
    def truncate(data: bytes) -> bytes:
        return data[:-1]

    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        result = yield Exchange(("evidence", ctx.rank), round_id=1, timeout_s=1.0)
        return result.missing

    result = run(program, 3, faults=[Corrupt(rank=0, rewrite=truncate, layer="wire")])
    assert result.values() == [(), (0,), (0,)]  # rank 0's own answer is intact
    assert result.outcomes[(1, "main")].stats.undecodable_dropped == 1
    assert "truncate" in _fault_records(result)[0]


def test_flip_bit_targets_one_leaf() -> None:
    assert FlipBit(bit=0, leaf=1)((4, [4, 4], "s", True)) == (4, [5, 4], "s", True)
    assert FlipBit(bit=63)(1.0) == -1.0
    assert FlipBit(bit=9)(b"\x00\x00") == b"\x00\x02"


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Freeze(rank=0), "exactly one of start_s"),
        (lambda: Freeze(rank=0, start_s=1.0, at_op=3), "exactly one of start_s"),
        (lambda: Freeze(rank=0, at_op=3), "name it"),
        (lambda: Freeze(rank=-1, start_s=0.0), "rank"),
        (lambda: Freeze(rank=0, start_s=0.0, duration_s=0.0), "duration_s"),
        (lambda: Delay(ranks={0}, extra_latency_s=math.inf), "extra_latency_s"),
        (lambda: Delay(ranks={0}, extra_latency_s=1.0, direction="sideways"), "direction"),
        (lambda: Drop(src_ranks={0}, dst_ranks={1}, probability=0.0), "probability"),
        (lambda: Partition(side_a={0, 1}, side_b={1}), "both sides"),
        (lambda: Corrupt(rank=0, rewrite=42), "callable"),  # type: ignore[arg-type]
        (lambda: Corrupt(rank=0, rewrite=abs, layer="disk"), "layer"),
    ],
)
def test_bad_faults_are_refused_with_the_value(build: Any, fragment: str) -> None:
    with pytest.raises((ValueError, TypeError), match=fragment):
        build()


def test_a_fault_naming_a_rank_outside_the_world_is_refused() -> None:
    cluster = SimCluster(4, seed=0)
    with pytest.raises(ValueError, match=r"ranks \[7\] outside the world of 4"):
        cluster.inject(Crash(rank=7, at_s=1.0))
