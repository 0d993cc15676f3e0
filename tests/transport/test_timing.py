"""The one timer (spec/replay.md TIMING-1..TIMING-6): CUDA events that never drain the device
(against a fake torch.cuda with CUDA's contract, tests/fake_cuda.py, and against a real GPU when
there is one), the wall clock on a CPU, and the fake timer of CPU tests."""

from __future__ import annotations

import threading
import time

import pytest

from scout.transport._binding import PollSettings
from scout.transport.nccl.timing import (
    CudaEventTimer,
    FakeClock,
    FakeMark,
    FakeTimer,
    WallTimer,
    timer_for,
    wait_elapsed_s,
)
from tests.fake_cuda import Drained, FakeCuda


def test_TIMING_1_marks_carry_the_host_time_and_misuse_names_the_marks() -> None:
    before_ns = time.monotonic_ns()
    timer = WallTimer()
    start = timer.record()
    end = timer.record()
    assert before_ns <= start.recorded_ns <= end.recorded_ns <= time.monotonic_ns()
    assert timer.completed(start)
    with pytest.raises(ValueError, match=r"end mark \(#\d+\) was recorded before the start"):
        timer.elapsed_s(end, start)
    with pytest.raises(TypeError, match="must be a WallMark .* got FakeMark"):
        timer.elapsed_s(start, FakeTimer().record())
    cuda = FakeCuda(device_count=2)
    on_0, on_1 = CudaEventTimer(0, cuda=cuda), CudaEventTimer("cuda:1", cuda=cuda)
    with pytest.raises(ValueError, match="recorded on cuda:1, this timer times cuda:0"):
        on_0.elapsed_s(on_0.record(), on_1.record())
    with pytest.raises(ValueError, match="needs a CUDA device, got 'cpu'"):
        CudaEventTimer("cpu", cuda=cuda)


def test_TIMING_2_elapsed_never_drains_and_is_none_until_the_end_event_completes() -> None:
    cuda = FakeCuda()
    timer = CudaEventTimer("cuda:0", cuda=cuda)
    start = timer.record()
    end = timer.record()
    # Both events were recorded on the current stream, in order.
    assert start.event.stream is cuda.current_stream(0) and end.event.stream is start.event.stream
    assert start.event.enable_timing and end.event.enable_timing
    # The device has not got there: None, with a query and no elapsed_time (which would fail on
    # a pending event, as CUDA's does) and no synchronize (which would raise Drained).
    assert timer.elapsed_s(start, end) is None
    assert not timer.completed(end)
    cuda.complete(start.event, after_ms=1.0)
    assert timer.completed(start) and not timer.completed(end)
    assert timer.elapsed_s(start, end) is None
    cuda.complete(end.event, after_ms=2.5)
    assert timer.elapsed_s(start, end) == pytest.approx(0.0025)
    assert cuda.drains == 0
    # The fake really refuses a drain (so the zero above means something).
    with pytest.raises(Drained):
        cuda.synchronize(0)


def test_TIMING_2_a_pending_end_costs_one_query() -> None:
    cuda = FakeCuda()
    timer = CudaEventTimer(0, cuda=cuda)
    start, end = timer.record(), timer.record()
    assert timer.elapsed_s(start, end) is None
    assert (start.event.queries, end.event.queries) == (0, 1)


def test_TIMING_3_the_cpu_timer_is_wall_time_not_cpu_time() -> None:
    timer = WallTimer()
    start = timer.record()
    time.sleep(0.05)  # no CPU time passes, wall time does
    end = timer.record()
    elapsed_s = timer.elapsed_s(start, end)
    assert elapsed_s is not None and elapsed_s >= 0.05


def test_TIMING_3_wall_arithmetic_on_a_given_clock() -> None:
    readings = iter([1_000, 2_501_000])
    timer = WallTimer(clock_ns=lambda: next(readings))
    start, end = timer.record(), timer.record()
    assert timer.elapsed_s(start, end) == 0.0025


def test_TIMING_4_timer_for_a_device() -> None:
    import torch

    assert isinstance(timer_for(None), WallTimer)
    assert isinstance(timer_for("cpu"), WallTimer)
    assert isinstance(timer_for(torch.device("cpu")), WallTimer)
    cuda = FakeCuda(device_count=2)
    chosen = timer_for(torch.device("cuda", 1), cuda=cuda)
    assert isinstance(chosen, CudaEventTimer) and chosen.device_index == 1
    with pytest.raises(ValueError, match="no timer for device 'meta'"):
        timer_for("meta")


def test_TIMING_5_fake_arithmetic_lag_and_withheld_marks() -> None:
    clock = FakeClock(now_ns=10)
    timer = FakeTimer(clock, lag_s=0.002)
    start = timer.record()
    clock.advance_s(0.001)
    end = timer.record()
    # The device is 2 ms behind: nothing completed yet.
    assert timer.elapsed_s(start, end) is None
    clock.advance_s(0.0015)
    assert timer.completed(start) and not timer.completed(end)
    clock.advance_s(0.0005)
    assert timer.elapsed_s(start, end) == 0.001  # exact: nanoseconds in, one division out
    hung = timer.withhold()
    clock.advance_s(3600)
    assert timer.elapsed_s(end, hung) is None and not timer.completed(hung)
    timer.complete(hung)
    assert timer.elapsed_s(end, hung) == pytest.approx(3600.002 - 0.002 - 0.001)
    with pytest.raises(ValueError, match="was not withheld"):
        timer.complete(hung)
    with pytest.raises(ValueError, match="advance_s: seconds must be finite and >= 0, got -1"):
        clock.advance_s(-1)
    with pytest.raises(ValueError, match="lag_s must be finite and >= 0, got nan"):
        FakeTimer(lag_s=float("nan"))


def test_TIMING_6_a_bounded_wait_polls_and_gives_none_at_the_deadline() -> None:
    timer = FakeTimer()
    start, hung = timer.record(), timer.withhold()
    began_s = time.monotonic()
    assert wait_elapsed_s(timer, start, hung, timeout_s=0.05) is None
    waited_s = time.monotonic() - began_s
    assert 0.05 <= waited_s < 2.0  # bounded (the upper bound only guards against a hang)
    assert timer.queries > 2  # it polled, it did not give up after one look
    with pytest.raises(ValueError, match="timeout_s must be finite and >= 0, got inf"):
        wait_elapsed_s(timer, start, hung, timeout_s=float("inf"))


def test_TIMING_6_a_wait_returns_once_the_device_gets_there() -> None:
    cuda = FakeCuda()
    timer = CudaEventTimer(0, cuda=cuda)
    start, end = timer.record(), timer.record()
    cuda.complete(start.event, after_ms=0.0)
    finisher = threading.Timer(0.02, lambda: cuda.complete(end.event, after_ms=7.0))
    finisher.start()
    try:
        elapsed_s = wait_elapsed_s(
            timer, start, end, timeout_s=10.0, poll=PollSettings(busy_poll_s=0.0, poll_interval_s=0.002)
        )
    finally:
        finisher.join(timeout=5.0)
    assert elapsed_s == pytest.approx(0.007)
    assert cuda.drains == 0


def test_TIMING_5_fake_marks_are_the_fake_timer_s_own() -> None:
    with pytest.raises(TypeError, match="FakeTimer.complete: the given mark must be a FakeMark"):
        FakeTimer().complete(WallTimer().record())  # type: ignore[arg-type]
    assert isinstance(FakeTimer().record(), FakeMark)


def test_TIMING_2_real_events_resolve_without_a_drain() -> None:
    """On a GPU: a 50 ms device sleep between two events leaves the end pending; once it is
    done (waited for by polling, never by synchronize) the elapsed time covers the sleep."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the fake above covers the contract on CPU")
    timer = timer_for(torch.device("cuda", torch.cuda.current_device()))
    start = timer.record()
    torch.cuda._sleep(int(50e-3 * 1.4e9))  # ~50 ms of spinning at ~1.4 GHz
    end = timer.record()
    assert timer.elapsed_s(start, end) is None
    elapsed_s = wait_elapsed_s(timer, start, end, timeout_s=30.0)
    assert elapsed_s is not None and elapsed_s > 0.01
