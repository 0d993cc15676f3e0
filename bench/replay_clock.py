"""Benchmark: which clock should time replay on a CPU (spec/replay.md STRAG-1)?

A straggler is the wall time a rank costs the job (issue 24): a rank that waits -- a sleep in its
layers, a slow file system, a device that answers late -- costs it as surely as one that
computes slowly. The thread's CPU time (``cpu``) does not advance while a rank waits; the wall
clock (``wall``) also counts the time the host kept a runnable thread off a CPU, which on a
shared host is contention, not the rank; ``own`` is the wall clock less that run-queue delay
(Linux's schedstat, as LOOP-1 and COMM-1 subtract it).

Per clock, interleaved in rounds (so a drift of the host hits every clock alike): a healthy
4-rank DDP job (bench/stragglers.py's small GPT, gloo, a replay of every recipe class at every
step) -- the spread of healthy peers' per-check evidence (STRAG-2: standard deviation and 99th
percentile); then rank 1 slowed 1.5x by *waiting* (``faults.SlowOps(waits=True)``:
after each of its operations the thread sleeps half the operation's time) and by *computing*
(``faults.SlowOps``: it spins as long) -- the check at which replay first confirms it
(``device-slow``), and any other rank confirmed.

``--load N`` runs N busy processes beside the jobs (a noisy neighbour on the host).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/replay_clock.py [--steps 60] [--rounds 2] [--load 0]
Writes bench/results/replay_clock.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stragglers  # noqa: E402  (bench/stragglers.py: the job, its runner and evidence_noise)

from scout.replay.replay import ReplayConfig  # noqa: E402

RESULTS = stragglers.REPO / "bench" / "results" / "replay_clock.json"
CLOCKS = ("cpu", "own", "wall")
SLOW_FACTOR = 1.5
WARM_CHECKS = 3  # the first checks include one-time costs


def _spin_forever() -> None:
    while True:
        pass


def _first_confirmation(events: list[dict[str, Any]], rank: int) -> tuple[int | None, list[int]]:
    """The step (= check: one replay check per step here) of the first ``device-slow``
    confirmation of ``rank``, and the other ranks ever confirmed device-slow."""
    first = None
    others: set[int] = set()
    for event in events:
        if event["kind"] != "device" or event["reason"] != "device-slow":
            continue
        if event["rank"] == rank and first is None:
            first = event["step"]
        elif event["rank"] != rank:
            others.add(event["rank"])
    return first, sorted(others)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per job (one replay check per step)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the jobs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.steps < WARM_CHECKS + 5 or args.rounds < 1 or args.load < 0:
        parser.error(f"need --steps >= {WARM_CHECKS + 5}, --rounds >= 1, --load >= 0; got {args.steps}, "
                     f"{args.rounds}, {args.load}")
    floor_ms = ReplayConfig().device_floor_ms
    busy = [multiprocessing.Process(target=_spin_forever, daemon=True) for _ in range(args.load)]
    for process in busy:
        process.start()
    healthy: dict[str, list[dict[str, list[Any]]]] = {clock: [] for clock in CLOCKS}
    slowed: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for round_index in range(args.rounds):
            for clock in CLOCKS:
                run = stragglers.run_job({"steps": args.steps, "check_every": 1, "timing_clock": clock})
                healthy[clock] += run["device_checks"][WARM_CHECKS:]
                print(f"round {round_index} {clock} healthy: "
                      f"{stragglers.evidence_noise(run['device_checks'][WARM_CHECKS:], floor_ms)}", flush=True)
                for how in ("wait", "compute"):
                    run = stragglers.run_job({"steps": args.steps, "check_every": 1, "timing_clock": clock,
                                              "device": {str(stragglers.SLOW_PEER): SLOW_FACTOR},
                                              "device_waits": how == "wait"})
                    first, others = _first_confirmation(run["events"], stragglers.SLOW_PEER)
                    slowed.append({"round": round_index, "clock": clock, "how": how, "first_check": first,
                                   "others_confirmed": others})
                    print(f"round {round_index} {clock} {how} 1.5x: confirmed at check {first}, others {others}",
                          flush=True)
    finally:
        for process in busy:
            process.kill()
    rows: dict[str, Any] = {}
    for clock in CLOCKS:
        noise = stragglers.evidence_noise(healthy[clock], floor_ms)
        per_how: dict[str, Any] = {}
        for how in ("wait", "compute"):
            firsts = [r["first_check"] for r in slowed if r["clock"] == clock and r["how"] == how]
            found = [f for f in firsts if f is not None]
            per_how[how] = {"first_checks": firsts,
                            "median_first_check": statistics.median(found) if found else None,
                            "others_confirmed": sorted({o for r in slowed if r["clock"] == clock
                                                        and r["how"] == how for o in r["others_confirmed"]})}
        rows[clock] = {"healthy_evidence": noise, "slowed_1_5x": per_how}
    result = {
        "benchmark": "replay_clock", "steps": args.steps, "rounds": args.rounds, "load": args.load,
        "slow_factor": SLOW_FACTOR, "ranks": stragglers.WORLD, "host": platform.node(),
        "cpus": multiprocessing.cpu_count(), "seconds": round(time.perf_counter() - started, 1),
        "clocks": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
