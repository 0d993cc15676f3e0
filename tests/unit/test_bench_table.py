"""``./dev bench`` prints one table of every goal and exits non-zero when one is missed
(bench/run.py over the JSON every benchmark writes through bench/_goals.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]


def _write(results: Path, name: str, goals: list[dict], **extra: object) -> None:
    document = {"benchmark": name, "goals": goals, "load_average_1_5_15_min": [1.5, 1.0, 0.5]}
    document.update(extra)
    (results / f"{name}.json").write_text(json.dumps(document))


def _goal(name: str, measured: float, target: float, met: bool) -> dict:
    return {"name": name, "measured": measured, "target": target, "unit": "ms",
            "comparison": "<=", "ratio": measured / target, "met": met, "detail": ""}


def _table(results: Path, *names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--table", "--results", str(results), *names],
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_every_goal_is_a_row_and_a_miss_fails_the_run(tmp_path: Path) -> None:
    _write(tmp_path, "verdict", [_goal("exact verdict", 0.2, 0.5, True), _goal("timing verdict", 3.0, 2.0, False)])
    _write(tmp_path, "signature_gpu", [], skipped="no CUDA device")
    completed = _table(tmp_path, "verdict", "signature_gpu", "sim")
    assert completed.returncode == 1, completed.stdout
    lines = completed.stdout.splitlines()
    assert any("exact verdict" in line and " met" in line for line in lines)
    assert any("timing verdict" in line and "NOT MET" in line and "1.50" in line for line in lines)
    assert any("skipped: no CUDA device" in line for line in lines)
    assert any("sim" in line and "no results" in line for line in lines)
    assert "1 goal(s) missed or failed out of 2" in completed.stdout


def test_all_goals_met_exits_zero(tmp_path: Path) -> None:
    _write(tmp_path, "verdict", [_goal("exact verdict", 0.2, 0.5, True)])
    completed = _table(tmp_path, "verdict")
    assert completed.returncode == 0, completed.stdout


def test_a_benchmark_without_goals_counts_as_failed(tmp_path: Path) -> None:
    _write(tmp_path, "verdict", [])
    completed = _table(tmp_path, "verdict")
    assert completed.returncode == 1 and "FAILED: no goals" in completed.stdout
