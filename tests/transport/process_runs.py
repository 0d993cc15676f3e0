"""Launch a multi-process worker run (mpiexec, the torch launcher, torchrun) from pytest, bounded.

The run writes ``rank<r>.json`` files; :func:`run_ranks` returns them in rank order, or fails
the test with the command's output when the run failed, hung or wrote nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.transport import binding_cases as cases

REPO = Path(__file__).resolve().parents[2]
OUTPUT_TAIL_CHARS = 6000


@attrs.frozen
class RankRun:
    size: int
    binding: str
    results: list[dict[str, Any]]
    out_dir: Path

    def case(self, name: str) -> list[dict[str, Any]]:
        per_rank = [
            r.get(name, {"error": f"case {name!r} missing from the output"}) for r in self.results
        ]
        if any("skipped" in r for r in per_rank):
            pytest.skip(f"{name} at size {self.size}: {per_rank[0].get('skipped')}")
        return per_rank

    def check(self, name: str, all_cases: dict[str, cases.Case]) -> None:
        all_cases[name].check(self.case(name), self.size, self.binding)


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_ranks(
    command: list[str], out_dir: Path, size: int, binding: str, timeout_s: float
) -> RankRun:
    """Run ``command`` (in its own session, killed whole at ``timeout_s``) and load its results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=10)
        pytest.fail(
            f"{' '.join(command)} ran past {timeout_s}s (a hang):\n{output[-OUTPUT_TAIL_CHARS:]}"
        )
    files = [out_dir / f"rank{r}.json" for r in range(size)]
    absent = [f.name for f in files if not f.exists()]
    if process.returncode != 0 or absent:
        pytest.fail(
            f"{' '.join(command)} exited with {process.returncode}; missing outputs {absent}:\n"
            f"{output[-OUTPUT_TAIL_CHARS:]}"
        )
    results = [json.loads(f.read_text()) for f in files]
    for rank, result in enumerate(results):
        assert "worker_error" not in result, f"rank {rank}: {result['worker_error']}"
    return RankRun(size=size, binding=binding, results=results, out_dir=out_dir)
