"""examples/train_moe.py as its docstring runs it (spec/moe.md MOE-9, MOE-10, spec/replay.md
REC-8): the catalog built by `scout moe-catalog` from the examples directory, the MoE trained by
4 gloo ranks under torchrun with `scout.attach` at its defaults. Its experts are a plain module
found by structure; its cycle stays within 2x of the dense cycle (issue 24's newcomer saw 12x);
one expert of one rank computing a wrong bit is named, and no checkpoint trained on it is
certified."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scout import reports

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TORCHRUN = Path(sys.executable).with_name("torchrun")
SCOUT = Path(sys.executable).with_name("scout")
DENSE_CYCLE_STEPS = 2 * 3  # replay_interval_steps (default 2) x the example's 3 blocks (REC-4)
FAULT_STEP = 14


def test_MOE_9_MOE_10_REC_8_the_moe_example_keeps_the_dense_cadence_and_names_a_faulty_expert(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # as a user's shell
    env.update(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    catalog = tmp_path / "moe.json"
    built = subprocess.run([str(SCOUT), "moe-catalog", "--model", "train_moe:model_for_catalog", "--n-exec",
                            "1,8,32,128", "--out", str(catalog)], cwd=EXAMPLES, env=env, capture_output=True,
                           text=True, timeout=180)
    assert built.returncode == 0, built.stderr
    recipes = int(re.search(r"(\d+) expert recipe\(s\)", built.stdout).group(1))  # type: ignore[union-attr]
    assert recipes > DENSE_CYCLE_STEPS, built.stdout  # more expert recipes than dense steps: MOE-10's case

    run_dir, checkpoints = tmp_path / "run", tmp_path / "ckpt"
    run = subprocess.run([str(TORCHRUN), "--nproc-per-node", "4", "--standalone", str(EXAMPLES / "train_moe.py"),
                          "--steps", "36", "--run-dir", str(run_dir), "--checkpoint-dir", str(checkpoints),
                          "--moe-catalog", str(catalog), "--fault", f"expert-sdc:2:{FAULT_STEP}"],
                         cwd=tmp_path, env={**env, "SCOUT_CHECKPOINT_EVERY_CYCLES": "1"}, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if "scout: replay cycle" in line]
    assert len(said) == 1, run.stderr[-3000:]
    cycle_steps = int(re.search(r"replay cycle (\d+) steps", said[0]).group(1))  # type: ignore[union-attr]
    assert cycle_steps <= 2 * DENSE_CYCLE_STEPS, said  # MOE-10: within 2x of the dense cycle
    assert f"{recipes} expert recipe(s)" in said[0] or cycle_steps == DENSE_CYCLE_STEPS, said

    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    sdc = [r for r in records if r["kind"] == "sdc"]
    assert sdc and {tuple(r["ranks"]) for r in sdc} == {(2,)}, sdc
    first = min(r["step"] for r in sdc)
    assert FAULT_STEP <= first < FAULT_STEP + cycle_steps, sdc  # within one cycle of the onset
    expert_recipes = {r["evidence"]["recipe"] for r in sdc if r["evidence"]["recipe"].startswith("expert.")}
    # Expert 1 of the second block: slot 1 x 4 + 1 (MOE-1, layer major), at some catalog row count.
    assert expert_recipes and {recipe.split("@")[0] for recipe in expert_recipes} == {"expert.5"}, sdc
    verified = [r["evidence"]["checkpoint"] for r in records
                if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]
    assert verified, records  # the cycles before the fault verified a checkpoint
    assert all(int(name.split("/s")[1]) < FAULT_STEP for name in verified), verified
