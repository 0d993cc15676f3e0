"""The ``on_report`` hook (spec/ops.md OPS-4): a command run for each new report, the record as
JSON on its standard input.

The sidecar owns the runner and calls :meth:`OnReportRunner.poll` from its loop; nothing here
blocks. Commands run one at a time, in the order the reports were written, each in a session of
its own (so a timeout ends the command and whatever it started); standard input is a temporary
file holding the record (writing to a pipe could block on a command that does not read it).
Its output (stdout and stderr) goes to a pipe that a reader thread drains as it comes, keeping
only the last ``OUTPUT_TAIL_BYTES`` (spec/ops.md OPS-4): a command that prints gigabytes costs
the sidecar neither memory nor disk, and the tail is logged when the command fails. Each command
is killed ``timeout_s`` after it started. At most ``queue_max`` reports wait; more are dropped
and counted. Every outcome is counted (the metrics export the counts) and every failure is
logged.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

__all__ = ["OUTCOMES", "OUTPUT_TAIL_BYTES", "QUEUE_MAX", "OnReportRunner", "OutputTail"]

QUEUE_MAX: Final = 256
#: Characters of a failed command's output quoted in the log line.
OUTPUT_TAIL_CHARS: Final = 500
#: OPS-4: bytes of a command's output kept (its last ones); the rest is read and let go. Four
#: UTF-8 bytes per character at most, so the quoted characters are always there.
OUTPUT_TAIL_BYTES: Final = 4 * OUTPUT_TAIL_CHARS
#: The reader takes the pipe this many bytes at a time.
READ_CHUNK_BYTES: Final = 1 << 16
#: After the command's session is killed the reader has this long to reach the end of the pipe
#: (a process outside the session may still hold it open); then it is told to stop.
DRAIN_WAIT_S: Final = 1.0
#: Every outcome a run has; ``scout_on_report_total{outcome}`` counts them.
OUTCOMES: Final = ("succeeded", "failed", "timed_out", "not_started", "dropped")


class OutputTail:
    """Drains one pipe in a thread of its own, keeping its last ``keep_bytes`` (OPS-4): memory is
    bounded whatever the writer prints, and the writer never blocks on a full pipe."""

    def __init__(self, fd: int, keep_bytes: int = OUTPUT_TAIL_BYTES) -> None:
        if keep_bytes < 1:
            raise ValueError(f"keep_bytes must be >= 1, got {keep_bytes}")
        self.fd = fd
        self.keep_bytes = keep_bytes
        self.total_bytes = 0
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="scout-on-report-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([self.fd], [], [], 0.1)
                if not ready:
                    continue
                chunk = os.read(self.fd, READ_CHUNK_BYTES)
                if not chunk:
                    return  # every writer closed it
                with self._lock:
                    self.total_bytes += len(chunk)
                    self._tail += chunk
                    if len(self._tail) > self.keep_bytes:
                        del self._tail[: len(self._tail) - self.keep_bytes]
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def close(self, wait_s: float = DRAIN_WAIT_S) -> bytes:
        """Wait up to ``wait_s`` for the end of the output, stop reading, and return the tail."""
        self._thread.join(wait_s)
        self._stop.set()
        self._thread.join(1.0)
        with self._lock:
            return bytes(self._tail)


class _Running:
    def __init__(self, process: subprocess.Popen[bytes], output: OutputTail, started_s: float, kind: str) -> None:
        self.process = process
        self.output = output
        self.started_s = started_s
        self.kind = kind


class OnReportRunner:
    """Runs ``argv`` once per submitted record, one at a time, each for at most ``timeout_s``."""

    def __init__(self, argv: Sequence[str], *, timeout_s: float, queue_max: int = QUEUE_MAX,
                 log: Callable[[str], None], env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not argv:
            raise ValueError("on_report needs a command, got an empty one")
        if not 0 < timeout_s <= 600:
            raise ValueError(f"on_report timeout_s must be in (0, 600] seconds, got {timeout_s!r}")
        if queue_max < 1:
            raise ValueError(f"queue_max must be >= 1, got {queue_max}")
        self.argv = list(argv)
        self.timeout_s = float(timeout_s)
        self.queue_max = queue_max
        self.log = log
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.counts: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self._running: _Running | None = None

    @property
    def idle(self) -> bool:
        return self._running is None and not self.queue

    def submit(self, record: Mapping[str, Any]) -> bool:
        """Queue one record; False (and counted as dropped) when the queue is full."""
        if len(self.queue) >= self.queue_max:
            self.counts["dropped"] += 1
            if self.counts["dropped"] == 1 or self.counts["dropped"] % 100 == 0:
                self.log(f"on_report: {self.counts['dropped']} report(s) dropped: {self.queue_max} already wait "
                         f"(each command may take up to {self.timeout_s:g} s)")
            return False
        self.queue.append(dict(record))
        return True

    def poll(self) -> None:
        """Finish the running command if it ended or overran, then start the next one."""
        running = self._running
        if running is not None:
            code = running.process.poll()
            if code is None and self.clock() - running.started_s >= self.timeout_s:
                self._finish(running, "timed_out", f"still running after {self.timeout_s:g} s; killed")
            elif code is not None:
                if code == 0:
                    self._finish(running, "succeeded", "")
                else:
                    self._finish(running, "failed", f"exited with code {code}")
        if self._running is None and self.queue:
            self._start(self.queue.popleft())

    def close(self, deadline_s: float) -> None:
        """Run what is queued until ``deadline_s`` (a ``clock`` time), then kill what still runs;
        what is still queued then is dropped (counted)."""
        while not self.idle and self.clock() < deadline_s:
            self.poll()
            time.sleep(0.02)
        if self._running is not None:
            self._finish(self._running, "timed_out", "still running when the sidecar stopped; killed")
        if self.queue:
            self.counts["dropped"] += len(self.queue)
            self.log(f"on_report: {len(self.queue)} report(s) not run: the sidecar stopped")
            self.queue.clear()

    def _start(self, record: dict[str, Any]) -> None:
        kind = str(record.get("kind", "?"))
        try:
            with tempfile.TemporaryFile() as stdin:
                stdin.write((json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
                stdin.seek(0)
                read_end, write_end = os.pipe()
                env = {**self.env, "SCOUT_REPORT_KIND": kind}
                try:
                    process = subprocess.Popen(self.argv, stdin=stdin, stdout=write_end, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True, close_fds=True)
                except OSError:
                    os.close(read_end)
                    raise
                finally:
                    os.close(write_end)  # the command holds it now: the pipe ends when the command's side does
        except OSError as error:
            self.counts["not_started"] += 1
            self.log(f"on_report: could not start {self.argv[0]!r} for a {kind} report: {error}")
            return
        self._running = _Running(process, OutputTail(read_end), self.clock(), kind)

    def _kill(self, running: _Running) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(running.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.process.wait(5.0)

    def _finish(self, running: _Running, outcome: str, why: str) -> None:
        self._kill(running)  # whatever the command left running in its session goes with it
        self._running = None
        self.counts[outcome] += 1
        output = running.output.close(DRAIN_WAIT_S if outcome != "succeeded" else 0.2)
        if outcome != "succeeded":
            tail = output.decode("utf-8", "replace")[-OUTPUT_TAIL_CHARS:].strip()
            self.log(f"on_report: {' '.join(self.argv)[:200]} for a {running.kind} report {why}"
                     + (f"; its output ended: {tail}" if tail else ""))
