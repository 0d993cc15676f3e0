"""Every script of bench/ imports and answers ``--help`` (issue 38: ``bench/overhead.py`` could not
even start for months and nothing noticed, though ``./dev bench`` listed it). ``bench/run.py
--check`` runs each one's ``--help`` in one process; ``--list`` shows what ``./dev bench`` runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "run.py"


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_bench_script_imports_and_answers_help() -> None:
    completed = subprocess.run([sys.executable, str(RUN), "--check"], capture_output=True, text=True, timeout=600,
                               check=False, cwd=REPO)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    runner = _runner()
    names = runner.scripts()
    assert names and set(names) == set(runner.BENCHMARKS) | set(runner.BY_HAND), names
    lines = completed.stdout.splitlines()
    assert sorted(line.split(":")[0] for line in lines) == names and all(line.endswith(": ok") for line in lines)


def test_list_shows_the_benchmarks_that_run_and_the_scripts_run_by_hand() -> None:
    completed = subprocess.run([sys.executable, str(RUN), "--list"], capture_output=True, text=True, timeout=60,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    runner = _runner()
    listed = [line.split()[0] for line in completed.stdout.splitlines() if line.startswith("  ")]
    assert listed == [*runner.BENCHMARKS, *runner.BY_HAND]
    assert "overhead" not in listed and "campaign" not in listed  # replaced by bench/evaluate.py


@pytest.mark.parametrize(("text", "problem"), [
    ("from scout.replay import attach\n", "ImportError"),  # the bug of issue 38
    ("import sys\nsys.exit(3)\n", "exited 3"),
    ("print('measuring')\n", "ran to its end instead of printing its usage"),
    ("import pathlib\npathlib.Path(__file__).with_name('results').joinpath('x.json').write_text('{}')\n"
     "print('usage: measured anyway')\nraise SystemExit(0)\n", "wrote to bench/results/"),
])
def test_the_check_fails_a_script_that_cannot_start_or_ignores_help(tmp_path: Path, text: str, problem: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner()
    (tmp_path / "results").mkdir()
    (tmp_path / "broken.py").write_text(text)
    (tmp_path / "fine.py").write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    monkeypatch.setattr(runner, "BENCH", tmp_path)
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    found = runner.check_help("broken")
    assert found is not None and problem in found, found
    assert runner.check_help("fine") is None
