"""Stragglers in wall time on real 4-rank jobs: tests/job/straggler_job.py under ``torchrun``
with ``scout.attach`` at its defaults (a replay check every 2 steps, a loop check every 10).
What a user reads -- ``reports.jsonl`` and ``timing.jsonl`` -- is what is checked.

- **Device** (spec/replay.md STRAG-1): a rank whose layers take 1.5x as long, forward and
  backward, by *waiting* (sleep: a device that answers late, a throttled rank) or by computing
  (spin), under DDP and under FSDP2 (a ``(4, 1)`` HSDP mesh: four replicas), is named
  ``device-slow`` within 5 replay checks -- replay is timed on the wall clock less the run-queue
  delay, so a rank that waits is as slow as one that computes.
- **Loop** (LOOP-1..LOOP-3): a rank that waits 1.5 times its forward in its loop (sleeping or
  spinning) is named ``loop-slow`` within 5 loop checks (the 4th measured) under DDP and FSDP2.
- **Forward** (LOOP-7): a rank whose blocks' forward hooks wait (or spin) half the block's
  forward is named ``forward-slow`` within 5 loop checks under DDP and FSDP2 (the 4th measured).
- A healthy job names nobody, of any kind.

The sleep cases run in every suite (about 20 s each); the others are slow (each job 20 s to 40 s
on 2 shared cores). A rank whose *forward* alone is 1.5x as long loses only 5-10 % of a loop on
that host, inside the healthy ranks' spread there (spec/replay.md LOOP-3, bench/loop_wall.py),
and its replay ratio is about 1.16 (the forward is a third of a block's time, about 18 device
checks, STRAG-4): the forward time of LOOP-7 is what names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.reports.timing import TIMING_FILE, read_timing

pytestmark = [pytest.mark.torchdist]

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
CHECK_STEPS = 10
CHECKS_MAX = 5  # issue 24: a 1.5x straggler is named within 5 checks
#: (mesh, how) of the fault tests: DDP with a sleeping rank in every suite; spinning and HSDP
#: (whose replica groups tests/job/test_attach_fsdp.py and the replay PEER-2 test cover in every
#: suite) in the slow tier, to keep CI's pytest time (issue 40).
SLEEP_IN_EVERY_SUITE = [
    ("ddp", "sleep"),
    pytest.param("ddp", "spin", marks=pytest.mark.slow),
    pytest.param("hsdp", "sleep", marks=pytest.mark.slow),
    pytest.param("hsdp", "spin", marks=pytest.mark.slow),
]


def _job(tmp_path: Path, steps: int, fault: str = "", mesh: str = "ddp") -> list[dict[str, Any]]:
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONPATH": str(REPO)}
    command = [str(TORCHRUN), "--nproc-per-node", "4", "--standalone", str(REPO / "tests/job/straggler_job.py"),
               "--steps", str(steps), "--run-dir", str(run_dir), "--mesh", mesh,
               *(["--fault", fault] if fault else [])]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return reports.read_records(run_dir / reports.REPORTS_FILE)


def _loop_slow(records: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
    return [(r["ranks"], r["step"]) for r in records if r["kind"] == "straggler" and r["reason"] == "loop-slow"]


def _stragglers(records: list[dict[str, Any]]) -> list[tuple[str, list[int], int]]:
    return [(r["reason"], r["ranks"], r["step"]) for r in records if r["kind"] == "straggler"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["ddp", "hsdp"])
def test_STRAG_1_LOOP_1_LOOP_3_a_healthy_job_names_nobody(tmp_path: Path, mesh: str) -> None:
    """200 steps: 100 replay checks and 20 loop checks, under DDP and under FSDP2 (HSDP (4, 1))."""
    assert _stragglers(_job(tmp_path, 200, mesh=mesh)) == []


@pytest.mark.parametrize(("mesh", "how"), SLEEP_IN_EVERY_SUITE)
def test_STRAG_1_a_rank_whose_layers_are_1_5x_slow_is_named_device_slow_within_5_checks(
        tmp_path: Path, mesh: str, how: str) -> None:
    """Rank 1's every block takes half again as long, forward and backward -- by sleeping (a
    device that answers late: its CPU time does not grow) or by spinning."""
    records = _job(tmp_path, 40, fault=f"slow-layers:1:1.5:{how}", mesh=mesh)
    named = _stragglers(records)
    assert named and named[0][:2] == ("device-slow", [1]), named
    assert {tuple(ranks) for _, ranks, _ in named} == {(1,)}, named  # nobody else, of any kind
    devices = [r for r in read_timing(tmp_path / "run" / TIMING_FILE).records if r["kind"] == "device"]
    confirmed_at = next(i for i, r in enumerate(devices, 1) if 1 in r["confirmed"])
    assert devices[confirmed_at - 1]["step"] == named[0][2], (devices, named)
    assert confirmed_at <= CHECKS_MAX, [(r["step"], r["performance_ratio"]) for r in devices]
    ratios = [r["performance_ratio"][1] for r in devices[:confirmed_at] if r["performance_ratio"][1] is not None]
    # The slowdown is seen in wall time (a sleeping rank too); its size on this host is
    # bench/stragglers.py's figure, not a unit test's (no ratio of two timings here).
    assert sorted(ratios)[len(ratios) // 2] > 1.0, ratios


@pytest.mark.parametrize(("mesh", "how"), SLEEP_IN_EVERY_SUITE)
def test_LOOP_7_a_rank_whose_forward_hooks_take_half_its_forward_is_named_forward_slow_within_5_checks(
        tmp_path: Path, mesh: str, how: str) -> None:
    """Rank 1's every block has a forward hook that waits half the block's forward (a user's
    hook, a profiler's): under FSDP2 the block is the sharded unit, whose hooks replay does not
    run (REPLAY-8), and under DDP the forward is a third of a replay -- the live forward time
    (LOOP-7) sees it as 1.5x."""
    named = _stragglers(_job(tmp_path, 60, fault=f"slow-forward:1:1.5:{how}", mesh=mesh))
    forward = [(ranks, step) for reason, ranks, step in named if reason == "forward-slow"]
    assert forward and forward[0][0] == [1] and forward[0][1] <= CHECKS_MAX * CHECK_STEPS, named
    assert {tuple(ranks) for _, ranks, _ in named} == {(1,)}, named  # nobody else, of any kind
    lines = [r for r in read_timing(tmp_path / "run" / TIMING_FILE).records if r["kind"] == "forward"]
    assert [r["step"] for r in lines] == list(range(CHECK_STEPS, 61, CHECK_STEPS)), lines
    ratios = sorted(r["performance_ratio"][1] for r in lines)
    assert ratios[len(ratios) // 2] > 1.0, ratios  # slower than its peers; its size is bench/'s


@pytest.mark.slow
@pytest.mark.parametrize(("mesh", "how"), [("ddp", "sleep"), ("ddp", "spin"), ("hsdp", "sleep"), ("hsdp", "spin")])
def test_LOOP_1_LOOP_3_a_rank_that_waits_in_its_loop_is_named_within_5_checks(tmp_path: Path, mesh: str,
                                                                              how: str) -> None:
    """Rank 2 waits 1.5 times its forward's time after each forward, in its loop, outside any
    module (a slow data path, a descheduled rank), asleep or busy: replay never sees it. Under
    FSDP2 a step has dozens of collectives; the wait is their union (LOOP-1), so their ordinary
    lengths do not dilute the ratio (measured: 4th check under both, spec/replay.md LOOP-3)."""
    named = _loop_slow(_job(tmp_path, 120, fault=f"slow-loop:2:2.5:{how}", mesh=mesh))
    assert named and named[0][0] == [2] and named[0][1] <= CHECKS_MAX * CHECK_STEPS, named
    assert {tuple(ranks) for ranks, _ in named} == {(2,)}, named
    # LOOP-6: every check's ratios are in timing.jsonl -- rank 2's median ratio up to its
    # confirmation above the slow ratio (the test's allowance), and the lines from its
    # confirmation on hold it confirmed.
    loops = [r for r in read_timing(tmp_path / "run" / TIMING_FILE).records if r["kind"] == "loop"]
    assert [r["step"] for r in loops] == list(range(CHECK_STEPS, 121, CHECK_STEPS)), loops
    upto = [r["performance_ratio"][2] for r in loops if r["step"] <= named[0][1]]
    ratios = sorted(ratio for ratio in upto if ratio is not None)
    assert ratios and ratios[len(ratios) // 2] > loops[0]["slow_ratio"], upto
    assert all(2 in r["confirmed"] for r in loops if r["step"] >= named[0][1]), loops
