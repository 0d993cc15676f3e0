"""Benchmark: what the live path's self-check (spec/replay.md SELF-8) costs, on the example GPT
(examples/train_gpt.py: 4 blocks 64 wide, 4 heads, sequence 32, batch 8, AdamW) on one CPU thread.

A training step is timed in CPU time of this thread (``time.thread_time``, nearly blind to other
tenants of a shared box) three ways, interleaved, ``--repetitions`` times after a warm-up:
``plain`` (no capture), ``capture`` (every module recipe -- embedding, the 4 blocks, the head --
captured in the step, ``self_check`` off) and ``self_check`` (the same with it on). The
difference of the last two is the self-check of those 6 calls. At the job's defaults
(``replay_interval_steps`` 2) a cycle is 8 steps and captures each of those 6 calls once, so
the self-check's share of training is ``(self_check - capture) / (8 x plain)``. Run for
``replay_rows`` 1 (the default: cut replays) and 0 (exact replays of the whole call).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/self_check.py  (writes bench/results/self_check.json)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from scout.core.self_check import LiveCheck
from scout.replay.capture import ModuleCapture
from scout.replay.replay import RecipeModules

REPO = Path(__file__).resolve().parents[1]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", REPO / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def measure(rows: int, repetitions: int, cycle_steps: int) -> dict[str, Any]:
    example = _example()
    torch.manual_seed(0)
    model = example.GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    recipes = RecipeModules.discover(model).by_recipe()
    captures = {on: ModuleCapture(recipes, 2**30, rows=rows, self_check=on) for on in (False, True)}
    times: dict[str, list[float]] = {"plain": [], "capture": [], "self_check": []}
    paths: set[str] = set()
    for repetition in range(repetitions + 3):
        for name in times:
            capture = None if name == "plain" else captures[name == "self_check"]
            if capture is not None:
                capture.arm(repetition + 1, list(recipes))
            tokens = example.batch(repetition + 1, 0)
            began = time.thread_time()
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, example.VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            # SELF-9: the re-executions run when the codes are asked for (outside the forward
            # and backward; in a job, at the optimizer's pre-step hook), inside the timed span.
            outcomes = [capture.live(recipe, repetition + 1) for recipe in recipes] if capture is not None else []
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ended = time.thread_time()
            if capture is not None and capture.self_check:
                if any(o.code is not LiveCheck.MATCH for o in outcomes):
                    raise RuntimeError(f"a healthy call did not reproduce its live output: {outcomes}")
                paths.update(o.path for o in outcomes)
            if capture is not None:
                capture.release()
            if repetition >= 3:  # warm-up
                times[name].append(ended - began)
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    share = (medians["self_check"] - medians["capture"]) / (cycle_steps * medians["plain"])
    return {"replay_rows": rows, "paths": sorted(paths), "calls_checked_per_step": len(recipes),
            **{f"{name}_step_ms": round(value, 3) for name, value in medians.items()},
            "self_check_ms_per_call": round((medians["self_check"] - medians["capture"]) / len(recipes), 3),
            "share_of_training_at_defaults": round(share, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=60)
    parser.add_argument("--cycle-steps", type=int, default=8, help="steps per cycle at the job's defaults")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "self_check.json")
    args = parser.parse_args()
    if args.repetitions < 1:
        parser.error(f"--repetitions must be >= 1, got {args.repetitions}")
    torch.set_num_threads(1)
    results = {"benchmark": "self_check", "model": "examples/train_gpt.py GPT (4 blocks, 64 wide, 32 x 8)",
               "clock": "time.thread_time, one thread", "repetitions": args.repetitions,
               "cycle_steps": args.cycle_steps,
               "runs": [measure(rows, args.repetitions, args.cycle_steps) for rows in (1, 0)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
