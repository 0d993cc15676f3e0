"""Replay on 4 real CPU processes (gloo, DDP, a tiny transformer with dropout).

Each test launches ``tests/replay/_launch.py``: one torch import, four forked ranks, every
wait bounded (a rank that runs past its deadline is killed and named). Faults come from
``scout.replay.faults``. Peer positions equal ranks here (the replay group is the world).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests import processes

REPO = Path(__file__).resolve().parents[2]
WORLD = 4
pytestmark = pytest.mark.torchdist

EVERY_CLASS = {"embedding_steps": 3, "hidden_steps": 1, "output_steps": 3, "optimizer_steps": 2}
HEALTHY_STEPS = int(os.environ.get("SCOUT_TEST_HEALTHY_STEPS", "12"))


def run(
    tmp_path: Path,
    timeout_s: float = 240,
    same_results: bool = True,
    scenario: str = "train",
    world: int = WORLD,
    **kwargs: Any,
) -> dict[int, dict[str, Any]]:
    out = tmp_path / "ranks.json"
    environment = dict(os.environ, OMP_NUM_THREADS="1", SCOUT_TEST_RANK_DEADLINE_S=str(timeout_s))
    completed = processes.run_forked("tests.replay._launch:main", [scenario, str(world), json.dumps(kwargs), str(out)],
                                     cwd=REPO, env=environment, timeout=timeout_s + 60)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["late_ranks"] == [], f"ranks {report['late_ranks']} missed the deadline"
    ranks = {}
    for rank, entry in report["ranks"].items():
        assert entry["status"] == "ok", f"rank {rank} failed:\n{entry['payload']}"
        ranks[int(rank)] = entry["payload"]
    # Every rank decides from the same gathered rows, so every rank reports the same results.
    if same_results:
        assert all(ranks[r]["results"] == ranks[0]["results"] for r in ranks)
    assert all(not ranks[r]["errors"] for r in ranks)
    return ranks


def by_status(results: list[dict[str, Any]], status: str) -> list[dict[str, Any]]:
    return [r for r in results if r["status"] == status]


def test_REPLAY_5_EVID_5_healthy_run_attributes_nothing_and_touches_nothing(tmp_path: Path) -> None:
    ranks = run(tmp_path, steps=HEALTHY_STEPS, intervals=EVERY_CLASS, check_isolation=True)
    results = ranks[0]["results"]
    assert (
        results and not by_status(results, "ATTRIBUTED") and not by_status(results, "INCONCLUSIVE")
    )
    assert {r["recipe"] for r in results} == {
        "embedding",
        "hidden.0",
        "hidden.1",
        "hidden.2",
        "output",
        "optimizer.0",
    }
    for payload in ranks.values():
        assert payload["isolation_ok"], "a check changed live parameters, gradients or state"
        assert payload["disabled_reason"] is None and payload["coverage_pending"] == []
        assert max(payload["capture_bytes"]) < 2**20  # CAP-5: bounded and reported


def test_FAULT_1_REPLAY_6_bit_flip_in_a_hidden_layer_output_on_rank_2_is_attributed_to_rank_2(
    tmp_path: Path,
) -> None:
    ranks = run(
        tmp_path, steps=3, intervals=EVERY_CLASS, output_flip={"rank": 2, "layer": 1, "bit": 20}
    )
    results = ranks[0]["results"]
    attributed = by_status(results, "ATTRIBUTED")
    # within one cycle (cycle_length_steps = 3 hidden layers x 1 step)
    assert attributed == [
        {
            "recipe": "hidden.1",
            "step": 2,
            "status": "ATTRIBUTED",
            "outliers": [2],
            # The flip is the block's own forward hook, which its self-replay does not run
            # (SELF-2): rank 2's live output also differs from its own replay.
            "sources": ["output", "live"],
            "reason": None,
        }
    ]
    assert not by_status(results, "INCONCLUSIVE")


# SIG-3 end to end: whichever bit of the faulty unit's output is wrong, replay names the rank.
# A signature over a lossy copy (say, after a cast to bfloat16) still sees the high mantissa
# bit of test_FAULT_1_REPLAY_6 above; it loses the low mantissa bits of fp32, which these catch.
# Bits: low mantissa, the sign, the lowest exponent bit (x2 or /2: finite, the run goes on).
BIT_CASES = {
    "float32": {"mantissa-0": 0, "mantissa-1": 1, "mantissa-8": 8, "mantissa-15": 15, "sign": 31, "exponent": 23},
    "bfloat16": {"mantissa-0": 0, "mantissa-1": 1, "mantissa-3": 3, "sign": 15, "exponent": 7},
}
# CI runs float32's lowest mantissa bit and bfloat16's sign bit; ./dev test-all runs every case.
CI_BITS = {("float32", "mantissa-0"), ("bfloat16", "sign")}


def _bit_params():
    for dtype, bits in BIT_CASES.items():
        for name, bit in bits.items():
            marks = () if (dtype, name) in CI_BITS else (pytest.mark.slow,)
            yield pytest.param(dtype, bit, id=f"{dtype}-{name}", marks=marks)


@pytest.mark.parametrize(("dtype", "bit"), list(_bit_params()))
def test_FAULT_1_SIG_3_any_flipped_bit_of_a_hidden_output_is_attributed(tmp_path: Path, dtype: str, bit: int) -> None:
    hidden_only = {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0}
    ranks = run(
        tmp_path, steps=2, intervals=hidden_only, dtype=dtype, output_flip={"rank": 2, "layer": 1, "bit": bit}
    )
    results = ranks[0]["results"]
    assert [(r["recipe"], r["step"], r["status"]) for r in results] == [
        ("hidden.0", 1, "AGREE"),
        ("hidden.1", 2, "ATTRIBUTED"),
    ], results
    assert results[1]["outliers"] == [2] and results[1]["sources"] == ["output", "live"]  # live: SELF-2


def test_FAULT_1_the_same_attribution_through_the_projects_torch_transport(tmp_path: Path) -> None:
    """TransportPeerGroup over scout.transport.nccl.TorchTransport (gloo on CPU here)."""
    ranks = run(
        tmp_path,
        steps=3,
        intervals=EVERY_CLASS,
        output_flip={"rank": 2, "layer": 1, "bit": 20},
        binding=True,
    )
    attributed = by_status(ranks[0]["results"], "ATTRIBUTED")
    assert [(r["recipe"], r["outliers"]) for r in attributed] == [("hidden.1", [2])]
    assert len(ranks[0]["results"]) == 6 and not by_status(ranks[0]["results"], "INCONCLUSIVE")


def test_FAULT_2_REPLAY_3_parameter_corruption_on_rank_1_is_attributed(tmp_path: Path) -> None:
    ranks = run(
        tmp_path,
        steps=3,
        intervals={
            "embedding_steps": 0,
            "hidden_steps": 1,
            "output_steps": 0,
            "optimizer_steps": 0,
        },
        parameter_flip={"rank": 1, "step": 1, "layer": 2, "bit": 25},
    )
    (attributed,) = by_status(ranks[0]["results"], "ATTRIBUTED")
    assert attributed["recipe"] == "hidden.2" and attributed["outliers"] == [1]
    assert "parameters" in attributed["sources"]


def test_FAULT_2_OPT_2_optimizer_state_corruption_on_rank_3_is_attributed(tmp_path: Path) -> None:
    ranks = run(
        tmp_path,
        steps=3,
        intervals={
            "embedding_steps": 0,
            "hidden_steps": 0,
            "output_steps": 0,
            "optimizer_steps": 1,
        },
        state_flip={"rank": 3, "step": 1, "bit": 22},
    )
    results = ranks[0]["results"]
    assert [r["status"] for r in results] == ["AGREE", "ATTRIBUTED", "ATTRIBUTED"]
    assert all(r["outliers"] == [3] and "parameters" in r["sources"] for r in results[1:])
    # the replayed update itself agrees: every peer replays the source's (healthy) slice
    assert all("updated" not in r["sources"] for r in results)


def test_READY_2_READY_3_a_peer_describing_other_work_makes_it_inconclusive_without_a_hang(
    tmp_path: Path,
) -> None:
    every_step = {"embedding_steps": 1, "hidden_steps": 1, "output_steps": 1, "optimizer_steps": 1}
    ranks = run(tmp_path, steps=3, intervals=every_step, short_batch={"rank": 3, "step": 2})
    results = ranks[0]["results"]
    step_2 = {r["recipe"]: r for r in results if r["step"] == 2}
    for recipe in ("embedding", "hidden.1", "output"):
        assert step_2[recipe]["status"] == "INCONCLUSIVE"
        assert step_2[recipe]["reason"] == "readiness-mismatch: peers [3] describe other work"
    assert step_2["optimizer.0"]["status"] == "AGREE"  # same parameter shapes: still comparable
    assert not by_status(results, "ATTRIBUTED")
    assert all(r["status"] == "AGREE" for r in results if r["step"] != 2)


def test_READY_5_CAP_2_a_peer_that_is_not_ready_is_inconclusive_never_attributed(
    tmp_path: Path,
) -> None:
    every_step = {"embedding_steps": 1, "hidden_steps": 1, "output_steps": 1, "optimizer_steps": 1}
    ranks = run(tmp_path, steps=2, intervals=every_step, tiny_capture_rank=1)
    results = ranks[0]["results"]
    assert len(results) == 8 and not by_status(results, "ATTRIBUTED")
    assert all(r["reason"] == "not-ready: 1:capture_too_large" for r in results)


def test_READY_1_peers_with_another_schedule_disable_replay_everywhere(tmp_path: Path) -> None:
    # Each peer reports its own due recipes (its schedule differs), all Inconclusive.
    ranks = run(
        tmp_path,
        same_results=False,
        steps=3,
        intervals=EVERY_CLASS,
        intervals_override={"rank": 2, "intervals": {"hidden_steps": 2}},
    )
    for payload in ranks.values():
        assert "disagree on the replay schedule" in payload["disabled_reason"]
        assert payload["results"]
        assert all(r["reason"].startswith("replay-disabled") for r in payload["results"])


def test_STRAG_1_STRAG_4_FAULT_3_slow_compute_on_rank_1_is_a_confirmed_straggler_not_sdc(
    tmp_path: Path,
) -> None:
    hidden_only = {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0}
    ranks = run(tmp_path, steps=6, intervals=hidden_only, slow_rank={"rank": 1, "delay_s": 0.02})
    payload = ranks[0]
    assert not by_status(payload["results"], "ATTRIBUTED")  # slow is not corrupt
    confirmed = payload["confirmed_stragglers"]
    times = [[ranks[r]["compute_ms"][i] for r in range(WORLD)] for i in range(6)]
    # STRAG-12: never before 4 checks with evidence, and only ever rank 1. A noisy check may
    # carry no evidence (it delays the confirmation, never advances it).
    assert confirmed[:3] == [[], [], []], times
    assert [1] in confirmed and all(c in ([], [1]) for c in confirmed), (confirmed, times)
    first = confirmed.index([1])
    assert payload["stragglers"][first] == [["Confirmed", 1]]
    assert all(r["confirmed_stragglers"] == confirmed for r in ranks.values())
    # COMM-3: slow compute delays rank 1's arrival at collectives, but that is time before the
    # call, not inside it: no communication straggler.
    communication = [c["confirmed"] for c in payload["communication"]]
    assert all(c == [] for c in communication), [c["own_ms"] for c in payload["communication"]]


def _events(ranks: dict[int, dict[str, Any]], kind: str) -> list[tuple[str, int, int]]:
    """(reason, rank, step) of every straggler event of one kind; every rank saw the same."""
    seen = [[e for e in ranks[r]["events"] if e["kind"] == kind] for r in ranks]
    assert all(s == seen[0] for s in seen), seen
    return [(e["reason"], e["rank"], e["step"]) for e in seen[0]]


def _evidence(ranks: dict[int, dict[str, Any]], kind: str) -> list[tuple[int, list[Any]]]:
    return [(c["step"], c[kind]) for c in ranks[0]["checks"] if c[kind]]


def _compact_evidence(ranks: dict[int, dict[str, Any]], kind: str) -> str:
    """Every check's evidence per rank, one short line each, so a failure message shows all of
    it (pytest cuts a long list's repr)."""
    return "\n" + "\n".join(
        f"step {c['step']}: " + " ".join("-" if x is None else f"{x:+.2f}" for x in c[kind])
        + f" confirmed {c['confirmed'][kind]}" for c in ranks[0]["checks"] if c[kind])


# Slow tier: the straggler's life (confirmed once, recovered once) is STRAG-13's unit test
# (tests/replay/test_straggler.py), a whole device slow on a real job is
# tests/job/test_stragglers_torchrun.py's, both in CI.
@pytest.mark.slow
def test_STRAG_4_FAULT_5_a_2x_device_straggler_is_device_slow_and_recovers_exactly_once(
    tmp_path: Path,
) -> None:
    """Every operation of rank 1 -- forward, backward, optimizer and replay -- computes twice
    as long (FAULT-5) until step 32, then it is healthy again. Checks every 2 steps: rank 1 is
    confirmed ``device-slow`` while the fault lasts and reported recovered once, after it
    stops; nobody else is ever confirmed, and nobody is a communication straggler. (A device
    straggler also slows its loop: ``loop-slow`` may name rank 1 too, and nobody else.)

    This test is about the straggler's life -- confirmed once, recovered once, nobody else --
    not its latency: 2x, not 1.5x, because 4 ranks on 2 shared cores make a 1.5x rank's
    evidence scatter (0.16-1.03 a check here) and the noise guard (STRAG-2) then holds it back
    for as many checks as the scatter says (one CI run saw no confirmation in 16 checks, with
    two checks of no evidence). A 2x rank's evidence sits at the clip (ln 1.5) in most checks,
    so its own noise is small. How many checks a 1.5x confirmation takes is measured by
    bench/stragglers.py and bench/evaluate.py, and shown on real jobs by
    tests/job/test_stragglers_torchrun.py."""
    ranks = run(
        tmp_path,
        scenario="train_stragglers",
        # 16 checks while slow; 19 checks after it: recovery needs about 7 checks at the centre
        # (STRAG-9, recovery evidence 0.6 at ln 1.1 a check) and more when the recovered rank's
        # evidence is noisy (one CI run had not recovered 13 checks after the fault).
        steps=72,
        device_slow={"rank": 1, "factor": 2.0, "until_step": 33},
    )
    device = _events(ranks, "device")
    evidence = _compact_evidence(ranks, "device")
    assert [(reason, rank) for reason, rank, _ in device] == [
        ("device-slow", 1),
        ("recovered-device-slow", 1),
    ], evidence
    (_, _, confirmed_at), (_, _, recovered_at) = device
    assert confirmed_at <= 32 < recovered_at, evidence
    ratio = next(e["ratio"] for e in ranks[0]["events"] if e["reason"] == "device-slow")
    # The per-rank performance ratio names rank 1 the slower; how close it comes to the fault's 2x
    # on this host is a timing, measured by bench/stragglers.py (no ratio of two timings here).
    assert ratio > 1.0, evidence
    assert _events(ranks, "communication") == [], _evidence(ranks, "communication")
    assert all(rank == 1 for _, rank, _ in _events(ranks, "loop")), _evidence(ranks, "loop")


def test_LOOP_3_FAULT_6_a_1_5x_loop_straggler_is_loop_slow_and_not_a_device_straggler(
    tmp_path: Path,
) -> None:
    """Rank 2's loop body is followed by a wait of half its duration, outside any module
    (FAULT-6: a slow data path). Replay never sees it; the loop timer does (a check every 4
    steps, over the median of their loop times): rank 2 is confirmed ``loop-slow``, nobody is
    ``device-slow`` or ``communication-slow``."""
    ranks = run(
        tmp_path,
        scenario="train_stragglers",
        steps=44,
        loop_check_every=4,
        loop_slow={"rank": 2, "factor": 1.5},
    )
    loop = _events(ranks, "loop")
    assert [(reason, rank) for reason, rank, _ in loop] == [("loop-slow", 2)], _evidence(ranks, "loop")
    assert _events(ranks, "device") == [], _evidence(ranks, "device")
    assert _events(ranks, "communication") == [], _evidence(ranks, "communication")


# CI's healthy straggler check is a real torchrun job's (tests/job/test_attach_torchrun.py: 100
# steps, 10 loop checks and >= 40 device checks with their communication timing, nobody
# confirmed); this one is the slow tier's.
@pytest.mark.slow
def test_STRAG_4_LOOP_3_a_healthy_run_confirms_nobody(tmp_path: Path) -> None:
    ranks = run(tmp_path, scenario="train_stragglers", steps=40, loop_check_every=4)
    for kind in ("device", "communication", "loop"):
        assert _events(ranks, kind) == [], (kind, _evidence(ranks, kind))


def test_COMM_1_COMM_3_FAULT_4_slow_communication_on_rank_2_is_a_communication_straggler(
    tmp_path: Path,
) -> None:
    """Rank 2 enters every replay collective 60 ms late (FAULT-4): the others wait for it, so
    their time inside collectives grows as much as rank 2's -- only the split into entry and
    wait (COMM-1) tells who the others waited for."""
    hidden_only = {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0}
    ranks = run(
        tmp_path,
        steps=6,
        intervals=hidden_only,
        slow_communication={"rank": 2, "delay_s": 0.06},
    )
    payload = ranks[0]
    assert not by_status(payload["results"], "ATTRIBUTED")  # slow is not corrupt
    rounds = payload["communication"]
    own = [c["own_ms"] for c in rounds]
    assert all(len(o) == WORLD for o in own), own
    confirmed = [c["confirmed"] for c in rounds]
    assert confirmed[:3] == [[], [], []], own  # STRAG-12: not before 4 checks with evidence
    assert [2] in confirmed and all(c in ([], [2]) for c in confirmed), (confirmed, own)
    first = confirmed.index([2])
    assert rounds[first]["reports"] == [["Confirmed", 2]]
    assert all([c["confirmed"] for c in r["communication"]] == confirmed for r in ranks.values())
    # Compute is untouched: no compute straggler is confirmed, on any rank.
    assert all(not any(r["confirmed_stragglers"]) for r in ranks.values()), [
        ranks[r]["compute_ms"] for r in ranks
    ]


@pytest.mark.slow
def test_EVID_5_healthy_run_of_200_steps_attributes_nothing(tmp_path: Path) -> None:
    ranks = run(tmp_path, steps=200, intervals=EVERY_CLASS, check_isolation=True)
    results = ranks[0]["results"]
    assert len(results) > 200 and all(r["status"] == "AGREE" for r in results)
    assert all(p["isolation_ok"] and not any(p["confirmed_stragglers"]) for p in ranks.values())


def _same_within_groups(ranks: dict[int, dict[str, Any]]) -> dict[tuple[int, ...], list[Any]]:
    """Results by peer group; every member of a group decides from the same rows (READY-2)."""
    groups: dict[tuple[int, ...], list[Any]] = {}
    for payload in ranks.values():
        results = groups.setdefault(tuple(payload["peers"]), payload["results"])
        assert payload["results"] == results, payload["peers"]
    return groups


def test_PEER_2_PEER_3_REPLAY_8_CAP_7_fsdp2_hsdp_2x2_replays_among_the_replicas_of_each_shard(
    tmp_path: Path,
) -> None:
    """FSDP2 (fully_shard) with HSDP on a 2x2 (replicate x shard) mesh, gloo on CPU. Peers
    are the replicas of one shard: (0, 2) and (1, 3). Replay runs on the parameters the live
    forward gathered, without FSDP's hooks, and leaves every local shard, gradient and
    optimizer state bitwise untouched. A bit flip on rank 2 is *detected* in its group but,
    with two peers, never attributed (VERDICT: n = 2 disagreeing is not attributable)."""
    ranks = run(
        tmp_path,
        same_results=False,
        scenario="train_hsdp",
        steps=3,
        intervals=EVERY_CLASS,
        output_flip={"rank": 2, "layer": 1},
        check_isolation=True,
    )
    assert {r: ranks[r]["peers"] for r in ranks} == {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    assert all(p["peers_from_process_group"] == p["peers"] for p in ranks.values())  # PEER-3
    every_recipe = ["embedding", "hidden.0", "hidden.1", "hidden.2", "output"]
    assert all(p["sharded_recipes"] == every_recipe for p in ranks.values())
    assert all(p["isolation_ok"] and p["disabled_reason"] is None for p in ranks.values())
    groups = _same_within_groups(ranks)
    clean = groups[(1, 3)]
    assert len(clean) == 6 and all(r["status"] == "AGREE" for r in clean)
    flipped = groups[(0, 2)]
    assert [r for r in flipped if r["status"] != "AGREE"] == [
        {
            "recipe": "hidden.1",
            "step": 2,
            "status": "INCONCLUSIVE",
            "outliers": [],
            "sources": [],
            "reason": "output:no-majority",
        }
    ]


@pytest.mark.slow
def test_FAULT_1_REPLAY_8_fsdp2_hsdp_3x2_bit_flip_on_rank_4_is_attributed_in_its_group(
    tmp_path: Path,
) -> None:
    """Three replicas of two shards (6 ranks): rank 4 (replica 2, shard 0) computes a wrong
    bit in block 1; its group (0, 2, 4) attributes position 2, the other group agrees."""
    ranks = run(
        tmp_path,
        same_results=False,
        scenario="train_hsdp",
        world=6,
        steps=3,
        mesh_shape=[3, 2],
        intervals=EVERY_CLASS,
        output_flip={"rank": 4, "layer": 1},
    )
    groups = _same_within_groups(ranks)
    assert set(groups) == {(0, 2, 4), (1, 3, 5)}
    assert all(r["status"] == "AGREE" for r in groups[(1, 3, 5)])
    attributed = by_status(groups[(0, 2, 4)], "ATTRIBUTED")
    assert [(r["recipe"], r["step"], r["outliers"], r["sources"]) for r in attributed] == [
        ("hidden.1", 2, [2], ["output"])
    ]
    assert not by_status(groups[(0, 2, 4)], "INCONCLUSIVE")
