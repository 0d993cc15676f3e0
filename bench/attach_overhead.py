"""End-to-end overhead of ``scout.attach`` on a GPT trained with DDP, measured as interleaved
A/B runs of one training script (this file, under ``torchrun --nproc-per-node 2``, gloo on CPU).

An *arm* is one way to run the same model, data and steps: without scout (``off``), with scout
at its defaults, at another replay cadence, or with one part of scout switched off -- the
``observer`` and ``replay`` settings, or a private benchmark switch (scout/job/bench_switches.py:
``instrumentation``, ``ddp_hook``, ``loop_timer``, ``gate``). A *round* runs every arm once, in
an order that rotates from round to round (and reverses every other round), so drift on a
shared machine falls on every arm alike. A run's figure is its **mean** step time over its
measured steps -- a replay check every few steps is part of the cost, so a median would hide it
-- and an arm's overhead in a round is its mean over the ``off`` arm's mean of the same round,
minus one; the result is the median over rounds, with the range.

Each run also reports, from inside the measured window: scout's own accounting of
``job.step()`` (``job.costs``: replay, its compute and collectives, gate and reports, cycle
ends), the CPU time of rank 0's trainer process (every thread) and of its observer process.

This file is three things: the benchmark of the overhead at defaults (``./dev py
bench/attach_overhead.py``; goal <= 1.0 % on a CPU box, <= 0.5 % on a GPU, TARGETS.md), the
library bench/evaluate.py measures cadences and parts with (:func:`interleaved`), and the
torchrun worker (``--worker``).

    ./dev py bench/attach_overhead.py [--rounds 5] [--steps 24] [--batch 8] [--size large]

On a GPU host (tests/gpu/run.py runs it so): ``--device cuda --nproc N``, one rank per GPU over
NCCL (ranks beyond the GPUs share them over gloo), every step ending in a
``torch.cuda.synchronize`` in both arms so that a step's time is the GPU's; the result goes to
bench/results/attach_overhead_gpu.json unless ``--output`` says where.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parents[1]
GOAL_CPU = 0.010  # TARGETS.md: <= 1.0 % on this 2-core box
GOAL_GPU = 0.005  # TARGETS.md: <= 0.5 % on a GPU
#: Model sizes (examples/train_gpt.py's GPT). ``large`` is the goal's >= 50M model.
SIZES: dict[str, dict[str, int]] = {
    "large": dict(vocab=16384, width=512, layers=12, heads=8),  # 54.6M parameters
    "small": dict(vocab=2048, width=256, layers=4, heads=4),  # 4.2M parameters
    "tiny": dict(vocab=256, width=64, layers=4, heads=4),  # quick mode: the plumbing, not a figure
}
SEQUENCE = 128
WARMUP_STEPS = 2
#: Parts that are settings of scout.attach; the other parts are scout/job/bench_switches.py's.
SETTING_PARTS = ("observer", "replay")
RUN_TIMEOUT_S = 3600.0


@attrs.frozen
class Arm:
    """One way to run the job: ``scout`` off, or on with ``cadence`` (replay_interval_steps;
    None: the default) and the parts in ``off`` switched off."""

    name: str
    scout: bool = True
    cadence: int | None = None
    off: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "scout": self.scout, "cadence": self.cadence, "off": list(self.off)}


OFF = Arm("off", scout=False)
DEFAULTS = Arm("defaults")


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", REPO / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``, every thread, to the nanosecond (/proc/PID/task/*/schedstat;
    /proc/PID/stat counts 10 ms ticks, too coarse for an observer that should barely run)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total_ns / 1e9


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _time_on_this_thread(job: Any) -> None:
    """Add to ``job.costs`` the CPU time this thread spends in ``job.step()`` and in the dense
    replay (``step_cpu_s``, ``replay_cpu_s``): unlike their wall times they leave out waiting for
    a slower peer in scout's collectives -- a wait the job would otherwise spend in its own next
    all-reduce -- and they hardly move with the machine's load. Wrapped here, in the benchmark,
    so that the product carries no second clock."""
    def timed(function: Callable[[], Any], name: str) -> Callable[[], Any]:
        def wrapper() -> Any:
            started = time.thread_time()
            try:
                return function()
            finally:
                job.costs[name] = job.costs.get(name, 0.0) + time.thread_time() - started

        return wrapper

    for check in job.pipeline.checks:
        if check.name == "replay":  # scout/job/checks.py ReplayCheck: its runner steps the replay
            check.runner.step = timed(check.runner.step, "replay_cpu_s")
    job.step = timed(job.step, "step_cpu_s")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    arm = Arm(**{**json.loads(args.arm), "off": tuple(json.loads(args.arm)["off"])})
    size = SIZES[args.size]
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
    example.SEQUENCE = SEQUENCE  # the attention mask's size (examples/train_gpt.py builds it from this global)
    torch.manual_seed(0)
    model = example.GPT(**size).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    job = None
    if arm.scout:
        import scout

        keywords: dict[str, Any] = {part: False for part in arm.off if part in SETTING_PARTS}
        if arm.cadence is not None:
            keywords["replay_interval_steps"] = arm.cadence
        job = scout.attach(ddp, optimizer, run_dir=args.run_dir, **keywords)
        job.restore()
        _time_on_this_thread(job)
    times: list[float] = []
    train_cpu: list[float] = []  # this thread's CPU time of forward, backward and the optimizer
    window: dict[str, Any] = {}

    def snapshot() -> dict[str, Any]:
        taken: dict[str, Any] = {"cpu_s": _own_cpu_s(), "wall_s": time.perf_counter()}
        if job is not None:
            taken["costs_s"] = dict(job.costs)
            if job.observer is not None:
                taken["observer_cpu_s"] = _process_cpu_s(job.observer.pid)
        return taken

    for step in range(1, WARMUP_STEPS + args.steps + 1):
        if step == WARMUP_STEPS + 1:
            window["start"] = snapshot()
        generator = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, size["vocab"], (args.batch, SEQUENCE + 1), generator=generator).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started, started_cpu = time.perf_counter(), time.thread_time()
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, size["vocab"]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trained_cpu = time.thread_time() - started_cpu
        if job is not None:
            job.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's time is the GPU's, in both arms
        if step > WARMUP_STEPS:
            times.append(time.perf_counter() - started)
            train_cpu.append(trained_cpu)
    end = snapshot()
    start = window["start"]
    result: dict[str, Any] = {
        "rank": rank, "parameters": parameters, "layers": size["layers"], "batch": args.batch, "step_s": times,
        "train_cpu_s": train_cpu,
        "trainer_cpu_s": end["cpu_s"] - start["cpu_s"], "window_wall_s": end["wall_s"] - start["wall_s"],
    }
    if job is not None:
        result["costs_s"] = {name: seconds - start["costs_s"].get(name, 0.0) for name, seconds in end["costs_s"].items()}
        if "observer_cpu_s" in end:
            result["observer_cpu_s"] = end["observer_cpu_s"] - start["observer_cpu_s"]
        result["replay_interval_steps"] = job.config.replay_interval_steps
        result["replay_rows"] = job.config.replay_rows
        job.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


def one_run(arm: Arm, *, size: str, steps: int, batch: int, nproc: int, device: str, work: Path) -> dict[str, Any]:
    """One torchrun job of ``arm``; rank 0's measurements."""
    out = work / f"{arm.name}-{time.monotonic_ns()}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
               __file__, "--worker", "--arm", json.dumps(arm.to_json()), "--size", size, "--steps", str(steps),
               "--batch", str(batch), "--device", device, "--out", str(out), "--run-dir", str(work / f"run-{out.stem}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.pop("SCOUT_BENCH_OFF", None)
    private = [part for part in arm.off if part not in SETTING_PARTS]
    if private:
        env["SCOUT_BENCH_OFF"] = ",".join(private)
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    if completed.returncode != 0 or not out.exists():
        raise RuntimeError(f"the {arm.name} run failed (exit {completed.returncode}): {completed.stderr[-3000:]}")
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def round_order(arms: Sequence[Arm], index: int) -> list[Arm]:
    """Round ``index``'s order: rotated by the round number, reversed every other round."""
    shift = index % len(arms)
    order = list(arms[shift:]) + list(arms[:shift])
    return order[::-1] if index % 2 else order


def mean_step_s(run: dict[str, Any]) -> float:
    return float(statistics.fmean(run["step_s"]))


def interleaved(
    arms: Sequence[Arm], *, rounds: int, size: str, steps: int, batch: int, nproc: int = 2, device: str = "cpu",
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """``rounds`` rounds of every arm (the first arm must be ``off``); per round and arm, the run
    and its overhead against the round's ``off`` run. Also the load average around each round."""
    if not arms or arms[0].scout:
        raise ValueError(f"the first arm must be scout off (the reference), got {arms[:1]}")
    work = Path(tempfile.mkdtemp(prefix="scout-overhead-"))
    results: list[dict[str, Any]] = []
    for index in range(rounds):
        load_before = list(os.getloadavg())
        runs = {arm.name: one_run(arm, size=size, steps=steps, batch=batch, nproc=nproc, device=device, work=work)
                for arm in round_order(arms, index)}
        reference = mean_step_s(runs[arms[0].name])
        overheads = {name: mean_step_s(run) / reference - 1 for name, run in runs.items()}
        results.append({"round": index, "order": [a.name for a in round_order(arms, index)], "runs": runs,
                        "overhead": overheads, "load_before": load_before, "load_after": list(os.getloadavg())})
        log(f"  round {index + 1}/{rounds} ({size}): off {reference:.3f} s/step; "
            + ", ".join(f"{name} {100 * value:+.2f} %" for name, value in overheads.items() if name != arms[0].name))
    return results


def summary(results: list[dict[str, Any]], arm: str) -> dict[str, float]:
    """An arm's overhead over rounds: median, min, max, n (fractions)."""
    values = [r["overhead"][arm] for r in results]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def driver(args: argparse.Namespace) -> int:
    results = interleaved([OFF, DEFAULTS], rounds=args.rounds, size=args.size, steps=args.steps, batch=args.batch,
                          nproc=args.nproc, device=args.device)
    overheads = [r["overhead"]["defaults"] for r in results]
    goal = GOAL_CPU if args.device == "cpu" else GOAL_GPU
    on_runs = [r["runs"]["defaults"] for r in results]
    off_means = [mean_step_s(r["runs"]["off"]) for r in results]
    breakdown: dict[str, float] = {}
    for run, reference in zip(on_runs, off_means, strict=True):
        window_s = reference * len(run["step_s"])
        parts = dict(run.get("costs_s", {}))
        parts["observer_cpu_s"] = run.get("observer_cpu_s", 0.0)
        for name, seconds in parts.items():
            breakdown[name] = breakdown.get(name, 0.0) + seconds / window_s / len(on_runs)
    result = {
        "model_parameters": on_runs[0]["parameters"], "size": args.size,
        "ranks": args.nproc, "device": args.device, "batch": args.batch, "sequence": SEQUENCE,
        "steps_per_run": args.steps, "rounds": args.rounds,
        "off_step_s": off_means, "on_step_s": [mean_step_s(run) for run in on_runs],
        "overhead_median": statistics.median(overheads), "overhead_min": min(overheads),
        "overhead_max": max(overheads), "breakdown_fraction_of_step": breakdown,
        "goal": goal, "met": statistics.median(overheads) <= goal,
        "load_average": [r["load_after"] for r in results],
        "note": "mean step time over the measured steps; replay at the defaults: one hidden layer every 2 "
                "steps, 1 row of the batch (CAP-8); a cycle replays every recipe once in 2 x layers steps",
    }
    sys.path.insert(0, str(REPO / "bench"))
    from _goals import at_most, print_goals, write_results

    goals = [at_most("attach overhead at defaults (>= 50M GPT)", 100 * result["overhead_median"], 100 * goal, "%",
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
    parser.add_argument("--arm", default=json.dumps(DEFAULTS.to_json()), help="the worker's arm (JSON)")
    parser.add_argument("--size", choices=sorted(SIZES), default="large")
    parser.add_argument("--steps", type=int, default=24, help="measured steps per run (24: one cycle at defaults)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
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
