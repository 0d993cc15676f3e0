"""Checkpoint bytes through torch.distributed.checkpoint, chosen by the gate and the recovery
decision, on 4 CPU processes (gloo): a restarted job restores the checkpoint the decision picks
and trains on to a state bit-identical to the uninterrupted run (tests/unit/dcp_gate_job.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import processes

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 300


def launch(phase: str, work: Path) -> dict:
    out = work / f"{phase}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = processes.run_forked("tests.unit.dcp_gate_job:main", [phase, str(work), str(out)], cwd=REPO, env=env,
                                timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["late_ranks"] == [], result
    errors = {r: v["payload"] for r, v in result["ranks"].items() if v["status"] != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())
    return {int(r): v["payload"] for r, v in result["ranks"].items()}


@pytest.mark.torchdist
def test_GATE_restore_through_dcp_continues_bit_identically(tmp_path: Path) -> None:
    first = launch("first", tmp_path)
    trust = first[0]["trust"]
    # Boundaries at 3, 6, 9, 12; t0/s3 verified at 6; SDC at step 8 quarantines t0/s6;
    # checkpoints captured while tainted are quarantined at once.
    assert trust == {
        "t0/s3": "RECOVERY_VERIFIED",
        "t0/s6": "QUARANTINED",
        "t0/s9": "QUARANTINED",
        "t0/s12": "QUARANTINED",
    }
    assert any(r.startswith("sdc: ") and "group dp peers [2]" in r for r in first[0]["reports"])
    reference = {payload["final"] for payload in first.values()}
    assert len(reference) == WORLD_DISTINCT_RNG, "each rank's final state (its RNG included) is its own"

    restarted = launch("restart", tmp_path)
    for rank, outcomes in restarted.items():
        assert outcomes["sdc"]["choice"] == "verified" and outcomes["sdc"]["checkpoint"] == "t0/s3"
        assert outcomes["straggler"]["choice"] == "latest" and outcomes["straggler"]["checkpoint"] == "t0/s6"
        # DCP restores every bit of what was saved: parameters, optimizer state, RNG state ...
        assert outcomes["sdc"]["loaded"] == first[rank]["saved"]["3"]
        assert outcomes["straggler"]["loaded"] == first[rank]["saved"]["6"]
        # ... and training on from it ends where the uninterrupted run ended, bit for bit.
        for failure in ("sdc", "straggler"):
            assert outcomes[failure]["final"] == first[rank]["final"], (rank, failure)


WORLD_DISTINCT_RNG = 4
