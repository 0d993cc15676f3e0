"""Cases that every real binding (MPI, torch.distributed) must pass, run on real processes.

Pytest-free on purpose: a worker process (``mpi_worker.py`` under ``mpiexec``, ``torch_worker.py``
forking gloo ranks, ``tests/gpu/gpu_worker.py`` under ``torchrun``) runs every case on every rank
and writes what happened as JSON; the pytest files then call the matching ``check_*`` on the
list of per-rank results. A case is ``run(transport, hooks) -> dict`` (JSON values only) and a
check is ``check(results, size, binding)`` that raises AssertionError.

Round ids of the world group increase from case to case (100, 200, ...): a binding may treat an
answer for a round below the current one as late (the MPI binding does).

Timing: a silent peer sleeps ``SILENT_SLEEP_S`` while the others wait ``SHORT_TIMEOUT_S``; every
wait a case makes is bounded, so a broken binding fails the case instead of hanging the worker.
The guarantee numbers (G1..G5) refer to the list in ``scout/transport/base.py``.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from scout.transport.base import (
    DeadlineExceeded,
    Group,
    PayloadTooLarge,
    Transport,
)

SHORT_TIMEOUT_S = 0.3
SILENT_SLEEP_S = 0.7
LONG_TIMEOUT_S = 10.0
SYNC_TIMEOUT_S = 10.0
# How far past its deadline a call may return on a loaded 2-core CI machine.
DEADLINE_SLACK_S = 2.0


class Hooks(Protocol):
    """What a case needs from its binding beyond the Transport protocol."""

    binding: str

    def inject(self, transport: Transport, group: Group, round_id: int, kind: str) -> None:
        """Make every peer see, for exchange ``round_id`` on ``group``, a bad answer from this
        rank: ``kind`` is "garbage" (bytes that are no frame) or "wrong_round" (a well-formed
        answer numbered ``round_id - 1``)."""

    def cleanup_injected(self, transport: Transport) -> None:
        """Remove whatever inject() left behind (store keys); no-op where nothing stays."""

    def fresh_transport(self) -> Any:
        """Another transport over the same ranks (collective where the binding's setup is)."""


@attrs.frozen
class Case:
    name: str
    run: Callable[[Any, Hooks], dict[str, Any]]
    check: Callable[[list[dict[str, Any]], int, str], None]
    min_size: int = 1


def stats_of(transport: Any) -> dict[str, int]:
    return attrs.asdict(transport.stats)


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def _error_name(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return "no error"


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start_s = time.monotonic()
    value = call()
    return value, time.monotonic() - start_s


def _assert_deadline_kept(elapsed_s: float, timeout_s: float, what: str) -> None:
    assert elapsed_s >= timeout_s * 0.95, f"{what} returned after {elapsed_s:.3f}s < {timeout_s}s"
    assert elapsed_s <= timeout_s + DEADLINE_SLACK_S, (
        f"{what} returned {elapsed_s:.3f}s after it started; deadline was {timeout_s}s"
    )


def _no_errors(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank} raised:\n{result['error']}"


# -- G2: the exchange --------------------------------------------------------------------------


def run_exchange_everyone(t: Any, hooks: Hooks) -> dict[str, Any]:
    payload = {"rank": t.rank, "blob": bytes([t.rank]) * 3, "pair": (t.rank, -t.rank)}
    result = t.exchange(payload, round_id=100, timeout_s=LONG_TIMEOUT_S)
    answers = result.by_position(None)
    return {
        "missing": list(result.missing),
        "ranks": [a["rank"] for a in answers],
        "blobs_ok": all(a["blob"] == bytes([a["rank"]]) * 3 for a in answers),
        "pairs_ok": all(a["pair"] == (a["rank"], -a["rank"]) for a in answers),
        "round_id": result.round_id,
        "is_transport": isinstance(t, Transport),
    }


def check_exchange_everyone(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        assert r["missing"] == []
        assert r["ranks"] == list(range(size))
        assert r["blobs_ok"] and r["pairs_ok"], "payload types did not survive the wire"
        assert r["round_id"] == 100
        assert r["is_transport"], "the binding must satisfy the Transport protocol"


def run_exchange_silent_peer(t: Any, hooks: Hooks) -> dict[str, Any]:
    """The last rank answers round 200 only after the others' deadline (G1, G2)."""
    silent = t.size - 1
    before = stats_of(t)
    out: dict[str, Any] = {}
    if t.rank == silent:
        time.sleep(SILENT_SLEEP_S)
        late = t.exchange("late", round_id=200, timeout_s=0.0)
        out["late_missing"] = list(late.missing)
    else:
        result, elapsed_s = _timed(
            lambda: t.exchange("on time", round_id=200, timeout_s=SHORT_TIMEOUT_S)
        )
        out["missing"] = list(result.missing)
        out["answered"] = sorted(result.answers)
        out["elapsed_s"] = elapsed_s
    t.barrier(timeout_s=SYNC_TIMEOUT_S)
    after_round = t.exchange(t.rank, round_id=201, timeout_s=LONG_TIMEOUT_S)
    out["next_round_missing"] = list(after_round.missing)
    out["next_round_answers"] = after_round.by_position(None)
    out["delta"] = _delta(before, stats_of(t))
    return out


def check_exchange_silent_peer(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    silent = size - 1
    for rank, r in enumerate(results):
        if rank == silent:
            # Every peer had answered long before; a zero timeout still takes their answers.
            assert r["late_missing"] == []
        else:
            assert r["missing"] == [silent]
            assert r["answered"] == [p for p in range(size) if p != silent]
            _assert_deadline_kept(r["elapsed_s"], SHORT_TIMEOUT_S, "exchange with a silent peer")
            if binding == "mpi":
                # The silent rank's round-200 answer reached them after round 200 closed.
                assert r["delta"]["late_or_wrong_round_dropped"] >= 1, r["delta"]
        assert r["next_round_missing"] == [], "a late peer must not spoil the next round"
        assert r["next_round_answers"] == list(range(size))
        assert r["delta"]["undecodable_dropped"] == 0


def _run_bad_answer(t: Any, hooks: Hooks, round_id: int, kind: str) -> dict[str, Any]:
    bad = 1
    before = stats_of(t)
    out: dict[str, Any] = {}
    if t.rank == bad:
        hooks.inject(t, t.world, round_id, kind)
    else:
        result = t.exchange("fine", round_id=round_id, timeout_s=SHORT_TIMEOUT_S)
        out["missing"] = list(result.missing)
        out["answers"] = {str(k): v for k, v in sorted(result.answers.items())}
    t.barrier(timeout_s=SYNC_TIMEOUT_S)
    if t.rank == bad:
        hooks.cleanup_injected(t)
    out["delta"] = _delta(before, stats_of(t))
    return out


def run_exchange_garbage(t: Any, hooks: Hooks) -> dict[str, Any]:
    """Rank 1 answers round 300 with bytes that are not a frame (G2: dropped and counted)."""
    return _run_bad_answer(t, hooks, 300, "garbage")


def check_exchange_garbage(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for rank, r in enumerate(results):
        if rank == 1:
            continue
        assert r["missing"] == [1], "garbage is not an answer"
        assert r["answers"] == {str(p): "fine" for p in range(size) if p != 1}
        assert r["delta"]["undecodable_dropped"] >= 1, r["delta"]


def run_exchange_wrong_round(t: Any, hooks: Hooks) -> dict[str, Any]:
    """Rank 1 answers round 400 with a well-formed answer for round 399 (G2)."""
    return _run_bad_answer(t, hooks, 400, "wrong_round")


def check_exchange_wrong_round(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for rank, r in enumerate(results):
        if rank == 1:
            continue
        assert r["missing"] == [1], "an answer for another round is not an answer"
        assert r["delta"]["late_or_wrong_round_dropped"] >= 1, r["delta"]
        assert r["delta"]["undecodable_dropped"] == 0, r["delta"]


def run_exchange_zero_timeout(t: Any, hooks: Hooks) -> dict[str, Any]:
    result, elapsed_s = _timed(lambda: t.exchange("now", round_id=500, timeout_s=0))
    t.barrier(timeout_s=SYNC_TIMEOUT_S)
    return {"own": result.answers.get(t.rank), "elapsed_s": elapsed_s}


def check_exchange_zero_timeout(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        assert r["own"] == "now"
        assert r["elapsed_s"] < DEADLINE_SLACK_S


# -- G3: collectives ---------------------------------------------------------------------------


_MIXED = [None, True, 3, -2.5, "text", b"\x00\xff", (1, 2), [3, [4]], {"k": (5,)}, 2**70]


def run_collectives_everyone(t: Any, hooks: Hooks) -> dict[str, Any]:
    mine = _MIXED[t.rank % len(_MIXED)]
    gathered = t.all_gather(mine, timeout_s=LONG_TIMEOUT_S)
    broadcasts = [
        t.broadcast(
            ("from", root) if t.rank == root else "ignored", root=root, timeout_s=LONG_TIMEOUT_S
        )
        for root in range(t.size)
    ]
    t.barrier(timeout_s=LONG_TIMEOUT_S)
    return {
        "gathered_ok": gathered == [_MIXED[p % len(_MIXED)] for p in range(t.size)],
        "broadcasts_ok": broadcasts == [("from", root) for root in range(t.size)],
    }


def check_collectives_everyone(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        assert r["gathered_ok"], "all_gather lost, reordered or changed a payload"
        assert r["broadcasts_ok"], "broadcast did not deliver the root's payload"


def run_collective_silent_peer(t: Any, hooks: Hooks) -> dict[str, Any]:
    """The last rank enters each collective after the others' deadline (G1, G3)."""
    silent = t.size - 1
    out: dict[str, Any] = {}
    calls: dict[str, Callable[[float], Any]] = {
        "all_gather": lambda timeout_s: t.all_gather(t.rank, timeout_s=timeout_s),
        "barrier": lambda timeout_s: t.barrier(timeout_s=timeout_s),
        "broadcast": lambda timeout_s: t.broadcast("root says", root=0, timeout_s=timeout_s),
    }
    for index, (name, call) in enumerate(calls.items()):
        if t.rank == silent:
            time.sleep(SILENT_SLEEP_S)
            out[f"{name}_late"] = call(LONG_TIMEOUT_S)
        else:
            start_s = time.monotonic()
            try:
                out[f"{name}_value"] = call(SHORT_TIMEOUT_S)
            except DeadlineExceeded as exc:
                out[f"{name}_missing"] = list(exc.missing)
            out[f"{name}_elapsed_s"] = time.monotonic() - start_s
        t.exchange(None, round_id=600 + index, timeout_s=LONG_TIMEOUT_S)  # regroup
    out["after"] = t.all_gather(t.rank * 2, timeout_s=LONG_TIMEOUT_S)
    return out


def check_collective_silent_peer(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    silent = size - 1
    for rank, r in enumerate(results):
        if rank == silent:
            # The late member finds every piece waiting and completes.
            assert r["all_gather_late"] == list(range(size))
            assert r["broadcast_late"] == "root says"
        else:
            assert r["all_gather_missing"] == [silent]
            _assert_deadline_kept(r["all_gather_elapsed_s"], SHORT_TIMEOUT_S, "all_gather")
            assert r["barrier_missing"] == [silent]
            _assert_deadline_kept(r["barrier_elapsed_s"], SHORT_TIMEOUT_S, "barrier")
            # Every member waits for every other (all or nothing), the root included.
            assert r["broadcast_missing"] == [silent]
            _assert_deadline_kept(r["broadcast_elapsed_s"], SHORT_TIMEOUT_S, "broadcast")
        assert r["after"] == [2 * p for p in range(size)], "collectives must work again"


def run_subgroups(t: Any, hooks: Hooks) -> dict[str, Any]:
    parity = t.group([r for r in range(t.size) if r % 2 == t.rank % 2], f"parity{t.rank % 2}")
    reverse = t.group(list(reversed(range(t.size))), "reversed")
    exchanged = t.exchange(t.rank, round_id=700, timeout_s=LONG_TIMEOUT_S, group=parity)
    gathered = t.all_gather(t.rank * 7, timeout_s=LONG_TIMEOUT_S, group=parity)
    root = parity.ranks[-1]
    received = t.broadcast(f"root {t.rank}", root=root, timeout_s=LONG_TIMEOUT_S, group=parity)
    t.barrier(timeout_s=LONG_TIMEOUT_S, group=parity)
    reversed_gather = t.all_gather(t.rank, timeout_s=LONG_TIMEOUT_S, group=reverse)
    reversed_exchange = t.exchange(t.rank, round_id=701, timeout_s=LONG_TIMEOUT_S, group=reverse)
    return {
        "members": list(parity.ranks),
        "exchanged": sorted(exchanged.answers),
        "exchange_missing": list(exchanged.missing),
        "gathered": gathered,
        "received": received,
        "root": root,
        "reversed_gather": reversed_gather,
        "reversed_exchange": reversed_exchange.by_position(None),
    }


def check_subgroups(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for rank, r in enumerate(results):
        members = [p for p in range(size) if p % 2 == rank % 2]
        assert r["members"] == members
        assert r["exchanged"] == members, "a subgroup exchange must hear its members only"
        assert r["exchange_missing"] == []
        assert r["gathered"] == [7 * p for p in members]
        assert r["received"] == f"root {members[-1]}"
        assert r["reversed_gather"] == list(reversed(range(size))), "order is peer position"
        assert r["reversed_exchange"] == list(reversed(range(size)))


# -- G4, G5: limits and misuse -----------------------------------------------------------------


def run_payload_over_limit(t: Any, hooks: Hooks) -> dict[str, Any]:
    limit = t.max_payload_bytes
    before = stats_of(t)
    too_big = b"x" * (limit - 4)  # bytes encode to 5 + len: one byte over the limit
    exactly = b"y" * (limit - 5)
    errors = {
        "exchange": _error_name(lambda: t.exchange(too_big, round_id=800, timeout_s=1)),
        "all_gather": _error_name(lambda: t.all_gather(too_big, timeout_s=1)),
        "broadcast": _error_name(lambda: t.broadcast(too_big, root=t.rank, timeout_s=1)),
    }
    message = ""
    try:
        t.exchange(too_big, round_id=800, timeout_s=1)
    except PayloadTooLarge as exc:
        message = str(exc)
    # Nothing was sent, so round 800 with a payload exactly at the limit is clean.
    result = t.exchange(exactly, round_id=800, timeout_s=LONG_TIMEOUT_S)
    return {
        "errors": errors,
        "message_names_sizes": str(limit - 4 + 5) in message and str(limit) in message,
        "missing": list(result.missing),
        "sizes": sorted(len(v) for v in result.answers.values()),
        "delta": _delta(before, stats_of(t)),
        "limit": limit,
    }


def check_payload_over_limit(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        assert r["errors"] == {
            "exchange": "PayloadTooLarge",
            "all_gather": "PayloadTooLarge",
            "broadcast": "PayloadTooLarge",
        }
        assert r["message_names_sizes"], "the error must name the encoded size and the limit"
        assert r["missing"] == []
        assert r["sizes"] == [r["limit"] - 5] * size
        assert r["delta"]["late_or_wrong_round_dropped"] == 0
        assert r["delta"]["undecodable_dropped"] == 0


def run_wrong_group(t: Any, hooks: Hooks) -> dict[str, Any]:
    others = tuple(r for r in range(t.size) if r != t.rank) or (t.rank + 1,)
    foreign = Group((0, t.size + 3), "foreign")
    return {
        "rank_outside_world": _error_name(lambda: t.group([t.size], "too far")),
        "negative_rank": _error_name(lambda: t.group([-1], "negative")),
        "not_a_member": _error_name(
            lambda: t.exchange(1, round_id=1, timeout_s=1, group=Group(others, "others"))
        ),
        "other_transport": _error_name(lambda: t.all_gather(1, timeout_s=1, group=foreign)),
        "not_a_group": _error_name(lambda: t.barrier(timeout_s=1, group="world")),
        "root_outside": _error_name(lambda: t.broadcast(1, root=t.size + 1, timeout_s=1)),
        "message": _message(lambda: t.group([t.size], "too far")),
    }


def _message(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as exc:
        return str(exc)
    return ""


def check_wrong_group(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        for key in (
            "rank_outside_world",
            "negative_rank",
            "not_a_member",
            "other_transport",
            "not_a_group",
            "root_outside",
        ):
            assert r[key] == "GroupError", (key, r[key])
        assert str(size) in r["message"], "the error must name the offending rank"


def run_bad_timeouts(t: Any, hooks: Hooks) -> dict[str, Any]:
    before = stats_of(t)
    calls: dict[str, Callable[[Any], Any]] = {
        "exchange": lambda s: t.exchange(1, round_id=900, timeout_s=s),
        "all_gather": lambda s: t.all_gather(1, timeout_s=s),
        "broadcast": lambda s: t.broadcast(1, root=0, timeout_s=s),
        "barrier": lambda s: t.barrier(timeout_s=s),
    }
    bad_values = {"-1": -1, "-0.001": -0.001, "nan": math.nan, "inf": math.inf}
    errors = {
        f"{name}({label})": _error_name(lambda c=call, v=value: c(v))
        for name, call in calls.items()
        for label, value in bad_values.items()
    }
    errors.update(
        {f"{name}('1')": _error_name(lambda c=call: c("1")) for name, call in calls.items()}
    )
    message = _message(lambda: t.exchange(1, round_id=900, timeout_s=-1))
    # Nothing was sent and no collective was counted: both still line up.
    result = t.exchange(2, round_id=900, timeout_s=LONG_TIMEOUT_S)
    gathered = t.all_gather(t.rank, timeout_s=LONG_TIMEOUT_S)
    return {
        "errors": errors,
        "message": message,
        "missing": list(result.missing),
        "gathered": gathered,
        "delta": _delta(before, stats_of(t)),
    }


def check_bad_timeouts(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        for call, error in r["errors"].items():
            expected = "TypeError" if call.endswith("('1')") else "ValueError"
            assert error == expected, (call, error)
        assert "-1" in r["message"] and "timeout_s" in r["message"]
        assert r["missing"] == []
        assert r["gathered"] == list(range(size))
        assert r["delta"]["late_or_wrong_round_dropped"] == 0


def run_use_after_close(t: Any, hooks: Hooks) -> dict[str, Any]:
    other = hooks.fresh_transport()
    other.close()
    other.close()  # idempotent
    calls: dict[str, Callable[[], Any]] = {
        "exchange": lambda: other.exchange(1, round_id=1, timeout_s=1),
        "all_gather": lambda: other.all_gather(1, timeout_s=1),
        "broadcast": lambda: other.broadcast(1, root=0, timeout_s=1),
        "barrier": lambda: other.barrier(timeout_s=1),
        "group": lambda: other.group([0], "g"),
        "bad_timeout_after_close": lambda: other.exchange(1, round_id=1, timeout_s=-1),
    }
    errors = {name: _error_name(call) for name, call in calls.items()}
    # Closing one transport leaves the other working.
    result = t.exchange("still here", round_id=1000, timeout_s=LONG_TIMEOUT_S)
    return {"errors": errors, "missing": list(result.missing)}


def check_use_after_close(results: list[dict[str, Any]], size: int, binding: str) -> None:
    _no_errors(results)
    for r in results:
        assert set(r["errors"].values()) == {"TransportClosed"}, r["errors"]
        assert r["missing"] == []


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case("exchange_everyone", run_exchange_everyone, check_exchange_everyone),
        Case("exchange_silent_peer", run_exchange_silent_peer, check_exchange_silent_peer, 2),
        Case("exchange_garbage", run_exchange_garbage, check_exchange_garbage, 2),
        Case("exchange_wrong_round", run_exchange_wrong_round, check_exchange_wrong_round, 2),
        Case("exchange_zero_timeout", run_exchange_zero_timeout, check_exchange_zero_timeout),
        Case("collectives_everyone", run_collectives_everyone, check_collectives_everyone),
        Case(
            "collective_silent_peer",
            run_collective_silent_peer,
            check_collective_silent_peer,
            2,
        ),
        Case("subgroups", run_subgroups, check_subgroups),
        Case("payload_over_limit", run_payload_over_limit, check_payload_over_limit),
        Case("wrong_group", run_wrong_group, check_wrong_group),
        Case("bad_timeouts", run_bad_timeouts, check_bad_timeouts),
        Case("use_after_close", run_use_after_close, check_use_after_close),
    )
}


def run_cases(
    transport: Any, hooks: Hooks, cases: dict[str, Case], *, sync: bool = True
) -> dict[str, dict[str, Any]]:
    """Run ``cases`` in order on this rank; a case that raises records its traceback.

    Between cases every rank meets at a barrier (bounded); if that fails the ranks no longer
    agree on where they are, so the remaining cases are recorded as not run.
    """
    results: dict[str, dict[str, Any]] = {}
    aborted = ""
    for name, case in cases.items():
        if aborted:
            results[name] = {"error": f"not run: {aborted}"}
            continue
        if transport.size < case.min_size:
            results[name] = {"skipped": f"needs {case.min_size} ranks"}
            continue
        try:
            results[name] = case.run(transport, hooks)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
        if sync:
            try:
                transport.barrier(timeout_s=SYNC_TIMEOUT_S)
            except Exception as exc:
                aborted = f"the barrier after case {name!r} failed: {exc}"
    return results


def check_case(name: str, per_rank: list[dict[str, Any]], size: int, binding: str) -> None:
    """Assert case ``name`` on the per-rank results (skips are honoured by the caller)."""
    CASES[name].check(per_rank, size, binding)
