"""Benchmark of the simulated cluster: events per second and wall time at 4096 ranks.

    python bench/sim.py [--ranks 4096] [--seed 1]

Runs the built-in scenarios and a world-wide collective job on one core and writes
``bench/results/sim.json``. Every number in it is measured here with ``time.perf_counter``;
nothing is estimated. Goals (docs/design.md §4, "thousands of ranks on one core"): at least
100,000 events/s, and a 4096-rank scenario in under 30 s of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

from scout.scenarios.registry import ScenarioParams, run_scenario
from scout.transport.program import AllGather, Barrier, Broadcast
from scout.transport.sim import SimCluster, SimContext

RESULTS = Path(__file__).resolve().parent / "results" / "sim.json"
GOAL_EVENTS_PER_S = 100_000
GOAL_WALL_S = 30.0
SCENARIOS = (
    ("exchange-healthy", 8),
    ("exchange-healthy", 64),
    ("exchange-silent-peer", 8),
    ("exchange-partition", 8),
    ("crash-during-allgather", 8),
    ("corrupt-evidence", 8),
)
WORLD_COLLECTIVE_ROUNDS = 10


def world_collectives(ctx: SimContext) -> Generator[Any, Any, int]:
    """Every rank all-gathers, broadcasts and meets at a barrier over the whole world."""
    for round_id in range(WORLD_COLLECTIVE_ROUNDS):
        values = yield AllGather((ctx.rank, round_id), timeout_s=10.0)
        assert len(values) == ctx.size
        yield Broadcast(round_id, root=round_id % ctx.size, timeout_s=10.0)
        yield Barrier(timeout_s=10.0)
    return WORLD_COLLECTIVE_ROUNDS


def measure_scenario(name: str, ranks: int, group_size: int, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    report = run_scenario(name, ScenarioParams(ranks=ranks, seed=seed, group_size=group_size))
    total_wall_s = time.perf_counter() - started
    result = report.result
    return {
        "job": name,
        "ranks": ranks,
        "group_size": group_size,
        "rounds": report.params.rounds,
        "seed": seed,
        "ok": report.ok,
        "events": result.events,
        "messages": result.messages_sent,
        "virtual_time_s": result.virtual_time_s,
        "run_wall_s": round(result.wall_s, 4),
        "total_wall_s": round(total_wall_s, 4),
        "events_per_s": round(result.events / result.wall_s),
    }


def measure_world_collectives(ranks: int, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    cluster = SimCluster(ranks, seed=seed)
    cluster.spawn(world_collectives)
    result = cluster.run()
    total_wall_s = time.perf_counter() - started
    return {
        "job": "world-collectives",
        "ranks": ranks,
        "group_size": ranks,
        "rounds": WORLD_COLLECTIVE_ROUNDS,
        "seed": seed,
        "ok": result.values() == [WORLD_COLLECTIVE_ROUNDS] * ranks,
        "events": result.events,
        "messages": result.messages_sent,
        "virtual_time_s": result.virtual_time_s,
        "run_wall_s": round(result.wall_s, 4),
        "total_wall_s": round(total_wall_s, 4),
        "events_per_s": round(result.events / result.wall_s),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    args, _ = parser.parse_known_args(argv)  # ./dev bench passes its arguments to every bench
    runs = [measure_scenario(name, args.ranks, size, args.seed) for name, size in SCENARIOS]
    runs.append(measure_world_collectives(args.ranks, args.seed))
    events = sum(run["events"] for run in runs)
    run_wall_s = sum(run["run_wall_s"] for run in runs)
    slowest = max(runs, key=lambda run: run["total_wall_s"])
    summary = {
        "events": events,
        "run_wall_s": round(run_wall_s, 4),
        "events_per_s": round(events / run_wall_s),
        "slowest_job": slowest["job"],
        "slowest_total_wall_s": slowest["total_wall_s"],
        "all_ok": all(run["ok"] for run in runs),
        "meets_events_per_s_goal": events / run_wall_s >= GOAL_EVENTS_PER_S,
        "meets_wall_s_goal": slowest["total_wall_s"] < GOAL_WALL_S,
    }
    document = {
        "benchmark": "sim",
        "measured_with": "time.perf_counter",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "goals": {"events_per_s_min": GOAL_EVENTS_PER_S, "wall_s_max": GOAL_WALL_S},
        "summary": summary,
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    width = max(len(run["job"]) for run in runs)
    for run in runs:
        print(
            f"{run['job']:<{width}}  ranks={run['ranks']} group={run['group_size']} "
            f"events={run['events']} wall_s={run['total_wall_s']:.2f} "
            f"events/s={run['events_per_s']} ok={run['ok']}"
        )
    print(
        f"total: {summary['events']} events in {summary['run_wall_s']:.2f} s = "
        f"{summary['events_per_s']} events/s; slowest {summary['slowest_job']} "
        f"{summary['slowest_total_wall_s']:.2f} s; wrote {RESULTS}"
    )
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
