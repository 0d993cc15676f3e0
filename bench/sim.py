"""Benchmark of the simulated cluster: events per second and wall time at 4096 ranks, and every
observer scenario at 65,536 ranks with its wall time and peak memory.

    python bench/sim.py [--ranks 4096] [--observer-ranks 65536] [--seed 1]

Runs the built-in exchange scenarios and a world-wide collective job on one core, then each
observer scenario (the production observer driver on every simulated rank) in a subprocess of
its own, whose peak resident memory the kernel reports (``wait4``), and writes
``bench/results/sim.json``. Every number in it is measured here; nothing is estimated.
Goals: at least 100,000 events/s and a 4096-rank exchange scenario in under 30 s
(docs/design.md §4, "thousands of ranks on one core"); each observer scenario at 65,536 ranks in
under 60 s and 2 GiB (docs/simulator.md, "Memory"), and its memory within the figure the registry states for it
(``scout.scenarios.registry.memory_estimate_bytes``, which refuses larger runs up front).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import Goal, at_least, at_most, print_goals, write_results  # noqa: E402

from scout.scenarios.registry import (  # noqa: E402
    ScenarioParams,
    memory_estimate_bytes,
    run_scenario,
    scenario_names,
)
from scout.transport.program import AllGather, Barrier, Broadcast  # noqa: E402
from scout.transport.sim import SimCluster, SimContext  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "sim.json"
GOAL_EVENTS_PER_S = 100_000
GOAL_WALL_S = 30.0
GOAL_OBSERVER_WALL_S = 60.0
GOAL_OBSERVER_MEMORY_BYTES = 2 * 2**30
OBSERVER_RUN_BOUND_S = 900.0  # a run past this is stopped and counted as missing its goal
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


def measure_in_subprocess(name: str, ranks: int, seed: int) -> dict[str, Any]:
    """One scenario in a fresh interpreter: its wall time and peak resident memory (the
    child reads its own ``ru_maxrss``, Linux: KiB)."""
    code = (
        "import json, resource\n"
        "from scout.scenarios.registry import ScenarioParams, run_scenario\n"
        f"report = run_scenario({name!r}, ScenarioParams(ranks={ranks}, seed={seed}))\n"
        "print(json.dumps({'ok': report.ok, 'wall_s': report.wall_s, "
        "'events': report.result.events, 'virtual_time_s': report.result.virtual_time_s, "
        "'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))\n"
    )
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        output, _ = process.communicate(timeout=OBSERVER_RUN_BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"job": name, "ranks": ranks, "ok": False, "error": f"ran past {OBSERVER_RUN_BOUND_S} s",
                "total_wall_s": OBSERVER_RUN_BOUND_S, "peak_rss_bytes": None}
    total_wall_s = time.perf_counter() - started
    row: dict[str, Any] = {"job": name, "ranks": ranks, "seed": seed, "total_wall_s": round(total_wall_s, 2)}
    if process.returncode != 0 or not output.strip():
        row.update(ok=False, error=f"exit {process.returncode}")
    else:
        row.update(json.loads(output.strip().splitlines()[-1]))
        row["wall_s"] = round(row["wall_s"], 2)
    row.setdefault("peak_rss_bytes", None)
    row["estimate_bytes"] = memory_estimate_bytes(name, ScenarioParams(ranks=ranks, seed=seed))
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--observer-ranks", type=int, default=65_536)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-observer", action="store_true")
    args, _ = parser.parse_known_args(argv)
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
    observer_runs = []
    if not args.skip_observer:
        names = [n for n in scenario_names() if n.startswith("observer-")]
        for name in names:
            row = measure_in_subprocess(name, args.observer_ranks, args.seed)
            observer_runs.append(row)
            print(json.dumps(row), flush=True)
    goals: list[Goal] = [
        at_least(f"sim events per second (exchange scenarios, {args.ranks} ranks)", events / run_wall_s, GOAL_EVENTS_PER_S, "events/s"),
        at_most(f"sim slowest exchange scenario at {args.ranks} ranks", slowest["total_wall_s"], GOAL_WALL_S, "s"),
    ]
    for row in observer_runs:
        goals.append(at_most(f"sim {row['job']} at {row['ranks']} ranks: wall", row.get("wall_s", row["total_wall_s"]) if row.get("ok") else float("inf"), GOAL_OBSERVER_WALL_S, "s", row.get("error", "")))
        if row["peak_rss_bytes"] is not None:
            goals.append(at_most(f"sim {row['job']} at {row['ranks']} ranks: peak memory", row["peak_rss_bytes"] / 2**20, GOAL_OBSERVER_MEMORY_BYTES / 2**20, "MiB"))
            goals.append(at_most(f"sim {row['job']} memory within the stated estimate", row["peak_rss_bytes"] / 2**20, row["estimate_bytes"] / 2**20, "MiB"))
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
        "observer_runs": observer_runs,
    }
    document["goals_by_name"] = document.pop("goals")
    write_results("sim", document, goals, RESULTS)
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
    print_goals(goals)
    return 0 if summary["all_ok"] and all(goal.met for goal in goals) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
