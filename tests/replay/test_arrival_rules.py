"""LOOP-1..LOOP-7 in detail (scout/replay/arrival.py): what test_arrival.py's scenarios leave
open, each check compared whole -- the undecided checks and their reasons, the row's fields read
back as times, the bounds, the guard boundary's record of a failing window (GUARD-3), the
default timer (TIMING-4), and the arithmetic, exact to the nanosecond before the row rounds to
microseconds (half to even). One process, a scripted clock and scripted peers."""

from __future__ import annotations

import logging
import math
from collections.abc import Generator, Sequence

import pytest

from scout.core.verdict import Status
from scout.replay import arrival
from scout.replay.arrival import (
    PENDING_WAITS_PER_STEP_MAX,
    ForwardCheck,
    LoopCheck,
    LoopConfig,
    LoopTimer,
    PendingWait,
)
from scout.reports import guard
from scout.reports.guard import Part
from scout.transport.base import DeadlineExceeded, TransportError
from scout.transport.nccl.timing import FakeClock, FakeTimer, WallTimer
from tests.replay.test_arrival import MS, Clock, LoopPeers, StreamTimer, _step, _timer

NOBODY = (None,) * 4


@pytest.fixture
def boundary() -> Generator[guard.Boundary, None, None]:
    """This process's guard boundary, as in a job (GUARD-3 records each part's first failure)."""
    active = guard.activate(0, {})
    try:
        yield active
    finally:
        guard.deactivate(active)


class RaisingPeers(LoopPeers):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        self.rows.append(list(row))
        raise self.error


def test_LOOP_2_an_exchange_that_fails_disables_the_checks_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    clock, peers = Clock(), RaisingPeers(TransportError("the group is unusable"))
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    with caplog.at_level(logging.WARNING, logger="scout.replay"):
        check = _step(timer, clock, 1, 40.0, 20.0)
    reason = "transport failure in the loop exchange at step 1: the group is unusable"
    assert check == LoopCheck(1, NOBODY, NOBODY, None, NOBODY, (), frozenset(), NOBODY, reason)
    assert [r.getMessage() for r in caplog.records] == [f"scout: loop-straggler checks disabled: {reason}"]
    # Both sequential tests saw a check that said nothing, at its step (STRAG-10).
    assert timer.tracker.trail(0)[-1].step == 1 and timer.forward_tracker.trail(0)[-1].step == 1
    assert _step(timer, clock, 2, 40.0, 20.0) == LoopCheck(2, NOBODY, NOBODY, None, NOBODY, (), frozenset(), NOBODY,
                                                            f"disabled: {reason}")
    deadline = DeadlineExceeded("replay all_gather", 1.0, (12,))
    timer = _timer(RaisingPeers(deadline), clock, check_every_steps=1, warmup_steps=0)
    assert _step(timer, clock, 1, 40.0, 20.0).reason == f"deadline in the loop exchange at step 1: {deadline}"


def test_LOOP_2_a_group_of_one_and_peers_at_another_step_are_undecided_checks_whole() -> None:
    clock, peers = Clock(), LoopPeers()
    peers.size, peers.ranks = 1, (0,)
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    assert _step(timer, clock, 1, 40.0, 20.0) == LoopCheck(1, (None,), (None,), None, (None,), (), frozenset(),
                                                            (None,), "singleton")
    assert timer.tracker.trail(0)[-1].step == 1 and timer.forward_tracker.trail(0)[-1].step == 1
    peers = LoopPeers(others=[[3, 2, 21_000, 41_000, 20_000, 0, 0], [3, 1, 22_000, 42_000, 20_000, 0, 0],
                              [4, 3, 23_000, 43_000, 20_000, 0, 0]])
    timer = _timer(peers, clock, check_every_steps=4, warmup_steps=0)
    for step in (1, 2, 3):
        _step(timer, clock, step, 40.0, 20.0)
    check = _step(timer, clock, 4, 40.0, 20.0)
    assert check == LoopCheck(4, (20.0, 21.0, 22.0, 23.0), (40.0, 41.0, 42.0, 43.0), None, NOBODY, (), frozenset(),
                              NOBODY, "steps differ: [4, 3, 3, 4]")


def test_LOOP_3_LOOP_7_the_row_is_read_back_by_its_step_counts() -> None:
    """A peer with no step in its window has no times; one whose loop took 0 us (it waited the
    whole period) has a loop time of 0; a forward time of 0 counts where the peer had one."""
    clock = Clock()
    peers = LoopPeers(others=[[1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 5_000, 5_000, 1, 0], [1, 3, 2_000, 9_000, 7_000, 0, 0]])
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    check = _step(timer, clock, 1, 30.0, 20.0)
    assert check.loop_ms == (10.0, None, 0.0, 2.0) and check.period_ms == (30.0, None, 5.0, 9.0)
    assert check.forward is not None and check.forward.forward_ms == (None, None, 0.0, None)
    # The forward comparison, decided or not, carries its test's ratios and the verdict's reason.
    forward = check.forward
    assert forward.verdict is not None and forward.verdict.status is Status.INCONCLUSIVE
    assert forward.verdict.reason is not None and forward.reason == forward.verdict.reason.value
    assert forward.performance_ratios == timer.forward_tracker.performance_ratios() == NOBODY
    # No peer with a forward time: the forward check says so, and its test sees a silent check.
    peers.others = [[2, 1, 10_000, 30_000, 20_000, 0, 0]] * 3
    check = _step(timer, clock, 2, 30.0, 20.0)
    assert check.forward == ForwardCheck(NOBODY, None, NOBODY, frozenset(), NOBODY, "no forward times")
    assert timer.forward_tracker.trail(2)[-1].step == 2


def test_LOOP_3_loop_times_are_judged_with_the_configured_relative_floor() -> None:
    clock = Clock()
    peers = LoopPeers(others=[[1, 1, 20_000, 40_000, 20_000, 0, 0], [1, 1, 23_000, 43_000, 20_000, 0, 0],
                              [1, 1, 20_000, 40_000, 20_000, 0, 0]])
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    check = _step(timer, clock, 1, 40.0, 20.0)  # 15% slower: inside LOOP-3's 25% floor (10% by default)
    assert check.verdict is not None and check.verdict.status is Status.AGREE and check.reason is None


def test_LOOP_4_the_configuration_and_its_defaults() -> None:
    assert LoopConfig(window_steps_max=1, trail_checks=1).window_steps_max == 1
    with pytest.raises(TypeError, match=r"LoopConfig.timing must be a TimingConfig, got 0.25"):
        LoopConfig(timing=0.25)  # type: ignore[arg-type]
    clock, peers = Clock(), LoopPeers()
    timer = LoopTimer(peers, clock_ns=clock)  # the default configuration, the thread's run-queue delay
    assert timer.config == LoopConfig()
    for step in range(1, 11):
        timer.begin_step()
        clock.now_ns += 10 * MS
        timer.end_step(step)
    assert peers.rows[-1][:2] == [10, 8]  # two warm-up steps
    short = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0, trail_checks=2), clock_ns=clock,
                      run_queue_delay_s=lambda: 0.0)
    for step in (1, 2, 3):
        _step(short, clock, step, 40.0, 20.0)
    assert [e.step for e in short.tracker.trail(0)] == [2, 3] == [e.step for e in short.forward_tracker.trail(0)]


def test_LOOP_1_a_step_keeps_at_most_its_bound_of_spans_and_of_waits() -> None:
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    timer.begin_step()
    timer.collective(5, 5)  # a collective that returned as it was entered: a wait of 0
    for index in range(PENDING_WAITS_PER_STEP_MAX - 1):
        timer.collective(index, index + 1)
    timer.collective(10 * MS, 15 * MS)  # the bound's next span: not kept
    clock.now_ns += 20 * MS
    timer.end_step(1)
    assert peers.rows[-1][4] == 1  # the first 1024 spans: 1023 ns
    marked = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=clock,
                       run_queue_delay_s=lambda: 0.0, timer=FakeTimer(clock))  # type: ignore[arg-type]
    marked.begin_step()
    for _ in range(PENDING_WAITS_PER_STEP_MAX):
        marked.collective_started()()
    finish = marked.collective_started()  # the bound's next wait: not timed
    clock.now_ns += 5 * MS
    finish()
    marked.end_step(1)
    assert peers.rows[-1][4] == 0


def test_LOOP_1_LOOP_7_the_longest_asynchronous_wait_counts_and_the_forward_window_is_placed_from_the_first_mark(
) -> None:
    clock, peers = Clock(), LoopPeers()
    timer = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=lambda: 0.0, timer=FakeTimer(clock))  # type: ignore[arg-type]
    timer.begin_step()
    for start_ms, end_ms in ((0, 3), (5, 15), (20, 22)):  # the longest is neither the first nor the last
        clock.now_ns = start_ms * MS
        finish = timer.collective_started()
        if start_ms == 5:
            clock.now_ns = 4 * MS
            timer.forward_started()  # the window opens after the first wait's start
        clock.now_ns = end_ms * MS
        finish()
    clock.now_ns = 30 * MS
    timer.forward_ended()
    timer.end_step(1)
    # wait: the 10 ms one; forward: 4..30 ms less the 10 ms wait inside it.
    assert peers.rows[-1] == [1, 1, 20_000, 30_000, 10_000, 1, 16_000]


def test_LOOP_5_a_step_whose_wait_started_on_an_unresolved_mark_waits_and_nothing_fails(
        boundary: guard.Boundary) -> None:
    clock, peers = Clock(), LoopPeers()
    stream = StreamTimer(clock)
    timer = LoopTimer(peers, LoopConfig(check_every_steps=2, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=lambda: 0.0, timer=stream)  # type: ignore[arg-type]
    timer.begin_step()
    timer.collective_started()()  # resolved: the step's first mark
    stream.waiting = True
    finish = timer.collective_started()  # its start mark waits on the stream
    stream.waiting = False
    clock.now_ns += 2 * MS
    finish()  # its end mark resolves at once
    clock.now_ns += 8 * MS
    timer.end_step(1)
    clock.now_ns += 10 * MS
    timer.end_step(2)
    assert peers.rows[-1][:2] == [2, 0]  # step 1 is not resolved; step 2 waits behind it
    stream.collective_completed()
    for step in (3, 4):
        clock.now_ns += 10 * MS
        timer.end_step(step)
    assert peers.rows[-1][:2] == [4, 4] and boundary.failures([Part.LOOP]) == []


def test_GUARD_3_LOOP_2_a_window_that_cannot_be_closed_is_recorded_and_the_exchange_is_still_entered(
        boundary: guard.Boundary) -> None:
    clock, peers = Clock(), LoopPeers()
    delay_s = [0.0]
    timer = LoopTimer(peers, LoopConfig(check_every_steps=2, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=lambda: delay_s[0])
    timer.begin_step()
    clock.now_ns += 10 * MS
    timer.end_step(1)
    delay_s[0] = math.nan  # a run-queue delay that is no number
    clock.now_ns += 10 * MS
    timer.end_step(2)
    assert peers.rows[-1] == [2, 0, 0, 0, 0, 0, 0]  # the window dropped, the row sent
    (failure,) = boundary.failures([Part.LOOP])
    assert (failure.part, failure.where, failure.error_type) == (Part.LOOP, "job.step", "ValueError")
    with pytest.raises(ValueError, match="steps must increase: step 2 after step 2; call end_step once per "
                                         "training step"):
        timer.end_step(2)


def test_GUARD_3_LOOP_2_a_row_that_cannot_be_made_is_recorded_and_an_empty_row_is_sent(
        boundary: guard.Boundary) -> None:
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    timer.begin_step()
    clock.now_ns = 10**400  # a clock beyond any float: the window's median cannot become microseconds
    check = timer.end_step(1)
    assert peers.rows[-1] == [1, 0, 0, 0, 0, 0, 0] and check is not None and check.loop_ms == NOBODY
    (failure,) = boundary.failures([Part.LOOP])
    assert (failure.part, failure.where, failure.error_type) == (Part.LOOP, "job.step", "OverflowError")


def test_LOOP_1_a_body_never_begun_adds_no_step_and_no_failure(boundary: guard.Boundary) -> None:
    """``begin_step`` may be left out: the first ``end_step`` closes no body, and after an
    exchange that raised (not a transport error: it propagates) no body is open either."""
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=2, warmup_steps=0)
    clock.now_ns += 5 * MS
    timer.collective(0, 5 * MS)  # before any body: ignored
    timer.end_step(1)
    clock.now_ns += 7 * MS
    timer.end_step(2)
    assert peers.rows[-1] == [2, 1, 7_000, 7_000, 0, 0, 0]
    broken = RaisingPeers(RuntimeError("a bug in the binding"))
    timer = _timer(broken, clock, check_every_steps=1, warmup_steps=0)
    with pytest.raises(RuntimeError, match="a bug in the binding"):
        _step(timer, clock, 1, 40.0, 20.0)
    clock.now_ns += 7 * MS
    with pytest.raises(RuntimeError):
        timer.end_step(2)
    assert broken.rows[-1] == [2, 0, 0, 0, 0, 0, 0] and boundary.failures([Part.LOOP]) == []


def test_LOOP_5_a_pending_wait_reads_its_length_in_ns_and_never_blocks() -> None:
    clock = FakeClock()
    timer = FakeTimer(clock)
    wait = PendingWait(timer, timer.record())
    assert wait.blocking is False and wait.elapsed_ns() is None  # unfinished
    clock.now_ns += 1_500_000_000
    wait.finish()
    assert wait.elapsed_ns() == 1_500_000_000
    zero = PendingWait(timer, timer.record(), blocking=True)
    zero.finish()
    assert zero.blocking is True and zero.elapsed_ns() == 0
    unresolved = PendingWait(timer, timer.withhold())
    unresolved.finish()
    assert unresolved.elapsed_ns() is None
    clock.now_ns += MS
    timer.complete(unresolved.start)  # its start resolved after its end: no negative wait
    assert unresolved.elapsed_ns() == 0


def test_TIMING_4_the_loop_timer_times_by_cuda_events_only_where_this_process_initialised_cuda(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The choice of timer, with torch.cuda's answers scripted (this machine has no GPU; the
    CUDA timer itself is tested on one)."""
    import torch

    chosen: list[object] = []
    monkeypatch.setattr(arrival, "timer_for", lambda device: chosen.append(device) or "cuda timer")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert isinstance(LoopTimer(LoopPeers(), run_queue_delay_s=lambda: 0.0).timer, WallTimer) and chosen == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert LoopTimer(LoopPeers(), run_queue_delay_s=lambda: 0.0).timer == "cuda timer"
    assert chosen == [torch.device("cuda", 3)]

    def broken() -> bool:
        raise RuntimeError("no driver")

    monkeypatch.setattr(torch.cuda, "is_initialized", broken)
    with caplog.at_level(logging.DEBUG, logger="scout.replay"):
        assert isinstance(LoopTimer(LoopPeers(), run_queue_delay_s=lambda: 0.0).timer, WallTimer)
    (record,) = [r for r in caplog.records if r.name == "scout.replay"]
    assert record.getMessage() == "scout: loop waits by the wall clock"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


def _rows(timer_of: str, script: Sequence[tuple[str, int]], *, check_every_steps: int = 1,
          delay_start_s: float = 0.0) -> list[list[int]]:
    """Run ``script`` -- (action, ns) pairs: "advance" the clock, "delay" the run-queue delay
    to (ns as seconds / 1e9), "start"/"finish" a blocking wait timed by marks, "forward" open,
    "forwarded" close the forward window, "end" the step -- and return the rows sent."""
    clock, peers = Clock(), LoopPeers()
    delay_s = [delay_start_s]
    timer = LoopTimer(peers, LoopConfig(check_every_steps=check_every_steps, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=lambda: delay_s[0],
                      timer=FakeTimer(clock) if timer_of == "device" else None)  # type: ignore[arg-type]
    timer.begin_step()
    finish = None
    step = 0
    for action, value in script:
        if action == "advance":
            clock.now_ns += value
        elif action == "delay":
            delay_s[0] = value / 1e9
        elif action == "start":
            finish = timer.collective_started(blocking=True)
        elif action == "finish":
            assert finish is not None
            finish()
        elif action == "forward":
            timer.forward_started()
        elif action == "forwarded":
            timer.forward_ended()
        else:
            step += 1
            timer.end_step(step)
    return [list(row) for row in peers.rows]


def test_LOOP_2_the_row_is_exact_to_the_nanosecond_and_rounds_to_microseconds_half_to_even() -> None:
    # Periods of 0 and 1000 ns: the medians are 500 ns, 0.5 us, which rounds to 0.
    assert _rows("host", [("end", 0), ("advance", 1_000), ("end", 0)], check_every_steps=2) == [
        [2, 2, 0, 0, 0, 0, 0]]
    # 1.5 s off a CPU (from 1.0 s to 2.5 s of run-queue delay) in a body of 1.5 s + 1500 ns: 1.5 us.
    assert _rows("host", [("delay", 2_500_000_000), ("advance", 1_500_001_500), ("end", 0)],
                 delay_start_s=1.0) == [[1, 1, 2, 2, 0, 0, 0]]
    # Forward windows of 1500 ns, on the host and on a device: 1.5 us rounds to 2.
    forward = [("forward", 0), ("advance", 1_500), ("forwarded", 0), ("end", 0)]
    assert _rows("host", forward)[0][5:] == [1, 2] and _rows("device", forward)[0][5:] == [1, 2]
    # The same with 1.5 s off a CPU inside the host's window.
    assert _rows("host", [("forward", 0), ("delay", 1_500_000_000), ("advance", 1_500_001_500), ("forwarded", 0),
                          ("end", 0)])[0][5:] == [1, 2]
    # Device forward windows of 0 and 1000 ns: a median of 0.5 us, 0.
    assert _rows("device", [("forward", 0), ("forwarded", 0), ("end", 0), ("forward", 0), ("advance", 1_000),
                            ("forwarded", 0), ("end", 0)], check_every_steps=2)[0][5:] == [2, 0]
    # A wait timed by marks of 1500 ns: 1.5 us, 2. Waits of 1500 and 2500 ns placed 1.5 s after
    # the step's first mark: 2 and 2 (2.5 us rounds to even).
    assert _rows("device", [("start", 0), ("advance", 1_500), ("finish", 0), ("end", 0)])[0][4] == 2
    later = [("start", 0), ("finish", 0), ("advance", 1_500_000_000), ("start", 0)]
    assert _rows("device", [*later, ("advance", 1_500), ("finish", 0), ("end", 0)])[0][4] == 2
    assert _rows("device", [*later, ("advance", 2_500), ("finish", 0), ("end", 0)])[0][4] == 2


def test_LOOP_5_every_step_dropped_from_the_backlog_is_counted() -> None:
    clock, peers = Clock(), LoopPeers()
    stream = StreamTimer(clock)
    timer = LoopTimer(peers, LoopConfig(check_every_steps=4, warmup_steps=0, window_steps_max=1), clock_ns=clock,
                      run_queue_delay_s=lambda: 0.0, timer=stream)  # type: ignore[arg-type]
    timer.begin_step()
    for step in (1, 2):  # each step's wait never resolves
        stream.waiting = True
        timer.collective_started()()
        stream.waiting = False
        clock.now_ns += 10 * MS
        timer.end_step(step)
    for step in (3, 4):
        clock.now_ns += 10 * MS
        timer.end_step(step)
    assert timer.dropped_steps == 2 and peers.rows[-1][:2] == [4, 1]
