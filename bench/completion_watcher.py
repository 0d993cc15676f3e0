"""Benchmark: what completion tracking costs a healthy trainer (spec/observer.md INSTR-13).
Writes bench/results/completion_watcher.json.

- poll: one watcher poll, per source -- markers (nothing pending; 64 pending), PyTorch's Flight
  Recorder on gloo (a 64-entry ring, as ``TORCH_FR_BUFFER_SIZE=64``), the emulated backend's
  recorder (a test backend, shown but not in the goal);
- the watcher thread's own CPU while its trainer is healthy and idle, read from the thread's
  schedstat over a window: the polls *and* the wake-ups, which cost more than the polls on a VM
  (about 0.13 ms each here); as a share of one core (goal <= 0.1 %);
- tracking on a wrapped collective: what the tracker adds to one ``all_reduce`` call;
- step overhead: a small MLP step with one all-reduce on a one-rank gloo group, instrumented
  with completion tracking (the watcher running) against instrumented without it: rounds of
  ``STEPS_PER_ARM`` steps per arm, the arms' order drawn per round; goal: the median of the
  per-round differences <= 0.5 % of the step.

Run: .venv/bin/python bench/completion_watcher.py
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

# The Flight Recorder reads its buffer size when the process group is made.
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import at_most, print_goals, write_results  # noqa: E402

from scout.observer import completion as comp  # noqa: E402
from scout.observer.progress import ProgressPublisher, RecordIdentity  # noqa: E402

STEPS_PER_ARM = 5
PRODUCTION_SOURCES = ("markers_nothing_pending", "markers_64_pending", "flight_recorder_gloo_64_entries")


def per_call_us(call: Callable[[], Any], calls: int, batches: int = 9) -> dict[str, float]:
    call()
    means = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return {"best_us": round(min(means), 3), "median_us": round(statistics.median(means), 3)}


class _Done:
    def is_completed(self) -> bool:
        return False


def bench_polls(publisher: ProgressPublisher) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    idle = comp.CompletionTracker(comp.Contract.BLOCKING)
    busy = comp.CompletionTracker(comp.Contract.BLOCKING)
    for _ in range(64):
        busy.launched(0xF00D, _Done())
    results: dict[str, Any] = {
        "markers_nothing_pending": per_call_us(comp.MarkerSource(idle, 7).poll, 20_000),
        "markers_64_pending": per_call_us(comp.MarkerSource(busy, 7).poll, 20_000),
    }
    for _ in range(70):  # fill the 64-entry ring
        dist.all_reduce(torch.ones(8))
    tracking = comp.start_tracking(publisher, source="flight-recorder", poll_interval_s=comp.POLL_INTERVAL_S)
    assert tracking is not None and tracking.source_name == "PyTorch's Flight Recorder", tracking
    try:
        results["flight_recorder_gloo_64_entries"] = per_call_us(tracking.watcher.source.poll, 500)
    finally:
        tracking.stop()
    results["emulated_recorder_256_entries"] = _emulated_poll()
    return results


def _emulated_poll() -> dict[str, float]:
    """The emulated recorder's dump and parse, from a group made outside any process group."""
    import torch

    from scout.transport.nccl import emulated

    with tempfile.TemporaryDirectory() as directory:
        import torch.distributed as dist

        store = dist.FileStore(os.path.join(directory, "store"), 1)
        group = emulated.EmulatedProcessGroup(store, 0, 1, timedelta(seconds=30))
        for _ in range(emulated.RECORDER_ENTRIES_MAX + 4):
            group.allreduce([torch.ones(8)]).wait()
        source = comp.TraceSource(group.flight_recorder_dump, 7, emulated.group_name(group), (0,), started_known=True)
        return per_call_us(source.poll, 300)


def bench_tracked_call() -> dict[str, Any]:
    """One wrapped all_reduce with and without the completion tracker behind it."""
    import torch
    import torch.distributed as dist

    from scout.observer import instrument as inst

    tensor = torch.ones(1)
    out: dict[str, Any] = {}
    for label, tracked in (("without_tracking", False), ("with_tracking", True)):
        publisher = ProgressPublisher(RecordIdentity(f"bench-call-{os.getpid()}-{label}", 0, 0))
        try:
            inst.instrument(publisher, completion=tracked, completion_source="markers")
            out[label] = per_call_us(lambda: dist.all_reduce(tensor), 2_000)
        finally:
            inst.uninstrument()
            publisher.close()
    out["added_us"] = round(out["with_tracking"]["best_us"] - out["without_tracking"]["best_us"], 3)
    return out


def bench_step_overhead(pairs: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from scout.observer import instrument as inst

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()) for _ in range(6)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(64, 512)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def timed_step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        model(data).square().mean().backward()
        dist.all_reduce(flat)
        optimizer.step()
        return (time.perf_counter() - start) * 1e3

    plain: list[float] = []
    tracked: list[float] = []
    order = random.Random(2608)
    for pair in range(pairs + 3):
        arms = [("plain", False), ("tracked", True)]
        order.shuffle(arms)
        for label, track in arms:
            publisher = ProgressPublisher(RecordIdentity(f"bench-step-{os.getpid()}-{pair}-{label}", 0, 0))
            try:
                inst.instrument(publisher, completion=track, completion_source="markers")
                inst.instrument_module(model)
                timed_step()  # the watcher's first poll and thread start are not the steady state
                elapsed = statistics.median(timed_step() for _ in range(STEPS_PER_ARM))
            finally:
                inst.uninstrument()
                publisher.close()
            if pair >= 3:
                (tracked if track else plain).append(elapsed)
    differences = [b - a for a, b in zip(plain, tracked, strict=True)]
    plain_median = statistics.median(plain)
    return {
        "model": "6 blocks of Linear(512,512)+ReLU, batch 64, one all-reduce per step, 1 thread, gloo world of 1",
        "pairs": pairs,
        "step_ms_plain_median": round(plain_median, 3),
        "step_ms_tracked_median": round(statistics.median(tracked), 3),
        "overhead_ms_median_of_pairs": round(statistics.median(differences), 4),
        "overhead_percent": round(statistics.median(differences) / plain_median * 100, 3),
    }


def watcher_thread_cpu(window_s: float = 5.0) -> dict[str, float]:
    """The CPU a running watcher thread takes a second (markers, nothing happening), from its
    thread's schedstat: what a busy host gives it."""
    publisher = ProgressPublisher(RecordIdentity(f"bench-thread-{os.getpid()}", 0, 0))
    watcher = comp.CompletionWatcher(comp.MarkerSource(comp.CompletionTracker(comp.Contract.BLOCKING), 7),
                                     publisher.completion_writer())
    try:
        watcher.start()
        time.sleep(0.5)
        stat = Path(f"/proc/self/task/{watcher._thread.native_id}/schedstat")
        before, polls = int(stat.read_text().split()[0]), watcher.polls
        time.sleep(window_s)
        used_ns, polls = int(stat.read_text().split()[0]) - before, watcher.polls - polls
    finally:
        watcher.stop()
        publisher.close()
    return {"core_percent": used_ns / (window_s * 1e9) * 100, "polls_per_s": polls / window_s,
            "us_per_poll": used_ns / max(polls, 1) / 1e3}


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group("gloo", init_method=f"file://{directory}/rdzv", rank=0, world_size=1,
                                timeout=timedelta(seconds=60))
        publisher = ProgressPublisher(RecordIdentity(f"bench-polls-{os.getpid()}", 0, 0))
        try:
            polls = bench_polls(publisher)
            thread = watcher_thread_cpu()
            call = bench_tracked_call()
            step = bench_step_overhead(pairs=30)
        finally:
            publisher.close()
            dist.destroy_process_group()
    worst_poll_us = max(polls[name]["median_us"] for name in PRODUCTION_SOURCES)
    goals = [
        at_most("completion_watcher_core_percent", round(thread["core_percent"], 4), 0.1, "% of a core",
                f"the watcher thread's CPU, {thread['polls_per_s']:.1f} polls/s at {thread['us_per_poll']:.0f} us "
                f"each with its wake-up (a poll alone: up to {worst_poll_us:.1f} us)"),
        at_most("completion_tracking_step_overhead_percent", max(0.0, step["overhead_percent"]), 0.5, "%",
                "median of A/B pairs, watcher running vs no completion tracking"),
    ]
    print_goals(goals)
    print(f"polls: {polls}\ntracked call: {call}\nstep: {step}")
    path = write_results("completion_watcher", {"polls": polls, "watcher_thread": thread, "tracked_call": call,
                                                "step_overhead": step}, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
