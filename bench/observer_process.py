"""The observer process's start-up time, resident memory and CPU while its trainer is healthy
(goals: start < 1 s, < 50 MiB, and next to nothing while healthy).

Starts ``python -m scout.observer.process`` the way ``scout.observer.launch`` does, times it from
the spawn to its address line, and reads its resident memory once it is waiting for the
rendezvous; median and spread over several starts. Then a group of two observers (started with
``scout.observer.launch.start_observer``) watches two progress records that this process
advances every millisecond, as a healthy trainer's layer hooks do, and their CPU time over the
window is read from /proc: at the default ``watch_interval_s`` (DRIVER-6) and, for comparison,
at 0.05 s (the poll every observer made before). On a machine whose cores the trainers keep busy,
this CPU is taken from them. Writes bench/results/observer_process.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scout.observer.launch import WATCH_INTERVAL_S, _environment, start_observer
from scout.observer.progress import ProgressPublisher, RecordIdentity
from scout.observer.rendezvous import DirectoryRendezvous

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import at_most, print_goals, spread, write_results  # noqa: E402

STARTS = 7
START_GOAL_S = 1.0
RSS_GOAL_MIB = 50.0
HEALTHY_WINDOW_S = 10.0
#: CPU share of one core an observer may take while its trainer is healthy: at 1 % two observers on
#: a 2-core box already cost a 2-rank job about 1 % of its time (issue 23).
HEALTHY_CPU_GOAL = 0.001


def _cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid``, to the nanosecond (schedstat: /proc/PID/stat counts
    10 ms ticks, too coarse for a process that should barely run)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total_ns / 1e9


def healthy_cpu(watch_interval_s: float) -> float:
    """Share of one core each of two observers uses while their records advance every ms."""
    job = f"bench-cpu-{os.getpid()}-{time.monotonic_ns()}"
    publishers = [ProgressPublisher(RecordIdentity(job, 0, rank)) for rank in (0, 1)]
    handles: list = [None, None]
    done = threading.Event()
    with tempfile.TemporaryDirectory() as directory:
        def start(rank: int) -> None:
            handles[rank] = start_observer(publishers[rank], group_ranks=(0, 1), secret=b"k" * 32,
                                           rendezvous=DirectoryRendezvous(directory),
                                           config={"stall_threshold_s": 10.0}, watch_interval_s=watch_interval_s)
            # The observer's parent-death signal fires when the thread that started it ends.
            done.wait(HEALTHY_WINDOW_S + 120)

        threads = [threading.Thread(target=start, args=(rank,)) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while None in handles and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            for handle in handles:
                handle.wait_ready(60)
            before = [_cpu_s(handle.pid) for handle in handles]
            started = time.monotonic()
            while time.monotonic() - started < HEALTHY_WINDOW_S:
                for publisher in publishers:
                    publisher.advance()
                time.sleep(0.001)
            elapsed = time.monotonic() - started
            shares = [(_cpu_s(handle.pid) - b) / elapsed for handle, b in zip(handles, before, strict=True)]
        finally:
            for publisher, handle in zip(publishers, handles, strict=True):
                publisher.close()
                if handle is not None:
                    handle.close()
            done.set()
            for thread in threads:
                thread.join(10)
    return statistics.fmean(shares)


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
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    runs = [one_start() for _ in range(STARTS)]
    starts, rss = [r[0] for r in runs], [r[1] for r in runs]
    cpu = {"default": healthy_cpu(WATCH_INTERVAL_S), "poll_0.05_s": healthy_cpu(0.05)}
    goals = [
        at_most("observer process start", statistics.median(starts), START_GOAL_S, "s",
                "spawn to its address line, median of the starts"),
        at_most("observer process resident memory", statistics.median(rss), RSS_GOAL_MIB, "MiB",
                "VmRSS while it waits for the rendezvous, median"),
        at_most("observer CPU while its trainer is healthy", 100 * cpu["default"], 100 * HEALTHY_CPU_GOAL,
                "% of a core", f"watch_interval_s {WATCH_INTERVAL_S} s (DRIVER-6); reading every 0.05 s instead: "
                f"{100 * cpu['poll_0.05_s']:.3f} %"),
    ]
    write_results("observer_process", {"start_s": spread(starts), "rss_mib": spread(rss), "healthy_cpu_share": cpu,
                                       "healthy_window_s": HEALTHY_WINDOW_S}, goals)
    print_goals(goals)
    return 0 if all(goal.met for goal in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
