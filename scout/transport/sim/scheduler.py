"""The seeded event scheduler: a heap of events ordered by (virtual time, sequence number).

Two events at the same virtual time run in the order they were scheduled (the sequence number
breaks the tie), so the order never depends on hashing, memory addresses or the host. All
randomness of a run comes from ``Scheduler.rng``, one ``random.Random(seed)``.

Every run is bounded (TIGER_STYLE: put a limit on everything): by a number of events and by a
virtual time. Hitting a bound raises :class:`SimulationLimitExceeded` naming the seed.

Events are plain tuples ``(time_s, seq, kind, a, b)``; ``kind`` indexes the table of handlers
that the simulator's parts fill with :meth:`Scheduler.register` (each part registers the events
it handles). Keeping them tuples (not objects) is what keeps the per-event cost low.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from scout.core.guards import whole_number
from scout.transport.sim.clock import VirtualClock
from scout.transport.sim.errors import SimulationLimitExceeded, reproduce_line

__all__ = ["DEFAULT_MAX_EVENTS", "DEFAULT_MAX_VIRTUAL_TIME_S", "STALE", "Handler", "Scheduler"]

DEFAULT_MAX_EVENTS = 100_000_000
DEFAULT_MAX_VIRTUAL_TIME_S = 7 * 24 * 3600.0

Handler = Callable[[Any, Any], object]

# What a handler returns for an event that turned out to be a no-op (a timer whose wait already
# ended): such events are not removed from the heap -- too costly -- but must not count as the
# time the run was last active.
STALE: Any = object()


class Scheduler:
    """Owns the clock, the event heap, the random generator and the run bounds."""

    __slots__ = (
        "_heap",
        "_seq",
        "clock",
        "handlers",
        "active_s",
        "events",
        "max_events",
        "max_virtual_time_s",
        "reproduce",
        "rng",
        "seed",
    )

    def __init__(
        self,
        seed: int,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_virtual_time_s: float = DEFAULT_MAX_VIRTUAL_TIME_S,
    ) -> None:
        if not whole_number(seed):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        if not (max_virtual_time_s > 0 and math.isfinite(max_virtual_time_s)):
            raise ValueError(f"max_virtual_time_s must be finite and > 0, got {max_virtual_time_s}")
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = VirtualClock()
        self.max_events = max_events
        self.max_virtual_time_s = float(max_virtual_time_s)
        self.events = 0  # events handled so far, over all calls to run()
        self.active_s = 0.0  # virtual time of the last event that was not STALE
        self.reproduce = reproduce_line(seed)
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self.handlers: list[Handler] = []  # by event kind

    def register(self, handler: Handler) -> int:
        """Add ``handler`` to the table; returns its event kind, for :meth:`at`.

        Kinds only select a handler: the order of events is by ``(time_s, seq)``, so the order in
        which the parts register does not change a run.
        """
        if not callable(handler):
            raise TypeError(f"an event handler must be callable, got {handler!r}")
        self.handlers.append(handler)
        return len(self.handlers) - 1

    @property
    def now_s(self) -> float:
        return self.clock.now_s

    @property
    def pending(self) -> int:
        return len(self._heap)

    def at(self, time_s: float, kind: int, a: Any = None, b: Any = None) -> None:
        """Schedule event ``kind`` with arguments ``(a, b)`` at virtual ``time_s``."""
        if not time_s >= self.clock.now_s:  # also rejects NaN
            raise AssertionError(
                f"event kind {kind} scheduled in the past: time_s={time_s!r} < now_s="
                f"{self.clock.now_s!r}"
            )
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, a, b))

    def fan_out(self, kind: int, deliveries: list[tuple[float, Any]], b: Any) -> None:
        """Schedule event ``kind`` with ``(a, b)`` at ``time_s`` for each ``(time_s, a)``: one
        call for the n messages of an exchange, which is the simulator's hottest path."""
        now_s = self.clock.now_s
        heap = self._heap
        push = heapq.heappush
        seq = self._seq
        for time_s, a in deliveries:
            if not time_s >= now_s:
                raise AssertionError(f"event kind {kind} scheduled in the past: {time_s!r}")
            seq += 1
            push(heap, (time_s, seq, kind, a, b))
        self._seq = seq

    def run(self, until_s: float | None = None) -> None:
        """Handle events in order until none is left or the next one is after ``until_s``."""
        handlers = self.handlers
        heap = self._heap
        pop = heapq.heappop
        clock = self.clock
        stop_s = math.inf if until_s is None else until_s
        max_time_s = self.max_virtual_time_s
        budget = self.max_events - self.events
        handled = 0
        try:
            while heap:
                time_s = heap[0][0]
                if time_s > stop_s:
                    break
                if time_s > max_time_s:
                    raise SimulationLimitExceeded(
                        f"simulation passed max_virtual_time_s={max_time_s} (next event at "
                        f"{time_s:.6f} s, {len(heap)} events pending): a program probably never "
                        "finishes; raise the bound or pass until_s",
                        self.reproduce,
                    )
                if handled >= budget:
                    raise SimulationLimitExceeded(
                        f"simulation handled max_events={self.max_events} events by virtual time "
                        f"{clock.now_s:.6f} s with {len(heap)} still pending",
                        self.reproduce,
                    )
                _, _, kind, a, b = pop(heap)
                clock.now_s = time_s  # heap order guarantees time never moves backwards
                handled += 1
                if handlers[kind](a, b) is not STALE:
                    self.active_s = time_s
            if until_s is not None and until_s > clock.now_s:
                clock.now_s = until_s
        finally:
            self.events += handled
