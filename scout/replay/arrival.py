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
* ``wait``: the longest time it spent inside one of the step's collectives (from its entry to
  its exit, given by :meth:`LoopTimer.collective`) -- long for the ranks that arrived early,
  short for the one they waited for.

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
        # every collective of the body, from any thread: loop.collective(entry_ns, exit_ns)
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

__all__ = ["LOOP_ROW_LENGTH", "LoopCheck", "LoopConfig", "LoopTimer"]

logger = logging.getLogger("scout.replay")

#: LOOP-2: step, steps in the window, median loop, period and wait (microseconds).
LOOP_ROW_LENGTH: Final = 5


@attrs.frozen
class LoopConfig:
    """``check_every_steps``: a check at every step that is a multiple of it (the same steps
    on every peer). ``window_steps_max``: steps kept between two checks (the oldest are
    dropped). ``warmup_steps``: the first steps are not used (DDP rebuilds its buckets, lazy
    initialisation). ``timing``: the verdict's thresholds for one comparison of loop times."""

    check_every_steps: int = 50
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


class LoopTimer:
    """This rank's loop times and the group's loop-straggler test (LOOP-1..LOOP-4).

    ``collective`` may be called from any thread (DDP's communication hook); the other
    methods from the training loop only. Memory is bounded: one running maximum per step and
    at most ``window_steps_max`` steps.
    """

    def __init__(
        self,
        peers: PeerGroup,
        config: LoopConfig | None = None,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        run_queue_delay_s: Callable[[], float] | None = None,
    ) -> None:
        self.peers = peers
        self.config = config if config is not None else LoopConfig()
        self._clock_ns = clock_ns
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
        # (period_ns, wait_ns) of each step since the last check.
        self._window: deque[tuple[int, int]] = deque(maxlen=self.config.window_steps_max)
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
            started, wait_ns = self._body_started_ns, self._wait_ns
            delayed_ns = round((delay_s - self._delay_at_start_s) * 1e9)
            self._body_started_ns = None
        if started is not None and step > self.config.warmup_steps:
            self._window.append((max(0, now_ns - started - delayed_ns), wait_ns))
        check = None
        if step % self.config.check_every_steps == 0:
            check = self._check(step)
        self.begin_step()  # the next body starts after the check, unless begin_step says so
        return check

    # -- the check ----------------------------------------------------------------------------

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
