"""Conformance scenarios: rank programs that every binding of the transport contract runs.

Each ``scenario_<name>(ctx)`` is a rank program (``scout.transport.program``): it yields ops and
returns a result dict. The simulator runs it on N simulated ranks
(``test_conformance_sim.py``); a real binding runs it on every rank with
``run_blocking(scenario_<name>, transport)`` on a fresh transport. ``check_scenario(name,
results, size)`` then asserts the contract's guarantees on the per-rank results (a list indexed
by rank), whoever produced them.

Rules that keep one program valid everywhere:

* Results are JSON data (lists, string keys, numbers, strings): real bindings ship them between
  processes as JSON. Decoded payloads are compared by ``repr``, which keeps tuple / list / bytes
  distinctions that JSON would lose.
* A silent rank cannot "un-send": it sleeps past the deadline and then skips the op.
* After a collective deadline the group may be unusable (MPI, NCCL cannot cancel), so the one
  scenario that lets a collective time out is defined last and a late member joins afterwards,
  which completes the operation left in flight.
* Timeouts of healthy ops are generous (they return as soon as everyone took part); only the
  scenarios about deadlines wait them out, so a run costs a few seconds of wall time.

Scenarios run at any size >= 2; the suite runs them at 3, 4 and 5 (odd sizes give subgroups of
different sizes, including a group of one at size 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable
from typing import Any

from scout.transport.base import DeadlineExceeded, Group, PayloadTooLarge
from scout.transport.program import (
    AllGather,
    Barrier,
    Broadcast,
    Exchange,
    Now,
    RankContext,
    Sleep,
)

HEALTHY_TIMEOUT_S = 30.0  # healthy ops return long before this; it only bounds a broken binding
SILENT_TIMEOUT_S = 1.0  # the deadline the silent-peer scenarios wait out
SILENT_SLEEP_S = 1.5  # the silent rank sleeps past that deadline
BARRIER_DELAY_S = 0.3  # how late one rank arrives at a barrier
EARLY_TOLERANCE_S = 0.05  # a deadline may fire this much early (clock granularity)
LATE_TOLERANCE_S = 5.0  # and this much late on a loaded machine, without counting as a hang
ROUNDS = 3

Program = Generator[Any, Any, dict[str, Any]]


def silent_rank(size: int) -> int:
    """The rank that stays silent in the deadline scenarios: the last one."""
    return size - 1


def even_odd_groups(ctx: RankContext) -> tuple[Group, Group]:
    """Every rank builds both groups alike (bindings may need all ranks to know every group)."""
    ranks = ctx.world.ranks
    return ctx.group(ranks[0::2], "even"), ctx.group(ranks[1::2], "odd")


def evidence(rank: int, round_id: int) -> Any:
    """A payload that exercises the codec: tuple vs list, bytes, float, nested dict."""
    return {
        "rank": rank,
        "round": round_id,
        "pair": (rank, -rank),
        "list": [rank, 0.5],
        "blob": bytes([rank % 256, 7]),
    }


def _answers(result: Any) -> list[list[Any]]:
    return [[rank, repr(value)] for rank, value in sorted(result.answers.items())]


def _error_name(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


# ---------------------------------------------------------------------------- scenarios


def scenario_exchange_all_answer(ctx: RankContext) -> Program:
    """(a) Everyone takes part: the exchange is complete and carries every payload intact."""
    result = yield Exchange(evidence(ctx.rank, 1), round_id=1, timeout_s=HEALTHY_TIMEOUT_S)
    return {
        "round_id": result.round_id,
        "complete": result.complete,
        "missing": list(result.missing),
        "answers": _answers(result),
        "by_position": [repr(v) for v in result.by_position(None)],
    }


def scenario_exchange_rounds(ctx: RankContext) -> Program:
    """Consecutive rounds on one group: each round gets only its own answers."""
    rounds = []
    for round_id in range(1, ROUNDS + 1):
        result = yield Exchange(
            evidence(ctx.rank, round_id), round_id=round_id, timeout_s=HEALTHY_TIMEOUT_S
        )
        rounds.append(
            {
                "round_id": result.round_id,
                "missing": list(result.missing),
                "answers": _answers(result),
            }
        )
    return {"rounds": rounds}


def scenario_exchange_silent_peer(ctx: RankContext) -> Program:
    """(b) One peer is silent: the others return at the deadline naming it; nobody hangs."""
    silent = silent_rank(ctx.size)
    if ctx.rank == silent:
        yield Sleep(SILENT_SLEEP_S)  # past everyone's deadline; then it skips the exchange
        outcome: dict[str, Any] = {"role": "silent"}
    else:
        began_s = yield Now()
        result = yield Exchange(("here", ctx.rank), round_id=1, timeout_s=SILENT_TIMEOUT_S)
        ended_s = yield Now()
        outcome = {
            "role": "peer",
            "missing": list(result.missing),
            "answered": sorted(result.answers),
            "waited_s": ended_s - began_s,
        }
    yield Barrier(timeout_s=HEALTHY_TIMEOUT_S)  # everyone together again: the group still works
    return outcome


def scenario_stale_round_ignored(ctx: RankContext) -> Program:
    """Rank 0 exchanges round 1 alone and times out; everyone then meets in round 2. Rank 0's
    round-1 answer reaches the others during round 2 and must not count as a round-2 answer;
    their round-2 answers reach rank 0 before it gets there and must."""
    outcome: dict[str, Any] = {}
    if ctx.rank == 0:
        first = yield Exchange(("round", 1, ctx.rank), round_id=1, timeout_s=SILENT_TIMEOUT_S)
        outcome["round1_missing"] = list(first.missing)
    second = yield Exchange(("round", 2, ctx.rank), round_id=2, timeout_s=HEALTHY_TIMEOUT_S)
    outcome["round2_missing"] = list(second.missing)
    outcome["round2_answers"] = _answers(second)
    return outcome


def scenario_subgroups_even_odd(ctx: RankContext) -> Program:
    """(c) Exchange, all_gather and barrier inside an even/odd split of the world."""
    even, odd = even_odd_groups(ctx)
    mine = even if ctx.rank % 2 == 0 else odd
    result = yield Exchange(
        evidence(ctx.rank, 5), round_id=5, timeout_s=HEALTHY_TIMEOUT_S, group=mine
    )
    gathered = yield AllGather(("gather", ctx.rank), timeout_s=HEALTHY_TIMEOUT_S, group=mine)
    yield Barrier(timeout_s=HEALTHY_TIMEOUT_S, group=mine)
    return {
        "group": mine.name,
        "group_ranks": list(mine.ranks),
        "missing": list(result.missing),
        "answers": _answers(result),
        "gathered": [repr(value) for value in gathered],
    }


def scenario_all_gather_order(ctx: RankContext) -> Program:
    """all_gather returns values ordered by peer position, whatever the group's rank order."""
    world = yield AllGather(("value", ctx.rank), timeout_s=HEALTHY_TIMEOUT_S)
    reversed_group = ctx.group(tuple(reversed(ctx.world.ranks)), "reversed")
    backwards = yield AllGather(
        ("value", ctx.rank), timeout_s=HEALTHY_TIMEOUT_S, group=reversed_group
    )
    rotated_group = ctx.group(ctx.world.ranks[1:] + ctx.world.ranks[:1], "rotated")
    rotated = yield AllGather([ctx.rank], timeout_s=HEALTHY_TIMEOUT_S, group=rotated_group)
    return {
        "world": [repr(v) for v in world],
        "reversed": [repr(v) for v in backwards],
        "rotated": [repr(v) for v in rotated],
    }


def scenario_broadcast_each_root(ctx: RankContext) -> Program:
    """Broadcast from every root in turn; a non-root's payload is ignored."""
    received = []
    for root in ctx.world.ranks:
        payload = ("from", root, b"\x00\xff") if ctx.rank == root else ("ignored", ctx.rank)
        value = yield Broadcast(payload, root=root, timeout_s=HEALTHY_TIMEOUT_S)
        received.append(repr(value))
    return {"received": received}


def scenario_barrier_waits(ctx: RankContext) -> Program:
    """A barrier returns only when every member arrived: rank 0 comes late, the others wait."""
    yield Barrier(timeout_s=HEALTHY_TIMEOUT_S)  # line everyone up first
    began_s = yield Now()
    if ctx.rank == 0:
        yield Sleep(BARRIER_DELAY_S)
    result = yield Barrier(timeout_s=HEALTHY_TIMEOUT_S)
    ended_s = yield Now()
    yield Barrier(timeout_s=HEALTHY_TIMEOUT_S)  # and twice in a row
    return {"result": repr(result), "waited_s": ended_s - began_s}


def scenario_payload_limit(ctx: RankContext) -> Program:
    """(e) The limit is on the encoded size: one byte over raises PayloadTooLarge before
    anything is sent; exactly at the limit travels."""
    # The codec encodes bytes as a 1-byte tag, a 4-byte length, then the bytes.
    at_limit = b"x" * (ctx.max_payload_bytes - 5)
    over_limit = b"x" * (ctx.max_payload_bytes - 4)
    outcome: dict[str, Any] = {"max_payload_bytes": ctx.max_payload_bytes}
    try:
        yield Exchange(over_limit, round_id=1, timeout_s=HEALTHY_TIMEOUT_S)
        outcome["over_exchange"] = ["sent"]
    except PayloadTooLarge as exc:
        outcome["over_exchange"] = _error_name(exc)
    try:
        yield AllGather(over_limit, timeout_s=HEALTHY_TIMEOUT_S)
        outcome["over_all_gather"] = ["sent"]
    except PayloadTooLarge as exc:
        outcome["over_all_gather"] = _error_name(exc)
    result = yield Exchange(at_limit, round_id=2, timeout_s=HEALTHY_TIMEOUT_S)
    outcome["at_limit_missing"] = list(result.missing)
    outcome["at_limit_sizes"] = [len(value) for _, value in sorted(result.answers.items())]
    return outcome


def scenario_misuse_errors(ctx: RankContext) -> Program:
    """(f) Misuse raises at once, names the value, sends nothing, and leaves the transport
    usable: a rank outside the world or the group, a bad root, bad timeouts, bad payloads."""
    beyond_world = ctx.group(tuple(range(ctx.size + 1)), "beyond-world")
    without_me = ctx.group(tuple(r for r in ctx.world.ranks if r != ctx.rank), "without-me")
    attempts: list[tuple[str, Any]] = [
        ("exchange_rank_outside_world", Exchange(1, round_id=1, timeout_s=1.0, group=beyond_world)),
        ("all_gather_rank_outside_world", AllGather(1, timeout_s=1.0, group=beyond_world)),
        ("exchange_not_a_member", Exchange(1, round_id=1, timeout_s=1.0, group=without_me)),
        ("barrier_not_a_member", Barrier(timeout_s=1.0, group=without_me)),
        ("broadcast_root_outside", Broadcast(1, root=ctx.size, timeout_s=1.0)),
        ("exchange_negative_timeout", Exchange(1, round_id=1, timeout_s=-1.0)),
        ("barrier_nan_timeout", Barrier(timeout_s=math.nan)),
        ("all_gather_infinite_timeout", AllGather(1, timeout_s=math.inf)),
        ("exchange_unencodable_payload", Exchange(object(), round_id=1, timeout_s=1.0)),
        ("sleep_negative", Sleep(-1.0)),
    ]
    errors: dict[str, list[str]] = {}
    for name, op in attempts:
        try:
            yield op
            errors[name] = ["no error"]
        except Exception as exc:
            errors[name] = _error_name(exc)
    result = yield Exchange(("after", ctx.rank), round_id=2, timeout_s=HEALTHY_TIMEOUT_S)
    return {"errors": errors, "after_missing": list(result.missing)}


def scenario_collective_deadline(ctx: RankContext) -> Program:
    """A member is late for an all_gather: the others get DeadlineExceeded naming it. Defined
    last (the group may be unusable afterwards). The late member then joins, which completes
    the operation in flight; whether it gets the result or a deadline is up to the binding."""
    silent = silent_rank(ctx.size)
    if ctx.rank == silent:
        yield Sleep(SILENT_SLEEP_S)
    began_s = yield Now()
    try:
        values = yield AllGather(("late", ctx.rank), timeout_s=SILENT_TIMEOUT_S)
        outcome: dict[str, Any] = {"outcome": "result", "values": [repr(v) for v in values]}
    except DeadlineExceeded as exc:
        outcome = {"outcome": "DeadlineExceeded", "missing": list(exc.missing)}
    ended_s = yield Now()
    outcome["waited_s"] = ended_s - began_s
    outcome["role"] = "silent" if ctx.rank == silent else "peer"
    return outcome


# ---------------------------------------------------------------------------- checks

Results = list[dict[str, Any]]  # one result dict per rank, indexed by rank


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _expected_answers(ranks: Iterable[int], payload: Callable[[int], Any]) -> list[list[Any]]:
    return [[rank, repr(payload(rank))] for rank in sorted(ranks)]


def _check_waited(rank: int, waited_s: float, deadline_s: float, what: str) -> None:
    _expect(
        deadline_s - EARLY_TOLERANCE_S <= waited_s <= deadline_s + LATE_TOLERANCE_S,
        f"rank {rank}: {what} returned after {waited_s:.3f} s; expected the deadline "
        f"{deadline_s} s (no early return, no hang)",
    )


def check_exchange_all_answer(results: Results, size: int) -> None:
    expected = _expected_answers(range(size), lambda r: evidence(r, 1))
    for rank, got in enumerate(results):
        _expect(got["missing"] == [] and got["complete"], f"rank {rank}: missing {got['missing']}")
        _expect(got["round_id"] == 1, f"rank {rank}: round_id {got['round_id']}")
        _expect(got["answers"] == expected, f"rank {rank}: answers {got['answers']} != {expected}")
        _expect(
            got["by_position"] == [answer for _, answer in expected],
            f"rank {rank}: by_position {got['by_position']}",
        )


def check_exchange_rounds(results: Results, size: int) -> None:
    for rank, got in enumerate(results):
        _expect(len(got["rounds"]) == ROUNDS, f"rank {rank}: {len(got['rounds'])} rounds")
        for index, round_result in enumerate(got["rounds"]):
            round_id = index + 1
            expected = _expected_answers(range(size), lambda r, k=round_id: evidence(r, k))
            _expect(round_result["round_id"] == round_id, f"rank {rank}: {round_result}")
            _expect(round_result["missing"] == [], f"rank {rank} round {round_id}: missing")
            _expect(
                round_result["answers"] == expected,
                f"rank {rank} round {round_id}: answers {round_result['answers']}",
            )


def check_exchange_silent_peer(results: Results, size: int) -> None:
    silent = silent_rank(size)
    _expect(results[silent]["role"] == "silent", f"rank {silent}: {results[silent]}")
    others = [rank for rank in range(size) if rank != silent]
    for rank in others:
        got = results[rank]
        _expect(
            got["missing"] == [silent], f"rank {rank}: missing {got['missing']}, not [{silent}]"
        )
        _expect(got["answered"] == others, f"rank {rank}: answered {got['answered']} != {others}")
        _check_waited(rank, got["waited_s"], SILENT_TIMEOUT_S, "the exchange")


def check_stale_round_ignored(results: Results, size: int) -> None:
    _expect(
        results[0]["round1_missing"] == list(range(1, size)),
        f"rank 0 round 1: missing {results[0]['round1_missing']}",
    )
    expected = _expected_answers(range(size), lambda r: ("round", 2, r))
    for rank, got in enumerate(results):
        _expect(
            got["round2_missing"] == [], f"rank {rank} round 2: missing {got['round2_missing']}"
        )
        _expect(
            got["round2_answers"] == expected,
            f"rank {rank} round 2: answers {got['round2_answers']} (a round-1 answer taken?)",
        )


def check_subgroups_even_odd(results: Results, size: int) -> None:
    for rank, got in enumerate(results):
        members = list(range(rank % 2, size, 2))
        _expect(
            got["group"] == ("even" if rank % 2 == 0 else "odd"), f"rank {rank}: {got['group']}"
        )
        _expect(got["group_ranks"] == members, f"rank {rank}: group {got['group_ranks']}")
        _expect(got["missing"] == [], f"rank {rank}: missing {got['missing']}")
        _expect(
            got["answers"] == _expected_answers(members, lambda r: evidence(r, 5)),
            f"rank {rank}: answers {got['answers']}",
        )
        _expect(
            got["gathered"] == [repr(("gather", r)) for r in members],
            f"rank {rank}: gathered {got['gathered']}",
        )


def check_all_gather_order(results: Results, size: int) -> None:
    world = list(range(size))
    for rank, got in enumerate(results):
        _expect(got["world"] == [repr(("value", r)) for r in world], f"rank {rank}: {got['world']}")
        _expect(
            got["reversed"] == [repr(("value", r)) for r in reversed(world)],
            f"rank {rank}: reversed {got['reversed']}",
        )
        _expect(
            got["rotated"] == [repr([r]) for r in world[1:] + world[:1]],
            f"rank {rank}: rotated {got['rotated']}",
        )


def check_broadcast_each_root(results: Results, size: int) -> None:
    expected = [repr(("from", root, b"\x00\xff")) for root in range(size)]
    for rank, got in enumerate(results):
        _expect(got["received"] == expected, f"rank {rank}: received {got['received']}")


def check_barrier_waits(results: Results, size: int) -> None:
    for rank, got in enumerate(results):
        _expect(got["result"] == repr(None), f"rank {rank}: barrier returned {got['result']}")
        # Rank 0 itself slept the delay; the others waited for it (allowing for the skew with
        # which the first barrier released the ranks).
        _expect(
            got["waited_s"] >= BARRIER_DELAY_S / 2,
            f"rank {rank}: the barrier returned after {got['waited_s']:.3f} s, before rank 0 "
            f"arrived {BARRIER_DELAY_S} s late",
        )
        _expect(got["waited_s"] <= BARRIER_DELAY_S + LATE_TOLERANCE_S, f"rank {rank}: hung")


def check_payload_limit(results: Results, size: int) -> None:
    for rank, got in enumerate(results):
        limit = got["max_payload_bytes"]
        for key in ("over_exchange", "over_all_gather"):
            _expect("PayloadTooLarge" in got[key], f"rank {rank}: {key} gave {got[key]}")
        _expect(
            got["at_limit_missing"] == [],
            f"rank {rank}: at limit missing {got['at_limit_missing']}",
        )
        _expect(
            got["at_limit_sizes"] == [limit - 5] * size,
            f"rank {rank}: at-limit payload sizes {got['at_limit_sizes']}",
        )


MISUSE_EXPECTED = {
    "exchange_rank_outside_world": "GroupError",
    "all_gather_rank_outside_world": "GroupError",
    "exchange_not_a_member": "GroupError",
    "barrier_not_a_member": "GroupError",
    "broadcast_root_outside": "GroupError",
    "exchange_negative_timeout": "ValueError",
    "barrier_nan_timeout": "ValueError",
    "all_gather_infinite_timeout": "ValueError",
    "exchange_unencodable_payload": "TypeError",
    "sleep_negative": "ValueError",
}


def check_misuse_errors(results: Results, size: int) -> None:
    for rank, got in enumerate(results):
        for case, expected in MISUSE_EXPECTED.items():
            _expect(
                expected in got["errors"][case],
                f"rank {rank}: {case} raised {got['errors'][case]}, expected {expected}",
            )
        _expect(got["after_missing"] == [], f"rank {rank}: exchange after misuse: {got}")


def check_collective_deadline(results: Results, size: int) -> None:
    silent = silent_rank(size)
    for rank, got in enumerate(results):
        if rank == silent:
            _expect(got["role"] == "silent", f"rank {rank}: {got}")
            if got["outcome"] == "result":
                _expect(
                    got["values"] == [repr(("late", r)) for r in range(size)],
                    f"late rank {rank}: values {got['values']}",
                )
            else:
                _expect(got["outcome"] == "DeadlineExceeded", f"late rank {rank}: {got}")
            continue
        _expect(
            got["outcome"] == "DeadlineExceeded" and got["missing"] == [silent],
            f"rank {rank}: {got}; expected DeadlineExceeded naming [{silent}]",
        )
        _check_waited(rank, got["waited_s"], SILENT_TIMEOUT_S, "the all_gather")


CHECKS: dict[str, Callable[[Results, int], None]] = {
    "scenario_exchange_all_answer": check_exchange_all_answer,
    "scenario_exchange_rounds": check_exchange_rounds,
    "scenario_exchange_silent_peer": check_exchange_silent_peer,
    "scenario_stale_round_ignored": check_stale_round_ignored,
    "scenario_subgroups_even_odd": check_subgroups_even_odd,
    "scenario_all_gather_order": check_all_gather_order,
    "scenario_broadcast_each_root": check_broadcast_each_root,
    "scenario_barrier_waits": check_barrier_waits,
    "scenario_payload_limit": check_payload_limit,
    "scenario_misuse_errors": check_misuse_errors,
    "scenario_collective_deadline": check_collective_deadline,
}

# In definition order, which is also the order real bindings run them (collective deadline last).
SCENARIOS: dict[str, Callable[[RankContext], Program]] = {
    name: value for name, value in globals().items() if name.startswith("scenario_")
}
assert list(SCENARIOS) == list(CHECKS), "every scenario needs its check, in the same order"


def check_scenario(name: str, results: Results, size: int) -> None:
    """Assert the contract on the per-rank ``results`` of scenario ``name`` at ``size`` ranks."""
    _expect(len(results) == size, f"{name}: {len(results)} results for {size} ranks")
    CHECKS[name](results, size)
