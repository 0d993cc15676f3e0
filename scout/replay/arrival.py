"""Loop stragglers: the rank its peers wait for at the step's collectives (spec/replay.md
LOOP-1..LOOP-4).

Replay times controlled re-executions of layers, so it sees a slow *device* and never a slow
*training loop* -- host-side work outside any module (a slow data path, a slow Python
callback). Such a rank arrives late at the step's collectives and its peers wait for it, step
after step. Step wall time cannot show it (data-parallel collectives equalise it,
docs/prior-art.md lesson 7), and the ranks' clocks are not synchronised; what every rank can
measure on its own monotonic clock is

* ``period``: how long its loop body took (from :meth:`LoopTimer.begin_step` to
  :meth:`LoopTimer.end_step`), the same on every rank once the step's collectives equalise it,
  less the time the host kept the training thread waiting for a CPU (Linux run-queue delay,
  as COMM-1: host contention is not loop work, and on a shared host it is the largest noise);
* ``wait``: the time it waited in the step's collectives -- each span from its entry to its
  exit (:meth:`LoopTimer.collective`), or, where a collective returns at enqueue (NCCL, the
  emulated backend), from its enqueue to its completion, timed by marks of the device's timer
  and resolved later (:meth:`LoopTimer.collective_started`, LOOP-5) -- long for the ranks that
  arrived early, short for the one they waited for: the union of the spans of the calls that
  block the training thread (an FSDP2 step has dozens, and their ordinary lengths are nobody's
  own work) with the longest of the asynchronous ones (those overlap the rank's computation).

A rank's *loop time* is ``period - wait`` (LOOP-1): its own work in the step, the time its
peers waited for it included. At a check step every peer exchanges the median of its loop
times over the steps it timed since the last check (LOOP-8) in one fixed-size row over the replay peer group
(deadline-bounded, LOOP-2); ``classify_timing`` decides the comparison, and each peer's log
ratio to the centre feeds a sequential test of its own (``loop-slow``, LOOP-3).

The same row carries the rank's *forward time* (LOOP-7): the live forward of the hidden layers,
from the first layer's pre-hook to the last layer's forward hook (:meth:`LoopTimer.forward_started`,
:meth:`LoopTimer.forward_ended`, timed by marks), less the waits inside it. A forward hook that
waits or computes slows it, where replay -- which does not run a sharded unit's own hooks --
cannot see it; it has a sequential test of its own (``forward-slow``).

Wiring (the trainer, or ``scout.attach``'s per-step call)::

    loop = LoopTimer(peers)                     # the replay peer group, after it is built
    for step in range(1, steps + 1):
        loop.begin_step()                       # the loop body starts
        batch = next(data); loss = model(batch); loss.backward(); optimizer.step()
        # every collective of the body, from any thread: finish = loop.collective_started()
        # at its enqueue, finish() when it completed (a Work's future callback), or
        # loop.collective(entry_ns, exit_ns) when both times are known on this clock
        check = loop.end_step(step)             # collective at check steps: every peer calls it
        replayer.after_optimizer_step()         # and the rest of the per-step work

``begin_step`` may be left out: the next body then starts when ``end_step`` returns.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import attrs

from scout.core.budget import LOOP_WINDOW_STEPS_MAX
from scout.core.guards import whole_number
from scout.core.straggler import DEFAULT_SEQUENTIAL_CONFIG, SequentialConfig, check_evidence
from scout.core.verdict import (
    MISSING,
    Status,
    TimingConfig,
    Verdict,
    classify_timing,
)
from scout.replay.collectives import PeerGroup, RunQueueDelay
from scout.replay.stragglers import StragglerEvent, StragglerKind, StragglerTracker
from scout.reports import guard
from scout.reports.guard import Part
from scout.transport.base import DeadlineExceeded, TransportError
from scout.transport.nccl.timing import Mark, Timer, WallTimer, timer_for

__all__ = ["LOOP_ROW_LENGTH", "ForwardCheck", "LoopCheck", "LoopConfig", "LoopTimer", "PendingWait", "union_ns"]

logger = logging.getLogger("scout.replay")

#: LOOP-2: step, steps in the window, median loop, period and wait (microseconds); LOOP-7: steps
#: with a forward time and their median forward time (microseconds).
LOOP_ROW_LENGTH: Final = 7
#: LOOP-5: waits of one step awaiting their marks, and steps awaiting their waits.
PENDING_WAITS_PER_STEP_MAX: Final = 1024


class PendingWait:
    """LOOP-5: one collective's wait, timed by two marks of the timer: recorded at its enqueue,
    and by :meth:`finish` when it completed (any thread; on NCCL from its work's future
    callback, whose current stream waits for the collective). Resolved later, never waited for."""

    __slots__ = ("_timer", "blocking", "end", "start")

    def __init__(self, timer: Timer, start: Mark, blocking: bool = False) -> None:
        self._timer = timer
        self.start = start
        self.end: Mark | None = None
        self.blocking = blocking  # LOOP-1: the training thread (or its stream) waits in it

    def finish(self) -> None:
        if self.end is None:
            self.end = self._timer.record()

    def elapsed_ns(self) -> int | None:
        """The wait in ns, or None while unfinished or unresolved (never blocks)."""
        end = self.end
        if end is None:
            return None
        seconds = self._timer.elapsed_s(self.start, end)
        return None if seconds is None else max(0, round(seconds * 1e9))

    def placed_ns(self, origin: Mark) -> tuple[int, int] | None:
        """The wait's start and end in ns after ``origin`` (a mark of the same timer recorded
        no later than this wait's start), or None while unfinished or unresolved."""
        end = self.end
        if end is None:
            return None
        start_s = 0.0 if origin is self.start else self._timer.elapsed_s(origin, self.start)
        end_s = self._timer.elapsed_s(origin, end)
        if start_s is None or end_s is None:
            return None
        start_ns = max(0, round(start_s * 1e9))
        return start_ns, max(start_ns, round(end_s * 1e9))


def _default_timer(clock_ns: Callable[[], int]) -> Timer:
    """TIMING-4: events on the current CUDA device when this process uses CUDA, else the wall
    clock (``clock_ns``)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return timer_for(torch.device("cuda", torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - no usable CUDA timer: the wall clock
        logger.debug("scout: loop waits by the wall clock", exc_info=True)
    return WallTimer(clock_ns)


@attrs.frozen
class LoopConfig:
    """``check_every_steps``: a check at every step that is a multiple of it (the same steps
    on every peer). ``window_steps_max``: steps kept between two checks (the oldest are
    dropped). ``warmup_steps``: the first steps are not used (DDP rebuilds its buckets, lazy
    initialisation). ``timing``: the verdict's thresholds for one comparison of loop times."""

    check_every_steps: int = 10  # LOOP-2: one all-gather of 5 int64 every 10 steps (measured there)
    window_steps_max: int = LOOP_WINDOW_STEPS_MAX  # BUDGET-11 lengthens intervals up to it
    #: LOOP-8: only the last ``measured_steps`` steps before each check are timed (a job sets
    #: ``loop_check_steps``); the default times every step a window keeps.
    measured_steps: int = LOOP_WINDOW_STEPS_MAX
    warmup_steps: int = 2
    #: LOOP-3: a loop time is judged against its peers with a relative floor of 25%: host-side
    #: timings scatter more than replay's, and a verdict that names two of four peers is no
    #: evidence at all; the evidence itself is the log ratio, whatever the floor.
    timing: TimingConfig = TimingConfig(relative_floor=0.25)
    straggler: SequentialConfig = DEFAULT_SEQUENTIAL_CONFIG
    trail_checks: int = 16

    def __attrs_post_init__(self) -> None:
        for name, least in (
            ("check_every_steps", 1),
            ("window_steps_max", 1),
            ("measured_steps", 1),
            ("warmup_steps", 0),
            ("trail_checks", 1),
        ):
            value = getattr(self, name)
            if not whole_number(value) or value < least:
                raise ValueError(f"LoopConfig.{name} must be an int >= {least}, got {value!r}")
        if not isinstance(self.timing, TimingConfig):
            raise TypeError(f"LoopConfig.timing must be a TimingConfig, got {self.timing!r}")
        if not isinstance(self.straggler, SequentialConfig):
            raise TypeError(
                f"LoopConfig.straggler must be a SequentialConfig, got {self.straggler!r}"
            )


@attrs.frozen
class LoopCheck:
    """One check of loop times (LOOP-3): per peer, by position, the median loop time and
    period over the window (ms; None if the peer had no step in it), the verdict, the
    evidence, this check's confirmations and recoveries, the peers confirmed now and every
    peer's performance ratio; ``forward`` the same comparison of forward times (LOOP-7)."""

    step: int
    loop_ms: tuple[float | None, ...]
    period_ms: tuple[float | None, ...]
    verdict: Verdict | None
    evidence: tuple[float | None, ...]
    events: tuple[StragglerEvent, ...]  # the loop's and the forward's
    confirmed: frozenset[int]
    performance_ratios: tuple[float | None, ...]
    reason: str | None = None  # why the check said nothing (None when it was decided)
    forward: ForwardCheck | None = None


@attrs.frozen
class ForwardCheck:
    """LOOP-7: the check's comparison of forward times, per peer by position (ms; None if the
    peer had no forward time in its window)."""

    forward_ms: tuple[float | None, ...]
    verdict: Verdict | None
    evidence: tuple[float | None, ...]
    confirmed: frozenset[int]
    performance_ratios: tuple[float | None, ...]
    reason: str | None = None


def union_ns(spans: list[tuple[int, int]]) -> int:
    """LOOP-1: how long at least one of ``spans`` (start, end pairs on one clock) covered."""
    total = 0
    covered_to: int | None = None
    for start, end in sorted(spans):
        if covered_to is None or start > covered_to:
            total += end - start
            covered_to = end
        elif end > covered_to:
            total += end - covered_to
            covered_to = end
    return total


def _placed_spans(pending: list[PendingWait], origin: Mark) -> list[tuple[int, int]] | None:
    """LOOP-1, LOOP-5: the spans timed by marks, each placed by its distance from ``origin``
    (a device's marks have no common origin of their own); None while a mark is unfinished or
    unresolved."""
    spans = []
    for wait in pending:
        placed = wait.placed_ns(origin)
        if placed is None:
            return None
        spans.append(placed)
    return spans


def _origin(pending: list[PendingWait]) -> Mark:
    return min(pending, key=lambda wait: wait.start.sequence).start


def _clipped(spans: list[tuple[int, int]], low_ns: int, high_ns: int) -> list[tuple[int, int]]:
    """The parts of ``spans`` inside [low_ns, high_ns]."""
    return [(max(start, low_ns), min(end, high_ns)) for start, end in spans if end > low_ns and start < high_ns]


@attrs.frozen
class _EndedStep:
    """LOOP-5: an ended step whose waits (and forward window, LOOP-7) are timed by marks that
    may not be resolved yet."""

    period_ns: int
    timed_ns: int  # the union of the spans given by times (LOOP-1)
    pending: list[PendingWait]
    forward: PendingWait | None  # a closed forward window, or None
    forward_delayed_ns: int  # the run-queue delay inside it

    def settle(self) -> tuple[int, int, int | None] | None:
        """(period, wait, forward time or None) in ns, or None while a mark is unresolved."""
        starts = [*self.pending, *([self.forward] if self.forward is not None else [])]
        if not starts:
            return self.period_ns, self.timed_ns, None
        origin = _origin(starts)
        blocking = _placed_spans([wait for wait in self.pending if wait.blocking], origin)
        others = _placed_spans([wait for wait in self.pending if not wait.blocking], origin)
        if blocking is None or others is None:
            return None
        # LOOP-1: the blocking waits add up; of the asynchronous ones, which may overlap the
        # rank's computation, only the longest counts. Two clocks, two waits: the larger.
        spans = [*blocking, *([max(others, key=lambda span: span[1] - span[0])] if others else [])]
        wait_ns = max(self.timed_ns, union_ns(spans))
        if self.forward is None:
            return self.period_ns, wait_ns, None
        window = self.forward.placed_ns(origin)
        if window is None:
            return None
        low_ns, high_ns = window
        # LOOP-7: the forward less the waits inside it and the time off a CPU.
        inside_ns = union_ns(_clipped(spans, low_ns, high_ns))
        return self.period_ns, wait_ns, max(0, high_ns - low_ns - inside_ns - self.forward_delayed_ns)


def untimed() -> None:
    """What :meth:`LoopTimer.collective_started` returns for a collective outside a measured
    body (LOOP-8): nothing to finish."""
    return None


class LoopTimer:
    """This rank's loop times and the group's loop-straggler test (LOOP-1..LOOP-4).

    ``collective`` and ``collective_started`` (and what it returns) may be called from any
    thread (DDP's communication hook, a work's completion callback); the other methods from the
    training loop only. Memory is bounded: one running maximum and at most
    ``PENDING_WAITS_PER_STEP_MAX`` unresolved waits per step, at most ``window_steps_max`` steps
    in the window and as many awaiting their waits.
    """

    def __init__(
        self,
        peers: PeerGroup,
        config: LoopConfig | None = None,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        run_queue_delay_s: Callable[[], float] | None = None,
        timer: Timer | None = None,
    ) -> None:
        self.peers = peers
        self.config = config if config is not None else LoopConfig()
        self._clock_ns = clock_ns
        self.timer = timer if timer is not None else _default_timer(clock_ns)
        self.tracker = StragglerTracker(
            StragglerKind.LOOP, peers.ranks, self.config.straggler, self.config.trail_checks
        )
        self._lock = threading.Lock()
        # LOOP-1: the training thread's run-queue delay (seconds, cumulative).
        self._run_queue_delay = (
            run_queue_delay_s if run_queue_delay_s is not None else RunQueueDelay()
        )
        self._delay_at_start_s = 0.0
        self._body_started_ns: int | None = None
        #: LOOP-8: whether the current loop body is timed -- always ``_body_started_ns is not None``,
        #: kept as a flag the hooks read without the lock (a collective racing the body's start or
        #: end is outside it either way).
        self.measuring = False
        self._spans: list[tuple[int, int]] = []  # the current body's (entry_ns, exit_ns)
        self._collectives = 0
        self._pending: list[PendingWait] = []  # LOOP-5: the current body's waits timed by marks
        # LOOP-7: the current body's forward window (marks) and the run-queue delay at its start.
        self._forward: PendingWait | None = None
        self._forward_delay_s = 0.0
        self._forward_delayed_ns: int | None = None
        self.forward_tracker = StragglerTracker(
            StragglerKind.FORWARD, peers.ranks, self.config.straggler, self.config.trail_checks
        )
        # (period_ns, wait_ns, forward_ns or None) of each step since the last check.
        self._window: deque[tuple[int, int, int | None]] = deque(maxlen=self.config.window_steps_max)
        # LOOP-5: the ended steps whose marks are not all resolved yet.
        self._unresolved: deque[_EndedStep] = deque()
        self.dropped_steps = 0  # ended steps whose waits did not resolve within the bound
        self.disabled_reason: str | None = None
        self.last_step = 0

    def set_check_every_steps(self, steps: int) -> None:
        """BUDGET-11: checks from now on at every step that is a multiple of ``steps`` (every peer
        sets the same at the same step); the window keeps the steps since the last check."""
        self.config = attrs.evolve(self.config, check_every_steps=steps)

    # -- the training loop's side -----------------------------------------------------------

    def measures(self, step: int) -> bool:
        """LOOP-8: whether step ``step``'s body is timed: one of the last ``measured_steps``
        steps up to the check at or after it."""
        every = self.config.check_every_steps
        return self.config.measured_steps >= every or (-step) % every < self.config.measured_steps

    def begin_step(self) -> None:
        """The loop body of the next step starts now."""
        if self.last_step and not self.measures(self.last_step + 1):  # LOOP-8: not timed
            if self.measuring:
                with self._lock:
                    self.measuring = False
                    self._body_started_ns = None
                    self._spans, self._pending, self._forward = [], [], None
            return
        delay_s = self._run_queue_delay()
        with self._lock:
            self.measuring = True
            self._delay_at_start_s = delay_s
            self._body_started_ns = self._clock_ns()
            self._spans = []
            self._collectives = 0
            self._pending = []
            self._forward = None
            self._forward_delayed_ns = None

    def collective_started(self, blocking: bool = False) -> Callable[[], None]:
        """LOOP-5: a collective of the current step was enqueued now; call the returned
        function when it completed (from any thread). ``blocking``: the training thread called
        it without ``async_op`` and waits for it (LOOP-1: such waits add up; of the others only
        the longest counts). Outside a measured loop body it is ignored (it returns
        :func:`untimed`, LOOP-8)."""
        if not self.measuring:
            return untimed
        with self._lock:
            if self._body_started_ns is None or len(self._pending) >= PENDING_WAITS_PER_STEP_MAX:
                return untimed
            wait = PendingWait(self.timer, self.timer.record(), blocking)
            self._pending.append(wait)
            self._collectives += 1
        return wait.finish

    def forward_started(self) -> None:
        """LOOP-7: the first hidden layer's forward starts (its pre-hook); only the first call
        of a body counts."""
        if not self.measuring:  # LOOP-8
            return
        delay_s = self._run_queue_delay()
        with self._lock:
            if self._body_started_ns is None or self._forward is not None:
                return
            self._forward = PendingWait(self.timer, self.timer.record())
            self._forward_delay_s = delay_s

    def forward_ended(self) -> None:
        """LOOP-7: the last hidden layer's forward returned (its forward hook); only the first
        return after :meth:`forward_started` closes the window (a recomputation in the backward
        is not a second forward)."""
        if not self.measuring:  # LOOP-8
            return
        delay_s = self._run_queue_delay()
        with self._lock:
            forward = self._forward
            if self._body_started_ns is None or forward is None or forward.end is not None:
                return
            forward.finish()
            # LOOP-7: a thread kept off a CPU delays the host's clock, not a device's events.
            host = isinstance(self.timer, WallTimer)
            self._forward_delayed_ns = max(0, round((delay_s - self._forward_delay_s) * 1e9)) if host else 0

    def collective(self, entry_ns: int, exit_ns: int) -> None:
        """One collective of the current step on this rank: when it was entered and when it
        returned (or its asynchronous work completed), on the monotonic clock in ns. Outside
        a loop body (between ``end_step`` and the next ``begin_step``) it is ignored."""
        wait_ns = exit_ns - entry_ns
        if wait_ns < 0:
            raise ValueError(
                f"a collective cannot return before it is entered: entry {entry_ns} ns, exit "
                f"{exit_ns} ns (pass monotonic-clock times, entry first)"
            )
        with self._lock:
            if self._body_started_ns is None:
                return
            if len(self._spans) < PENDING_WAITS_PER_STEP_MAX:
                self._spans.append((entry_ns, exit_ns))
            self._collectives += 1

    def end_step(self, step: int) -> LoopCheck | None:
        """The loop body of ``step`` ended now. At a check step (``step`` a multiple of
        ``check_every_steps``) this is collective over the peer group -- every peer must call
        it at the same step -- and returns the check; otherwise None."""
        if step <= self.last_step:
            raise ValueError(
                f"steps must increase: step {step} after step {self.last_step}; call end_step "
                "once per training step"
            )
        self.last_step = step
        try:
            self._close_body(step)
        except Exception as error:  # spec/guard.md GUARD-3: the check's exchange below is still entered
            guard.failed(Part.LOOP, error, "job.step")
            self._window.clear()
        check = None
        if step % self.config.check_every_steps == 0:
            check = self._check(step)
        self.begin_step()  # the next body starts after the check, unless begin_step says so
        return check

    def _close_body(self, step: int) -> None:
        """The loop body of ``step`` ended now: its period and waits join the window."""
        if not self.measuring:  # LOOP-8: a body not timed has nothing to close
            self._settle()
            return
        now_ns = self._clock_ns()
        delay_s = self._run_queue_delay()
        with self._lock:
            started, spans, pending = self._body_started_ns, self._spans, self._pending
            delayed_ns = round((delay_s - self._delay_at_start_s) * 1e9)
            forward, forward_delayed_ns = self._forward, self._forward_delayed_ns
            self.measuring = False
            self._body_started_ns = None
            self._spans = []
            self._pending = []
            self._forward = None
        if started is not None and step > self.config.warmup_steps:
            period_ns = max(0, now_ns - started - delayed_ns)
            closed = forward if forward is not None and forward_delayed_ns is not None else None
            self._unresolved.append(_EndedStep(period_ns, union_ns(spans), pending, closed, forward_delayed_ns or 0))
            if len(self._unresolved) > self.config.window_steps_max:
                self._unresolved.popleft()
                self.dropped_steps += 1
        self._settle()

    # -- the check ----------------------------------------------------------------------------

    def _settle(self) -> None:
        """LOOP-5: steps whose waits all resolved join the window, oldest first; a step waiting
        for a mark keeps the later ones waiting (the window stays in step order)."""
        while self._unresolved:
            ended = self._unresolved[0]
            settled = ended.settle()
            if settled is None:
                return
            self._unresolved.popleft()
            self._window.append(settled)

    def _row(self, step: int) -> list[int]:
        window = list(self._window)
        self._window.clear()
        if not window:
            return [step, 0, 0, 0, 0, 0, 0]
        loops = [max(0, period - wait) for period, wait, _ in window]
        forwards = [forward for _, _, forward in window if forward is not None]
        return [
            step,
            len(window),
            round(statistics.median(loops) / 1e3),
            round(statistics.median(period for period, _, _ in window) / 1e3),
            round(statistics.median(wait for _, wait, _ in window) / 1e3),
            len(forwards),
            round(statistics.median(forwards) / 1e3) if forwards else 0,
        ]

    def _check(self, step: int) -> LoopCheck:
        size = self.peers.size
        try:
            row = self._row(step)
        except Exception as error:  # GUARD-3: an empty window, and the exchange is still entered
            guard.failed(Part.LOOP, error, "job.step")
            self._window.clear()
            row = [step, 0, 0, 0, 0, 0, 0]
        nobody: tuple[float | None, ...] = (None,) * size
        if self.disabled_reason is not None:
            return self._undecided(step, nobody, nobody, None, f"disabled: {self.disabled_reason}")
        if size == 1:
            return self._undecided(step, nobody, nobody, None, "singleton")
        try:
            rows = self.peers.all_gather_int64(row)
        except TransportError as exc:  # a deadline, or a group the binding marked unusable
            kind = "deadline" if isinstance(exc, DeadlineExceeded) else "transport failure"
            self.disabled_reason = f"{kind} in the loop exchange at step {step}: {exc}"
            logger.warning("scout: loop-straggler checks disabled: %s", self.disabled_reason)
            return self._undecided(step, nobody, nobody, None, self.disabled_reason)
        loop_ms = tuple(r[2] / 1e3 if r[1] > 0 else None for r in rows)
        period_ms = tuple(r[3] / 1e3 if r[1] > 0 else None for r in rows)
        if any(r[0] != step for r in rows):
            # Every peer calls end_step at the same step; a peer elsewhere says nothing here.
            steps = [r[0] for r in rows]
            return self._undecided(step, loop_ms, period_ms, None, f"steps differ: {steps}")
        verdict, evidence, events, reason = self._compare(self.tracker, step, loop_ms)
        forward_ms = tuple(r[6] / 1e3 if r[5] > 0 else None for r in rows)
        forward, forward_events = self._forward_check(step, forward_ms)
        return LoopCheck(
            step,
            loop_ms,
            period_ms,
            verdict,
            evidence,
            (*events, *forward_events),
            self.tracker.confirmed,
            self.tracker.performance_ratios(),
            reason,
            forward,
        )

    def _compare(
        self, tracker: StragglerTracker, step: int, times_ms: tuple[float | None, ...]
    ) -> tuple[Verdict, tuple[float | None, ...], tuple[StragglerEvent, ...], str | None]:
        """LOOP-3 (and LOOP-7 for forward times): one comparison and its sequential test."""
        values = [MISSING if v is None else v for v in times_ms]
        verdict = classify_timing(values, self.config.timing)
        evidence = check_evidence(
            {"loop": values}, {"loop": verdict}, self.config.timing.absolute_floor_ms, self.peers.size
        )
        events = tracker.observe(step, evidence)
        reason = None
        if verdict.status is Status.INCONCLUSIVE and verdict.reason is not None:
            reason = verdict.reason.value
        return verdict, evidence, events, reason

    def _forward_check(
        self, step: int, forward_ms: tuple[float | None, ...]
    ) -> tuple[ForwardCheck, tuple[StragglerEvent, ...]]:
        """LOOP-7: forward times are compared when some peer has one (a job whose hidden layers
        are not timed says nothing about them)."""
        tracker = self.forward_tracker
        if all(v is None for v in forward_ms):
            tracker.observe(step, (None,) * self.peers.size)
            return ForwardCheck(forward_ms, None, (None,) * self.peers.size, tracker.confirmed,
                                tracker.performance_ratios(), "no forward times"), ()
        verdict, evidence, events, reason = self._compare(tracker, step, forward_ms)
        return ForwardCheck(forward_ms, verdict, evidence, tracker.confirmed, tracker.performance_ratios(),
                            reason), events

    def _undecided(
        self,
        step: int,
        loop_ms: tuple[float | None, ...],
        period_ms: tuple[float | None, ...],
        verdict: Verdict | None,
        reason: str,
    ) -> LoopCheck:
        evidence: tuple[float | None, ...] = (None,) * self.peers.size
        events = self.tracker.observe(step, evidence)  # STRAG-10: changes nothing
        self.forward_tracker.observe(step, evidence)
        return LoopCheck(
            step,
            loop_ms,
            period_ms,
            verdict,
            evidence,
            events,
            self.tracker.confirmed,
            self.tracker.performance_ratios(),
            reason,
        )
