"""A communicator and ``Work`` handle with NCCL's contract, in-process (spec/transport.md WAIT-*).

* A collective returns a :class:`FakeNcclWork` at once (enqueue); it completes when the test
  says so (:meth:`FakeNcclWork.finish`, or after ``completes_after_s``), or never.
* ``is_completed()`` never blocks.
* ``wait(timeout)`` with a timeout waits up to it; if the work has not completed by then the
  **communicator is aborted** and the call raises, as NCCL's does; every later collective on an
  aborted communicator, and every wait on its works, raises.
* ``wait()`` without a timeout on a work that has not completed would block the host on NCCL's
  blocking-wait path; here it raises :class:`BlockedOnIncompleteWork` so that a test can never
  hang on it and code that does it is caught.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any


class CommunicatorAborted(RuntimeError):
    pass


class BlockedOnIncompleteWork(AssertionError):
    pass


class FakeCommunicator:
    def __init__(self) -> None:
        self.aborted = False
        self.works: list[FakeNcclWork] = []

    def collective(
        self, completes_after_s: float | None = 0.0, *, error: Exception | None = None
    ) -> FakeNcclWork:
        if self.aborted:
            raise CommunicatorAborted("NCCL communicator was aborted; every collective fails")
        work = FakeNcclWork(self, completes_after_s, error)
        self.works.append(work)
        return work


class FakeNcclWork:
    def __init__(self, comm: FakeCommunicator, completes_after_s: float | None, error: Exception | None) -> None:
        self.comm = comm
        self.completes_at_s = None if completes_after_s is None else time.monotonic() + completes_after_s
        self.error = error
        self.polls = 0
        self.waits: list[Any] = []  # the timeout of every wait() call (None: none given)

    def finish(self) -> None:
        self.completes_at_s = time.monotonic()

    def _done(self) -> bool:
        return self.completes_at_s is not None and time.monotonic() >= self.completes_at_s

    def is_completed(self) -> bool:
        self.polls += 1
        return self.comm.aborted or self._done()

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.waits.append(timeout)
        if self.comm.aborted:
            raise CommunicatorAborted("NCCL communicator was aborted")
        if timeout is not None:
            until_s = time.monotonic() + timeout.total_seconds()
            while not self._done() and time.monotonic() < until_s:
                time.sleep(0.001)
            if not self._done():
                self.comm.aborted = True  # NCCL: a timed-out wait aborts the communicator
                raise CommunicatorAborted(
                    f"Watchdog caught collective operation timeout: wait timed out after {timeout}"
                )
        elif not self._done():
            raise BlockedOnIncompleteWork("wait() without a timeout on a work that has not completed")
        if self.error is not None:
            raise self.error
        return True
