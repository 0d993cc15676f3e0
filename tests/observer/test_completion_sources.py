"""Which completion source each process group gets, and what the start-up line says
(spec/observer.md INSTR-9, INSTR-10, INSTR-12, INSTR-16), compared whole: the source's kind,
key, group, ranks and whether it knows started; the markers trackers' contract, clock and
capture check; the point-to-point key; the log line. Fake groups stand in for the emulated
backend and for NCCL (the fake CUDA of tests/fake_cuda.py, a fake ``torch._C._distributed_c10d``);
the ranks are a world of one gloo group in this process where ``register`` and
``start_tracking`` need torch.distributed."""

from __future__ import annotations

import logging
import pickle
import time
import types
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from scout.core.observer import Completion, HostContract, PendingState
from scout.observer import completion as comp
from scout.transport.nccl.timing import CudaEventTimer
from tests.fake_cuda import FakeCuda
from tests.observer import flight_recorder_dumps as dumps
from tests.observer.test_completion import FakeClock as StreamClock
from tests.observer.test_completion import FakeWork

F, G = 0xF00D, 0x600D
RANK = 3
NAME, RANKS = "0", (0, 1, 2, 3)
P2P_KEY = comp.source_key("p2p", NAME, (0, 1, 2, 3, -1, RANK))
MARKERS_LINE = ("markers: collectives called through torch.distributed, DDP's buckets and buffer broadcasts, from any "
                "thread; collectives issued only from C++ are not seen (set TORCH_FR_BUFFER_SIZE to see them)")




class Emulated:
    """The two methods of the emulated backend's group that tracking asks for (INSTR-14)."""

    def __init__(self) -> None:
        self.clock = StreamClock()
        self.dumps: list[bool] = []

    def flight_recorder_dump(self, collectives: bool = True) -> dict[str, Any]:
        self.dumps.append(collectives)
        return dumps.nccl_dump(["completed", "started"])

    def mark_clock(self) -> StreamClock:
        return self.clock


class FakeC10d:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any, Any]] = []

    def _dump(self, name: str, collectives: Any, stacks: Any, active: Any) -> bytes:
        self.calls.append((name, collectives, stacks, active))
        dump = dumps.nccl_dump(["completed", "started"]) if name == "_dump_nccl_trace" else dumps.GLOO_SUBGROUP_PENDING
        return pickle.dumps(dump)

    def _dump_nccl_trace(self, a: Any = None, b: Any = None, c: Any = None) -> bytes:
        return self._dump("_dump_nccl_trace", a, b, c)

    def _dump_fr_trace(self, a: Any = None, b: Any = None, c: Any = None) -> bytes:
        return self._dump("_dump_fr_trace", a, b, c)


class Publisher:
    def __init__(self) -> None:
        self.contracts: list[HostContract] = []

    def raise_contract(self, contract: HostContract) -> None:
        self.contracts.append(contract)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCuda, FakeC10d]:
    cuda = FakeCuda(4)
    c10d = FakeC10d()
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setattr(comp, "torch_c10d", lambda: c10d)
    monkeypatch.setattr(comp, "_own_rank", lambda: RANK)
    return cuda, c10d


def tracker_of(tracker: comp.CompletionTracker | None) -> Any:
    if tracker is None:
        return None
    clock = tracker.clock
    if isinstance(clock, CudaEventTimer):
        clock = ("cuda", clock.device_index, clock._cuda)  # type: ignore[assignment]
    return (tracker.contract, clock, tracker._stream_capturing, tracker.entries_max, tracker.overflowed)


def source_of(source: Any) -> Any:
    if source is None:
        return None
    if isinstance(source, comp.MarkerSource):
        return ("markers", source.key, source.point_to_point)
    assert isinstance(source, comp.TraceSource)
    return ("trace", source.key, source.group_name, source.group_ranks, source.started_known)


def make(mode: str, backend: str, environ: dict[str, str], group: Any, *, device: Any = None,
         caplog: pytest.LogCaptureFixture) -> tuple[comp.CompletionTracking, comp.GroupTracking, Any]:
    tracking = comp.CompletionTracking(Publisher(), source=mode, environ=environ, device=device)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="scout"):
        entry = tracking._make(group, NAME, RANKS, backend)
    assert entry.group is group and (entry.name, entry.ranks, entry.backend, entry.order) == (NAME, RANKS, backend, 0)
    whole = (entry.contract, source_of(entry.source), tracker_of(entry.tracker), tracker_of(entry.p2p), entry.p2p_key,
             entry.how)
    assert [r.getMessage() for r in caplog.records if r.name == "scout"][-1] == tracking.described[-1]
    return tracking, entry, whole


def line(backend: str, how: str) -> list[str]:
    return [f"scout: completion tracking of group '0' (4 ranks, {backend}) by {how}"]


@pytest.mark.parametrize("mode", ["auto", "flight-recorder"])
def test_INSTR_10_INSTR_14_an_emulated_group_is_read_from_its_recorder_with_its_stream_for_sends(
        mode: str, fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    group = Emulated()
    tracking, entry, whole = make(mode, "scoutemu", {}, group, caplog=caplog)
    assert whole == (comp.Contract.DEVICE, ("trace", comp.source_key("emulated", NAME, RANKS), NAME, RANKS, True), None,
                     (comp.Contract.DEVICE, group.clock, None, comp.ENTRIES_MAX, False), P2P_KEY,
                     "the emulated backend's recorder")
    assert tracking.described == line("scoutemu", "the emulated backend's recorder: every collective, "
                                      "scheduled/started/completed")
    polled = entry.source.poll()  # type: ignore[union-attr]
    assert polled is not None and group.dumps == [True]
    assert (polled[0].enqueued, polled[0].completed, polled[0].pending_state) == (2, 1, PendingState.STARTED)


def test_INSTR_10_an_emulated_group_counted_by_markers_uses_its_stream_clock(
        fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    group = Emulated()
    tracking, entry, whole = make("markers", "scoutemu", {"TORCH_FR_BUFFER_SIZE": "64"}, group, caplog=caplog)
    assert whole == (comp.Contract.DEVICE, ("markers", comp.source_key("markers", NAME, RANKS), False),
                     (comp.Contract.DEVICE, group.clock, None, comp.ENTRIES_MAX, False),
                     (comp.Contract.DEVICE, group.clock, None, comp.ENTRIES_MAX, False), P2P_KEY, "markers")
    assert tracking.described == line("scoutemu", MARKERS_LINE)
    assert entry.source.tracker is entry.tracker and group.dumps == []  # type: ignore[union-attr]


@pytest.mark.parametrize("variable", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_INSTR_12_a_gloo_group_with_the_flight_recorder_on_is_read_from_the_cpu_recorder(
        variable: str, fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    _, c10d = fakes
    tracking, entry, whole = make("auto", "gloo", {variable: "64", "TORCH_NCCL_ENABLE_TIMING": "1"}, object(),
                                  caplog=caplog)
    assert whole == (comp.Contract.BLOCKING, ("trace", comp.source_key("flight-recorder", NAME, RANKS), NAME, RANKS,
                                              False),
                     None, (comp.Contract.BLOCKING, None, None, comp.ENTRIES_MAX, False), P2P_KEY,
                     "PyTorch's Flight Recorder")
    assert tracking.described == line("gloo", "PyTorch's Flight Recorder: every collective, from Python or C++, read "
                                      "with _dump_fr_trace; started unknown")
    assert list(tracking.shared_dumps) == ["_dump_fr_trace"]
    assert entry.source.dump is tracking.shared_dumps["_dump_fr_trace"]  # type: ignore[union-attr]
    entry.source.poll()  # type: ignore[union-attr]
    assert c10d.calls == [("_dump_fr_trace", True, False, True)]  # entries, no stacks, only active


@pytest.mark.parametrize(("timing", "started"), [("1", True), ("true", True), ("TRUE", True), ("0", False),
                                                 ("yes", False)])
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_INSTR_12_an_nccl_group_with_the_flight_recorder_on_is_read_from_ncclss_recorder(
        backend: str, timing: str, started: bool, fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    cuda, c10d = fakes
    environ = {"TORCH_FR_BUFFER_SIZE": "8", "TORCH_NCCL_ENABLE_TIMING": timing, "LOCAL_RANK": "2"}
    tracking, entry, whole = make("auto", backend, environ, object(), caplog=caplog)
    assert whole == (comp.Contract.DEVICE, ("trace", comp.source_key("flight-recorder", NAME, RANKS), NAME, RANKS,
                                            started),
                     None, (comp.Contract.DEVICE, ("cuda", 2, cuda), None, comp.ENTRIES_MAX, False), P2P_KEY,
                     "PyTorch's Flight Recorder")
    how = "PyTorch's Flight Recorder: every collective, from Python or C++, read with _dump_nccl_trace"
    how += "; started from its timing events" if started else "; started unknown (set TORCH_NCCL_ENABLE_TIMING=1 to see it)"
    assert tracking.described == line(backend, how)
    assert list(tracking.shared_dumps) == ["_dump_nccl_trace"]
    entry.source.poll()  # type: ignore[union-attr]
    assert c10d.calls == [("_dump_nccl_trace", True, False, True)]


@pytest.mark.parametrize("size", ["0", "", "-1", "x"])
def test_INSTR_10_a_flight_recorder_size_that_is_not_positive_leaves_it_off(
        size: str, fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    tracking, _, whole = make("flight-recorder", "gloo", {"TORCH_FR_BUFFER_SIZE": size}, object(), caplog=caplog)
    assert whole == (comp.Contract.BLOCKING, None, None, None, 0, "")
    assert tracking.described == line("gloo", "nothing: the Flight Recorder is off (set TORCH_FR_BUFFER_SIZE before "
                                      "init_process_group)")
    # A bad first variable does not hide a good second one.
    assert comp._flight_recorder_enabled({"TORCH_FR_BUFFER_SIZE": size, "TORCH_NCCL_TRACE_BUFFER_SIZE": "1"})
    assert not comp._flight_recorder_enabled({"TORCH_NCCL_TRACE_BUFFER_SIZE": size})


@pytest.mark.parametrize("environ", [{}, {"TORCH_FR_BUFFER_SIZE": "64"}])
def test_INSTR_10_a_backend_without_a_known_contract_or_recorder_is_not_tracked(
        environ: dict[str, str], fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    tracking, _, whole = make("auto", "ucc", environ, object(), caplog=caplog)
    assert whole == (None, None, None, None, 0, "")
    assert tracking.described == line("ucc", "nothing: no known completion contract for backend 'ucc'")


@pytest.mark.parametrize("mode", ["auto", "markers"])
def test_INSTR_10_a_gloo_group_without_the_recorder_is_counted_by_markers(
        mode: str, fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    environ = {"TORCH_FR_BUFFER_SIZE": "64"} if mode == "markers" else {}
    tracking, entry, whole = make(mode, "gloo", environ, object(), caplog=caplog)
    blocking = (comp.Contract.BLOCKING, None, None, comp.ENTRIES_MAX, False)
    assert whole == (comp.Contract.BLOCKING, ("markers", comp.source_key("markers", NAME, RANKS), False), blocking,
                     blocking, P2P_KEY, "markers")
    assert entry.tracker is not entry.p2p and entry.source.tracker is entry.tracker  # type: ignore[union-attr]
    assert tracking.described == line("gloo", MARKERS_LINE)
    assert tracking.shared_dumps == {}


def test_INSTR_10_INSTR_11_an_nccl_group_without_the_recorder_is_counted_by_cuda_events(
        fakes: Any, caplog: pytest.LogCaptureFixture) -> None:
    cuda, _ = fakes
    tracking, entry, whole = make("auto", "nccl", {"LOCAL_RANK": "1"}, object(), device=torch.device("cuda", 3),
                                  caplog=caplog)
    events = (comp.Contract.DEVICE, ("cuda", 3, cuda), cuda.is_current_stream_capturing, comp.ENTRIES_MAX, False)
    assert whole == (comp.Contract.DEVICE, ("markers", comp.source_key("markers", NAME, RANKS), False), events, events,
                     P2P_KEY, "markers")
    assert entry.p2p is not entry.tracker and entry.p2p.clock is entry.tracker.clock  # type: ignore[union-attr]
    assert tracking.described == line("nccl", "markers: CUDA events on cuda:3 (from the module's parameters) and Work "
                                      "handles of the collectives called through torch.distributed and DDP's hook; set "
                                      "TORCH_FR_BUFFER_SIZE and TORCH_NCCL_ENABLE_TIMING=1 to see C++-issued ones")


def test_INSTR_11_nccl_markers_without_an_event_timer_say_started_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoEvents(FakeCuda):
        def current_device(self) -> int:
            return 1

    cuda = NoEvents(2)

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("no events")

    import scout.transport.nccl.timing as timing

    monkeypatch.setattr(timing, "CudaEventTimer", broken)
    tracker, source, how = comp.nccl_markers(NAME, RANKS, {}, device=None, group=None, cuda=cuda)
    assert (tracker.contract, tracker.clock, tracker._stream_capturing) == (comp.Contract.DEVICE, None,
                                                                          cuda.is_current_stream_capturing)
    assert (source.tracker, source.key, source.point_to_point) == (tracker, comp.source_key("markers", NAME, RANKS),
                                                                   False)
    assert how == ("markers: CUDA events on cuda:1 (from the current device) and Work handles of the collectives called "
                   "through torch.distributed and DDP's hook (no event timer: started unknown); set "
                   "TORCH_FR_BUFFER_SIZE and TORCH_NCCL_ENABLE_TIMING=1 to see C++-issued ones")
    assert comp._cuda_clock(0, cuda) is None


def test_INSTR_10_the_cuda_index_of_a_device_and_the_recorder_of_a_backend() -> None:
    assert comp._cuda_index("cuda:12") == 12
    assert comp._cuda_index("cuda") is None and comp._cuda_index("cpu:1") is None and comp._cuda_index("cuda:x") is None
    assert comp._cuda_index(torch.device("cuda", 0)) == 0 and comp._cuda_index(torch.device("cuda")) is None
    assert comp._cuda_index(torch.device("cpu")) is None and comp._cuda_index(None) is None
    assert comp._cuda_index(types.SimpleNamespace(type="cuda", index=5)) == 5
    assert comp._cuda_index(types.SimpleNamespace(index=5)) is None
    assert comp._recorder_backend("NCCL") == "nccl" and comp._recorder_backend("cpu:gloo, cuda:NCCL") == "nccl"
    assert comp._recorder_backend("Gloo") == "gloo" and comp._recorder_backend("cpu:gloo,cuda:ucc") == "cpu:gloo,cuda:ucc"
    assert comp.contract_of("NCCL") is comp.Contract.DEVICE and comp.contract_of("cpu:gloo, cuda:scoutemu") is \
        comp.Contract.DEVICE
    assert comp.contract_of("cpu:gloo,cuda:mpi") is comp.Contract.BLOCKING and comp.contract_of("ScoutGloo") is \
        comp.Contract.BLOCKING
    assert comp.contract_of("cpu:gloo,cuda:ucc") is None and comp.contract_of("") is None
    assert comp._emulated_clock(object()) is None and comp._emulated_clock(types.SimpleNamespace(mark_clock=3)) is None
    clock = StreamClock()
    assert comp._emulated_clock(types.SimpleNamespace(mark_clock=lambda: clock)) is clock


def test_INSTR_12_one_dump_per_recorder_per_poll_is_shared_by_its_groups() -> None:
    calls: list[bool] = []

    def dump(collectives: bool) -> dict[str, Any]:
        calls.append(collectives)
        return {"n": len(calls)}

    shared = comp._SharedDump(dump)
    assert shared.epoch == 0
    assert shared(True) == {"n": 1} and shared(True) == {"n": 1} and shared(False) == {"n": 2}
    assert shared(False) == {"n": 2} and calls == [True, False]
    shared.epoch = 1
    assert shared(True) == {"n": 3} and shared(False) == {"n": 4} and shared(True) == {"n": 3}
    tracking = comp.CompletionTracking(Publisher(), source="auto", environ={})  # type: ignore[arg-type]
    first = tracking._recorder(dump, "_dump_fr_trace")
    assert tracking._recorder(lambda _: {}, "_dump_fr_trace") is first and first(True) == {"n": 5}
    assert tracking._recorder(dump, "_dump_nccl_trace") is not first
    assert set(tracking.shared_dumps) == {"_dump_fr_trace", "_dump_nccl_trace"}


# --------------------------------------------------------------------------------------------
# The markers tracker and the watcher, details (INSTR-11, INSTR-13, PROGRESS-10)
# --------------------------------------------------------------------------------------------


def test_INSTR_11_a_capture_check_that_fails_tracks_and_one_that_says_capturing_counts() -> None:
    answers: list[Any] = [True, RuntimeError("no answer"), 0, 1]

    def capturing() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = StreamClock()
    tracker = comp.CompletionTracker(comp.Contract.DEVICE, clock, stream_capturing=capturing)
    assert tracker.begin(F) is None and tracker.captured == 1 and clock.recorded == 0
    assert tracker.begin(F) is not None and tracker.begin(G) is not None
    assert tracker.begin(F) is None and tracker.captured == 2
    assert tracker.coordinate()[:2] == (2, 0)  # type: ignore[index]
    with pytest.raises(ValueError, match="entries_max must be >= 1, got 0"):
        comp.CompletionTracker(comp.Contract.BLOCKING, entries_max=0)
    assert comp.CompletionTracker(comp.Contract.BLOCKING, entries_max=1).entries_max == 1


def test_INSTR_11_the_coordinate_whole_with_the_pending_time_and_the_last_completed_fingerprint() -> None:
    now = iter([100, 200, 300, 400])
    clock = StreamClock()
    tracker = comp.CompletionTracker(comp.Contract.DEVICE, clock, now_ns=lambda: next(now))
    first = tracker.begin(F)  # mark 1, at 100
    assert first is not None and (first.sequence, first.fingerprint, first.enqueued_ns, first.start_mark) == (1, F, 100, 1)
    assert (first.end_mark, first.work, first.returned) == (None, None, False)
    tracker.end(first)  # end mark 2
    assert (first.end_mark, first.work, first.returned) == (2, None, True)
    work = FakeWork()
    tracker.launched(G, work)  # mark 3, at 200, no end mark
    assert tracker.coordinate() == (2, 0, F, PendingState.ENQUEUED, 100, 0)
    clock.reached = 2
    assert tracker.coordinate() == (2, 1, G, PendingState.ENQUEUED, 200, F)
    clock.reached = 3
    assert tracker.coordinate() == (2, 1, G, PendingState.STARTED, 200, F)
    source = comp.MarkerSource(tracker, 77, point_to_point=True)
    assert source.poll() == (Completion(77, 2, 1, G, PendingState.STARTED, F, True), 200)
    assert comp.MarkerSource(tracker, 77).poll()[0].point_to_point is False  # type: ignore[index]
    batch = [FakeWork(True), FakeWork()]
    tracker.end(tracker.begin(F), batch)  # INSTR-16: a batch of sends and receives completes whole
    work.done = True
    assert tracker.coordinate()[:2] == (3, 2)  # type: ignore[index]
    batch[1].done = True
    assert tracker.coordinate() == (3, 3, 0, PendingState.NONE, 0, F)
    tracker.end(None)  # an untracked call: nothing


def test_INSTR_11_a_clock_whose_completed_fails_gives_unknown_and_an_end_mark_query_that_fails_is_over() -> None:
    class Failing(StreamClock):
        def completed(self, mark: Any) -> bool:
            raise RuntimeError("query failed")

    tracker = comp.CompletionTracker(comp.Contract.DEVICE, Failing())
    pending = tracker.begin(F)
    assert tracker.coordinate()[:4] == (1, 0, F, PendingState.UNKNOWN)  # type: ignore[index]
    tracker.end(pending)  # the end mark's query fails too: a failed collective no longer blocks
    assert tracker.coordinate()[:2] == (1, 1)  # type: ignore[index]
    blocking = comp.CompletionTracker(comp.Contract.BLOCKING, StreamClock())
    entry = blocking.begin(F)
    assert entry is not None and entry.start_mark == 1  # a clock given is used also on a blocking backend
    blocking.end(entry)
    assert entry.end_mark is None and blocking.coordinate()[:2] == (1, 1)  # type: ignore[index]


class Writer:
    def __init__(self) -> None:
        self.published: list[list[Any]] = []
        self.withdrawn = 0
        self.released = 0

    def publish_slots(self, slots: list[Any]) -> None:
        self.published.append(slots)

    def withdraw(self) -> None:
        self.withdrawn += 1

    def release(self) -> None:
        self.released += 1


class Scripted:
    key = 9

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def poll(self) -> Any:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_INSTR_13_the_watcher_publishes_each_slot_whole_and_counts_its_polls(caplog: pytest.LogCaptureFixture) -> None:
    from scout.observer.progress import CompletionSlot

    first = Completion(5, 3, 2, F, PendingState.STARTED, G, True)
    second = Completion(6, 1, 1, 0, PendingState.NONE, F)
    writer = Writer()
    watcher = comp.CompletionWatcher(Scripted([[(first, 11), (second, 0)]]), writer)  # type: ignore[arg-type]
    assert (watcher.poll_interval_s, watcher.capture_gate, watcher.skipped_polls, watcher.polls, watcher.publishes,
            watcher.failed_polls, watcher.withdrawn_reason) == (comp.POLL_INTERVAL_S, None, 0, 0, 0, 0, None)
    assert watcher._thread.daemon and watcher._thread.name == "scout-completion"
    watcher.poll_once()
    watcher.poll_once()
    assert writer.published == [[CompletionSlot(5, 3, 2, F, G, int(PendingState.STARTED), 11, True),
                                 CompletionSlot(6, 1, 1, 0, F, int(PendingState.NONE), 0, False)]]
    assert (watcher.polls, watcher.publishes) == (2, 1)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=rf"poll_interval_s must be in \(0, 1\] seconds, got {bad!r}"):
            comp.CompletionWatcher(Scripted([None]), writer, poll_interval_s=bad)  # type: ignore[arg-type]
    assert comp.CompletionWatcher(Scripted([None]), writer, poll_interval_s=1.0).poll_interval_s == 1.0  # type: ignore[arg-type]


@pytest.mark.parametrize("error", [ValueError("v"), RuntimeError("r"), OSError("o"), pickle.UnpicklingError("u")])
def test_INSTR_13_failed_polls_in_a_row_withdraw_naming_the_last_error_and_a_good_poll_resets_them(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    good = (Completion(5, 1, 1), 0)
    writer = Writer()
    answers = [error] * (comp.FAILED_POLLS_MAX - 1) + [good] + [error] * comp.FAILED_POLLS_MAX
    watcher = comp.CompletionWatcher(Scripted(answers), writer)  # type: ignore[arg-type]
    for _ in range(comp.FAILED_POLLS_MAX - 1):
        watcher.poll_once()
    assert watcher.failed_polls == comp.FAILED_POLLS_MAX - 1 and writer.withdrawn == 0
    watcher.poll_once()
    assert watcher.failed_polls == 0 and watcher.publishes == 1
    with caplog.at_level(logging.WARNING, logger="scout"):
        for _ in range(comp.FAILED_POLLS_MAX):
            watcher.poll_once()
    reason = f"20 polls of the completion source failed in a row, the last: {error}"
    assert watcher.withdrawn_reason == reason and writer.withdrawn == 1 and watcher._stop.is_set()
    assert caplog.messages == [f"scout: completion tracking stops ({reason}); the observer judges by host progress "
                               "alone"]
    polls = watcher.polls
    watcher.poll_once()
    watcher.withdraw("again")
    assert watcher.polls == polls and watcher.withdrawn_reason == reason and writer.withdrawn == 1
    watcher.stop()
    assert writer.released == 1


def test_INSTR_13_an_overflow_withdraws_naming_the_bound_and_withdraw_is_once() -> None:
    writer = Writer()
    watcher = comp.CompletionWatcher(Scripted([None]), writer)  # type: ignore[arg-type]
    watcher.poll_once()
    assert watcher.withdrawn_reason == f"more than {comp.ENTRIES_MAX} collectives pending at once"
    other = comp.CompletionWatcher(Scripted([None]), writer)  # type: ignore[arg-type]
    other.withdraw("the completion part is off")
    assert other.withdrawn_reason == "the completion part is off" and other._stop.is_set() and writer.withdrawn == 2


def test_GUARD_3_a_poll_that_raises_in_the_thread_is_reported_and_the_thread_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.reports import guard

    failures: list[tuple[Any, str, str]] = []
    points: list[str] = []
    monkeypatch.setattr(guard, "failed", lambda part, error, where: failures.append((part, str(error), where)))
    monkeypatch.setattr(guard, "INJECTING", True)  # GUARD-9: the thread's injection point
    monkeypatch.setattr(guard, "inject", points.append)
    writer = Writer()
    watcher = comp.CompletionWatcher(Scripted([KeyError("bad"), (Completion(5, 1, 1), 0)]), writer,  # type: ignore[arg-type]
                                     poll_interval_s=0.01)
    watcher._thread.start()
    deadline = 200
    while not writer.published and deadline:
        time.sleep(0.01)
        deadline -= 1
    watcher.stop()
    assert failures[:1] == [(guard.Part.COMPLETION, "'bad'", "completion thread")] and writer.published
    assert points[:2] == ["completion.poll", "completion.poll"]


# --------------------------------------------------------------------------------------------
# Every group of a world of one (INSTR-9, INSTR-16, PROGRESS-13)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


class Tracking:
    """What :class:`comp.MultiSource` asks of the tracking: its groups, a scan, the shared dumps."""

    def __init__(self, entries: list[comp.GroupTracking]) -> None:
        self._entries = entries
        self.scans = 0
        self.shared_dumps = {"_dump_fr_trace": comp._SharedDump(lambda _: {})}

    def scan(self) -> None:
        self.scans += 1

    def entries(self) -> list[comp.GroupTracking]:
        return self._entries


def markers_group(order: int) -> comp.GroupTracking:
    tracker = comp.CompletionTracker(comp.Contract.BLOCKING)
    return comp.GroupTracking(None, str(order), (0,), "gloo", comp.Contract.BLOCKING,
                              comp.MarkerSource(tracker, 100 + order), tracker, comp.CompletionTracker(
                                  comp.Contract.BLOCKING), 200 + order, order, "markers")


def keys(polled: list[tuple[Completion, int]] | None) -> list[int]:
    assert polled is not None
    return [completion.source for completion, _ in polled]


def test_INSTR_9_at_most_sixteen_groups_the_pending_first_then_those_that_changed_last() -> None:
    from scout.core.observer import COMPLETION_GROUPS_MAX

    assert COMPLETION_GROUPS_MAX == 16
    groups = [markers_group(order) for order in range(18)]
    tracking = Tracking(groups)
    source = comp.MultiSource(tracking)  # type: ignore[arg-type]
    assert source.key == 0
    assert keys(source.poll()) == list(range(100, 116))  # nothing pending, nothing changed: by order
    assert tracking.scans == 1 and tracking.shared_dumps["_dump_fr_trace"].epoch == 1
    groups[17].tracker.begin(F)  # type: ignore[union-attr]
    groups[16].tracker.end(groups[16].tracker.begin(F))  # type: ignore[union-attr]
    assert keys(source.poll()) == [*range(100, 114), 116, 117]
    assert tracking.scans == 2 and tracking.shared_dumps["_dump_fr_trace"].epoch == 2
    groups[15].tracker.end(groups[15].tracker.begin(G))  # type: ignore[union-attr]
    assert keys(source.poll()) == [*range(100, 113), 115, 116, 117]  # 15 changed last, then 16
    assert keys(source.poll()) == [*range(100, 113), 115, 116, 117]  # unchanged since: the same order


def test_INSTR_16_a_groups_sends_and_receives_appear_once_it_has_any_and_an_overflow_of_them_is_skipped() -> None:
    groups = [markers_group(0), markers_group(1)]
    source = comp.MultiSource(Tracking(groups))  # type: ignore[arg-type]
    assert comp._p2p_source(groups[0]) is None
    assert keys(source.poll()) == [100, 101]
    p2p = groups[1].p2p
    assert p2p is not None
    p2p.begin(F)
    found = comp._p2p_source(groups[1])
    assert found is not None and (found.tracker, found.key, found.point_to_point) == (p2p, 201, True)
    polled = source.poll()
    assert keys(polled) == [100, 101, 201] and polled[2][0].point_to_point  # type: ignore[index]
    p2p.overflowed = True  # a full ring of sends: left out, the group's own coordinate stays
    assert comp._p2p_source(groups[1]) is None
    assert keys(source.poll()) == [100, 101]
    groups[0].p2p = None
    assert comp._p2p_source(groups[0]) is None
    groups[1].tracker.overflowed = True  # type: ignore[union-attr]
    assert source.poll() is None  # the group's own tracker overflowed: the section is withdrawn
    groups[1].source = None
    assert keys(source.poll()) == [100]
    groups[0].source = None  # a group counted by nobody: its sends and receives still are
    groups[0].p2p = comp.CompletionTracker(comp.Contract.BLOCKING)
    groups[0].p2p.begin(F)
    assert keys(source.poll()) == [200]


@pytest.mark.torchdist
def test_INSTR_9_PROGRESS_13_every_group_of_the_world_is_tracked_once_and_raises_the_contract(
        world_of_one: None, fakes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(comp, "_own_rank", lambda: 0)
    publisher = Publisher()
    tracking = comp.CompletionTracking(publisher, source="auto", environ={})  # type: ignore[arg-type]
    assert (tracking.mode, tracking.environ, tracking.only, tracking.device, tracking.capture_gate, tracking.watcher,
            tracking.described, tracking.shared_dumps) == ("auto", {}, None, None, None, None, [], {})
    assert tracking.source_name == "none" and tracking.entries() == []
    world = dist.group.WORLD
    tracking.scan()
    first = tracking.entries()
    assert [entry.group for entry in first] == [world] and first[0].order == 0
    assert publisher.contracts == [HostContract.BLOCKING]
    tracking.scan()  # nothing new: one length check
    assert tracking.entries() == first and publisher.contracts == [HostContract.BLOCKING]
    assert tracking.register(world) is first[0] and publisher.contracts == [HostContract.BLOCKING]
    assert first[0].backend == "gloo" and first[0].ranks == (0,)
    sub = dist.new_group([0], backend="gloo")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "NCCL" if group is sub else "gloo")
    ranks_of = dist.get_process_group_ranks
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: [7] if group is sub else ranks_of(group))
    registered: list[Any] = []
    register = tracking.register

    def counted(group: Any) -> comp.GroupTracking | None:
        registered.append(group)
        return register(group)

    monkeypatch.setattr(tracking, "register", counted)
    tracking.scan()  # a group made since: tracked, second; the known ones are not registered again
    assert registered == [sub]
    from torch.distributed import distributed_c10d

    default_group = distributed_c10d._get_default_group
    asked: list[int] = []

    def counted_default() -> Any:
        asked.append(1)
        return default_group()

    monkeypatch.setattr(distributed_c10d, "_get_default_group", counted_default)
    tracking.scan()
    assert registered == [sub] and asked == []  # nothing new: one length check, not one registration
    entries = tracking.entries()
    assert (entries[1].backend, entries[1].ranks) == ("nccl", (7,))
    assert [entry.group for entry in entries] == [world, sub] and [entry.order for entry in entries] == [0, 1]
    assert entries[1].contract is comp.Contract.DEVICE and publisher.contracts[-1] is HostContract.ENQUEUE
    assert tracking.source_name == "markers"
    assert tracking.entry(None) is entries[0] and tracking.entry(sub) is entries[1]
    assert tracking.tracks(None) and tracking.tracks(sub)
    assert tracking.tracker_for(None) is entries[0].tracker and tracking.tracker_for(sub) is entries[1].tracker
    assert tracking.p2p_tracker_for(None) is entries[0].p2p and tracking.p2p_tracker_for(sub) is entries[1].p2p
    assert tracking.tracker is entries[0].tracker


@pytest.mark.torchdist
def test_INSTR_9_a_tracking_of_one_group_answers_for_that_group_only(world_of_one: None, fakes: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(comp, "_own_rank", lambda: 0)
    sub = dist.new_group([0], backend="gloo")
    tracking = comp.CompletionTracking(Publisher(), source="auto", environ={}, only=sub)  # type: ignore[arg-type]
    tracking.scan()
    assert [entry.group for entry in tracking.entries()] == [sub]
    assert tracking.entry(None) is None and not tracking.tracks(None) and tracking.tracker_for(None) is None
    assert tracking.p2p_tracker_for(None) is None
    assert tracking.entry(sub) is tracking.entries()[0] and tracking.tracks(sub)
    assert tracking.tracker is tracking.entries()[0].tracker is not None
    assert len(tracking.entries()) == 1  # asking about the world did not register it
    off = comp.CompletionTracking(Publisher(), source="flight-recorder", environ={})  # type: ignore[arg-type]
    assert off.entry(sub) is not None and not off.tracks(sub) and off.source_name == "none"


@pytest.mark.torchdist
def test_INSTR_9_start_tracking_publishes_every_group_and_stop_releases(world_of_one: None,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    import os

    import torch.distributed as dist

    from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity

    publisher = ProgressPublisher(RecordIdentity(f"sources-{id(caplog)}", 0, 0))
    reader = ProgressReader(publisher.name, publisher.token, claim=False)
    try:
        sub = dist.new_group([0], backend="gloo")
        assert comp.start_tracking(publisher, group=sub, source="flight-recorder", environ={}) is None
        tracking = comp.start_tracking(publisher, environ={}, poll_interval_s=0.5)
        assert tracking is not None and tracking.watcher is not None and tracking.capture_gate is None
        assert tracking.environ == {} and tracking.environ is not os.environ
        assert tracking.watcher.poll_interval_s == 0.5 and tracking.watcher._thread.is_alive()
        assert tracking.watcher.polls == 1 and tracking.watcher.publishes == 1  # the first poll before the thread
        assert isinstance(tracking.watcher.source, comp.MultiSource) and tracking.watcher.source.tracking is tracking
        assert [entry.group for entry in tracking.entries()] == [dist.group.WORLD, sub]
        snapshot = reader.read()
        assert snapshot is not None and snapshot.completion is not None and len(snapshot.completion.slots) == 2
        tracking.stop()
        assert not tracking.watcher._thread.is_alive()
        tracking.stop()
        publisher.completion_writer().release()  # released: a new writer may be taken
        one = comp.start_tracking(publisher, group=sub, environ={})
        assert one is not None and [entry.group for entry in one.entries()] == [sub] and one.mode == "auto"
        one.stop()
        publisher.completion_writer().release()
        markers = comp.start_tracking(publisher, group=sub, source="markers", environ={"TORCH_FR_BUFFER_SIZE": "8"})
        assert markers is not None and markers.mode == "markers" and markers.source_name == "markers"
        markers.stop()
    finally:
        reader.close()
        publisher.close()


def test_INSTR_10_no_recorder_dump_says_why_and_which_dump(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scout"):
        assert comp.recorder_source("mpi", NAME, RANKS, {}, FakeC10d()) is None
        assert comp.recorder_source("nccl", NAME, RANKS, {}, types.SimpleNamespace()) is None
    assert caplog.messages == [
        "scout: no Flight Recorder dump for backend 'mpi' in this torch (no recorder records it); completion falls "
        "back to markers",
        "scout: no Flight Recorder dump for backend 'nccl' in this torch (_dump_nccl_trace); completion falls back "
        "to markers"]
    found = comp.recorder_source("nccl", NAME, RANKS, {}, FakeC10d())
    assert found is not None and found[0].dump.__name__ == "read" and not found[0].started_known
    assert found[1].endswith("read with _dump_nccl_trace; started unknown (set TORCH_NCCL_ENABLE_TIMING=1 to see it)")


@pytest.mark.torchdist
def test_INSTR_13_start_tracking_of_an_nccl_group_holds_the_capture_gate_until_stop(
        world_of_one: None, fakes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import torch.distributed as dist

    from scout.observer import graph_capture
    from scout.observer.progress import ProgressPublisher, RecordIdentity

    monkeypatch.setattr(comp, "_own_rank", lambda: 0)
    sub = dist.new_group([0], backend="gloo")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl" if group is sub else "gloo")
    publisher = ProgressPublisher(RecordIdentity(f"gate-{id(sub)}", 0, 0))
    try:
        device = torch.device("cuda", 2)
        tracking = comp.start_tracking(publisher, group=sub, device=device)
        assert tracking is not None and tracking.environ is os.environ and tracking.device is device
        assert tracking.capture_gate is not None and graph_capture._INSTALLED is not None
        assert tracking.watcher is not None and tracking.watcher.capture_gate is tracking.capture_gate
        assert tracking.entries()[0].tracker.clock.device_index == 2  # type: ignore[union-attr]
        tracking.stop()
        assert tracking.capture_gate is None and graph_capture._INSTALLED is None

        def refused(self: Any) -> None:
            raise RuntimeError("no thread")

        monkeypatch.setattr(comp.CompletionWatcher, "start", refused)
        with pytest.raises(RuntimeError, match="no thread"):
            comp.start_tracking(publisher, group=sub)
        assert graph_capture._INSTALLED is None  # a start that fails gives the gate back
    finally:
        publisher.close()


# --------------------------------------------------------------------------------------------
# Details the tables above leave open
# --------------------------------------------------------------------------------------------


class WithoutCaptureCheck:
    """A ``torch.cuda`` without ``is_current_stream_capturing`` (an older torch)."""

    def __init__(self, cuda: FakeCuda) -> None:
        self._cuda = cuda

    def __getattr__(self, name: str) -> Any:
        if name == "is_current_stream_capturing":
            raise AttributeError(name)
        return getattr(self._cuda, name)


def test_INSTR_10_INSTR_11_the_marks_device_of_nccl_markers_and_of_the_recorders_sends(
        fakes: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cuda, _ = fakes
    bound = types.SimpleNamespace(bound_device_id=torch.device("cuda", 2))
    tracker, _, how = comp.nccl_markers(NAME, RANKS, {"LOCAL_RANK": "1"}, device=None, group=bound, cuda=cuda)
    assert tracker.clock.device_index == 2 and "cuda:2 (from the process group's device)" in how  # type: ignore[union-attr]
    _, entry, _ = make("auto", "nccl", {"LOCAL_RANK": "1"}, bound, caplog=caplog)
    assert entry.tracker.clock.device_index == 2  # type: ignore[union-attr]
    _, entry, _ = make("auto", "nccl", {"LOCAL_RANK": "1"}, object(), caplog=caplog)
    assert entry.tracker.clock.device_index == 1 and entry.p2p.clock.device_index == 1  # type: ignore[union-attr]
    recorded = {"TORCH_FR_BUFFER_SIZE": "8", "LOCAL_RANK": "1"}
    _, entry, _ = make("auto", "nccl", recorded, bound, caplog=caplog)
    assert entry.p2p.clock.device_index == 2  # type: ignore[union-attr]
    _, entry, _ = make("auto", "nccl", recorded, bound, device=torch.device("cuda", 3), caplog=caplog)
    assert entry.p2p.clock.device_index == 3  # type: ignore[union-attr]
    old = WithoutCaptureCheck(cuda)
    assert comp.nccl_markers(NAME, RANKS, {}, device=None, group=None, cuda=old)[0]._stream_capturing is None
    monkeypatch.setattr(torch, "cuda", old)
    _, entry, _ = make("auto", "nccl", {}, object(), caplog=caplog)
    assert entry.tracker._stream_capturing is None and entry.p2p._stream_capturing is None  # type: ignore[union-attr]
    # LOCAL_RANK at the count of visible devices is not one of them: the current device.
    assert comp.tracking_device(environ={"LOCAL_RANK": "4"}, cuda=FakeCuda(4)) == (0, "the current device")
    assert comp._cuda_index(types.SimpleNamespace(type="cuda")) is None


def test_INSTR_11_what_could_not_be_asked_or_recorded_is_logged_at_debug_with_the_error(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def fails() -> bool:
        raise RuntimeError("no answer")

    class NoRecord(StreamClock):
        def record(self) -> int:
            raise RuntimeError("no mark")

    import scout.transport.nccl.timing as timing

    def no_timer(*_: Any, **__: Any) -> Any:
        raise RuntimeError("no timer")

    monkeypatch.setattr(timing, "CudaEventTimer", no_timer)
    with caplog.at_level(logging.DEBUG, logger="scout"):
        comp.CompletionTracker(comp.Contract.DEVICE, NoRecord(), stream_capturing=fails).begin(F)
        assert comp._cuda_clock(0, FakeCuda()) is None
    found = [(r.getMessage(), str(r.exc_info[1]) if r.exc_info else None) for r in caplog.records if r.name == "scout"]
    assert found == [("scout: could not ask whether the stream is capturing", "no answer"),
                     ("scout: could not record a completion mark", "no mark"),
                     ("scout: no CUDA event timer for completion marks", "no timer")]


def test_INSTR_10_contracts_of_lists_of_backends_in_any_order() -> None:
    assert comp.contract_of("cuda:nccl,cpu:gloo") is comp.Contract.DEVICE
    assert comp._recorder_backend("cuda:nccl,cpu:gloo") == "nccl"
    assert comp._recorder_backend("nccl,cpu:gloo") == "nccl"  # a bare name among device:name pairs
    assert comp.contract_of("cpu:gloo,cuda:mpi,xla:scoutgloo") is comp.Contract.BLOCKING  # every blocking backend


def test_PROGRESS_10_a_heartbeat_goes_out_from_nine_tenths_of_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.observer.progress import COMPLETION_HEARTBEAT_S

    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    writer = Writer()
    watcher = comp.CompletionWatcher(Scripted([(Completion(5, 1, 1), 0)]), writer)  # type: ignore[arg-type]
    watcher.poll_once()
    clock[0] = 0.5 * COMPLETION_HEARTBEAT_S
    watcher.poll_once()
    assert watcher.publishes == 1  # unchanged, not yet due
    clock[0] = 0.9 * COMPLETION_HEARTBEAT_S
    watcher.poll_once()
    assert watcher.publishes == 2 and len(writer.published) == 2


def test_INSTR_13_stop_waits_for_the_thread_two_seconds_at_most_then_releases() -> None:
    class Thread:
        def __init__(self) -> None:
            self.joined: list[Any] = []

        def is_alive(self) -> bool:
            return True

        def join(self, timeout: Any = None) -> None:
            self.joined.append(timeout)

    writer = Writer()
    watcher = comp.CompletionWatcher(Scripted([None]), writer)  # type: ignore[arg-type]
    thread = Thread()
    watcher._thread = thread  # type: ignore[assignment]
    watcher.stop()
    watcher.stop(0.5)
    assert thread.joined == [2.0, 0.5] and writer.released == 2 and watcher._stop.is_set()


def test_INSTR_12_the_recorders_wall_clock_enqueue_time_and_a_group_found_under_its_pg_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    full = dumps.nccl_subgroup_pending()
    for entry in full["entries"]:
        if entry["pg_id"] == 1:
            entry["process_group"] = ("g", entry["process_group"][1])
    full["pg_config"]["1"]["name"] = "g"
    monkeypatch.setattr(time, "time_ns", lambda: 9_000)
    monkeypatch.setattr(time, "monotonic_ns", lambda: 1_000)
    source = comp.TraceSource(lambda collectives: full if collectives else dumps.status_only(full), 7, "g", (0, 1),
                              started_known=True)
    monkeypatch.undo()
    assert source.wall_minus_monotonic_ns == 8_000
    first = source.poll()
    started = next(entry for entry in full["entries"] if entry["collective_seq_id"] == 6 and entry["pg_id"] == 1)
    assert first is not None and first[1] == started["time_created_ns"] - 8_000
    assert (first[0].enqueued, first[0].completed, first[0].pending_state) == (7, 5, PendingState.STARTED)
    second = source.poll()  # status only, found under the pg_id the entries named
    assert second is not None and (second[0].enqueued, second[0].completed) == (7, 5)
    full["pg_status"]["1"]["last_completed_collective"] = 6  # moved on
    third = source.poll()
    assert third is not None and (third[0].enqueued, third[0].completed) == (7, 6)


def test_INSTR_12_the_last_completed_fingerprint_is_published_from_the_recorder() -> None:
    from scout.observer.flight_recorder import entry_fingerprint

    dump = dumps.GLOO_BUFFER_BROADCAST_PENDING
    source = comp.TraceSource(lambda _: dump, 7, "0", (0, 1), started_known=False)
    polled = source.poll()
    done = next(e for e in dump["entries"] if e["collective_seq_id"] == 5)
    assert polled is not None and polled[0].completed_fingerprint == entry_fingerprint(done, (0, 1)) != 0


def test_INSTR_10_without_torch_distributed_start_tracking_says_so_in_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists in this test process")
    with caplog.at_level(logging.INFO, logger="scout"):
        assert comp.start_tracking(Publisher(), source="markers") is None  # type: ignore[arg-type]
    assert caplog.messages == ["scout: no completion tracking: torch.distributed is not initialised"]
