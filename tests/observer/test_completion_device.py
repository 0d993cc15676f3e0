"""Completion tracking on a GPU, on CPU (spec/observer.md INSTR-10, INSTR-11, INSTR-12, INSTR-13):
the recorder each backend's groups are read from (recorded dumps of both formats, and a fake
``torch._C._distributed_c10d`` that counts which dump was called), no CUDA event query while a
CUDA graph is being captured (the fake CUDA of tests/fake_cuda.py fails such a query and spoils
the capture, as CUDA does), and the device the marks are recorded on."""

from __future__ import annotations

import pickle
import threading
import time
import types
from typing import Any

import pytest
import torch

from scout.core.observer import Completion, PendingState
from scout.observer import completion as comp
from scout.observer import graph_capture
from scout.observer.flight_recorder import coordinate_from_trace, entry_fingerprint
from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity
from scout.transport.nccl.timing import CudaEventTimer
from tests.fake_cuda import FakeCuda
from tests.observer import flight_recorder_dumps as dumps

F, G = 0xF00D, 0x600D
TIMING = {"TORCH_NCCL_ENABLE_TIMING": "1"}


class FakeWork:
    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done


# --------------------------------------------------------------------------------------------
# The right recorder (INSTR-10, INSTR-12)
# --------------------------------------------------------------------------------------------


def _empty_recorder() -> dict[str, Any]:
    """A recorder no collective was recorded into: gloo's on a job whose groups are all NCCL."""
    return {"version": "2.10", "pg_config": {"": {"desc": "", "name": "", "ranks": "[]"}}, "comm_lib_version": "",
            "pg_status": {}, "entries": []}


class FakeC10d:
    """The two dumps an NCCL build of torch 2.13 has, each over its own recorder, counting calls."""

    def __init__(self, nccl: dict[str, Any], cpu: dict[str, Any]) -> None:
        self.recorders = {"_dump_nccl_trace": nccl, "_dump_fr_trace": cpu}
        self.calls: list[str] = []

    def _dump(self, name: str, include_collectives: bool | None) -> bytes:
        self.calls.append(name)
        recorder = self.recorders[name]
        return pickle.dumps(recorder if include_collectives in (None, True) else dumps.status_only(recorder))

    def _dump_nccl_trace(self, includeCollectives: bool | None = None, includeStackTraces: bool | None = None,  # noqa: N803
                         onlyActive: bool | None = None) -> bytes:  # noqa: N803 - torch's names
        return self._dump("_dump_nccl_trace", includeCollectives)

    def _dump_fr_trace(self, includeCollectives: bool | None = None, includeStackTraces: bool | None = None,  # noqa: N803
                       onlyActive: bool | None = None) -> bytes:  # noqa: N803 - torch's names
        return self._dump("_dump_fr_trace", includeCollectives)


def test_INSTR_12_recorded_gloo_dump_of_a_sub_group_and_its_status_only_dump() -> None:
    dump = dumps.GLOO_SUBGROUP_PENDING
    pending = dump["entries"][2]
    found = coordinate_from_trace(dump, "1", group_ranks=(0, 1), started_known=False, wall_minus_monotonic_ns=0)
    assert (found.enqueued, found.completed, found.pending_state) == (2, 1, PendingState.UNKNOWN)
    assert found.pending_fingerprint == entry_fingerprint(pending, (0, 1)) != 0
    assert found.completed_fingerprint == entry_fingerprint(dump["entries"][1], (0, 1))
    assert found.status_key == "1"
    default = coordinate_from_trace(dump, "0", group_ranks=(0, 1), started_known=False, wall_minus_monotonic_ns=0)
    assert (default.enqueued, default.completed, default.pending_state) == (1, 1, PendingState.NONE)
    status = coordinate_from_trace(dumps.GLOO_SUBGROUP_PENDING_STATUS, "1", group_ranks=(0, 1), started_known=False,
                                   wall_minus_monotonic_ns=0, status_key="1")
    assert (status.enqueued, status.completed, status.pending_fingerprint) == (2, 1, 0)


def test_INSTR_12_nccl_recorder_dump_in_torch_2_13_format() -> None:
    dump = dumps.nccl_subgroup_pending()
    sub = coordinate_from_trace(dump, "1", group_ranks=(0, 1), started_known=True, wall_minus_monotonic_ns=10)
    started = dump["entries"][1]
    assert (sub.enqueued, sub.completed, sub.pending_state) == (7, 5, PendingState.STARTED)
    assert sub.pending_fingerprint == entry_fingerprint(started, (0, 1)) != 0
    assert sub.pending_since_ns == started["time_created_ns"] - 10
    assert sub.completed_fingerprint == 0  # onlyActive: the completed 5th is not in the dump
    default = coordinate_from_trace(dump, "0", group_ranks=(0, 1, 2, 3), started_known=True,
                                    wall_minus_monotonic_ns=0)
    assert (default.enqueued, default.completed, default.pending_state) == (12, 11, PendingState.ENQUEUED)
    # The same group read from gloo's recorder of the same job says something else entirely.
    assert coordinate_from_trace(dumps.GLOO_SUBGROUP_PENDING, "1", group_ranks=(0, 1), started_known=True,
                                 wall_minus_monotonic_ns=0) != sub


@pytest.mark.parametrize(
    ("backend", "nccl", "cpu", "wanted", "expected"),
    [
        # An NCCL job: NCCL's recorder has the groups; the CPU recorder is empty.
        ("nccl", dumps.nccl_subgroup_pending(), _empty_recorder(), "_dump_nccl_trace", (7, 5, PendingState.STARTED)),
        # A gloo job on an NCCL build: gloo's recorder has the group; NCCL's has another job's numbers.
        ("gloo", dumps.nccl_subgroup_pending(), dumps.GLOO_SUBGROUP_PENDING, "_dump_fr_trace",
         (2, 1, PendingState.UNKNOWN)),
    ],
)
def test_INSTR_12_a_group_is_read_with_the_dump_of_its_backends_recorder(
        backend: str, nccl: dict[str, Any], cpu: dict[str, Any], wanted: str, expected: tuple[Any, ...]) -> None:
    c10d = FakeC10d(nccl, cpu)
    found = comp.recorder_source(backend, "1", (0, 1), TIMING, c10d)
    assert found is not None
    source, how = found
    assert wanted in how
    polled = source.poll()
    assert polled is not None
    completion, _ = polled
    assert (completion.enqueued, completion.completed, completion.pending_state) == expected
    assert completion.pending_fingerprint != 0
    assert set(c10d.calls) == {wanted}, f"{backend} read {c10d.calls}"


def test_INSTR_10_no_recorder_source_where_no_recorder_records_the_backend() -> None:
    c10d = FakeC10d(dumps.nccl_subgroup_pending(), dumps.GLOO_SUBGROUP_PENDING)
    assert comp.recorder_source("mpi", "1", (0, 1), TIMING, c10d) is None
    cpu_build = types.SimpleNamespace(_dump_fr_trace=c10d._dump_fr_trace)  # no NCCL in this torch
    assert comp.recorder_source("nccl", "1", (0, 1), TIMING, cpu_build) is None
    assert c10d.calls == []
    assert comp.RECORDER_DUMPS == {"nccl": "_dump_nccl_trace", "gloo": "_dump_fr_trace", "scoutgloo": "_dump_fr_trace"}


def test_INSTR_10_this_torch_has_the_dump_gloo_is_read_with() -> None:
    """The name the table gives for gloo is the one torch 2.13 has (a CPU build has no NCCL's)."""
    from scout.observer.completion import torch_c10d

    assert callable(getattr(torch_c10d(), comp.RECORDER_DUMPS["gloo"]))
    if not torch.cuda.is_available():
        assert not hasattr(torch_c10d(), comp.RECORDER_DUMPS["nccl"])


# --------------------------------------------------------------------------------------------
# No event query during a CUDA graph capture (INSTR-11, INSTR-13)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def record() -> Any:
    publisher = ProgressPublisher(RecordIdentity(f"capture-{time.monotonic_ns()}", 0, 0))
    reader = ProgressReader(publisher.name, publisher.token, claim=False)
    yield publisher, reader
    reader.close()
    publisher.close()


@pytest.fixture
def cuda() -> Any:
    fake = FakeCuda()
    yield fake
    assert graph_capture._INSTALLED is None, "a test left the capture gate installed"


def _pending_collective(cuda: FakeCuda) -> tuple[comp.CompletionTracker, FakeWork]:
    tracker = comp.CompletionTracker(comp.Contract.DEVICE, CudaEventTimer(0, cuda=cuda),
                                     stream_capturing=cuda.is_current_stream_capturing)
    cuda.launch(10_000.0)  # the stream is busy: the collective waits for it
    work = FakeWork()
    tracker.launched(F, work)
    return tracker, work


def _poll_from_another_thread(watcher: comp.CompletionWatcher) -> None:
    thread = threading.Thread(target=watcher.poll_once)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_INSTR_13_without_the_gate_a_poll_during_a_capture_spoils_it(cuda: FakeCuda, record: Any) -> None:
    """The hazard the gate exists for (and what makes the next test able to fail): the
    watcher's query from its own thread during a global-mode capture fails and invalidates the
    capture, and the evidence is lost too: the collective the stream has not reached reads
    ``unknown`` instead of ``enqueued``."""
    publisher, reader = record
    tracker, _ = _pending_collective(cuda)
    watcher = comp.CompletionWatcher(comp.MarkerSource(tracker, 7), publisher.completion_writer())
    graph = cuda.CUDAGraph()
    cuda.set_stream(cuda.Stream())
    graph.capture_begin()
    _poll_from_another_thread(watcher)
    with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureInvalidated"):
        graph.capture_end()
    assert cuda.unsafe_calls >= 1
    seen = reader.read().progress().completion
    assert seen is not None and (seen.completed, seen.pending_state) == (0, PendingState.UNKNOWN)
    watcher.stop()


def test_INSTR_13_polls_are_skipped_and_counted_during_a_capture_and_resume_after(cuda: FakeCuda,
                                                                                 record: Any) -> None:
    publisher, reader = record
    gate = graph_capture.acquire([cuda.CUDAGraph])
    try:
        tracker, work = _pending_collective(cuda)
        watcher = comp.CompletionWatcher(comp.MarkerSource(tracker, 7), publisher.completion_writer(),
                                         capture_gate=gate)
        watcher.poll_once()
        before = reader.read().progress().completion
        assert before is not None and (before.enqueued, before.completed, before.pending_state) == (
            1, 0, PendingState.ENQUEUED)
        queries = cuda.pending[0].queries
        graph = cuda.CUDAGraph()
        cuda.set_stream(cuda.Stream())
        graph.capture_begin()
        assert gate.capturing
        for _ in range(3):
            _poll_from_another_thread(watcher)
        assert (watcher.skipped_polls, watcher.polls) == (3, 1)
        assert cuda.pending[0].queries == queries and cuda.unsafe_calls == 0  # no query at all
        graph.capture_end()  # not invalidated: it would raise
        assert not gate.capturing
        cuda.run_all()
        work.done = True
        watcher.poll_once()  # resumed
        after = reader.read().progress().completion
        assert after is not None and (after.enqueued, after.completed) == (1, 1)
        assert (watcher.skipped_polls, watcher.polls) == (3, 2)
        watcher.stop()
    finally:
        graph_capture.release(gate)


class BlockingSource:
    """A poll that holds until released, noting whether a capture was under way at its end."""

    key = 0x5C0

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.inside = threading.Event()
        self.release = threading.Event()
        self.capture_seen_at_end: bool | None = None

    def poll(self) -> tuple[Completion, int]:
        self.inside.set()
        assert self.release.wait(10)
        self.capture_seen_at_end = bool(self.cuda.captures)
        return Completion(self.key, 1, 0, F, PendingState.ENQUEUED), 5


def test_INSTR_13_a_capture_begins_only_after_a_poll_in_progress_ends(cuda: FakeCuda, record: Any) -> None:
    publisher, _ = record
    gate = graph_capture.acquire([cuda.CUDAGraph])
    try:
        source = BlockingSource(cuda)
        watcher = comp.CompletionWatcher(source, publisher.completion_writer(), capture_gate=gate)
        polling = threading.Thread(target=watcher.poll_once)
        polling.start()
        assert source.inside.wait(10)
        begun = threading.Event()
        graph = cuda.CUDAGraph()

        def capture() -> None:
            cuda.set_stream(cuda.Stream())
            graph.capture_begin()
            begun.set()

        capturing = threading.Thread(target=capture)
        capturing.start()
        assert not begun.wait(0.3)  # held while the poll runs
        source.release.set()
        assert begun.wait(10)
        polling.join(10)
        capturing.join(10)
        assert source.capture_seen_at_end is False and watcher.polls == 1
        assert gate.late_captures == 0
        graph.capture_end()
        watcher.stop()
    finally:
        graph_capture.release(gate)


def test_INSTR_11_a_collective_issued_inside_a_capture_is_not_tracked_and_records_no_event(cuda: FakeCuda) -> None:
    tracker = comp.CompletionTracker(comp.Contract.DEVICE, CudaEventTimer(0, cuda=cuda),
                                     stream_capturing=cuda.is_current_stream_capturing)
    graph = cuda.CUDAGraph()
    cuda.set_stream(cuda.Stream())
    graph.capture_begin()
    entry = tracker.begin(F)
    tracker.end(entry)
    assert entry is None and tracker.captured == 1
    assert cuda.recorded_in_capture == 0
    graph.capture_end()
    tracker.end(tracker.begin(G))  # outside the capture: tracked
    assert tracker.coordinate()[:3] == (1, 0, G)


def test_INSTR_13_the_gate_never_leaves_a_failed_capture_announced_and_puts_the_methods_back(cuda: FakeCuda) -> None:
    original = cuda.CUDAGraph.capture_begin  # inherited from the fake's base class
    first = graph_capture.acquire([cuda.CUDAGraph])
    second = graph_capture.acquire([cuda.CUDAGraph])
    assert first is second and cuda.CUDAGraph.capture_begin is not original
    try:
        graph = cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="non-default stream"):
            graph.capture_begin()  # on the default stream: it never begins
        assert not first.capturing
        cuda.set_stream(cuda.Stream())
        graph.capture_begin()
        cuda.captures[0].invalidated = True
        with pytest.raises(RuntimeError, match="Invalidated"):
            graph.capture_end()
        assert not first.capturing
    finally:
        graph_capture.release(second)
        assert cuda.CUDAGraph.capture_begin is not original  # one user left
        graph_capture.release(first)
    assert cuda.CUDAGraph.capture_begin is original and "capture_begin" not in vars(cuda.CUDAGraph)


def test_INSTR_13_torchs_capture_classes_are_wrapped_and_restored() -> None:
    classes = graph_capture.graph_classes()
    assert torch.cuda.CUDAGraph in classes
    originals = {cls: (cls.__dict__["capture_begin"], cls.__dict__["capture_end"]) for cls in classes}
    gate = graph_capture.acquire()
    try:
        for cls in classes:
            assert cls.__dict__["capture_begin"].__wrapped__ is originals[cls][0]
    finally:
        graph_capture.release(gate)
    assert {cls: (cls.__dict__["capture_begin"], cls.__dict__["capture_end"]) for cls in classes} == originals


# --------------------------------------------------------------------------------------------
# The marks' device (INSTR-10)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "bound", "environ", "visible", "expected"),
    [
        (torch.device("cuda", 2), None, {"LOCAL_RANK": "1"}, 4, (2, "the module's parameters")),
        ("cuda:3", None, {}, 4, (3, "the module's parameters")),
        (None, torch.device("cuda", 1), {"LOCAL_RANK": "3"}, 4, (1, "the process group's device")),
        (None, None, {"LOCAL_RANK": "3"}, 4, (3, "LOCAL_RANK")),
        (None, None, {"LOCAL_RANK": "3"}, 1, (0, "the one visible GPU")),  # CUDA_VISIBLE_DEVICES per rank
        (torch.device("cpu"), None, {"LOCAL_RANK": "5"}, 4, (0, "the current device")),
        (None, None, {}, 4, (0, "the current device")),
    ],
)
def test_INSTR_10_the_marks_device_comes_from_the_module_the_group_or_local_rank(
        device: Any, bound: Any, environ: dict[str, str], visible: int, expected: tuple[int, str]) -> None:
    cuda = FakeCuda(visible)  # no set_device: the current device is GPU 0 on every rank
    group = types.SimpleNamespace(bound_device_id=bound)
    assert comp.tracking_device(device=device, group=group, environ=environ, cuda=cuda) == expected


def test_INSTR_10_a_rank_that_never_calls_set_device_records_its_marks_on_its_own_gpu() -> None:
    cuda = FakeCuda(4)
    tracker, source, how = comp.nccl_markers("0", (0, 1, 2, 3), {"LOCAL_RANK": "2"}, device=None, group=None,
                                             cuda=cuda)
    assert "cuda:2 (from LOCAL_RANK)" in how and source.tracker is tracker
    tracker.launched(F, FakeWork())
    event = cuda.pending[0]
    assert event.stream is cuda.default_stream(2) and cuda.current_device() == 0
    model = torch.nn.Linear(2, 2)
    assert comp.module_device(model) is None  # a CPU module says nothing
    on_gpu = types.SimpleNamespace(parameters=lambda: [types.SimpleNamespace(device=torch.device("cuda", 3))],
                                   buffers=lambda: [])
    assert comp.module_device(on_gpu) == torch.device("cuda", 3)
