"""One timer for every duration scout measures on a device (spec/replay.md TIMING-1..TIMING-6).

A :class:`Timer` records *marks* in the order of the work it times and says how long passed
between two of them, without ever waiting for the device:

* on a CUDA device (:class:`CudaEventTimer`) a mark is a ``torch.cuda.Event(enable_timing=True)``
  recorded on the current stream, so it completes when the work queued before it on that stream
  has run; ``elapsed_s`` asks ``event.query()`` first and is None while the end mark has not
  completed -- it never calls ``synchronize`` (TIMING-2), so the queue is never drained and host
  launch contention does not pass for a slow device;
* on a CPU (:class:`WallTimer`) a mark is a read of the monotonic wall clock
  (``time.monotonic_ns``): wall time, never the thread's CPU time, because a straggler is the
  wall time the job loses (docs/design.md section 7.2, TIMING-3);
* in tests (:class:`FakeTimer`) a mark is a point on a :class:`FakeClock` that completes when
  the test says so, or never (TIMING-5).

:func:`timer_for` picks one for a device (TIMING-4). :func:`wait_elapsed_s` is the one bounded
wait for a duration that a caller needs now: it polls ``elapsed_s`` with the transports' bounded
backoff (:func:`scout.transport._binding.wait_until`) until a deadline, and still never drains
the device (TIMING-6).

Every mark also carries ``recorded_ns``, the host's monotonic clock when it was recorded: when
a collective was enqueued, for example, while its event says when the device got past it.

torch is imported only when a CUDA timer is made: this module adds nothing to a CPU import.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import attrs

from scout.core.guards import whole_number
from scout.transport._binding import PollSettings, wait_until

if TYPE_CHECKING:
    import torch

__all__ = [
    "CudaEventTimer",
    "EventMark",
    "FakeClock",
    "FakeMark",
    "FakeTimer",
    "Mark",
    "Timer",
    "WallMark",
    "WallTimer",
    "timer_for",
    "wait_elapsed_s",
]

# Every mark of this process gets the next number, so that "end recorded before start" is an
# error naming both marks instead of a negative duration (TIMING-1).
_sequence = itertools.count()


@attrs.frozen(eq=False)
class WallMark:
    """A read of the host's monotonic wall clock (``time.monotonic_ns``)."""

    recorded_ns: int
    sequence: int


@attrs.frozen(eq=False)
class EventMark:
    """A CUDA event recorded on ``stream`` of CUDA device ``device_index``."""

    event: Any  # torch.cuda.Event (enable_timing=True)
    device_index: int
    stream: Any  # the torch.cuda.Stream it was recorded on
    recorded_ns: int
    sequence: int


@attrs.define(eq=False)
class FakeMark:
    """A point on a :class:`FakeClock`: complete once the clock reaches ``completes_at_ns``;
    None means withheld (the device never gets there until :meth:`FakeTimer.complete`)."""

    recorded_ns: int
    completes_at_ns: int | None
    sequence: int


Mark: TypeAlias = WallMark | EventMark | FakeMark


class Timer(Protocol):
    """Marks in the order of the work timed, and the time between two of them (TIMING-1)."""

    @property
    def name(self) -> str:
        """What the marks are: ``wall``, ``cuda-event``, ``fake``."""
        ...

    def record(self) -> Mark:
        """A mark after the work issued so far (on a CUDA device: on the current stream)."""
        ...

    def completed(self, mark: Mark) -> bool:
        """Whether the device has got past ``mark``; never blocks."""
        ...

    def elapsed_s(self, start: Mark, end: Mark) -> float | None:
        """Seconds from ``start`` to ``end``; None while either has not completed. Never
        blocks and never drains the device (TIMING-2)."""
        ...


def _check_mark(timer: str, mark: Any, kind: type, role: str) -> None:
    if not isinstance(mark, kind):
        raise TypeError(
            f"{timer}: the {role} mark must be a {kind.__name__} recorded by this kind of timer, "
            f"got {type(mark).__name__}"
        )


def _check_order(timer: str, start: Mark, end: Mark) -> None:
    if end.sequence < start.sequence:
        raise ValueError(
            f"{timer}: the end mark (#{end.sequence}) was recorded before the start mark "
            f"(#{start.sequence}); pass them in the order they were recorded"
        )


class WallTimer:
    """Marks are reads of the monotonic wall clock; every mark is complete when recorded
    (TIMING-3). ``clock_ns`` is for tests; it must be monotonic."""

    name = "wall"

    def __init__(self, clock_ns: Any = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns

    def record(self) -> WallMark:
        return WallMark(recorded_ns=self._clock_ns(), sequence=next(_sequence))

    def completed(self, mark: Mark) -> bool:
        _check_mark("WallTimer.completed", mark, WallMark, "given")
        return True

    def elapsed_s(self, start: Mark, end: Mark) -> float:
        _check_mark("WallTimer.elapsed_s", start, WallMark, "start")
        _check_mark("WallTimer.elapsed_s", end, WallMark, "end")
        _check_order("WallTimer.elapsed_s", start, end)
        return (end.recorded_ns - start.recorded_ns) / 1e9


class CudaEventTimer:
    """Marks are CUDA events recorded on the current stream of ``device`` (TIMING-2).

    ``cuda`` is the ``torch.cuda`` module; tests pass a fake with the same contract
    (``Event(enable_timing=True)``, ``current_stream(device)``; an event's ``record(stream)``,
    ``query()``, ``elapsed_time(end)`` in ms, which fails on an event not yet complete).
    """

    name = "cuda-event"

    def __init__(self, device: torch.device | int | str | None = None, *, cuda: Any = None) -> None:
        if cuda is None:
            import torch

            cuda = torch.cuda
        self._cuda = cuda
        self._device = device
        self._device_index = _cuda_index(device, cuda)

    @property
    def device_index(self) -> int:
        return self._device_index

    def record(self) -> EventMark:
        stream = self._cuda.current_stream(self._device_index)
        event = self._cuda.Event(enable_timing=True)
        recorded_ns = time.monotonic_ns()
        event.record(stream)
        return EventMark(
            event=event,
            device_index=self._device_index,
            stream=stream,
            recorded_ns=recorded_ns,
            sequence=next(_sequence),
        )

    def completed(self, mark: Mark) -> bool:
        self._check(mark, "given", "completed")
        assert isinstance(mark, EventMark)
        return bool(mark.event.query())

    def elapsed_s(self, start: Mark, end: Mark) -> float | None:
        self._check(start, "start", "elapsed_s")
        self._check(end, "end", "elapsed_s")
        assert isinstance(start, EventMark) and isinstance(end, EventMark)
        _check_order("CudaEventTimer.elapsed_s", start, end)
        # query() before elapsed_time(): elapsed_time on an event still pending is an error,
        # and nothing here may wait for the device (TIMING-2). The end is queried first: on one
        # stream it completes last, so a pending end costs one query.
        if not end.event.query() or not start.event.query():
            return None
        elapsed_ms = float(start.event.elapsed_time(end.event))
        return elapsed_ms / 1e3

    def _check(self, mark: Mark, role: str, method: str) -> None:
        _check_mark(f"CudaEventTimer.{method}", mark, EventMark, role)
        assert isinstance(mark, EventMark)
        if mark.device_index != self._device_index:
            raise ValueError(
                f"CudaEventTimer.{method}: the {role} mark was recorded on cuda:"
                f"{mark.device_index}, this timer times cuda:{self._device_index}"
            )


def _cuda_index(device: Any, cuda: Any) -> int:
    if device is None:
        return int(cuda.current_device())
    if whole_number(device):
        index = device
    else:
        text = str(device)
        kind, _, number = text.partition(":")
        if kind != "cuda":
            raise ValueError(f"CudaEventTimer needs a CUDA device, got {device!r}")
        index = int(number) if number else int(cuda.current_device())
    if index < 0:
        raise ValueError(f"CudaEventTimer: a CUDA device index is >= 0, got {device!r}")
    return index


def timer_for(device: Any, *, cuda: Any = None) -> Timer:
    """TIMING-4: the timer of ``device`` (a ``torch.device``, its string, or None for the CPU):
    CUDA events on a CUDA device, the wall clock on a CPU. Any other device type is an error
    naming it (its events and their contract would need their own timer). ``cuda``: as for
    :class:`CudaEventTimer`."""
    kind = "cpu" if device is None else str(getattr(device, "type", device)).partition(":")[0]
    if kind == "cuda":
        return CudaEventTimer(device, cuda=cuda)
    if kind == "cpu":
        return WallTimer()
    raise ValueError(
        f"timer_for: no timer for device {device!r} (type {kind!r}); scout times 'cuda' devices "
        "by events and 'cpu' by the wall clock"
    )


class FakeClock:
    """A clock for tests that moves only when told (TIMING-5)."""

    def __init__(self, now_ns: int = 0) -> None:
        self.now_ns = now_ns

    def advance_s(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"FakeClock.advance_s: seconds must be finite and >= 0, got {seconds!r}")
        self.now_ns += round(seconds * 1e9)

    def monotonic_s(self) -> float:
        return self.now_ns / 1e9


class FakeTimer:
    """A device in a test (TIMING-5): a mark recorded at clock time t completes at
    ``t + lag_s`` (the device is ``lag_s`` behind the host); :meth:`withhold` records one that
    never completes until :meth:`complete` -- a kernel that never ends. ``elapsed_s`` is the
    difference of the completion times, so the arithmetic is exact in nanoseconds."""

    name = "fake"

    def __init__(self, clock: FakeClock | None = None, *, lag_s: float = 0.0) -> None:
        if not (math.isfinite(lag_s) and lag_s >= 0):
            raise ValueError(f"FakeTimer: lag_s must be finite and >= 0, got {lag_s!r}")
        self.clock = clock if clock is not None else FakeClock()
        self.lag_ns = round(lag_s * 1e9)
        self.queries = 0  # completed/elapsed_s calls, so a test can see a wait that polls

    def record(self) -> FakeMark:
        now_ns = self.clock.now_ns
        return FakeMark(recorded_ns=now_ns, completes_at_ns=now_ns + self.lag_ns, sequence=next(_sequence))

    def withhold(self) -> FakeMark:
        """A mark the device never gets past (until :meth:`complete`)."""
        return FakeMark(recorded_ns=self.clock.now_ns, completes_at_ns=None, sequence=next(_sequence))

    def complete(self, mark: FakeMark) -> None:
        """The device gets past a withheld ``mark`` now."""
        _check_mark("FakeTimer.complete", mark, FakeMark, "given")
        if mark.completes_at_ns is not None:
            raise ValueError(
                f"FakeTimer.complete: mark #{mark.sequence} was not withheld (it completes at "
                f"{mark.completes_at_ns} ns)"
            )
        mark.completes_at_ns = self.clock.now_ns

    def completed(self, mark: Mark) -> bool:
        _check_mark("FakeTimer.completed", mark, FakeMark, "given")
        assert isinstance(mark, FakeMark)
        self.queries += 1
        return mark.completes_at_ns is not None and mark.completes_at_ns <= self.clock.now_ns

    def elapsed_s(self, start: Mark, end: Mark) -> float | None:
        _check_mark("FakeTimer.elapsed_s", start, FakeMark, "start")
        _check_mark("FakeTimer.elapsed_s", end, FakeMark, "end")
        assert isinstance(start, FakeMark) and isinstance(end, FakeMark)
        _check_order("FakeTimer.elapsed_s", start, end)
        if not (self.completed(end) and self.completed(start)):
            return None
        assert start.completes_at_ns is not None and end.completes_at_ns is not None
        return (end.completes_at_ns - start.completes_at_ns) / 1e9


#: How wait_elapsed_s polls: yield briefly, then sleep with doubling backoff up to 1 ms -- a
#: replay's end event completes within milliseconds of its last kernel.
DEFAULT_ELAPSED_POLL = PollSettings(busy_poll_s=0.0005, poll_interval_s=0.001, min_sleep_s=0.00005)


def wait_elapsed_s(
    timer: Timer,
    start: Mark,
    end: Mark,
    *,
    timeout_s: float,
    poll: PollSettings = DEFAULT_ELAPSED_POLL,
) -> float | None:
    """TIMING-6: ``timer.elapsed_s(start, end)`` once both marks have completed, polled with
    bounded backoff for at most ``timeout_s`` (monotonic clock); None at the deadline. It waits
    for these two marks only -- never for the device or another stream."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"wait_elapsed_s: timeout_s must be a number, got {type(timeout_s).__name__}")
    if not (math.isfinite(timeout_s) and timeout_s >= 0):
        raise ValueError(f"wait_elapsed_s: timeout_s must be finite and >= 0, got {timeout_s!r}")
    found: list[float] = []

    def resolved() -> bool:
        elapsed = timer.elapsed_s(start, end)
        if elapsed is None:
            return False
        found.append(elapsed)
        return True

    if wait_until(resolved, time.monotonic() + timeout_s, poll):
        return found[0]
    return None
