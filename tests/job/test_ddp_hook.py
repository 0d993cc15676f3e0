"""INSTR-15: on gloo (no average inside its reduction) scout's DDP hook averages each bucket by a
division and one SUM all-reduce, never gloo's AVG (the same pass, on gloo's thread, unseen by the
budget), and the gradients are DDP's own, bit for bit: two real gloo ranks under torchrun (slow), and in CI one rank
started directly (the same job, a world of one: the hook's path and ops, without torchrun's
start-up)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchdist

JOB = Path(__file__).resolve().with_name("ddp_hook_job.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_INSTR_15_the_ddp_hook_on_gloo_divides_and_sums_and_matches_ddp(ranks: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if ranks == 1:
        command = [sys.executable, str(JOB), str(os.getpid())]
        env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(_free_port())})
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone",
                   str(JOB), str(os.getpid())]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # Several buckets (the first is 1 MB, the others 0.25 MB), each one SUM after the hook's division
    # (a power of 2 of ranks: x / n is DDP's x * (1 / n) exactly), and DDP's gradients exactly.
    assert result["calls"] >= 2 and result["ops"] == ["RedOpType.SUM"], result
    assert result["equal"] and result["gradients"] == 6, result
