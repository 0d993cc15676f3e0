"""Benchmark and full model check of the checkpoint gate: the exhaustive exploration of every
catalog of 1-4 recipes and 1-3 peer groups with every verdict outcome vector (the ``slow``
matrix of tests/model_check/test_gate_explore.py), the manifest's commit latency, and the
1024-rank simulated campaign. Writes bench/results/gate.json.

Run: ./dev py bench/gate_model_check.py [--full]   (./dev bench runs it without --full)
Without ``--full`` only the CI matrix runs (one vector per result class, one capture per run);
``--full`` adds every outcome vector with two captures per run (about half an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import at_least, print_goals, write_results  # noqa: E402

import scout.scenarios.gate_campaign  # noqa: E402,F401  (registers the scenario)
from scout.core.machine import explore  # noqa: E402
from scout.gate.manifest import ManifestWriter  # noqa: E402
from scout.scenarios.registry import ScenarioParams, run_scenario  # noqa: E402
from tests.gate_story import story_payloads  # noqa: E402
from tests.model_check.gate_harness import (  # noqa: E402
    CheckedGate,
    checked_environment,
    class_vectors,
    configurations,
    every_vector,
    initial,
    make_config,
)

RESULTS = REPO / "bench" / "results" / "gate_model_check.json"


def model_check(vectors_name: str, captures_max: int) -> list[dict[str, object]]:
    vectors = every_vector if vectors_name == "every" else class_vectors
    rows = []
    for recipes_count, groups_count in configurations(4, 3):
        started = time.perf_counter()
        result = explore(
            CheckedGate(),
            [initial(make_config(recipes_count, groups_count))],
            checked_environment(vectors, captures_max=captures_max),
            depth_max=200,
            states_max=5_000_000,
            require_exhaustive=True,
        )
        elapsed_s = time.perf_counter() - started
        rows.append(
            {
                "recipes": recipes_count,
                "groups": groups_count,
                "vectors": vectors_name,
                "captures_max": captures_max,
                "states": result.states_count,
                "transitions": result.transitions_count,
                "depth_reached": result.depth_reached,
                "exhaustive": not result.truncated,
                "witnessed": sorted(result.witnesses),
                "rows_unfired": list(result.labels_unfired),
                "elapsed_s": round(elapsed_s, 2),
                "transitions_per_s": round(result.transitions_count / elapsed_s),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def manifest_latency(commits: int = 200) -> dict[str, float]:
    payloads = story_payloads()
    with tempfile.TemporaryDirectory() as directory, ManifestWriter(directory, "story-job") as writer:
        durations_ms = []
        for index in range(commits):
            started = time.perf_counter()
            writer.commit(payloads[index % len(payloads)])
            durations_ms.append((time.perf_counter() - started) * 1000)
    durations_ms.sort()
    return {
        "commits": commits,
        "payload_bytes_max": max(len(json.dumps(p)) for p in payloads),
        "median_ms": round(statistics.median(durations_ms), 3),
        "p99_ms": round(durations_ms[int(0.99 * (commits - 1))], 3),
        "filesystem_of": tempfile.gettempdir(),
    }


def campaign(ranks: int = 1024, seeds: int = 3) -> list[dict[str, object]]:
    rows = []
    for seed in range(1, seeds + 1):
        report = run_scenario("gate-campaign", ScenarioParams(ranks=ranks, seed=seed))
        rows.append(
            {
                "ranks": ranks,
                "seed": seed,
                "ok": report.ok,
                "wall_s": round(report.wall_s, 2),
                "events": report.result.events,
                "events_per_s": round(report.events_per_s),
                "messages_sent": report.result.messages_sent,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="every outcome vector with two captures per run "
                        "(about twenty minutes on 2 cores)")
    full = parser.parse_args().full
    output = {
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": __import__("os").cpu_count()},
        "ci_matrix": model_check("class", 1),
        "manifest_commit": manifest_latency(),
        "campaign_1024": campaign(),
    }
    if full:
        output["full_matrix"] = model_check("every", 2)
    elif RESULTS.exists():
        # Keep the last full run's figures (it takes about twenty minutes) beside the quick ones.
        previous = json.loads(RESULTS.read_text(encoding="utf-8"))
        if "full_matrix" in previous:
            output["full_matrix"] = previous["full_matrix"]
    campaigns = output["campaign_1024"]
    goal_list = [
        at_least("gate model check: exhaustive matrix rows", sum(1 for r in output["ci_matrix"] if r["exhaustive"]), len(output["ci_matrix"]), "rows"),
        at_least("gate campaign 1024 ranks: runs ok", sum(1 for r in campaigns if r["ok"]), len(campaigns), "runs"),
    ]
    write_results("gate_model_check", output, goal_list, RESULTS)
    print_goals(goal_list)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
