"""A configuration mistake on a real 4-rank torchrun job is one clear line, printed once, naming
its source; every rank exits (docs/attach.md "Configuration", scout/job/startup.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _job(tmp_path: Path, run_dir: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **environ})
    command = [str(TORCHRUN), "--nproc-per-node", "3", "--standalone", str(EXAMPLE), "--steps", "3",
               "--run-dir", str(run_dir)]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("environ", "run_dir_of", "says"),
    [
        ({"SCOUT_ONSDC": "restart"}, None,
         "environment variable SCOUT_ONSDC is not a scout setting; did you mean SCOUT_ON_SDC?"),
        pytest.param({"SCOUT_STALL_THRESHOLD_S": "-3"}, None,
                     "environment variable SCOUT_STALL_THRESHOLD_S: stall_threshold_s must be a number of seconds",
                     marks=pytest.mark.slow),
        ({}, "a-file/run", "run_dir "),
    ],
    ids=["misspelt-variable", "bad-variable-value", "run-dir-under-a-file"],
)
def test_CONFIG_a_mistake_is_one_line_from_rank_0_and_every_rank_exits(
        tmp_path: Path, environ: dict[str, str], run_dir_of: str | None, says: str) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    run_dir = tmp_path / (run_dir_of or "run")
    run = _job(tmp_path, run_dir, **environ)
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert output.count(says) == 1, output[-4000:]
    assert "[every rank]" in output, output[-4000:]
    # One traceback from the ranks (rank 0's); torchrun adds its own, outside the ranks.
    rank_tracebacks = [line for line in output.splitlines() if line.startswith("[rank") and "Traceback" in line]
    assert rank_tracebacks == ["[rank0]: Traceback (most recent call last):"], output[-4000:]
    assert "ConfigError" in output
    # torchrun's summary names rank 0 as the first failure.
    assert "Root Cause" in output and "rank      : 0 (local_rank: 0)" in output.split("Root Cause")[1], output[-2000:]
    assert not (run_dir / "reports.jsonl").exists()  # nothing started
