"""Benchmark: the straggler power table (spec/replay.md STRAG-1..STRAG-4, LOOP-1..LOOP-4).

How many checks does scout need to confirm a device straggler 1.2x, 1.5x and 2x as slow as its
peers, and a loop straggler 1.5x; how many false confirmations come per 10,000 healthy checks;
does a confirmation flap? Goals: 1.5x within 5 checks,
1.2x within 20, 0 false confirmations, no flapping.

1. **Noise, measured.** A healthy DDP job (a small GPT, 4 gloo ranks on this host) replays
   every recipe class at every step and closes a loop-timer check at every step, with the
   device fault's dispatch mode active at factor 1 (as in every run below): every peer's
   replay times per recipe per check (STRAG-1: the own clock here) and every rank's loop time per
   step (LOOP-1) are recorded. A shorter run times replay on the wall clock instead, for
   comparison (``healthy_evidence_by_clock``: the spread of healthy peers' evidence).
2. **Simulated checks, with the real test.** The pure core (``check_evidence``, the verdict,
   the sequential test) is driven by checks drawn from a noise model: ``measured`` resamples
   the measured checks (peers shuffled; for loops, the median over a default-cadence window of
   consecutive measured steps, from a random start); the parametric models draw every timed
   repetition from a log-normal with occasional 1.5-3x spikes (``quiet``: 2%, no spikes, a
   dedicated accelerator; ``shared``: 5%, 2% spikes; ``noisy``: 10%, 5% spikes). One peer of
   four is slowed by the factor. Per row: checks to the first confirmation (median, p90, max;
   trials that never confirm count as ``--checks-max + 1``), false confirmations per 10,000
   healthy checks (any peer), and flapping -- recoveries while a straggler persists, and, of
   the trials where a straggler slow for 10 checks was confirmed, the share where it is
   reported recovered exactly once after it stops and never confirmed again. Loop rows with
   2- and 10-step windows show what a shorter loop cadence costs.
3. **Real runs.** The same job at the default cadence (``ReplayConfig()`` and ``LoopConfig()``:
   a check every 50 steps): healthy; rank 1 slowed 1.2x, 1.5x and 2x in every operation
   (``faults.SlowOps``); rank 2's loop slowed 1.5x (``faults.SlowLoop``). Per run: the check at
   which each kind first confirmed each rank, and every event.

Goal flags are set from the medians of the measured-noise rows and from the real runs.
JSON: bench/results/stragglers.json.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/stragglers.py [--quick] [--no-real]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (one import, before the fork)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scout.core.recipes import Intervals  # noqa: E402
from scout.core.straggler import (  # noqa: E402
    DEFAULT_SEQUENTIAL_CONFIG,
    SequentialConfig,
    check_evidence,
    confirmation_start,
    confirmation_step,
)
from scout.core.verdict import MISSING, classify_timing  # noqa: E402
from scout.replay import faults  # noqa: E402
from scout.replay.arrival import LoopConfig, LoopTimer  # noqa: E402
from scout.replay.collectives import TorchPeerGroup  # noqa: E402
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer  # noqa: E402

RESULTS = REPO / "bench" / "results" / "stragglers.json"
NOISE = REPO / "bench" / "results" / "stragglers_noise.json"  # the measured checks, raw
WORLD = 4
SLOW_PEER = 1
GOAL_CHECKS = {1.5: 5, 1.2: 20}
COLLECTIVE_TIMEOUT_S = 300.0
RUN_DEADLINE_S = 1800.0
VOCAB, WIDTH, HEADS, LAYERS, SEQUENCE, BATCH = 64, 32, 4, 3, 16, 16


# --------------------------------------------------------------------------------------------
# The job (real runs)
# --------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_attention = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.projection = nn.Linear(WIDTH, WIDTH)
        self.norm_mlp = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm_attention(x)).chunk(3, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.projection(mixed.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm_mlp(x))


class SmallGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _job(rank: int, options: dict[str, Any]) -> dict[str, Any]:
    """One rank: DDP training with replay and the loop timer; the faults of ``options``."""
    torch.manual_seed(0)
    model = SmallGPT()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    peers = TorchPeerGroup(timeout_s=COLLECTIVE_TIMEOUT_S)
    every = options.get("check_every")
    clock = options.get("timing_clock", "auto")
    replay_config = ReplayConfig(timing_clock=clock)
    if every is not None:
        replay_config = ReplayConfig(
            intervals=Intervals(every, every, every, every), timing_clock=clock
        )
    loop_config = LoopConfig() if every is None else LoopConfig(check_every_steps=every)
    replayer = Replayer(ddp, optimizer, peers, replay_config, RecipeModules.discover(ddp))
    loop = LoopTimer(peers, loop_config)

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations
        entry = time.monotonic_ns()
        future = dist.all_reduce(bucket.buffer().div_(WORLD), async_op=True).get_future()

        def done(completed: Any) -> Any:
            loop.collective(entry, time.monotonic_ns())
            return completed.value()[0]

        return future.then(done)

    ddp.register_comm_hook(None, hook)
    device_factor = options.get("device", {}).get(str(rank), 1.0)
    loop_factor = options.get("loop", {}).get(str(rank), 1.0)
    slow_ops = faults.SlowOps(device_factor, waits=bool(options.get("device_waits"))).enter()
    slow_loop = faults.SlowLoop(loop_factor)
    generator = torch.Generator().manual_seed(rank)
    device_checks: list[dict[str, list[Any]]] = []
    loop_checks: list[list[float | None]] = []
    events: list[dict[str, Any]] = []
    try:
        for step in range(1, options["steps"] + 1):
            loop.begin_step()
            with slow_loop if loop_factor > 1 else contextlib.nullcontext():
                tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator)
                logits = ddp(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            check = loop.end_step(step)
            report = replayer.after_optimizer_step()
            if report.peer_compute_ms:
                device_checks.append(
                    {
                        k: [None if v is MISSING else v for v in t]
                        for k, t in report.peer_compute_ms.items()
                    }
                )
            found = list(report.straggler_events)
            if check is not None:
                loop_checks.append(list(check.loop_ms))
                found += list(check.events)
            events += [
                {
                    "kind": e.kind.value,
                    "reason": e.reason,
                    "rank": e.rank,
                    "step": e.step,
                    "ratio": e.performance_ratio,
                }
                for e in found
            ]
    finally:
        slow_ops.exit()
    replayer.close()
    dist.barrier()
    return {"device_checks": device_checks, "loop_checks": loop_checks, "events": events}


def _rank_main(rank: int, store: str, options: dict[str, Any], results: Any) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        results.put((rank, "ok", _job(rank, options)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # skip interpreter teardown (gloo threads); the result is already sent


def run_job(options: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's record of one 4-rank run (every rank decides alike)."""
    context = mp.get_context("fork")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as scratch:
        store = os.path.join(scratch, "store")
        processes = [
            context.Process(target=_rank_main, args=(r, store, options, results))
            for r in range(WORLD)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + RUN_DEADLINE_S
        collected: dict[int, tuple[str, Any]] = {}
        while len(collected) < WORLD and time.monotonic() < deadline:
            try:
                rank, status, payload = results.get(timeout=5.0)
            except queue.Empty:
                continue
            collected[rank] = (status, payload)
        for process in processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()  # our own child, by its handle
                process.join(timeout=5)
    failed = {r: p for r, (s, p) in collected.items() if s != "ok"}
    if failed or len(collected) < WORLD:
        raise RuntimeError(f"run failed: {failed or 'ranks missed the deadline'}")
    return collected[0][1]


# --------------------------------------------------------------------------------------------
# Noise models and simulated checks
# --------------------------------------------------------------------------------------------

Draw = Callable[[random.Random, float], dict[str, list[float]]]


def measured_device(checks: list[dict[str, list[Any]]]) -> Draw:
    """A measured check, peers shuffled; the slow peer's times multiplied by the factor."""
    usable = [c for c in checks if all(v is not None for t in c.values() for v in t)]

    def draw(rng: random.Random, factor: float) -> dict[str, list[float]]:
        check = rng.choice(usable)
        order = rng.sample(range(WORLD), WORLD)
        return {
            name: [times[p] * (factor if i == SLOW_PEER else 1.0) for i, p in enumerate(order)]
            for name, times in check.items()
        }

    return draw


def parametric_device(
    sigma: float, spike: float, base_ms: dict[str, float], repetitions: int = 3
) -> Draw:
    """Every timed repetition log-normal (sigma), a spike of 1.5-3x with probability
    ``spike``; the check's time is the median of the repetitions (STRAG-1)."""

    def one(rng: random.Random, ms: float) -> float:
        runs = []
        for _ in range(repetitions):
            value = ms * math.exp(rng.gauss(0.0, sigma))
            if rng.random() < spike:
                value *= rng.uniform(1.5, 3.0)
            runs.append(value)
        return statistics.median(runs)

    def draw(rng: random.Random, factor: float) -> dict[str, list[float]]:
        return {
            name: [one(rng, ms) * (factor if p == SLOW_PEER else 1.0) for p in range(WORLD)]
            for name, ms in base_ms.items()
        }

    return draw


def measured_loop(steps: list[list[float | None]], window: int) -> Draw:
    """Per rank, the median loop time over ``window`` consecutive measured steps from a random
    start (LOOP-2), ranks shuffled; the slow rank's times multiplied by the factor."""
    rows = [s for s in steps if all(v is not None for v in s)]

    def draw(rng: random.Random, factor: float) -> dict[str, list[float]]:
        start = rng.randrange(0, max(1, len(rows) - window))
        chunk = rows[start : start + window]
        order = rng.sample(range(WORLD), WORLD)
        medians = [statistics.median(row[p] for row in chunk) for p in order]  # type: ignore[misc]
        return {"loop": [m * (factor if i == SLOW_PEER else 1.0) for i, m in enumerate(medians)]}

    return draw


class Simulator:
    """The real pure core over drawn checks: per check, the verdict of each comparison,
    ``check_evidence`` and the sequential test."""

    def __init__(self, draw: Draw, floor_ms: float, timing: Any, config: SequentialConfig) -> None:
        self.draw, self.floor_ms, self.timing, self.config = draw, floor_ms, timing, config

    def run(
        self, rng: random.Random, factor_at: Callable[[int], float], checks: int
    ) -> list[tuple[int, str, int]]:
        state = confirmation_start(WORLD, self.config)
        changes = []
        for check in range(1, checks + 1):
            times = self.draw(rng, factor_at(check))
            verdicts = {name: classify_timing(t, self.timing) for name, t in times.items()}
            evidence = check_evidence(times, verdicts, self.floor_ms, WORLD)
            state, effects = confirmation_step(state, evidence)
            changes += [(check, type(e).__name__, e.peer) for e in effects]
        return changes


def evidence_noise(checks: list[dict[str, list[Any]]], floor_ms: float) -> dict[str, float]:
    """Healthy peers' per-check evidence (log ratio to the centre, STRAG-2): its standard
    deviation and 99th percentile over every peer and check."""
    values: list[float] = []
    for check in checks:
        if not all(v is not None for t in check.values() for v in t):
            continue
        verdicts = {name: classify_timing(t) for name, t in check.items()}
        values += [e for e in check_evidence(check, verdicts, floor_ms, WORLD) if e is not None]
    ordered = sorted(values)
    return {
        "values": len(values),
        "sd": statistics.pstdev(values),
        "p99": ordered[int(0.99 * (len(ordered) - 1))],
    }


def _summary(values: Sequence[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def power_row(
    sim: Simulator, factor: float, trials: int, checks_max: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    firsts, wrong, flaps = [], 0, 0
    for _ in range(trials):
        changes = sim.run(rng, lambda check: factor, checks_max)
        confirmed = [c for c, kind, peer in changes if kind == "Confirmed" and peer == SLOW_PEER]
        firsts.append(confirmed[0] if confirmed else checks_max + 1)
        wrong += sum(1 for _, kind, peer in changes if kind == "Confirmed" and peer != SLOW_PEER)
        flaps += sum(1 for _, kind, _ in changes if kind == "Recovered")
    row = {"factor": factor, "trials": trials, "checks_to_confirm": _summary(firsts)}
    row["confirmed_share"] = sum(f <= checks_max for f in firsts) / trials
    row["other_peers_confirmed"] = wrong
    row["recoveries_while_slow"] = flaps
    return row


def false_confirmations(sim: Simulator, checks: int, seed: int) -> dict[str, Any]:
    changes = sim.run(random.Random(seed), lambda check: 1.0, checks)
    confirmed = sum(1 for _, kind, _ in changes if kind == "Confirmed")
    return {
        "healthy_checks": checks,
        "confirmations": confirmed,
        "per_10000_checks": confirmed * 10000 / checks,
    }


def stop_row(
    sim: Simulator, factor: float, trials: int, slow_checks: int, after_checks: int, seed: int
) -> dict[str, Any]:
    """A straggler slow for ``slow_checks`` checks, then healthy. Among the trials where it
    was confirmed while slow, the clean outcome is exactly one recovery, after it stopped, and
    no second confirmation (nor any other peer confirmed): anything else is flapping."""
    rng = random.Random(seed)
    confirmed, clean, latencies = 0, 0, []
    for _ in range(trials):
        changes = sim.run(
            rng, lambda check: factor if check <= slow_checks else 1.0, slow_checks + after_checks
        )
        mine = [(c, kind) for c, kind, peer in changes if peer == SLOW_PEER]
        others = [c for c, _, peer in changes if peer != SLOW_PEER]
        if not mine or mine[0][0] > slow_checks:
            continue
        confirmed += 1
        if (
            [kind for _, kind in mine] == ["Confirmed", "Recovered"]
            and mine[1][0] > slow_checks
            and not others
        ):
            clean += 1
            latencies.append(mine[1][0] - slow_checks)
    row: dict[str, Any] = {"factor": factor, "trials": trials, "slow_checks": slow_checks}
    row["confirmed_while_slow_share"] = confirmed / trials
    row["clean_share_of_confirmed"] = clean / confirmed if confirmed else None
    row["checks_to_recover"] = _summary(latencies) if latencies else None
    return row


# --------------------------------------------------------------------------------------------
# Real runs at the default cadence
# --------------------------------------------------------------------------------------------


def _first_checks(events: list[dict[str, Any]], cadence: int) -> dict[str, dict[str, Any]]:
    """Per kind: the check (1-based) of every confirmation and recovery, by rank."""
    out: dict[str, dict[str, Any]] = {}
    for event in events:
        entry = out.setdefault(event["kind"], {})
        entry.setdefault(event["reason"], []).append(
            {"rank": event["rank"], "check": event["step"] // cadence, "ratio": event["ratio"]}
        )
    return out


def real_runs(steps: dict[str, int], cadence: int | None) -> list[dict[str, Any]]:
    every = cadence or ReplayConfig().intervals.hidden_steps
    scenarios = [
        ("healthy", {}, {}),
        ("device 1.2x", {str(SLOW_PEER): 1.2}, {}),
        ("device 1.5x", {str(SLOW_PEER): 1.5}, {}),
        ("device 2x", {str(SLOW_PEER): 2.0}, {}),
        ("loop 1.5x", {}, {"2": 1.5}),
    ]
    rows = []
    for name, device, loop in scenarios:
        count = steps[name]
        started = time.perf_counter()
        record = run_job({"steps": count, "device": device, "loop": loop, "check_every": cadence})
        rows.append(
            {
                "scenario": name,
                "steps": count,
                "cadence_steps": every,
                "checks": count // every,
                "events": _first_checks(record["events"], every),
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
        print(f"  real {name}: {rows[-1]['events']} ({rows[-1]['wall_s']} s)", flush=True)
    return rows


def _real_first(rows: list[dict[str, Any]], scenario: str, kind: str, rank: int) -> int | None:
    row = next(r for r in rows if r["scenario"] == scenario)
    hits = [
        e["check"] for e in row["events"].get(kind, {}).get(f"{kind}-slow", []) if e["rank"] == rank
    ]
    return min(hits) if hits else None


# --------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, trials and checks")
    parser.add_argument("--no-real", action="store_true", help="skip the real default-cadence runs")
    parser.add_argument("--noise-steps", type=int, default=None)
    parser.add_argument("--checks-max", type=int, default=40)
    parser.add_argument(
        "--noise-from", type=Path, default=None, help=f"reuse measured noise (a {NOISE.name})"
    )
    args = parser.parse_args()
    quick = args.quick
    trials = 60 if quick else 200
    healthy_checks = 4000 if quick else 20000
    noise_steps = args.noise_steps or (120 if quick else 300)
    config = DEFAULT_SEQUENTIAL_CONFIG
    replay_config, loop_config = ReplayConfig(), LoopConfig()
    window = loop_config.check_every_steps

    started = time.perf_counter()
    if args.noise_from is not None:
        noise = json.loads(args.noise_from.read_text())
        print(f"== noise from {args.noise_from}", flush=True)
    else:
        print(
            f"== measuring noise: a healthy 4-rank run, a check at every step, {noise_steps} steps",
            flush=True,
        )
        noise = run_job({"steps": noise_steps, "check_every": 1})
        NOISE.parent.mkdir(parents=True, exist_ok=True)
        NOISE.write_text(json.dumps(noise))
    device_checks = noise["device_checks"][3:]  # the first checks include one-time costs
    loop_steps = noise["loop_checks"][3:]
    base_ms = {
        name: statistics.median(v for c in device_checks for v in c.get(name, []) if v is not None)
        for name in device_checks[0]
    }
    print(
        f"  {len(device_checks)} replay checks, {len(loop_steps)} loop steps ({time.perf_counter() - started:.0f} s)"
    )

    clock_comparison = {"own (auto)": evidence_noise(device_checks, replay_config.device_floor_ms)}
    if args.noise_from is None:
        wall_steps = max(60, noise_steps // 3)
        print(f"== the same, replay timed on the wall clock, {wall_steps} steps", flush=True)
        wall = run_job({"steps": wall_steps, "check_every": 1, "timing_clock": "wall"})
        clock_comparison["wall"] = evidence_noise(
            wall["device_checks"][3:], replay_config.device_floor_ms
        )
    print(f"  healthy evidence by clock: {clock_comparison}", flush=True)
    device_models: dict[str, Draw] = {
        "measured": measured_device(device_checks),
        "quiet": parametric_device(0.02, 0.0, base_ms),
        "shared": parametric_device(0.05, 0.02, base_ms),
        "noisy": parametric_device(0.10, 0.05, base_ms),
    }
    simulated: list[dict[str, Any]] = []
    for name, draw in device_models.items():
        sim = Simulator(draw, replay_config.device_floor_ms, replay_config.timing, config)
        rows = [power_row(sim, f, trials, args.checks_max, seed=17) for f in (1.2, 1.5, 2.0)]
        entry = {
            "kind": "device",
            "noise": name,
            "power": rows,
            "false": false_confirmations(sim, healthy_checks, seed=23),
            "stop": stop_row(sim, 1.5, trials, 10, 30, seed=29),
        }
        simulated.append(entry)
        print(
            f"  sim device/{name}: "
            + ", ".join(f"{r['factor']}x median {r['checks_to_confirm']['median']}" for r in rows)
            + f"; false/10k {entry['false']['per_10000_checks']}",
            flush=True,
        )
    for short in (2, 10):  # shorter windows than the default: context for choosing a cadence
        short_sim = Simulator(
            measured_loop(loop_steps, short),
            loop_config.timing.absolute_floor_ms,
            loop_config.timing,
            loop_config.straggler,
        )
        simulated.append(
            {
                "kind": "loop",
                "noise": f"measured, {short}-step windows",
                "window_steps": short,
                "power": [power_row(short_sim, 1.5, trials, args.checks_max, seed=31)],
                "false": false_confirmations(short_sim, healthy_checks, seed=37),
            }
        )
        print(
            f"  sim loop/{short}-step windows: 1.5x median {simulated[-1]['power'][0]['checks_to_confirm']['median']}; false/10k {simulated[-1]['false']['per_10000_checks']}",
            flush=True,
        )
    loop_sim = Simulator(
        measured_loop(loop_steps, window),
        loop_config.timing.absolute_floor_ms,
        loop_config.timing,
        loop_config.straggler,
    )
    loop_rows = [power_row(loop_sim, f, trials, args.checks_max, seed=31) for f in (1.2, 1.5, 2.0)]
    simulated.append(
        {
            "kind": "loop",
            "noise": "measured",
            "window_steps": window,
            "power": loop_rows,
            "false": false_confirmations(loop_sim, healthy_checks, seed=37),
            "stop": stop_row(loop_sim, 1.5, trials, 10, 30, seed=41),
        }
    )
    print(
        "  sim loop/measured: "
        + ", ".join(f"{r['factor']}x median {r['checks_to_confirm']['median']}" for r in loop_rows),
        flush=True,
    )

    real: list[dict[str, Any]] = []
    cadence = 10 if quick else None
    if not args.no_real:
        every = cadence or replay_config.intervals.hidden_steps
        steps = {
            "healthy": 12 * every,
            "device 1.2x": 24 * every,
            "device 1.5x": 10 * every,
            "device 2x": 10 * every,
            "loop 1.5x": 10 * every,
        }
        print(f"== real runs, a check every {every} steps", flush=True)
        real = real_runs(steps, cadence)

    def sim_median(kind: str, factor: float) -> float:
        entry = next(e for e in simulated if e["kind"] == kind and e["noise"] == "measured")
        return next(r for r in entry["power"] if r["factor"] == factor)["checks_to_confirm"][
            "median"
        ]

    measured = [e for e in simulated if e["noise"] == "measured"]
    goals: dict[str, Any] = {}
    for kind, factor in (("device", 1.5), ("device", 1.2), ("loop", 1.5)):
        limit = GOAL_CHECKS[factor]
        label = f"{kind}_{factor}x_within_{limit}_checks"
        median = sim_median(kind, factor)
        scenario = f"{kind} {factor:g}x"
        first = (
            _real_first(real, scenario, kind, SLOW_PEER if kind == "device" else 2)
            if real
            else None
        )
        goals[label] = {
            "simulated_median_checks": median,
            "real_first_check": first,
            "met": median <= limit and (not real or (first is not None and first <= limit)),
        }
    real_false = 0
    if real:
        healthy = next(r for r in real if r["scenario"] == "healthy")
        real_false = sum(
            1
            for kind in healthy["events"].values()
            for reason, hits in kind.items()
            if not reason.startswith("recovered")
            for _ in hits
        )
    false_rates = {e["kind"]: e["false"]["per_10000_checks"] for e in measured}
    goals["zero_false_confirmations"] = {
        "simulated_per_10000_checks": false_rates,
        "real_healthy_confirmations": real_false if real else None,
        "met": all(v == 0 for v in false_rates.values()) and real_false == 0,
    }
    flapping = {
        e["kind"]: {
            "recoveries_while_slow": sum(r["recoveries_while_slow"] for r in e["power"]),
            "stop_clean_share": e["stop"]["clean_share_of_confirmed"],
        }
        for e in measured
    }
    goals["no_flapping"] = {
        **flapping,
        "met": all(
            v["recoveries_while_slow"] == 0 and v["stop_clean_share"] == 1.0
            for v in flapping.values()
        ),
    }
    output = {
        "benchmark": "stragglers",
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "quick": quick,
        "test": {
            k: getattr(config, k)
            for k in (
                "slow_ratio",
                "confirm_evidence",
                "clip_ratio",
                "fast_ratio",
                "recovery_ratio",
                "recovery_evidence",
                "noise_spread",
                "noise_checks",
            )
        },
        "noise": {
            "steps": noise_steps,
            "device_checks": len(device_checks),
            "loop_steps": len(loop_steps),
            "median_replay_ms": base_ms,
            "healthy_evidence_by_clock": clock_comparison,
        },
        "simulated": simulated,
        "real": real,
        "goals": goals,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(output, indent=2))
    for label, goal in goals.items():
        print(
            f"  {label}: {'met' if goal['met'] else 'NOT met'} {json.dumps({k: v for k, v in goal.items() if k != 'met'})}"
        )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
