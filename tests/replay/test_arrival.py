"""Loop stragglers from arrival at the step's collectives (spec/replay.md LOOP-1..LOOP-4), in
one process: a scripted peer group and a scripted clock. The 4-process runs are in
test_replay_distributed.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from scout.core.straggler import SequentialConfig
from scout.replay.arrival import LOOP_ROW_LENGTH, LoopConfig, LoopTimer, union_ns
from scout.reports.kinds import straggler_reason
from scout.transport.base import DeadlineExceeded
from scout.transport.nccl.timing import FakeTimer

Rows = list[list[int]]
MS = 1_000_000  # ns


class Clock:
    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


class LoopPeers:
    """Four peers: this process is position 0; the others' rows are ``others(row)``."""

    def __init__(self, others: list[list[int]] | None = None, fail: bool = False) -> None:
        self.size = 4
        self.position = 0
        self.ranks = (10, 11, 12, 13)
        self.others = others
        self.fail = fail
        self.rows: list[Sequence[int]] = []

    def all_gather_int64(self, row: Sequence[int]) -> Rows:
        self.rows.append(list(row))
        if self.fail:
            raise DeadlineExceeded("replay all_gather", 1.0, ())
        others = self.others or [list(row)] * 3
        return [list(row), *[list(o) for o in others]]

    def broadcast_(self, tensors: object, source_position: int) -> None:
        raise AssertionError("the loop timer only gathers")


def _timer(peers: LoopPeers, clock: Clock, **config: int) -> LoopTimer:
    """A loop timer on the scripted clock, with no run-queue delay (LOOP-1)."""
    return LoopTimer(peers, LoopConfig(**config), clock_ns=clock, run_queue_delay_s=lambda: 0.0)


def _step(timer: LoopTimer, clock: Clock, step: int, body_ms: float, wait_ms: float) -> object:
    """A loop body of ``body_ms`` whose collectives were in flight for ``wait_ms``."""
    timer.begin_step()
    clock.now_ns += round((body_ms - wait_ms) * MS)
    entry = clock.now_ns
    clock.now_ns += round(wait_ms * MS)
    timer.collective(entry, clock.now_ns)
    timer.collective(entry + MS // 2, entry + MS)  # inside the other one: counted once (LOOP-1)
    return timer.end_step(step)


def test_LOOP_1_LOOP_2_a_check_sends_the_median_loop_time_in_one_fixed_size_row() -> None:
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=4, warmup_steps=1)
    results = [
        _step(timer, clock, step, 30.0, wait) for step, wait in enumerate((9, 10, 20, 12), 1)
    ]
    assert results[:3] == [None, None, None]
    (row,) = peers.rows
    assert len(row) == LOOP_ROW_LENGTH
    # Step 1 is warm-up; loop = body - wait: 20, 10, 18 ms -> median 18 ms.
    assert row == [4, 3, 18_000, 30_000, 12_000, 0, 0]  # no forward window: LOOP-7
    check = results[3]
    assert check is not None and check.loop_ms == (18.0,) * 4 and check.period_ms == (30.0,) * 4
    assert check.evidence == (0.0,) * 4 and not check.events and check.reason is None


def _loop_rows(step: int, loop_ms: Sequence[float]) -> list[list[int]]:
    return [[step, 5, round(ms * 1000), 40_000, 10_000, 0, 0] for ms in loop_ms]


def test_LOOP_3_the_rank_the_others_wait_for_is_confirmed_loop_slow_and_recovers_once() -> None:
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    events = []
    for step in range(1, 25):
        slow = step <= 8
        # This rank (position 0) does 20 ms of loop work; peer 2 does 30 ms while it is slow.
        peers.others = _loop_rows(step, (20.2, 30.0 if slow else 20.1, 19.9))
        check = _step(timer, clock, step, 40.0, 20.0)
        assert check is not None
        events += [(e.step, e.rank, straggler_reason(e).value) for e in check.events]
    # 1.5x is beyond the clip: 4 checks confirm (STRAG-12); 7 checks on par recover it.
    assert events == [(4, 12, "loop-slow"), (15, 12, "recovered-loop-slow")]
    assert check.performance_ratios[2] == pytest.approx(1.0, abs=0.02)


def test_LOOP_3_a_check_with_a_missing_or_misaligned_peer_says_nothing() -> None:
    clock = Clock()
    peers = LoopPeers(others=[[2, 0, 0, 0, 0, 0, 0], [2, 5, 30_000, 1, 1, 0, 0], [2, 5, 20_000, 1, 1, 0, 0]])
    timer = _timer(peers, clock, check_every_steps=2, warmup_steps=0)
    _step(timer, clock, 1, 40.0, 20.0)
    check = _step(timer, clock, 2, 40.0, 20.0)
    assert check is not None and check.loop_ms[1] is None
    assert check.evidence == (None,) * 4 and check.reason == "missing-evidence"
    peers.others = [[3, 5, 20_000, 1, 1, 0, 0]] * 3  # peers at another step (a desync elsewhere)
    _step(timer, clock, 3, 40.0, 20.0)
    check = _step(timer, clock, 4, 40.0, 20.0)
    assert check is not None and check.evidence == (None,) * 4
    assert check.reason is not None and check.reason.startswith("steps differ")


def test_LOOP_2_a_deadline_disables_the_checks_and_never_raises() -> None:
    clock, peers = Clock(), LoopPeers(fail=True)
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    check = _step(timer, clock, 1, 40.0, 20.0)
    assert check is not None and check.evidence == (None,) * 4
    assert timer.disabled_reason is not None and "deadline" in timer.disabled_reason
    gathers = len(peers.rows)
    check = _step(timer, clock, 2, 40.0, 20.0)  # no further collective on a broken group
    assert len(peers.rows) == gathers and check is not None
    assert check.reason is not None and check.reason.startswith("disabled")


def test_LOOP_1_the_wait_is_the_union_of_the_blocking_spans_and_the_longest_asynchronous_one() -> None:
    """An FSDP2 step on a CPU has many blocking collectives: their ordinary lengths add up
    (disjoint spans are summed) and nothing is counted twice (overlapping spans count once);
    of the asynchronous ones, which may overlap the rank's computation, only the longest counts;
    spans timed by marks are a wait of their own, and the larger is the wait."""
    assert union_ns([]) == 0
    assert union_ns([(0, 10), (20, 25)]) == 15
    assert union_ns([(20, 25), (0, 10), (5, 12), (6, 7), (25, 30)]) == 22
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    timer.begin_step()
    for entry_ms, exit_ms in ((5, 10), (20, 26), (22, 24), (30, 34)):  # 5 + 6 + 4 ms
        timer.collective(entry_ms * MS, exit_ms * MS)
    clock.now_ns += 50 * MS
    timer.end_step(1)
    assert peers.rows[-1] == [1, 1, 35_000, 50_000, 15_000, 0, 0]
    # Marks on another clock: a span inside another and two disjoint ones, 8 + 3 ms; the spans
    # given by times (2 ms) are the smaller union.
    stream = FakeTimer(clock)  # type: ignore[arg-type]
    marked = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=clock,
                       run_queue_delay_s=lambda: 0.0, timer=stream)
    marked.begin_step()
    start = clock.now_ns
    outer = marked.collective_started(blocking=True)
    clock.now_ns += 2 * MS
    inner = marked.collective_started(blocking=True)
    clock.now_ns += 3 * MS
    inner()
    clock.now_ns += 3 * MS
    outer()
    clock.now_ns += 10 * MS
    last = marked.collective_started(blocking=True)
    clock.now_ns += 3 * MS
    last()
    marked.collective(start, start + 2 * MS)
    clock.now_ns += 9 * MS
    marked.end_step(1)
    assert peers.rows[-1] == [1, 1, 19_000, 30_000, 11_000, 0, 0]
    # Asynchronous ones (DDP's buckets during the backward): 4 ms and 6 ms, disjoint, of which
    # only the longest counts; it overlaps a blocking 5 ms one by 2 ms: 6 + 5 - 2 = 9 ms.
    marked.begin_step()
    first = marked.collective_started()
    clock.now_ns += 4 * MS
    first()
    clock.now_ns += 6 * MS
    second = marked.collective_started()
    clock.now_ns += 4 * MS
    blocked = marked.collective_started(blocking=True)
    clock.now_ns += 2 * MS
    second()
    clock.now_ns += 3 * MS
    blocked()
    clock.now_ns += 11 * MS
    marked.end_step(2)
    assert peers.rows[-1] == [2, 1, 21_000, 30_000, 9_000, 0, 0]


def test_LOOP_7_the_forward_time_is_its_window_less_the_waits_inside_it_and_the_time_off_a_cpu() -> None:
    clock, peers = Clock(), LoopPeers()
    delay_s = [0.0]
    timer = LoopTimer(peers, LoopConfig(check_every_steps=2, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=lambda: delay_s[0])
    for step in (1, 2):
        timer.begin_step()
        timer.forward_ended()  # before the window opens: nothing
        clock.now_ns += 2 * MS  # FSDP2's all-gather before the first layer: not in the window
        timer.forward_started()
        clock.now_ns += 10 * MS
        timer.forward_started()  # a second first-layer call (a recomputation): ignored
        finish = timer.collective_started(blocking=True)  # an all-gather between two layers: a wait
        clock.now_ns += 4 * MS
        finish()
        delay_s[0] += 0.001  # 1 ms off a CPU inside the window
        clock.now_ns += 14 * MS
        timer.forward_ended()  # the window closes: 28 ms, less 4 ms of wait, less 1 ms
        clock.now_ns += 20 * MS
        timer.forward_ended()  # the backward's recomputation of the last layer: ignored
        late = timer.collective_started()  # the gradient all-reduce, after the window
        clock.now_ns += 6 * MS
        late()
        timer.end_step(step)
    assert peers.rows[-1][5:] == [2, 23_000]
    # A window that never closed (the last layer not called): the step has no forward time.
    timer.begin_step()
    timer.forward_started()
    clock.now_ns += 5 * MS
    timer.end_step(3)
    timer.begin_step()
    clock.now_ns += 5 * MS
    timer.end_step(4)
    assert peers.rows[-1][5:] == [0, 0]
    # On a device's marks the host's run-queue delay is not taken out (the events do not see it).
    device = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=clock,
                       run_queue_delay_s=lambda: delay_s[0], timer=FakeTimer(clock))  # type: ignore[arg-type]
    device.begin_step()
    device.forward_started()
    delay_s[0] += 0.002
    clock.now_ns += 10 * MS
    device.forward_ended()
    device.end_step(1)
    assert peers.rows[-1][5:] == [1, 10_000]


def test_LOOP_7_a_forward_window_never_closed_leaves_the_loop_check_and_later_windows_alone() -> None:
    """Conditional compute, an early exit, a pipeline stage that skips its last layer, an exception
    inside the forward: the first layer's pre-hook opened the window and the last layer never
    closed it. That step has no forward time; its loop time counts, and so do every later step's
    loop and forward times -- this rank, 1.5x slower in its loop than its peers while every other
    step exits early, is confirmed ``loop-slow`` at the 4th check as always (STRAG-4)."""
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=2, warmup_steps=0)
    named = []
    for check_index in range(1, 7):
        for step in (2 * check_index - 1, 2 * check_index):
            timer.begin_step()
            timer.forward_started()
            clock.now_ns += 10 * MS
            if step % 2 == 0:
                timer.forward_ended()  # the full forward; odd steps exit early, the window left open
            clock.now_ns += 20 * MS
            finish = timer.collective_started()
            clock.now_ns += 5 * MS
            finish()
            peers.others = [[step, 2, 20_000, 25_000, 5_000, 1, 10_000]] * 3
            check = timer.end_step(step)
        assert check is not None
        row = peers.rows[-1]
        # Both steps in the window with their loop time; the closed window's forward time only.
        assert row[:3] == [step, 2, 30_000] and row[5:] == [1, 10_000], row
        named += [(e.step, e.rank, straggler_reason(e).value) for e in check.events]
    assert named == [(8, 10, "loop-slow")], named


def test_LOOP_7_a_rank_with_a_slow_forward_is_confirmed_forward_slow_and_the_loop_test_is_apart() -> None:
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    names = []
    for step in range(1, 7):
        # Loop times alike; peer 2's forward is 1.5x its peers' (a hook that waits).
        peers.others = [[step, 1, 20_000, 40_000, 20_000, 1, forward] for forward in (10_100, 15_000, 9_900)]
        timer.begin_step()
        timer.forward_started()
        clock.now_ns += 10 * MS
        timer.forward_ended()
        clock.now_ns += 10 * MS
        finish = timer.collective_started()
        clock.now_ns += 20 * MS
        finish()
        check = timer.end_step(step)
        assert check is not None and check.forward is not None
        names += [(e.step, e.rank, straggler_reason(e).value) for e in check.events]
    assert names == [(4, 12, "forward-slow")]
    assert check.forward.forward_ms == (10.0, 10.1, 15.0, 9.9) and check.forward.confirmed == {2}
    assert check.confirmed == frozenset() and check.verdict is not None  # the loop test: nobody
    # Peers without forward times (no hidden layers timed): the forward says nothing.
    peers.others = [[7, 1, 20_000, 40_000, 20_000, 0, 0]] * 3
    timer.begin_step()
    clock.now_ns += 10 * MS
    check = timer.end_step(7)
    assert check is not None and check.forward is not None and check.forward.verdict is None


def test_LOOP_1_collectives_from_other_threads_and_outside_a_body() -> None:
    clock, peers = Clock(), LoopPeers()
    timer = _timer(peers, clock, check_every_steps=2, warmup_steps=0)
    timer.begin_step()
    clock.now_ns += 50 * MS
    threads = [
        threading.Thread(target=timer.collective, args=(0, wait * MS)) for wait in (5, 30, 10)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    timer.end_step(1)
    timer.collective(0, 45 * MS)  # between end_step and the next begin_step: a bookkeeping
    clock.now_ns += 5 * MS  # collective of scout itself, not loop work -- ignored
    timer.begin_step()
    clock.now_ns += 50 * MS
    timer.end_step(2)
    assert peers.rows[0][2] == 35_000  # median of (50 - 30, 50 - 0) ms
    with pytest.raises(ValueError, match="cannot return before it is entered"):
        timer.collective(10, 5)
    with pytest.raises(ValueError, match="steps must increase: step 2 after step 2"):
        timer.end_step(2)


def test_LOOP_8_a_check_measures_the_steps_just_before_it_and_the_others_cost_no_timing() -> None:
    """Issue 38: at an interval of 8 with ``measured_steps`` 3, only steps 6..8 and 14..16 are
    timed; the steps between read no clock and no run-queue delay, and their collectives and
    forward hooks are ignored (what a collective listener gets back calls nothing)."""
    clock, peers = Clock(), LoopPeers()
    reads: list[int] = []

    def delay_s() -> float:
        reads.append(timer.last_step)
        return 0.0

    timer = LoopTimer(peers, LoopConfig(check_every_steps=8, measured_steps=3, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=delay_s)
    assert [s for s in range(1, 17) if timer.measures(s)] == [6, 7, 8, 14, 15, 16]
    measured = []
    for step in range(1, 17):
        timer.begin_step()
        measured.append(timer.measuring)
        timer.forward_started()
        clock.now_ns += (10 + step) * MS  # the body takes 10 ms more than its step's number
        timer.forward_ended()
        finish = timer.collective_started(blocking=True)
        clock.now_ns += 2 * MS
        finish()
        timer.end_step(step)
    # The first body (before any step was seen) is timed; then only the last 3 before each check.
    assert [s for s, m in enumerate(measured, 1) if m] == [1, 6, 7, 8, 14, 15, 16]
    # A timed body reads the run-queue delay at its start (twice after a step: end_step begins the
    # next body, and so does begin_step) and the forward's two ends -- the last step seen is the
    # one before -- and at its close (the step itself); a body not timed never.
    assert sorted(set(reads)) == [0, 1, 5, 6, 7, 8, 13, 14, 15, 16] and len(reads) == 4 + 6 * 5
    # Step 1's body is in the first window (the window holds what was timed since the last check).
    assert [row[:3] for row in peers.rows] == [[8, 4, 16_500], [16, 3, 25_000]]  # medians of 11, 16, 17, 18 and 24..26
    assert [row[5:] for row in peers.rows] == [[4, 16_500], [3, 25_000]]
    # Every step timed, as before, when measured_steps covers the interval.
    assert all(LoopTimer(peers, LoopConfig(check_every_steps=8, measured_steps=8)).measures(s) for s in range(1, 40))


def test_LOOP_4_configuration_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="check_every_steps must be an int >= 1, got 0"):
        LoopConfig(check_every_steps=0)
    with pytest.raises(ValueError, match="measured_steps must be an int >= 1, got 0"):
        LoopConfig(measured_steps=0)
    with pytest.raises(TypeError, match="straggler must be a SequentialConfig"):
        LoopConfig(straggler=1.5)  # type: ignore[arg-type]
    assert LoopConfig(straggler=SequentialConfig(slow_ratio=1.2)).straggler.slow_ratio == 1.2


def test_LOOP_2_a_group_of_one_never_exchanges() -> None:
    clock, peers = Clock(), LoopPeers()
    peers.size, peers.ranks = 1, (0,)
    timer = _timer(peers, clock, check_every_steps=1, warmup_steps=0)
    check = _step(timer, clock, 1, 40.0, 20.0)
    assert peers.rows == [] and check is not None
    assert check.reason == "singleton" and check.evidence == (None,)


class StreamTimer:
    """A FakeTimer whose marks, while ``waiting`` is set, are recorded on a stream that waits for
    a collective: they complete only at :meth:`collective_completed` -- NCCL's future callbacks
    run with such a current stream."""

    def __init__(self, clock: Clock) -> None:
        from scout.transport.nccl.timing import FakeClock, FakeTimer

        self.fake_clock = FakeClock()
        self.clock = clock
        self.timer = FakeTimer(self.fake_clock)
        self.waiting = False
        self.withheld: list[object] = []
        self.name = "stream"

    def _sync(self) -> None:
        self.fake_clock.now_ns = self.clock.now_ns

    def record(self) -> object:
        self._sync()
        if self.waiting:
            mark = self.timer.withhold()
            self.withheld.append(mark)
            return mark
        return self.timer.record()

    def collective_completed(self) -> None:
        self._sync()
        for mark in self.withheld:
            self.timer.complete(mark)  # type: ignore[arg-type]
        self.withheld.clear()
        self.waiting = False

    def completed(self, mark: object) -> bool:
        self._sync()
        return self.timer.completed(mark)  # type: ignore[arg-type]

    def elapsed_s(self, start: object, end: object) -> float | None:
        self._sync()
        return self.timer.elapsed_s(start, end)  # type: ignore[arg-type]


def test_LOOP_5_on_nccl_the_wait_is_timed_at_completion_though_the_hooks_callback_fires_at_enqueue() -> None:
    """NCCL marks a DDP hook's future complete at enqueue, so a wall-clock read in its
    callback measures ~0 on every rank; a mark recorded there sits on a stream that waits for
    the all-reduce and measures the real wait."""
    clock, peers = Clock(), LoopPeers()
    stream = StreamTimer(clock)
    timer = LoopTimer(peers, LoopConfig(check_every_steps=2, warmup_steps=0), clock_ns=clock,
                      run_queue_delay_s=lambda: 0.0, timer=stream)  # type: ignore[arg-type]
    wall_waits = []
    for step in (1, 2):
        timer.begin_step()
        clock.now_ns += 10 * MS  # the rank's own work before the all-reduce
        finish = timer.collective_started()  # the hook, at enqueue
        stream.waiting = True  # the callback's stream waits for the all-reduce
        entry = clock.now_ns
        finish()  # NCCL: the future's callback fires at once
        wall_waits.append(clock.now_ns - entry)
        clock.now_ns += 25 * MS  # the host runs on to its sync point; the peer is late
        stream.collective_completed()
        clock.now_ns += 5 * MS
        timer.end_step(step)
    assert wall_waits == [0, 0]
    # loop = period - wait = 40 - 25 ms on both steps (the wall clock in the callback: 40 ms).
    assert peers.rows[0][2] == 15_000 and peers.rows[0][4] == 25_000


def test_LOOP_5_a_step_joins_the_window_when_its_waits_resolve_in_step_order_and_the_backlog_is_bounded() -> None:
    clock, peers = Clock(), LoopPeers()
    stream = StreamTimer(clock)
    timer = LoopTimer(peers, LoopConfig(check_every_steps=3, warmup_steps=0, window_steps_max=4), clock_ns=clock,
                      run_queue_delay_s=lambda: 0.0, timer=stream)  # type: ignore[arg-type]
    timer.begin_step()
    stream.waiting = True
    late = timer.collective_started()
    late()  # its end mark waits for the collective
    clock.now_ns += 30 * MS
    timer.end_step(1)
    for step in (2, 3):  # resolved at once (nothing waits), but behind step 1 in the window
        clock.now_ns += 30 * MS
        timer.end_step(step)
    assert peers.rows[-1][1] == 0  # the check at step 3: nothing resolved yet, nothing sent
    stream.collective_completed()
    for step in (4, 5, 6):
        clock.now_ns += 30 * MS
        timer.end_step(step)
    assert peers.rows[-1][1] == 4 and timer.dropped_steps == 0  # a window of 4: steps 3..6
    # A mark that never completes: the steps behind it wait, at most window_steps_max of them.
    stream.waiting = True
    timer.collective_started()()
    stream.waiting = False
    for step in range(7, 13):
        clock.now_ns += 30 * MS
        timer.end_step(step)
    # The fifth ended step behind it drops it (step 7), and the rest flow into the window.
    assert timer.dropped_steps == 1 and peers.rows[-1] == [12, 4, 30_000, 30_000, 0, 0, 0]
