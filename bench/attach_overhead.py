"""End-to-end overhead of ``scout.attach`` at its default settings, on a GPT of >= 50M parameters.

Interleaved A/B runs of one training script (this file, under ``torchrun --nproc-per-node 2``,
gloo on CPU): the same model, data and steps with scout attached (``--scout on``: observers,
replay, gate -- every default) and without (``--scout off``). The order alternates each round so
drift on a shared machine falls on both arms. Each run reports the median step time over its
measured steps; the overhead is the median over rounds of (on / off - 1), with the spread over
rounds. The breakdown comes from the scout run itself: ``job.costs`` (replay -- of which compute
and collectives --, gate and reports, cycle ends), the observer process's CPU time, and the
publishes' cost estimated from their count. Goal: <= 0.5 %. Writes
bench/results/attach_overhead.json (``--output`` elsewhere).

    ./dev py bench/attach_overhead.py [--rounds 3] [--steps 26] [--batch 8]

On a GPU host (the GPU script tests/gpu/run.py runs it so): ``--device cuda --nproc N``, one
rank per GPU over NCCL (ranks beyond the GPUs share them over gloo), every step ending in a
``torch.cuda.synchronize`` in both arms so that a step's time is the GPU's; the result goes to
bench/results/attach_overhead_gpu.json unless ``--output`` says where.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.005
SIZE = dict(vocab=16384, width=512, layers=12, heads=8)  # 54.6M parameters
SEQUENCE = 128
WARMUP_STEPS = 2


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", REPO / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # replay is deterministic
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        one_gpu_each = int(os.environ["WORLD_SIZE"]) <= torch.cuda.device_count()
        dist.init_process_group("nccl" if one_gpu_each else "gloo")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    example = _example()
    torch.manual_seed(0)
    model = example.GPT(**SIZE).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    job = None
    if args.scout == "on":
        import scout

        job = scout.attach(ddp, optimizer, run_dir=args.run_dir)
        job.restore()
    times: list[float] = []
    for step in range(1, WARMUP_STEPS + args.steps + 1):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, SIZE["vocab"], (args.batch, SEQUENCE + 1), generator=generator).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, SIZE["vocab"]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if job is not None:
            job.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's time is the GPU's, in both arms
        if step > WARMUP_STEPS:
            times.append(time.perf_counter() - started)
    result: dict[str, Any] = {"rank": rank, "parameters": parameters, "step_s": times}
    if job is not None:
        result["costs_s"] = dict(job.costs)
        result["publishes"] = job.publisher._seq // 2
        observer_pid = job.observer.pid if job.observer is not None else None
        if observer_pid is not None:
            with open(f"/proc/{observer_pid}/stat", encoding="utf-8") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            result["observer_cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        job.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


def one_run(arm: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"{arm}-{time.monotonic_ns()}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "--standalone",
               __file__, "--worker", "--scout", arm, "--steps", str(args.steps), "--batch", str(args.batch),
               "--device", args.device, "--out", str(out), "--run-dir", str(work / f"run-{out.stem}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=3600)
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def driver(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="scout-overhead-"))
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        arms = ("off", "on") if index % 2 == 0 else ("on", "off")
        runs = {arm: one_run(arm, args, work) for arm in arms}
        off, on = (statistics.median(runs[a]["step_s"]) for a in ("off", "on"))
        rounds.append({"off_step_s": off, "on_step_s": on, "overhead": on / off - 1, "scout": runs["on"]})
        print(f"round {index + 1}: off {off:.3f} s/step, on {on:.3f} s/step, overhead {100 * (on / off - 1):+.2f} %",
              flush=True)
    overheads = [r["overhead"] for r in rounds]
    measured = args.steps
    breakdown: dict[str, float] = {}
    for r in rounds:
        scout_run = r["scout"]
        per_step = {name: seconds / measured for name, seconds in scout_run.get("costs_s", {}).items()}
        per_step["observer_cpu_s"] = scout_run.get("observer_cpu_s", 0.0) / measured
        per_step["publish_s_estimate"] = scout_run.get("publishes", 0) * 0.8e-6 / measured
        for name, value in per_step.items():
            breakdown.setdefault(name, 0.0)
            breakdown[name] += value / len(rounds) / r["off_step_s"]
    result = {
        "model_parameters": rounds[0]["scout"]["parameters"],
        "ranks": args.nproc, "device": args.device, "batch": args.batch, "sequence": SEQUENCE, "steps_per_run": args.steps, "rounds": args.rounds,
        "off_step_s": [r["off_step_s"] for r in rounds], "on_step_s": [r["on_step_s"] for r in rounds],
        "overhead_median": statistics.median(overheads), "overhead_min": min(overheads), "overhead_max": max(overheads),
        "breakdown_fraction_of_step": breakdown,
        "goal": GOAL, "met": statistics.median(overheads) <= GOAL,
        "load_average": os.getloadavg(),
        "note": "replay at the defaults: one hidden layer every 2 steps, 1 row of the batch (CAP-8); "
                "a cycle replays every recipe once in 2 x layers steps",
    }
    sys.path.insert(0, str(REPO / "bench"))
    from _goals import at_most, print_goals, write_results

    goals = [at_most("attach overhead at defaults (>= 50M GPT)", 100 * result["overhead_median"], 100 * GOAL, "%",
                     f"median over {args.rounds} interleaved A/B rounds; min {100 * result['overhead_min']:.2f} %, "
                     f"max {100 * result['overhead_max']:.2f} %")]
    name = "attach_overhead" if args.device == "cpu" else "attach_overhead_gpu"
    write_results(name, result, goals, Path(args.output) if args.output else None)
    print(json.dumps({k: v for k, v in result.items() if k not in ("off_step_s", "on_step_s")}, indent=2))
    print_goals(goals)
    return 0 if result["met"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--scout", choices=("on", "off"), default="on")
    parser.add_argument("--steps", type=int, default=26)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per run (default 2)")
    parser.add_argument("--output", default="", help="where the result JSON goes")
    parser.add_argument("--out", default="")
    parser.add_argument("--run-dir", default="")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
