"""WAIT-5, WAIT-6 (spec/transport.md): scout's own gloo groups run on the job's gloo device (no
event loop of their own); where the job's default group has no gloo, on one device of scout's,
whose loop is at SCHED_IDLE except inside scout's calls; the user's groups' loops are never touched. Real gloo ranks, forked by
tests.replay._launch, each attaching scout to a DDP model (tests/job/idle_loops_job.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import processes

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's"), pytest.mark.processes]


def _run(tmp_path: Path, **kwargs: Any) -> dict[int, dict[str, Any]]:
    out = tmp_path / "ranks.json"
    completed = processes.run_forked(
        "tests.replay._launch:main", ["tests.job.idle_loops_job:main", "2", json.dumps(kwargs), str(out)],
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1", SCOUT_TEST_RANK_DEADLINE_S="120"), timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["late_ranks"] == [], report
    ranks = {}
    for rank, entry in report["ranks"].items():
        assert entry["status"] == "ok", entry["payload"]
        ranks[int(rank)] = entry["payload"]
    return ranks


def _only(policies: dict[str, int]) -> set[int]:
    return set(policies.values())


def test_WAIT_6_scouts_gloo_groups_share_the_jobs_device_and_add_no_event_loop(tmp_path: Path) -> None:
    for seen in _run(tmp_path).values():
        assert seen["user_loops"] >= 1 and seen["scout_loops"] == 0, seen  # the default group's loop only
        assert seen["backend"] == "scoutgloo" and seen["replayed_steps"] == [1, 2, 3, 4, 5, 6], seen  # replay worked
        assert _only(seen["user_after_attach"]) == {seen["normal_policy"]}, seen
        # A collective of scout's left in flight on one rank: the job's all-reduce goes through.
        assert seen["user_sum_while_scout_pending"] == [3.0, 3.0, 3.0], seen
    assert [seen["scout_pending_then"] for _, seen in sorted(_run(tmp_path).items())] == [True, False]


def test_WAIT_5_scouts_gloo_loops_idle_between_its_calls_and_awake_inside_them(tmp_path: Path) -> None:
    for seen in _run(tmp_path, own_device=True).values():
        idle, normal = seen["idle_policy"], seen["normal_policy"]
        # The default group's loop existed before attach; scout's groups share one device of their own.
        assert seen["user_loops"] >= 1 and seen["scout_loops"] == 1, seen
        assert _only(seen["after_attach"]) == {idle}, seen
        assert _only(seen["user_after_attach"]) == {normal}, seen  # never touched
        assert _only(seen["after_restore"]) == {idle}, seen
        # Inside restore's program and every job.step() (replay due at every step here) scout's
        # loops run normally.
        assert seen["calls_in_restore"] == 1, seen
        steps = seen["inside_steps"][seen["calls_in_restore"]:]
        assert len(steps) == 6 and all(_only(p) == {normal} for p in seen["inside_steps"]), seen
        assert _only(seen["after_steps"]) == {idle}, seen


def test_WAIT_5_a_call_that_raises_leaves_the_loops_idle_again(tmp_path: Path) -> None:
    for seen in _run(tmp_path, fail_at=3, own_device=True).values():
        assert seen["failed"] == "a failure inside job.step()", seen
        assert _only(seen["inside_steps"][-1]) == {seen["normal_policy"]}, seen
        assert _only(seen["after_steps"]) == {seen["idle_policy"]}, seen
