"""Study: where scout's DDP bucket hook should average a CPU bucket (spec/observer.md INSTR-15).

Any communication hook makes DDP copy gradients into the bucket without the scaling it otherwise
fuses into that copy, so a hooked step makes one more pass over the gradients. Two places for it:
gloo's ``ReduceOp.AVG`` (a sum, then the division on gloo's thread, unseen by the budget) or the
hook's own division on the training thread before a sum (timed, so the budget counts it). This
study times a training step of the example GPT three ways -- DDP without a hook (``native``), a
hook with gloo's AVG (``avg``), a hook dividing then summing (``divide``) -- in the same processes,
three copies of the model stepped in rotation, ``--rounds`` rounds of ``--steps`` steps each; per
round the ratio of each hooked arm's median step to the native one's. Each rank is pinned to a core
(rank modulo the cores), so that the arms' differences are not the scheduler's.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/ddp_average.py --size small
     (2 ranks under torchrun, gloo; writes bench/results/ddp_average.json)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attach_overhead

REPO = Path(__file__).resolve().parents[1]
ARMS = ("native", "avg", "divide")


def _quartiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"q1": ordered[len(ordered) // 4], "median": statistics.median(ordered), "q3": ordered[3 * len(ordered) // 4]}


def _worker(args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {int(os.environ["RANK"]) % (os.cpu_count() or 1)})
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    example = attach_overhead._example()
    example.SEQUENCE = args.sequence  # the example's causal mask is made for its SEQUENCE
    dims = attach_overhead.SIZES[args.size]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    base = example.GPT(**dims)
    divided_ns = [0]

    def avg(state: Any, bucket: Any) -> Any:
        work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True)
        return work.get_future().then(lambda done: done.value()[0])

    def divide(state: Any, bucket: Any) -> Any:
        buffer = bucket.buffer()
        started = time.perf_counter_ns()
        buffer.div_(world)
        divided_ns[0] += time.perf_counter_ns() - started
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda done: done.value()[0])

    for function in (avg, divide):  # DDP checks a hook's annotations as objects; this module's are strings
        function.__annotations__ = {}
    models = {}
    for arm, hook in zip(ARMS, (None, avg, divide), strict=True):
        model = DistributedDataParallel(copy.deepcopy(base))
        if hook is not None:
            model.register_comm_hook(None, hook)
        models[arm] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    steps: dict[str, list[list[float]]] = {arm: [] for arm in ARMS}
    divisions_s: list[float] = []
    for round_index in range(args.rounds + 1):  # round 0 warms every arm up and is not kept
        shift = round_index % len(ARMS)
        for arm in ARMS[shift:] + ARMS[:shift]:
            model, optimizer = models[arm]
            times = []
            for step in range(args.steps):
                generator = torch.Generator().manual_seed(1000 * round_index + 10 * step + rank)
                tokens = torch.randint(0, dims["vocab"], (args.batch, args.sequence + 1), generator=generator)
                divided_ns[0] = 0
                began = time.perf_counter()
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                times.append(time.perf_counter() - began)
                if arm == "divide":
                    divisions_s.append(divided_ns[0] / 1e9)
            if round_index:
                steps[arm].append(times)
    if rank == 0:
        medians = {arm: [statistics.median(times) for times in steps[arm]] for arm in ARMS}
        native_s = statistics.median(t for times in steps["native"] for t in times)
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False, timeout=30).stdout.strip()
        result = {
            "benchmark": "ddp_average", "commit": commit, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_1_5_15_min": list(os.getloadavg()), "cpu_count": os.cpu_count(),
            "size": args.size, "ranks": world, "rounds": args.rounds, "steps_per_round": args.steps,
            "batch": args.batch, "sequence": args.sequence, "native_step_s": native_s,
            "division_s_per_step": statistics.median(divisions_s),
            "over_native": {arm: _quartiles([m / n - 1 for m, n in zip(medians[arm], medians["native"], strict=True)])
                            for arm in ("avg", "divide")},
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1), flush=True)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(attach_overhead.SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of every arm, in rotation")
    parser.add_argument("--steps", type=int, default=3, help="steps of one arm in a round")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=attach_overhead.SEQUENCE)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "ddp_average.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "batch", "sequence", "ranks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.worker:
        _worker(args)
        return 0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
               __file__, "--worker", *(argv if argv is not None else sys.argv[1:])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, check=False, timeout=max(600, args.rounds * args.steps * 3 * 20)).returncode


if __name__ == "__main__":
    sys.exit(main())
