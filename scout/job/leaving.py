"""A trainer's way out (spec/observer.md PROGRESS-11, PROGRESS-12).

A job that leaves by an exception must say so before anything else: the trainers of a job that
raised (``FaultDetected``, an error from ``restore()``, the user's own exception, Ctrl-C's
``KeyboardInterrupt``) take seconds to exit -- process groups torn down, the launcher noticing
-- and their observers must not read that as a stall of every rank. ``Job.step``,
``Job.restore`` and ``Job.__exit__`` mark their own way out; this module covers the rest:

- a chained ``sys.excepthook`` marks every live job of the process when an exception from the
  user's code reaches the top, before the previous hook prints it;
- an ``atexit`` handler removes every live job's progress record at interpreter exit, whatever
  the way out (the record would otherwise stay in ``/dev/shm``).

A job is watched from ``attach`` until ``job.close()``. Installed once per process; both hooks
never raise (the user's traceback and exit code are what they were).
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Protocol

__all__ = ["Leaver", "on_error", "unwatch", "watch"]


class Leaver(Protocol):
    """What the hooks ask of a job (``scout.job.attach.Job``)."""

    def leave(self, error: BaseException) -> None:
        """Mark the way out by ``error`` (idempotent, never raises)."""

    def remove_record(self) -> None:
        """Remove this rank's progress record (idempotent, never raises)."""


_watched: list[Leaver] = []
_lock = threading.Lock()
_installed = False


def watch(job: Leaver) -> None:
    """Cover ``job`` by the hooks until :func:`unwatch`."""
    global _installed
    with _lock:
        if not _installed:
            previous = sys.excepthook

            def excepthook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
                _leave_all(error)
                previous(kind, error, trace)

            sys.excepthook = excepthook
            atexit.register(_remove_all)
            _installed = True
        if job not in _watched:
            _watched.append(job)


@contextlib.contextmanager
def on_error(job: Leaver) -> Iterator[None]:
    """PROGRESS-11 around ``Job.restore`` and ``Job.step``: an exception that leaves the block
    marks the way out (``job.leave``) before anything else, then propagates unchanged."""
    try:
        yield
    except BaseException as error:
        job.leave(error)
        raise


def unwatch(job: Leaver) -> None:
    with _lock:
        if job in _watched:
            _watched.remove(job)


def _jobs() -> list[Leaver]:
    with _lock:
        return list(_watched)


def _leave_all(error: BaseException) -> None:
    for job in _jobs():
        with contextlib.suppress(Exception):
            job.leave(error)


def _remove_all() -> None:
    for job in _jobs():
        with contextlib.suppress(Exception):
            job.remove_record()
