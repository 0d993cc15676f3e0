"""Completion tracking on real NCCL and CUDA (the GPU script's case ``completion_device``;
spec/observer.md INSTR-10..13), one rank per GPU, one or two ranks:

    TORCH_FR_BUFFER_SIZE=256 TORCH_NCCL_ENABLE_TIMING=1 \
        torchrun --standalone --nproc-per-node=<1|2> -m tests.gpu.completion_worker OUT_DIR

No rank calls ``set_device`` and none passes ``device_id``: the current device is GPU 0 on every
rank, as in a script that forgot, and tracking must still record each rank's marks on its own
GPU (INSTR-10, from ``LOCAL_RANK``). Two trackings watch the default group at once, each into a
record of its own: markers through ``instrument()`` (INSTR-11), and PyTorch's Flight Recorder,
which on NCCL must be read with ``_dump_nccl_trace`` (INSTR-10, INSTR-12). Then:

1. *hang*: a kernel that runs ``SLEEP_S`` (``torch.cuda._sleep``) is queued before an
   ``all_reduce``, which returns at enqueue; while the kernel runs both records must show the
   collective pending and not started (``enqueued``), and once it ends, completed;
2. *capture*: a CUDA graph is captured (``torch.cuda.graph``, global mode) while both watchers
   poll every 10 ms; the capture must come out valid and replay right, and polls must have been
   skipped (INSTR-13); an ``all_reduce`` captured in a second graph is not tracked (INSTR-11);
3. *control*: a plain thread querying an event during a capture, without scout -- what the
   gate prevents; whether it spoiled the capture is reported, not judged (the driver decides).

Each rank writes ``OUT_DIR/completion_rank<r>.json`` after every step, so a failure names the
step it reached. ``check(per_rank)`` lists what did not hold.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

SLEEP_S = 1.5
POLL_INTERVAL_S = 0.01
SETTLE_S = 0.5  # longer than the NCCL watchdog's loop (it updates the recorder's group status)
CAPTURE_HOLD_S = 0.2  # the host stays inside the capture this long: polls fall due in it
ENQUEUED, UNKNOWN = 1, 3  # PendingState


def _path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"completion_rank{rank}.json"


def _write(out_dir: Path, rank: int, result: dict[str, Any]) -> None:
    partial = _path(out_dir, rank).with_suffix(".partial")
    partial.write_text(json.dumps(result, default=repr), encoding="utf-8")
    os.replace(partial, _path(out_dir, rank))


def _cycles(torch: Any, seconds: float) -> int:
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(seconds * probe / (start.elapsed_time(end) / 1e3))


def _coordinate(reader: Any) -> list[int] | None:
    snapshot = reader.read()
    section = None if snapshot is None else snapshot.completion
    return None if section is None else [section.enqueued, section.completed, int(section.pending_state)]


def run(out_dir: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    from scout.observer import completion, instrument
    from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    result: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "step": "start"}
    device = torch.device("cuda", local_rank)
    job = f"gpu-completion-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}"

    def step(name: str, body: Callable[[], None]) -> None:
        result["step"] = name
        body()
        _write(out_dir, rank, result)

    dist.init_process_group("nccl", timeout=timedelta(seconds=60))  # no device_id, no set_device
    markers_publisher = ProgressPublisher(RecordIdentity(job, 0, rank))
    recorder_publisher = ProgressPublisher(RecordIdentity(job + "-fr", 0, rank))
    markers = ProgressReader(markers_publisher.name, markers_publisher.token, claim=False)
    recorder = ProgressReader(recorder_publisher.name, recorder_publisher.token, claim=False)
    tracking: Any = None
    try:
        def start() -> None:
            nonlocal tracking
            result["current_device_at_start"] = torch.cuda.current_device()
            instrument.instrument(markers_publisher, completion_source="markers")
            active = instrument._ACTIVE
            assert active is not None and active.tracking is not None, "markers tracking did not start"
            active.tracking.watcher.poll_interval_s = POLL_INTERVAL_S
            tracker = active.tracking.tracker
            result["marks_device"] = getattr(getattr(tracker, "clock", None), "device_index", None)
            tracking = completion.start_tracking(recorder_publisher, source="flight-recorder",
                                                 poll_interval_s=POLL_INTERVAL_S)
            result["recorder_source"] = None if tracking is None else tracking.source_name
            with torch.cuda.device(device):
                dist.all_reduce(torch.ones(8, device=device))  # the communicator exists from here
                torch.cuda.synchronize(device)

        step("start", start)

        def hang() -> None:
            with torch.cuda.device(device):
                cycles = _cycles(torch, SLEEP_S)
                time.sleep(SETTLE_S)
                result["markers_before"], result["recorder_before"] = _coordinate(markers), _coordinate(recorder)
                torch.cuda._sleep(cycles)  # the stream is busy: the collective waits behind it
                began = time.monotonic()
                dist.all_reduce(torch.ones(1024, device=device))
                result["all_reduce_returned_after_s"] = round(time.monotonic() - began, 3)
                time.sleep(SLEEP_S / 3)
                result["markers_during"], result["recorder_during"] = _coordinate(markers), _coordinate(recorder)
                torch.cuda.synchronize(device)
                time.sleep(SETTLE_S)
                result["markers_after"], result["recorder_after"] = _coordinate(markers), _coordinate(recorder)

        step("hang", hang)

        def capture() -> None:
            active = instrument._ACTIVE
            assert active is not None and active.tracking is not None
            watchers = [active.tracking.watcher, *([tracking.watcher] if tracking is not None else [])]
            tracker = active.tracking.tracker
            with torch.cuda.device(device):
                weight = torch.randn(256, 256, device=device) / 16
                x = torch.randn(64, 256, device=device)
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):  # warm-up before capture, as torch's docs ask
                    for _ in range(3):
                        torch.tanh(x @ weight)
                torch.cuda.current_stream(device).wait_stream(side)
                skipped = sum(w.skipped_polls for w in watchers)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y = x
                    for _ in range(200):
                        y = torch.tanh(y @ weight)
                    time.sleep(CAPTURE_HOLD_S)
                x.copy_(torch.randn(64, 256, device=device))
                graph.replay()
                expected = x
                for _ in range(200):
                    expected = torch.tanh(expected @ weight)
                torch.cuda.synchronize(device)
                result["capture_replays_right"] = bool(torch.allclose(y, expected, atol=1e-4, rtol=1e-3))
                result["skipped_polls"] = sum(w.skipped_polls for w in watchers) - skipped
                enqueued = tracker.coordinate()[0] if tracker is not None else None
                captured = tracker.captured if tracker is not None else None
                try:
                    z = torch.ones(16, device=device)
                    collective = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(collective):
                        dist.all_reduce(z)
                    collective.replay()
                    torch.cuda.synchronize(device)
                    result["collective_capture"] = {
                        "ok": True,
                        "untracked": None if tracker is None else tracker.captured - captured,
                        "enqueued_unchanged": None if tracker is None else tracker.coordinate()[0] == enqueued,
                        "value": float(z[0].item()),
                    }
                except Exception as exc:  # NCCL in a graph may be unsupported here: reported, not judged
                    result["collective_capture"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}

        step("capture", capture)

        def control() -> None:
            if tracking is not None:
                tracking.stop()
            instrument.uninstrument()
            with torch.cuda.device(device):
                done = torch.cuda.Event()
                done.record()
                torch.cuda.synchronize(device)
                stop = threading.Event()
                errors: list[str] = []

                def query() -> None:
                    while not stop.is_set():
                        try:
                            done.query()
                        except Exception as exc:
                            errors.append(f"{type(exc).__name__}: {exc}"[:200])
                        time.sleep(0.001)

                querier = threading.Thread(target=query)
                weight = torch.randn(128, 128, device=device)
                graph = torch.cuda.CUDAGraph()
                outcome = "valid"
                querier.start()
                try:
                    with torch.cuda.graph(graph):
                        y = weight
                        for _ in range(50):
                            y = y @ weight
                        time.sleep(0.1)
                except Exception as exc:
                    outcome = f"{type(exc).__name__}: {exc}"[:200]
                finally:
                    stop.set()
                    querier.join(10)
                result["unguarded_query"] = {"capture": outcome, "query_errors": errors[:2]}

        step("control", control)
        result["step"] = "done"
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
    finally:
        _write(out_dir, rank, result)
        if tracking is not None:
            tracking.stop()
        instrument.uninstrument()
        markers.close()
        recorder.close()
        markers_publisher.close()
        recorder_publisher.close()
    dist.destroy_process_group()


def load(out_dir: Path, ranks: int) -> list[dict[str, Any]]:
    missing = [r for r in range(ranks) if not _path(out_dir, r).is_file()]
    if missing:
        raise ValueError(f"ranks {missing} wrote no results")
    return [json.loads(_path(out_dir, r).read_text(encoding="utf-8")) for r in range(ranks)]


def _pending_not_started(seen: Any, before: Any) -> bool:
    return (isinstance(seen, list) and isinstance(before, list) and seen[0] == before[0] + 1
            and seen[1] == before[0] and seen[2] == ENQUEUED)


def check(per_rank: list[dict[str, Any]]) -> list[str]:
    """What did not hold, one line each (empty: the case passes)."""
    problems = []
    for result in per_rank:
        who = f"rank {result.get('rank')}"
        if "error" in result:
            problems.append(f"{who} failed in step {result.get('step')}: {result['error'].strip().splitlines()[-1]}")
            continue
        if result.get("marks_device") != result.get("local_rank"):
            problems.append(f"{who}: marks on cuda:{result.get('marks_device')}, its GPU is {result.get('local_rank')}")
        if result.get("recorder_source") != "PyTorch's Flight Recorder":
            problems.append(f"{who}: the recorder source did not start ({result.get('recorder_source')})")
        for source in ("markers", "recorder"):
            before, during, after = (result.get(f"{source}_{when}") for when in ("before", "during", "after"))
            if not _pending_not_started(during, before):
                problems.append(f"{who}: {source} during the kernel {during} (before {before}); wanted one more "
                                "enqueued, not started")
            if not (isinstance(after, list) and isinstance(during, list) and after[0] == during[0] == after[1]):
                problems.append(f"{who}: {source} after the kernel {after}; wanted it completed")
        if result.get("capture_replays_right") is not True:
            problems.append(f"{who}: the graph captured beside the watchers did not replay right")
        if not result.get("skipped_polls"):
            problems.append(f"{who}: no poll was skipped during a {CAPTURE_HOLD_S} s capture")
        collective = result.get("collective_capture") or {}
        if collective.get("ok") and not (collective.get("untracked") == 1 and collective.get("enqueued_unchanged")):
            problems.append(f"{who}: a captured all_reduce was tracked ({collective})")
        if result.get("step") != "done":
            problems.append(f"{who}: stopped in step {result.get('step')}")
    return problems


def figures(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("marks_device", "current_device_at_start", "all_reduce_returned_after_s", "skipped_polls",
            "markers_before", "markers_during", "markers_after", "recorder_before", "recorder_during",
            "recorder_after", "collective_capture", "unguarded_query", "step")
    return {f"rank{r.get('rank')}": {k: r.get(k) for k in keys} for r in per_rank}


def summary(per_rank: list[dict[str, Any]]) -> str:
    first = per_rank[0]
    return (f"{len(per_rank)} rank(s): pending-not-started then completed by markers and NCCL's recorder; "
            f"{first.get('skipped_polls')} polls skipped in a capture that replayed right; marks on each rank's "
            f"GPU; unguarded query: {(first.get('unguarded_query') or {}).get('capture')}")


if __name__ == "__main__":
    run(Path(sys.argv[1]))
