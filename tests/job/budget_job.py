"""A worker for tests/job/test_budget_torchrun.py: the example GPT with DDP and DCP checkpoints,
scout attached with the replay cadence left to ``overhead_budget`` (spec/budget.md). Each rank
writes ``rank<r>.json`` into the run directory: every change of its cadence as it saw it (the step
it took effect, the interval and lanes, the origin, the pipeline's cycle, the dense runner's
schedule digest) -- what the test compares across ranks.

    torchrun --nproc-per-node 4 budget_job.py RUN_DIR CKPT_DIR --budget 0.5 --cycles-after 3
        [--slow-after-cycles 2 --slow-s 0.25]

The job runs until ``--cycles-after`` cycles have passed since the last change of cadence (at
most ``--steps-max`` steps). ``--slow-after-cycles N``: N cycles after the first decision every
rank sleeps ``--slow-s`` a step in its loop from then on -- a phase of training with a longer
step, which the budget must follow at a cycle boundary (BUDGET-6)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import scout

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--cycles-after", type=int, default=3)
    parser.add_argument("--steps-max", type=int, default=600)
    parser.add_argument("--slow-after-cycles", type=int, default=0)
    parser.add_argument("--slow-s", type=float, default=0.0)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(example.GPT())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = scout.attach(model, optimizer, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir,
                       overhead_budget=args.budget, checkpoint_every_cycles=1)
    step = job.restore()
    calibration, pipeline = job.parts.calibration, job.pipeline
    assert calibration is not None and calibration.dense is not None
    seen: list[dict[str, object]] = []
    launches: list[int] = []  # GUARD-4, BUDGET-13: the steps whose job.step() launched an agreement
    agreement = job.guarded.agreement
    slow_from: int | None = None
    # BUDGET-14: the steps whose job.step() took the quiet path, and at each step what was due at
    # it by the schedules in force before it (the replay check's, the loop check's), for the test.
    quiet: list[int] = []
    busy: dict[str, list[int]] = {"replay": [], "loop": []}
    quiet_step = pipeline.quiet_step  # called once at each quiet step (scout.job.stepping)

    def recorded_quiet_step(at: int) -> None:
        quiet.append(at)
        quiet_step(at)

    pipeline.quiet_step = recorded_quiet_step  # type: ignore[method-assign]
    loop_check = next(check for check in pipeline.checks if check.name == "loop")

    def note(at: int) -> None:
        state = {"step": at, "interval_steps": calibration.cadence.interval_steps, "lanes": calibration.cadence.lanes,
                 "origin_step": pipeline.origin_step, "cycle_steps": pipeline.cycle_steps,
                 "digest": calibration.dense.runner.schedule_digest,
                 "loop_check_steps": calibration.loop_check_steps, "agreement_steps": calibration.agreement_steps}
        if not seen or {k: v for k, v in seen[-1].items() if k != "step"} != {k: v for k, v in state.items()
                                                                             if k != "step"}:
            seen.append(state)

    note(step)
    while step < args.steps_max:
        step += 1
        if slow_from is not None and step >= slow_from:
            time.sleep(args.slow_s)
        tokens = example.batch(step, rank)
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, example.VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if calibration.dense.runner.schedule.due(step):
            busy["replay"].append(step)
        if loop_check.due(step):
            busy["loop"].append(step)
        job.step()
        if agreement.pending:  # launched at the end of this job.step(), collected at the next
            launches.append(step)
        note(step)
        last = seen[-1]
        if (args.slow_after_cycles and slow_from is None and calibration.decisions
                and step >= int(last["origin_step"]) + args.slow_after_cycles * int(last["cycle_steps"])):  # type: ignore[call-overload]
            slow_from = step + 1
        done = step >= int(last["origin_step"]) + args.cycles_after * int(last["cycle_steps"])  # type: ignore[call-overload]
        if calibration.decisions and done and (not args.slow_after_cycles or len(calibration.decisions) > 1):
            break
    Path(args.run_dir, f"rank{rank}.json").write_text(json.dumps({
        "changes": seen, "last_step": step, "slow_from": slow_from, "agreement_launches": launches,
        "quiet_steps": quiet, "due_steps": busy,
        "decisions": [{"interval_steps": d.cadence.interval_steps if d.cadence else None, "lanes": d.cadence.lanes
                       if d.cadence else None, "cycle_steps": d.cycle_steps, "status": d.status.value}
                      for d in calibration.decisions]}))
    job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
