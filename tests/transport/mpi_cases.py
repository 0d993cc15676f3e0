"""MPI-specific cases (run by mpi_worker.py under mpiexec; checked by test_conformance_mpi.py).

mpi4py is imported inside the run functions only, so that pytest can import the checks
without initializing MPI in its own process.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scout.transport._binding import Op, Stream, group_key, pack_frame
from scout.transport.base import DeadlineExceeded
from tests.transport import binding_cases as cases

if TYPE_CHECKING:
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport

LONG_TIMEOUT_S = cases.LONG_TIMEOUT_S
SHORT_TIMEOUT_S = cases.SHORT_TIMEOUT_S


def _wait_request(request: MPI.Request, timeout_s: float, status: MPI.Status | None = None) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not request.Test(status):
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.0005)
    return True


def run_user_traffic_isolated(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """A user message on the user's communicator, with scout's own tag, never reaches scout."""
    from mpi4py import MPI

    from scout.transport.mpi.transport import FRAME_TAG

    world = MPI.COMM_WORLD
    before = cases.stats_of(t)
    send = world.Isend([b"user %d" % t.rank, MPI.BYTE], (t.rank + 1) % t.size, FRAME_TAG)
    result = t.exchange("evidence", round_id=1100, timeout_s=LONG_TIMEOUT_S)
    buffer = bytearray(32)
    status = MPI.Status()
    received = _wait_request(
        world.Irecv([buffer, MPI.BYTE], MPI.ANY_SOURCE, MPI.ANY_TAG), LONG_TIMEOUT_S, status
    )
    sent = _wait_request(send, LONG_TIMEOUT_S)
    return {
        "missing": list(result.missing),
        "user_message": bytes(buffer[: status.Get_count(MPI.BYTE)]).decode() if received else "",
        "sent": sent,
        "delta": cases._delta(before, cases.stats_of(t)),
    }


def check_user_traffic_isolated(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for rank, r in enumerate(results):
        assert r["missing"] == []
        assert r["user_message"] == f"user {(rank - 1) % size}"
        assert r["sent"]
        assert r["delta"]["undecodable_dropped"] == 0


def run_early_answer_kept(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """Rank 0 finishes round 1200 early and answers 1201 while the others still wait in 1200:
    that early answer is kept for 1201, not dropped."""
    silent = t.size - 1
    before = cases.stats_of(t)
    out: dict[str, Any] = {}
    if t.rank == silent:
        time.sleep(cases.SILENT_SLEEP_S)
    else:
        timeout_s = 0.1 if t.rank == 0 else 0.5
        out["missing_1200"] = list(t.exchange(1200, round_id=1200, timeout_s=timeout_s).missing)
    result = t.exchange(1201, round_id=1201, timeout_s=LONG_TIMEOUT_S)
    out["missing_1201"] = list(result.missing)
    out["delta"] = cases._delta(before, cases.stats_of(t))
    return out


def check_early_answer_kept(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    silent = size - 1
    for rank, r in enumerate(results):
        assert r["missing_1201"] == []
        if rank == silent:
            # It never reached round 1200, so what the others sent it for 1200 was left over:
            # the leader's table (relayed exchange), plus a direct record from any member that
            # had no table by its fallback time on a loaded machine.
            assert 1 <= r["delta"]["late_or_wrong_round_dropped"] <= size - 1, r["delta"]
        else:
            assert r["missing_1200"] == [silent]
            assert r["delta"]["late_or_wrong_round_dropped"] == 0, "an early answer was lost"


def run_split_communicator(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport

    world_rank = MPI.COMM_WORLD.Get_rank()
    split = MPI.COMM_WORLD.Split(world_rank % 2, world_rank)
    sub = MpiTransport(split)
    try:
        result = sub.exchange(world_rank, round_id=1, timeout_s=LONG_TIMEOUT_S)
        gathered = sub.all_gather(world_rank, timeout_s=LONG_TIMEOUT_S)
        return {
            "rank": sub.rank,
            "size": sub.size,
            "answers": result.by_position(None),
            "gathered": gathered,
        }
    finally:
        sub.close()
        split.Free()


def check_split_communicator(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for world_rank, r in enumerate(results):
        members = [p for p in range(size) if p % 2 == world_rank % 2]
        assert r["rank"] == world_rank // 2
        assert r["size"] == len(members)
        assert r["answers"] == members, "ranks are those of the split communicator"
        assert r["gathered"] == members


def run_fast_path(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    import numpy as np

    gathered = t.all_gather_into(bytes([t.rank]) * 5, timeout_s=LONG_TIMEOUT_S)
    send = np.full(3, t.rank, dtype=np.int64)
    recv = np.zeros(3 * t.size, dtype=np.int64)
    returned = t.all_gather_into(send, recv, timeout_s=LONG_TIMEOUT_S)
    empty = t.all_gather_into(b"", timeout_s=LONG_TIMEOUT_S)
    sub = t.group([t.rank], "alone")
    return {
        "bytes": bytes(gathered).hex(),
        "array": recv.tolist(),
        "same_object": returned is recv,
        "empty": len(empty),
        "wrong_size": cases._error_name(
            lambda: t.all_gather_into(b"ab", bytearray(3), timeout_s=1)
        ),
        "read_only": cases._error_name(lambda: t.all_gather_into(b"a", b"x" * t.size, timeout_s=1)),
        "subgroup": cases._error_name(lambda: t.all_gather_into(b"a", timeout_s=1, group=sub)),
        "bad_timeout": cases._error_name(lambda: t.all_gather_into(b"a", timeout_s=-1)),
    }


def check_fast_path(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for r in results:
        assert r["bytes"] == b"".join(bytes([p]) * 5 for p in range(size)).hex()
        assert r["array"] == [p for p in range(size) for _ in range(3)]
        assert r["same_object"] and r["empty"] == 0
        assert r["wrong_size"] == "ValueError"
        assert r["read_only"] == "ValueError"
        assert r["subgroup"] == "GroupError"
        assert r["bad_timeout"] == "ValueError"


def run_fast_path_silent_peer(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """A deadline in the fast path names the absent rank, then that path refuses to run
    (its collective is still in flight) while the exchange keeps working."""
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport

    fast = MpiTransport(MPI.COMM_WORLD)
    silent = fast.size - 1
    out: dict[str, Any] = {}
    try:
        if fast.rank == silent:
            time.sleep(cases.SILENT_SLEEP_S)
            out["late"] = bytes(
                fast.all_gather_into(bytes([fast.rank]), timeout_s=LONG_TIMEOUT_S)
            ).hex()
        else:
            start_s = time.monotonic()
            try:
                fast.all_gather_into(bytes([fast.rank]), timeout_s=SHORT_TIMEOUT_S)
            except DeadlineExceeded as exc:
                out["missing"] = list(exc.missing)
            out["elapsed_s"] = time.monotonic() - start_s
            out["after"] = cases._error_name(lambda: fast.all_gather_into(b"x", timeout_s=1))
        out["exchange_missing"] = list(
            fast.exchange(fast.rank, round_id=1, timeout_s=LONG_TIMEOUT_S).missing
        )
    finally:
        fast.close()
    return out


def check_fast_path_silent_peer(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    silent = size - 1
    for rank, r in enumerate(results):
        if rank == silent:
            assert r["late"] == bytes(range(size)).hex(), "the late rank completes the collective"
        else:
            assert r["missing"] == [silent]
            cases._assert_deadline_kept(r["elapsed_s"], SHORT_TIMEOUT_S, "all_gather_into")
            assert r["after"] == "TransportError"
        assert r["exchange_missing"] == []


def run_mailbox_bounded(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """Answers for future rounds wait in a bounded mailbox; overflow is dropped and counted."""
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport
    from scout.transport.mpi.transport import FRAME_TAG

    small = MpiTransport(MPI.COMM_WORLD, max_stashed_messages=8)
    pair = small.group([0, 1], "pair")
    out: dict[str, Any] = {}
    try:
        if small.rank == 0:
            for index in range(50):
                frame = pack_frame(
                    Stream.EXCHANGE, Op.EXCHANGE, group_key(small.world), 5000 + index, 0, b"N"
                )
                small.comm.Send([frame, MPI.BYTE], 1, FRAME_TAG)
            small.exchange("done", round_id=1, timeout_s=LONG_TIMEOUT_S, group=pair)
        elif small.rank == 1:
            before = cases.stats_of(small)
            # MPI keeps the order of one sender's messages: "done" comes after all 50.
            done = small.exchange("done", round_id=1, timeout_s=LONG_TIMEOUT_S, group=pair)
            out["done_missing"] = list(done.missing)
            out["delta"] = cases._delta(before, cases.stats_of(small))
            held = small.exchange(None, round_id=5049, timeout_s=0.0)
            out["held_answers"] = sorted(held.answers)
    finally:
        small.close()
    return out


def check_mailbox_bounded(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    r = results[1]
    assert r["done_missing"] == []
    # 51 frames through a mailbox of 8: the 43 oldest are evicted and counted on arrival.
    assert r["delta"]["late_or_wrong_round_dropped"] == 43, r["delta"]
    assert 0 in r["held_answers"], "round 5049 was among the newest 8 and must still be held"


# -- relayed exchange (groups of 3 or more) ------------------------------------------------------

RELAY_ROUNDS = 5


def _count_posts(t: MpiTransport) -> list[int]:
    """Wrap the binding's _post so that every frame it sends is counted."""
    counter = [0]
    original = t._post

    def counting(stream: Any, number: int, group: Any, frame: bytes, targets: Any) -> None:
        counter[0] += len(targets)
        original(stream, number, group, frame, targets)

    t._post = counting  # type: ignore[method-assign]
    return counter


def run_relay_frames_per_round(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """Healthy rounds of a relayed exchange send O(n) frames: n-1 records up, n-1 tables down."""
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport

    fresh = MpiTransport(MPI.COMM_WORLD)
    counter = _count_posts(fresh)
    missing = []
    try:
        for index in range(RELAY_ROUNDS):
            result = fresh.exchange(("r", fresh.rank, index), round_id=700 + index, timeout_s=LONG_TIMEOUT_S)
            missing.append(list(result.missing))
            assert result.answers[(fresh.rank + 1) % fresh.size] == ("r", (fresh.rank + 1) % fresh.size, index)
        fresh.barrier(timeout_s=LONG_TIMEOUT_S)
        frames = counter[0] - (fresh.size - 1)  # the barrier's own frames
    finally:
        fresh.close()
    return {"missing": missing, "frames": frames}


def check_relay_frames_per_round(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    assert all(r["missing"] == [[]] * RELAY_ROUNDS for r in results), results
    total = sum(r["frames"] for r in results)
    # 2(n-1) per round for n >= 3, against n(n-1) for direct messages to every peer.
    expected = 2 * (size - 1) * RELAY_ROUNDS if size >= 3 else size * (size - 1) * RELAY_ROUNDS
    assert total == expected, f"{total} frames in {RELAY_ROUNDS} rounds of {size} ranks, not {expected}"


def run_relay_silent_leader(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """The round's leader is silent: the others still exchange among themselves directly and
    return at their deadline naming only the leader."""
    silent = t.size - 1
    round_id = 10 * t.size + silent  # group.ranks[round_id % n] == silent: the leader
    out: dict[str, Any] = {}
    if t.rank == silent:
        time.sleep(cases.SILENT_SLEEP_S)
    else:
        started = time.monotonic()
        result = t.exchange(("here", t.rank), round_id=round_id, timeout_s=SHORT_TIMEOUT_S)
        out["elapsed_s"] = time.monotonic() - started
        out["missing"] = list(result.missing)
        out["answered"] = sorted(result.answers)
    t.barrier(timeout_s=LONG_TIMEOUT_S)
    return out


def check_relay_silent_leader(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    silent = size - 1
    for rank, r in enumerate(results[:silent]):
        assert r["missing"] == [silent], f"rank {rank}: {r}"
        assert r["answered"] == list(range(silent)), f"rank {rank}: {r}"
        cases._assert_deadline_kept(r["elapsed_s"], SHORT_TIMEOUT_S, "exchange")


def run_relay_member_late_for_the_table(t: MpiTransport, hooks: Any) -> dict[str, Any]:
    """A member arrives after the leader sent its table but before the others' deadline: it
    sends its record directly, so every member still has every answer."""
    late = 1
    timeout_s = 4 * SHORT_TIMEOUT_S
    round_id = 20 * t.size  # leader: rank 0
    if t.rank == late:
        time.sleep(0.75 * timeout_s)  # past the leader's table (half the timeout), before the end
    result = t.exchange(("x", t.rank), round_id=round_id, timeout_s=timeout_s)
    t.barrier(timeout_s=LONG_TIMEOUT_S)
    return {"missing": list(result.missing), "answers": sorted(result.answers)}


def check_relay_member_late_for_the_table(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for rank, r in enumerate(results):
        assert r["missing"] == [] and r["answers"] == list(range(size)), f"rank {rank}: {r}"


MPI_CASES: dict[str, cases.Case] = {
    case.name: case
    for case in (
        cases.Case(
            "mpi_user_traffic_isolated", run_user_traffic_isolated, check_user_traffic_isolated
        ),
        cases.Case("mpi_early_answer_kept", run_early_answer_kept, check_early_answer_kept, 3),
        cases.Case("mpi_split_communicator", run_split_communicator, check_split_communicator),
        cases.Case("mpi_fast_path", run_fast_path, check_fast_path),
        cases.Case(
            "mpi_fast_path_silent_peer", run_fast_path_silent_peer, check_fast_path_silent_peer, 2
        ),
        cases.Case("mpi_mailbox_bounded", run_mailbox_bounded, check_mailbox_bounded, 2),
        cases.Case("mpi_relay_frames_per_round", run_relay_frames_per_round, check_relay_frames_per_round),
        cases.Case("mpi_relay_silent_leader", run_relay_silent_leader, check_relay_silent_leader, 3),
        cases.Case(
            "mpi_relay_member_late_for_the_table",
            run_relay_member_late_for_the_table,
            check_relay_member_late_for_the_table,
            3,
        ),
    )
}
