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
* ``wait``: the longest time it spent waiting in one of the step's collectives -- from its
  entry to its exit (:meth:`LoopTimer.collective`), or, where a collective returns at enqueue
  (NCCL, the emulated backend), from its enqueue to its completion, timed by marks of the
  device's timer and resolved later (:meth:`LoopTimer.collective_started`, LOOP-5) -- long for
  the ranks that arrived early, short for the one they waited for.

A rank's *loop time* is ``period - wait`` (LOOP-1): its own work in the step, the time its
peers waited for it included. At a check step every peer exchanges the median of its loop
times over the steps since the last check in one fixed-size row over the replay peer group
(deadline-bounded, LOOP-2); ``classify_timing`` decides the comparison, and each peer's log
ratio to the centre feeds a sequential test of its own (``loop-slow``, LOOP-3).

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
from scout.transport.base import DeadlineExceeded, TransportError
from scout.transport.nccl.timing import Mark, Timer, WallTimer, timer_for

__all__ = ["LOOP_ROW_LENGTH", "LoopCheck", "LoopConfig", "LoopTimer", "PendingWait"]

logger = logging.getLogger("scout.replay")

#: LOOP-2: step, steps in the window, median loop, period and wait (microseconds).
LOOP_ROW_LENGTH: Final = 5
#: LOOP-5: waits of one step awaiting their marks, and steps awaiting their waits.
PENDING_WAITS_PER_STEP_MAX: Final = 1024


class PendingWait:
    """LOOP-5: one collective's wait, timed by two marks of the timer: recorded at its enqueue,
    and by :meth:`finish` when it completed (any thread; on NCCL from its work's future
    callback, whose current stream waits for the collective). Resolved later, never waited for."""

    __slots__ = ("_timer", "end", "start")

    def __init__(self, timer: Timer, start: Mark) -> None:
        self._timer = timer
        self.start = start
        self.end: Mark | None = None

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
    window_steps_max: int = 256
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
            ("warmup_steps", 0),
            ("trail_checks", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
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
    peer's performance ratio."""

    step: int
    loop_ms: tuple[float | None, ...]
    period_ms: tuple[float | None, ...]
    verdict: Verdict | None
    evidence: tuple[float | None, ...]
    events: tuple[StragglerEvent, ...]
    confirmed: frozenset[int]
    performance_ratios: tuple[float | None, ...]
    reason: str | None = None  # why the check said nothing (None when it was decided)


def _nothing() -> None:
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
        self._wait_ns = 0  # the longest collective of the current body
        self._collectives = 0
        self._pending: list[PendingWait] = []  # LOOP-5: the current body's waits timed by marks
        # (period_ns, wait_ns) of each step since the last check.
        self._window: deque[tuple[int, int]] = deque(maxlen=self.config.window_steps_max)
        # LOOP-5: (period_ns, longest known wait_ns, waits still unresolved) of ended steps.
        self._unresolved: deque[tuple[int, int, list[PendingWait]]] = deque()
        self.dropped_steps = 0  # ended steps whose waits did not resolve within the bound
        self.disabled_reason: str | None = None
        self.last_step = 0

    # -- the training loop's side -----------------------------------------------------------

    def begin_step(self) -> None:
        """The loop body of the next step starts now."""
        delay_s = self._run_queue_delay()
        with self._lock:
            self._delay_at_start_s = delay_s
            self._body_started_ns = self._clock_ns()
            self._wait_ns = 0
            self._collectives = 0
            self._pending = []

    def collective_started(self) -> Callable[[], None]:
        """LOOP-5: a collective of the current step was enqueued now; call the returned
        function when it completed (from any thread). Outside a loop body it is ignored (the
        returned function does nothing)."""
        with self._lock:
            if self._body_started_ns is None or len(self._pending) >= PENDING_WAITS_PER_STEP_MAX:
                return _nothing
            wait = PendingWait(self.timer, self.timer.record())
            self._pending.append(wait)
            self._collectives += 1
        return wait.finish

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
            self._wait_ns = max(self._wait_ns, wait_ns)
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
        now_ns = self._clock_ns()
        delay_s = self._run_queue_delay()
        with self._lock:
            started, wait_ns, pending = self._body_started_ns, self._wait_ns, self._pending
            delayed_ns = round((delay_s - self._delay_at_start_s) * 1e9)
            self._body_started_ns = None
            self._pending = []
        if started is not None and step > self.config.warmup_steps:
            self._unresolved.append((max(0, now_ns - started - delayed_ns), wait_ns, pending))
            if len(self._unresolved) > self.config.window_steps_max:
                self._unresolved.popleft()
                self.dropped_steps += 1
        self._settle()
        check = None
        if step % self.config.check_every_steps == 0:
            check = self._check(step)
        self.begin_step()  # the next body starts after the check, unless begin_step says so
        return check

    # -- the check ----------------------------------------------------------------------------

    def _settle(self) -> None:
        """LOOP-5: steps whose waits all resolved join the window, oldest first; a step waiting
        for a mark keeps the later ones waiting (the window stays in step order)."""
        while self._unresolved:
            period_ns, wait_ns, pending = self._unresolved[0]
            waits = [w.elapsed_ns() for w in pending]
            if any(w is None for w in waits):
                return
            self._unresolved.popleft()
            self._window.append((period_ns, max([wait_ns, *(w for w in waits if w is not None)])))

    def _row(self, step: int) -> list[int]:
        window = list(self._window)
        self._window.clear()
        if not window:
            return [step, 0, 0, 0, 0]
        loops = [max(0, period - wait) for period, wait in window]
        return [
            step,
            len(window),
            round(statistics.median(loops) / 1e3),
            round(statistics.median(period for period, _ in window) / 1e3),
            round(statistics.median(wait for _, wait in window) / 1e3),
        ]

    def _check(self, step: int) -> LoopCheck:
        size = self.peers.size
        row = self._row(step)
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
        values = [MISSING if v is None else v for v in loop_ms]
        verdict = classify_timing(values, self.config.timing)
        evidence = check_evidence(
            {"loop": values}, {"loop": verdict}, self.config.timing.absolute_floor_ms, size
        )
        events = self.tracker.observe(step, evidence)
        reason = None
        if verdict.status is Status.INCONCLUSIVE and verdict.reason is not None:
            reason = verdict.reason.value
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
