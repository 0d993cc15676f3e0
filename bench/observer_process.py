"""The observer process's start-up time and resident memory (goals: start < 1 s, < 50 MiB).

Starts ``python -m scout.observer.process`` the way ``scout.observer.launch`` does, times it from
the spawn to its address line, and reads its resident memory once it is waiting for the
rendezvous; median and spread over several starts. Writes bench/results/observer_process.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scout.observer.launch import _environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import at_most, print_goals, spread, write_results  # noqa: E402

STARTS = 7
START_GOAL_S = 1.0
RSS_GOAL_MIB = 50.0


def one_start() -> tuple[float, float]:
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "scout.observer.process"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=_environment())
    assert process.stdin is not None and process.stdout is not None
    spec = {"job_id": "bench", "generation": 0, "rank": 0, "group_ranks": [0, 1], "group_id": "00" * 8,
            "group_key": "11" * 32, "record_name": "scout_bench", "record_token": "00" * 16, "config": {},
            "trainer_pid": os.getpid(), "trainer_start_ticks": 0, "poll_interval_s": 0.05}
    process.stdin.write((json.dumps(spec) + "\n").encode())
    process.stdin.flush()
    process.stdout.readline()
    start_s = time.monotonic() - started
    time.sleep(0.3)
    with open(f"/proc/{process.pid}/status", encoding="utf-8") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    process.terminate()
    process.wait(10)
    return start_s, rss_kib / 1024


def main() -> int:
    runs = [one_start() for _ in range(STARTS)]
    starts, rss = [r[0] for r in runs], [r[1] for r in runs]
    goals = [
        at_most("observer process start", statistics.median(starts), START_GOAL_S, "s",
                "spawn to its address line, median of the starts"),
        at_most("observer process resident memory", statistics.median(rss), RSS_GOAL_MIB, "MiB",
                "VmRSS while it waits for the rendezvous, median"),
    ]
    write_results("observer_process", {"start_s": spread(starts), "rss_mib": spread(rss)}, goals)
    print_goals(goals)
    return 0 if all(goal.met for goal in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
