"""Completion tracking in the trainer (spec/observer.md INSTR-9..13): the marker tracker with fake
works and a fake stream clock, the Flight Recorder reader on recorded dumps, the watcher, and
the choice of source."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from scout.core.observer import Completion, PendingState
from scout.observer import completion as comp
from scout.observer.flight_recorder import TraceError, coordinate_from_trace, entry_fingerprint
from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity
from tests.observer import flight_recorder_dumps as dumps

F, G = 0xF00D, 0x600D


def unique_job() -> str:
    return f"completion-{time.monotonic_ns()}"


class FakeWork:
    def __init__(self, done: bool = False) -> None:
        self.done = done

    def is_completed(self) -> bool:
        return self.done


class FakeClock:
    """Marks on a fake stream: a mark completes when the test advances the stream past it."""

    def __init__(self) -> None:
        self.recorded = 0
        self.reached = 0

    def record(self) -> int:
        self.recorded += 1
        return self.recorded

    def completed(self, mark: Any) -> bool:
        return int(mark) <= self.reached


def test_INSTR_11_blocking_backend_a_call_is_pending_until_it_returns_and_async_work_until_completed() -> None:
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING)
    assert tracker.coordinate() == (0, 0, 0, PendingState.NONE, 0, 0)
    inside = tracker.begin(F)
    assert tracker.coordinate()[:4] == (1, 0, F, PendingState.UNKNOWN)  # gloo: started cannot be told
    tracker.end(inside)
    assert tracker.coordinate()[:4] == (1, 1, 0, PendingState.NONE)
    work = FakeWork()
    tracker.launched(G, work)
    assert tracker.coordinate()[:4] == (2, 1, G, PendingState.UNKNOWN)
    work.done = True
    assert tracker.coordinate() == (2, 2, 0, PendingState.NONE, 0, G)


def test_INSTR_11_completed_is_a_contiguous_prefix_and_the_oldest_pending_is_reported() -> None:
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING)
    first, second = FakeWork(), FakeWork()
    tracker.launched(F, first)
    tracker.launched(G, second)
    second.done = True  # out of order: the first still blocks
    assert tracker.coordinate()[:4] == (2, 0, F, PendingState.UNKNOWN)
    first.done = True
    assert tracker.coordinate()[:4] == (2, 2, 0, PendingState.NONE)


def test_INSTR_11_device_backend_started_is_the_stream_reaching_the_call_and_completion_a_mark_or_the_work() -> None:
    clock = FakeClock()
    tracker = comp.CompletionTracker(comp.Contract.DEVICE, clock)
    blocking = tracker.begin(F)  # start mark 1
    tracker.end(blocking)  # end mark 2 (a blocking call returns at enqueue on NCCL)
    assert tracker.coordinate()[:4] == (1, 0, F, PendingState.ENQUEUED)  # the stream has not reached it
    clock.reached = 1
    assert tracker.coordinate()[:4] == (1, 0, F, PendingState.STARTED)
    clock.reached = 2
    assert tracker.coordinate()[:4] == (1, 1, 0, PendingState.NONE)
    work = FakeWork()
    tracker.launched(G, work)  # start mark 3; completion by the Work
    clock.reached = 5
    assert tracker.coordinate()[:4] == (2, 1, G, PendingState.STARTED)
    work.done = True
    assert tracker.coordinate()[:4] == (2, 2, 0, PendingState.NONE)


def test_INSTR_11_a_work_that_raises_is_over_and_a_clock_that_fails_gives_unknown() -> None:
    class Broken:
        def is_completed(self) -> bool:
            raise RuntimeError("aborted")

    class BrokenClock(FakeClock):
        def record(self) -> int:
            raise RuntimeError("no device")

    tracker = comp.CompletionTracker(comp.Contract.DEVICE, BrokenClock())
    tracker.launched(F, Broken())
    assert tracker.coordinate()[:2] == (1, 1)
    tracker.launched(G, FakeWork())
    assert tracker.coordinate()[3] is PendingState.UNKNOWN


@pytest.mark.parametrize("clock", ["none", "record fails"])
def test_INSTR_11_device_backend_without_a_working_clock_a_call_completes_when_it_returns_or_its_work_does(
        clock: str) -> None:
    """NCCL's contract with no event clock (a CPU tensor on a device backend, no CUDA) or a
    ``record()`` that fails: a blocking call's completion cannot be marked on the stream, so it
    counts as completed once it returned -- it must not stay pending forever (a healthy rank
    would then look stuck in it) -- and an asynchronous call once its Work is."""
    class BrokenClock(FakeClock):
        def record(self) -> int:
            raise RuntimeError("no device")

    tracker = comp.CompletionTracker(comp.Contract.DEVICE, None if clock == "none" else BrokenClock())
    blocking = tracker.begin(F)
    assert tracker.coordinate()[:4] == (1, 0, F, PendingState.UNKNOWN)  # not returned yet
    tracker.end(blocking)
    assert tracker.coordinate()[:4] == (1, 1, 0, PendingState.NONE)
    work = FakeWork()
    tracker.launched(G, work)
    tracker.end(tracker.begin(F))  # a blocking call behind the asynchronous one
    assert tracker.coordinate()[:4] == (3, 1, G, PendingState.UNKNOWN)
    work.done = True
    assert tracker.coordinate() == (3, 3, 0, PendingState.NONE, 0, F)


def test_INSTR_13_the_tracker_is_bounded_and_withdraws_when_full_of_pending_collectives() -> None:
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING, entries_max=3)
    works = [FakeWork() for _ in range(3)]
    for work in works:
        tracker.launched(F, work)
    works[0].done = True
    tracker.launched(G, FakeWork())  # room made by the completed front
    assert tracker.coordinate()[:2] == (4, 1)
    assert tracker.begin(F) is None and tracker.overflowed
    assert tracker.coordinate() is None


def test_INSTR_9_collectives_from_any_thread_are_counted() -> None:
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING)
    threads = [threading.Thread(target=lambda: tracker.end(tracker.begin(F))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert tracker.coordinate()[:2] == (8, 8)


# --------------------------------------------------------------------------------------------
# Flight Recorder (INSTR-12)
# --------------------------------------------------------------------------------------------


def test_INSTR_12_a_recorded_gloo_dump_gives_the_pending_buffer_broadcast() -> None:
    dump = dumps.GLOO_BUFFER_BROADCAST_PENDING
    found = coordinate_from_trace(dump, "0", group_ranks=(0, 1), started_known=False, wall_minus_monotonic_ns=0)
    pending = next(e for e in dump["entries"] if e["collective_seq_id"] == 6)
    done = next(e for e in dump["entries"] if e["collective_seq_id"] == 5)
    assert (found.enqueued, found.completed, found.pending_state) == (6, 5, PendingState.UNKNOWN)
    assert found.pending_fingerprint == entry_fingerprint(pending, (0, 1)) != 0
    assert found.completed_fingerprint == entry_fingerprint(done, (0, 1))
    assert found.pending_since_ns == pending["time_created_ns"]
    # Another group's name: nothing of it in the dump, so nothing enqueued.
    assert coordinate_from_trace(dump, "7", group_ranks=None, started_known=False, wall_minus_monotonic_ns=0) == \
        coordinate_from_trace({"version": "2.10", "entries": [], "pg_status": {}}, "7", group_ranks=None,
                              started_known=False, wall_minus_monotonic_ns=0)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["completed", "completed"], (2, 2, PendingState.NONE)),
        (["completed", "started", "scheduled"], (3, 1, PendingState.STARTED)),  # a peer's kernel waits in 2
        (["completed", "scheduled"], (2, 1, PendingState.ENQUEUED)),  # the stream never reached 2
    ],
)
def test_INSTR_12_nccl_dumps_with_timing_give_started_or_enqueued(states: list[str], expected: tuple[Any, ...]) -> None:
    dump = dumps.nccl_dump(states)
    found = coordinate_from_trace(dump, "0", group_ranks=(0, 1, 2, 3), started_known=True,
                                  wall_minus_monotonic_ns=1_000)
    assert (found.enqueued, found.completed, found.pending_state) == expected
    if found.pending_state is not PendingState.NONE:
        assert found.pending_since_ns == dump["entries"][found.completed]["time_created_ns"] - 1_000
    unknown = coordinate_from_trace(dump, "0", group_ranks=(0, 1, 2, 3), started_known=False,
                                    wall_minus_monotonic_ns=0)
    assert unknown.pending_state is (PendingState.NONE if expected[2] is PendingState.NONE else PendingState.UNKNOWN)


def test_INSTR_12_fingerprints_leave_rank_dependent_all_to_all_shapes_out_and_skip_point_to_point() -> None:
    dump = dumps.nccl_dump(["completed", "scheduled"])
    a2a = dict(dump["entries"][1], profiling_name="nccl:all_to_all_single", input_sizes=[[7, 4]])
    other_rank = dict(a2a, input_sizes=[[9, 4]])
    assert entry_fingerprint(a2a, None) == entry_fingerprint(other_rank, None)
    reduce_ = dump["entries"][1]
    assert entry_fingerprint(reduce_, None) != entry_fingerprint(dict(reduce_, input_sizes=[[2048]]), None)
    p2p = dict(reduce_, is_p2p=True, collective_seq_id=2)
    only_p2p = dict(dump, entries=[dump["entries"][0], p2p])
    found = coordinate_from_trace(only_p2p, "0", group_ranks=None, started_known=True, wall_minus_monotonic_ns=0)
    # Not in the ring: no fingerprint; started or not from the group's status.
    assert (found.pending_fingerprint, found.pending_state) == (0, PendingState.ENQUEUED)


def test_INSTR_12_a_status_only_dump_gives_the_numbers_and_a_full_dump_is_read_only_when_they_stand_still() -> None:
    states = ["completed", "started"]
    dump = dumps.nccl_dump(states)
    status_only = {key: value for key, value in dump.items() if key != "entries"}
    found = coordinate_from_trace(status_only, "0", group_ranks=None, started_known=True, wall_minus_monotonic_ns=0,
                                  status_key="0")
    assert (found.enqueued, found.completed, found.pending_state, found.pending_fingerprint) == (
        2, 1, PendingState.STARTED, 0)
    reads: list[bool] = []

    def recorder(collectives: bool) -> dict[str, Any]:
        reads.append(collectives)
        current = dumps.nccl_dump(states)
        return current if collectives else {k: v for k, v in current.items() if k != "entries"}

    source = comp.TraceSource(recorder, 7, "0", (0, 1, 2, 3), started_known=True)
    first = source.poll()
    assert reads == [True] and first is not None  # the first poll learns the group's status key
    states.append("scheduled")  # moving: status only
    states[1] = "completed"
    source.poll()
    assert reads == [True, False]
    described = source.poll()  # stood still since the last poll: one full dump describes it
    assert reads == [True, False, False, True] and described is not None
    assert described[0].pending_fingerprint == entry_fingerprint(dumps.nccl_dump(states)["entries"][2], (0, 1, 2, 3))
    assert source.poll() == described and reads[-1] is False and source.full_dumps == 2


def test_INSTR_12_a_dump_of_another_format_is_refused_naming_its_version() -> None:
    with pytest.raises(TraceError, match="version '3.0'"):
        coordinate_from_trace({"version": "3.0"}, "0", group_ranks=None, started_known=True, wall_minus_monotonic_ns=0)
    with pytest.raises(TraceError, match="last_enqueued_collective must be an int"):
        coordinate_from_trace({"version": "2.10", "entries": [], "pg_status": {"0": {"last_enqueued_collective": "x"}}},
                              "0", group_ranks=None, started_known=True, wall_minus_monotonic_ns=0)


# --------------------------------------------------------------------------------------------
# The watcher (INSTR-13)
# --------------------------------------------------------------------------------------------


class ScriptedSource:
    key = 0x5C0

    def __init__(self) -> None:
        self.next: Any = (Completion(self.key, 1, 0, F, PendingState.STARTED), 5)

    def poll(self) -> Any:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next


@pytest.fixture
def record() -> Any:
    publisher = ProgressPublisher(RecordIdentity(unique_job(), 0, 0))
    reader = ProgressReader(publisher.name, publisher.token, claim=False)
    yield publisher, reader
    reader.close()
    publisher.close()


def test_INSTR_13_the_watcher_publishes_changes_only_and_withdraws_after_failed_polls(record: Any) -> None:
    publisher, reader = record
    source = ScriptedSource()
    watcher = comp.CompletionWatcher(source, publisher.completion_writer())
    watcher.poll_once()
    watcher.poll_once()
    assert watcher.publishes == 1
    snapshot = reader.read()
    assert snapshot is not None and snapshot.progress().completion == source.next[0]
    source.next = (Completion(source.key, 1, 1, completed_fingerprint=F), 0)
    watcher.poll_once()
    assert watcher.publishes == 2 and reader.read().progress().completion == source.next[0]
    source.next = RuntimeError("dump failed")
    for _ in range(comp.FAILED_POLLS_MAX):
        watcher.poll_once()
    assert watcher.withdrawn_reason is not None
    assert reader.read().completion is None  # withdrawn: no completion evidence, never a stale one
    watcher.stop()


def test_INSTR_13_an_overflowed_tracker_withdraws_the_section(record: Any) -> None:
    publisher, reader = record
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING, entries_max=1)
    watcher = comp.CompletionWatcher(comp.MarkerSource(tracker, 7), publisher.completion_writer())
    tracker.launched(F, FakeWork())
    watcher.poll_once()
    assert reader.read().completion is not None
    tracker.launched(G, FakeWork())  # no room: overflow
    watcher.poll_once()
    assert watcher.withdrawn_reason is not None and reader.read().completion is None
    watcher.stop()


def test_INSTR_13_the_thread_stops_within_its_interval_and_releases_the_writer(record: Any) -> None:
    publisher, _ = record
    watcher = comp.CompletionWatcher(ScriptedSource(), publisher.completion_writer(), poll_interval_s=0.05)
    watcher.start()
    time.sleep(0.2)
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 0.5 and watcher.polls >= 2
    assert not watcher._thread.is_alive()
    publisher.completion_writer().release()  # released: a new writer may be taken


def test_INSTR_13_the_thread_runs_while_another_thread_is_blocked_in_a_c_call(record: Any) -> None:
    """A collective call blocks in C with the GIL released; so does a long ``select`` here."""
    import select
    import socket

    publisher, reader = record
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING)
    watcher = comp.CompletionWatcher(comp.MarkerSource(tracker, 7), publisher.completion_writer(),
                                     poll_interval_s=0.02)
    watcher.start()
    left, right = socket.socketpair()
    try:
        work = FakeWork()
        tracker.launched(F, work)
        threading.Timer(0.3, lambda: setattr(work, "done", True)).start()
        select.select([left], [], [], 0.8)  # blocked in C while the work completes
        seen = reader.read().progress().completion
        assert seen is not None and (seen.enqueued, seen.completed) == (1, 1)
    finally:
        left.close()
        right.close()
        watcher.stop()


def test_INSTR_10_without_a_process_group_nothing_is_tracked(caplog: pytest.LogCaptureFixture) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists in this test process")
    publisher = ProgressPublisher(RecordIdentity(unique_job(), 0, 0))
    try:
        with caplog.at_level(logging.INFO, logger="scout"):
            assert comp.start_tracking(publisher) is None
        assert "torch.distributed is not initialised" in caplog.text
        with pytest.raises(ValueError, match="completion source must be"):
            comp.start_tracking(publisher, source="nvml")
    finally:
        publisher.close()



def test_INSTR_11_on_cuda_events_a_stream_stuck_in_a_kernel_leaves_the_collective_enqueued_and_nothing_drains() -> None:
    """The NCCL marker path with scout's event timer (spec/replay.md TIMING-2) on the fake CUDA
    of tests/fake_cuda.py: a kernel that runs for 10 s before the collective keeps its start
    event pending (the stream has not reached it) -- a GPU-side hang -- and no poll ever
    synchronizes (the fake raises if anything does)."""
    from scout.transport.nccl.timing import CudaEventTimer
    from tests.fake_cuda import FakeCuda

    cuda = FakeCuda()
    tracker = comp.CompletionTracker(comp.Contract.DEVICE, CudaEventTimer(0, cuda=cuda))
    cuda.launch(10_000.0)  # the kernel that does not end (yet)
    work = FakeWork()
    tracker.launched(F, work)  # async_op: the start event, then the Work
    blocking = tracker.begin(G)
    tracker.end(blocking)  # a blocking call: an end event after it
    assert tracker.coordinate()[:4] == (2, 0, F, PendingState.ENQUEUED)
    cuda.run_all()  # the kernel ends: the stream reaches both collectives
    assert tracker.coordinate()[:4] == (2, 0, F, PendingState.STARTED)  # the first still waits for its Work
    work.done = True
    assert tracker.coordinate()[:4] == (2, 2, 0, PendingState.NONE)  # the second's end event completed too
    assert cuda.drains == 0
