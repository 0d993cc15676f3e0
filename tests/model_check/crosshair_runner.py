"""Run ``crosshair check`` (PEP 316 contracts) in a subprocess with an explicit budget.

Shared by the verdict and gate CrossHair tests; every run is bounded by its iteration budget,
a per-condition timeout and a wall-clock timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests import processes

REPO = Path(__file__).resolve().parents[2]


def run_crosshair(
    target: Path | str,
    *,
    max_uninteresting_iterations: int,
    per_condition_timeout_s: int,
    extra_path: Path | None = None,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths: Sequence[str] = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    budget = [
        f"--max_uninteresting_iterations={max_uninteresting_iterations}",
        f"--per_condition_timeout={per_condition_timeout_s}",
    ]
    return processes.run(
        [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316", *budget, str(target)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
