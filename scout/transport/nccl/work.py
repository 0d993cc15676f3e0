"""Waiting for a backend work handle without ever aborting its communicator (spec/transport.md
WAIT-1..WAIT-4).

On NCCL a ``Work.wait(timeout)`` whose timeout expires aborts the communicator (and the
watchdog may then end the process): every later collective on it fails. A deadline of scout's
must not do that -- a peer that is merely late would break replay for the rest of the run. So
scout never passes a timeout to ``wait``: :func:`wait_work` polls ``work.is_completed()`` (a
query of the work's end event on NCCL, a flag on gloo; neither blocks) with the transports'
bounded backoff, and calls ``work.wait()`` only once the work has completed, to surface a
backend error and, on NCCL, order the current stream after it. At the deadline it returns
:data:`TIMED_OUT` and leaves the work in flight: the communicator stays usable, and a late peer
still completes the collective.

Before it polls, the wait sleeps on the work's future (WAIT-7): on gloo that future completes
with the collective, so a rank waiting for late peers takes no CPU from them -- on a host with
more ranks than cores, the 2 ms of yielding was CPU the late ranks needed.

Every process group that scout waits on this way must have a backend timeout (the
``timeout=`` of ``init_process_group``/``new_group``, which NCCL's watchdog enforces) well above
scout's deadlines, or the watchdog aborts first (WAIT-4).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Final

from scout.transport._binding import PollSettings, wait_until

logger = logging.getLogger(__name__)

__all__ = ["FUTURE_SLICE_S", "TIMED_OUT", "WORK_POLL", "TimedOut", "completed_now", "wait_work"]


class TimedOut:
    """Marker: the work had not completed by the deadline; it is still in flight."""

    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT: Final = TimedOut()

#: How scout polls a work handle unless its caller has settings of its own: yield for 2 ms (a
#: replay collective usually completes within that), then sleep doubling up to 1 ms -- a query
#: costs a microsecond, and a longer sleep would add its length to a collective of milliseconds.
WORK_POLL: Final = PollSettings(busy_poll_s=0.002, poll_interval_s=0.001, min_sleep_s=0.00005)
#: WAIT-7: the longest sleep on a work's future between two queries of the work itself (a
#: backend whose future does not complete with its work then costs at most this, and a wait for
#: a late peer wakes 20 times a second).
FUTURE_SLICE_S: Final = 0.05


def _completion_event(work: Any) -> threading.Event | None:
    """WAIT-7: an event set when ``work``'s future completes (on gloo: when the collective
    does), or None for a work without a future or whose backend refuses one."""
    get_future = getattr(work, "get_future", None)
    if get_future is None:
        return None
    event = threading.Event()
    try:
        get_future().add_done_callback(lambda _future: event.set())
    except Exception:  # noqa: BLE001 - a backend without futures for this work: WAIT-1's poll alone
        logger.debug("scout: a work without a usable future; its wait polls", exc_info=True)
        return None
    return event


def wait_work(work: Any, deadline_s: float, poll: PollSettings = WORK_POLL) -> TimedOut | Exception | None:
    """WAIT-1: None once ``work`` completed without error; the backend's exception if it
    failed; :data:`TIMED_OUT` if it has not completed by ``deadline_s`` (``time.monotonic``).
    ``work.wait`` is called without a timeout, and only after ``work.is_completed()``; before
    polling, the caller sleeps on the work's future (WAIT-7)."""
    failure: list[Exception] = []

    def done() -> bool:
        try:
            return bool(work.is_completed())
        except Exception as exc:  # a backend may raise its error from the query itself
            failure.append(exc)
            return True

    # WAIT-7: sleep until the future completes. Not for a deadline already past (completed_now,
    # WAIT-3's one look): no callback is left on a work that is only looked at. In slices, with a
    # query between them: a backend whose future lags its work costs a slice, never the deadline.
    event = _completion_event(work) if deadline_s > time.monotonic() else None
    while event is not None:
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0 or event.wait(min(remaining_s, FUTURE_SLICE_S)) or done():
            break
    if not wait_until(done, deadline_s, poll):
        return TIMED_OUT
    if failure:
        return failure[0]
    try:
        completed = work.wait()
    except Exception as exc:  # the backends raise RuntimeError / DistBackendError subclasses
        return exc
    return None if completed is not False else TIMED_OUT


def completed_now(work: Any) -> TimedOut | Exception | None:
    """WAIT-3: :func:`wait_work` with a deadline already past: one look, never a wait."""
    return wait_work(work, float("-inf"))
