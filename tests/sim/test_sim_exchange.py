"""The evidence exchange on the simulator: contract guarantees 2, 4 and 5 (base.py)."""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import pytest

from scout.transport.base import ExchangeResult, Group, GroupError, PayloadTooLarge
from scout.transport.codec import EncodeError, encode
from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim import Crash, SimContext
from tests.sim.helpers import run


def test_complete_exchange_returns_every_answer_including_its_own() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, ExchangeResult]:
        return (yield Exchange({"r": ctx.rank, "t": (1, [2])}, round_id=1, timeout_s=5.0))

    result = run(program, 4)
    for rank, exchange in enumerate(result.values()):
        assert exchange.complete and exchange.missing == ()
        assert exchange.round_id == 1
        assert exchange.group == result.outcomes[(rank, "main")].value.group
        assert exchange.answers == {r: {"r": r, "t": (1, [2])} for r in range(4)}
        assert exchange.by_position(None) == [{"r": r, "t": (1, [2])} for r in range(4)]
    # It returned long before the deadline: one message latency, not timeout_s.
    assert result.virtual_time_s < 0.001


def test_mutable_answers_are_not_shared_between_receivers() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        result = yield Exchange([ctx.rank], round_id=1, timeout_s=1.0)
        result.answers[0].append("mine")  # must not show up at the other ranks
        return result.answers[0]

    assert run(program, 3).values() == [[0, "mine"]] * 3


def test_silent_peer_is_named_missing_exactly_at_the_deadline() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 3:
            yield Sleep(10.0)  # silent past everyone's deadline
            return None
        began_s = yield Now()
        result = yield Exchange(ctx.rank, round_id=1, timeout_s=2.5)
        ended_s = yield Now()
        return result.missing, sorted(result.answers), ended_s - began_s

    values = run(program, 4).values()
    for rank in range(3):
        missing, answered, waited_s = values[rank]
        assert missing == (3,)
        assert answered == [0, 1, 2]
        assert waited_s == pytest.approx(2.5, abs=1e-12)


def test_timeout_zero_returns_at_once_with_what_already_arrived() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 0:
            yield Sleep(1.0)  # the others' answers for round 1 are waiting by now
        result = yield Exchange(ctx.rank, round_id=1, timeout_s=0.0 if ctx.rank == 0 else 5.0)
        return result.missing

    values = run(program, 3).values()
    assert values[0] == ()  # everything had arrived: answers for a later round are kept


def test_answers_for_an_earlier_round_are_dropped_and_counted() -> None:
    """Rank 0 is late: its round-1 answer reaches peers that finished round 1."""

    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 0:
            yield Sleep(2.0)
        first = yield Exchange(("r1", ctx.rank), round_id=1, timeout_s=1.0)
        second = yield Exchange(("r2", ctx.rank), round_id=2, timeout_s=5.0)
        yield Sleep(1.0)  # still running when the late answer comes (an ended one discards it)
        return first.missing, second.missing, second.answers

    cluster_result = run(program, 3)
    values = cluster_result.values()
    for rank in (1, 2):
        assert values[rank][0] == (0,)  # round 1 timed out without rank 0
        assert values[rank][1] == ()
        assert values[rank][2] == {r: ("r2", r) for r in range(3)}  # never a round-1 answer
        assert cluster_result.outcomes[(rank, "main")].stats.late_or_wrong_round_dropped == 1
        assert cluster_result.outcomes[(rank, "main")].stats.exchanges == 2
        assert cluster_result.outcomes[(rank, "main")].stats.deadlines_exceeded == 1
    # Rank 0 finds round-1 answers of its peers waiting, then round 2's.
    assert values[0][0] == () and values[0][1] == ()
    assert cluster_result.outcomes[(0, "main")].stats.late_or_wrong_round_dropped == 0


def test_buffered_answers_of_a_skipped_round_are_dropped_and_counted() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 0:
            yield Sleep(2.5)  # peers run rounds 1 and 2 without it; it joins round 3
            result = yield Exchange(0, round_id=3, timeout_s=1.0)
            return result.missing
        for round_id in (1, 2, 3):
            result = yield Exchange(ctx.rank, round_id=round_id, timeout_s=1.0)
        return result.missing

    result = run(program, 3)
    assert result.values() == [(), (), ()]
    # Two stale rounds from each of two peers were waiting at rank 0.
    assert result.outcomes[(0, "main")].stats.late_or_wrong_round_dropped == 4


def test_rounds_are_kept_apart_per_group() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        a = Group((0, 1, 2), "a")
        b = Group((0, 1, 2), "b")  # same ranks, another name: another channel
        if ctx.rank == 0:
            yield Sleep(0.5)
        first = yield Exchange(("a", ctx.rank), round_id=7, timeout_s=2.0, group=a)
        second = yield Exchange(("b", ctx.rank), round_id=7, timeout_s=2.0, group=b)
        return sorted(first.answers.values()), sorted(second.answers.values())

    for first, second in run(program, 3).values():
        assert first == [("a", r) for r in range(3)]
        assert second == [("b", r) for r in range(3)]


def test_payload_limit_is_on_the_encoded_size() -> None:
    limit = 100

    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        at_limit = b"x" * (limit - 5)
        assert len(encode(at_limit)) == limit
        outcome = []
        try:
            yield Exchange(at_limit + b"x", round_id=1, timeout_s=1.0)
        except PayloadTooLarge as exc:
            outcome.append(str(exc))
        result = yield Exchange(at_limit, round_id=2, timeout_s=1.0)
        outcome.append(result.missing)
        return outcome

    result = run(program, 3, max_payload_bytes=limit)
    for message, missing in result.values():
        assert "101 bytes" in message and "max_payload_bytes=100" in message
        assert missing == ()
    # The oversized payload was never sent: 2 messages per rank for round 2 only.
    assert result.messages_sent == 6


@pytest.mark.parametrize(
    ("make_op", "error", "fragment"),
    [
        (
            lambda ctx: Exchange(1, round_id=1, timeout_s=1.0, group=Group((0, 9), "g")),
            GroupError,
            "outside the world",
        ),
        (
            lambda ctx: Exchange(1, round_id=1, timeout_s=1.0, group=Group((1, 2), "g")),
            GroupError,
            "not a member",
        ),
        (
            lambda ctx: Exchange(1, round_id=1, timeout_s=1.0, group=(0, 1)),
            GroupError,
            "must be a scout",
        ),
        (lambda ctx: Exchange(1, round_id=1, timeout_s=-0.5), ValueError, "-0.5"),
        (lambda ctx: Exchange(1, round_id=1, timeout_s=math.nan), ValueError, "nan"),
        (lambda ctx: Exchange(1, round_id=1, timeout_s="1"), TypeError, "str"),
        (lambda ctx: Exchange(1, round_id=True, timeout_s=1.0), TypeError, "round_id"),
        (lambda ctx: Exchange(object(), round_id=1, timeout_s=1.0), EncodeError, "object"),
        (lambda ctx: "not an op", TypeError, "not an op"),
    ],
)
def test_misuse_raises_in_the_program_and_sends_nothing(
    make_op: Any, error: type, fragment: str
) -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank != 0:
            return None
        try:
            yield make_op(ctx)
        except error as exc:
            return str(exc)
        return "no error"

    result = run(program, 3)
    assert fragment in result.value(0)
    assert result.messages_sent == 0


def test_group_of_one_returns_its_own_answer_at_once() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        result = yield Exchange(
            "alone", round_id=1, timeout_s=9.0, group=Group((ctx.rank,), f"self-{ctx.rank}")
        )
        now_s = yield Now()
        return result.answers, result.missing, now_s

    assert run(program, 2).values() == [({0: "alone"}, (), 0.0), ({1: "alone"}, (), 0.0)]


def test_crashed_peer_is_silence() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Sleep(1.0)
        result = yield Exchange(ctx.rank, round_id=1, timeout_s=0.5)
        return result.missing

    result = run(program, 3, faults=[Crash(rank=1, at_s=0.5)])
    assert result.value(0) == (1,) and result.value(2) == (1,)
    assert [o.rank for o in result.unfinished()] == [1]
    with pytest.raises(AssertionError, match="crashed.*reproduce with seed=0"):
        result.values()
