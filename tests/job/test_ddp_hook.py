"""INSTR-15: scout's DDP hook averages each bucket with one ReduceOp.AVG all-reduce, and the
gradients are DDP's own (bitwise, on two ranks); two real gloo ranks under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchdist

JOB = Path(__file__).resolve().with_name("ddp_hook_job.py")
REPO = Path(__file__).resolve().parents[2]


def test_INSTR_15_the_ddp_hook_averages_with_one_avg_all_reduce_and_matches_ddp() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", str(JOB),
         str(os.getpid())], capture_output=True, text=True, timeout=180, env=env, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # Several buckets (the first is 1 MB, the others 0.25 MB), every one averaged by AVG, and DDP's gradients exactly.
    assert result["calls"] >= 2 and result["ops"] == ["RedOpType.AVG"], result
    assert result["equal"] and result["gradients"] == 6, result
