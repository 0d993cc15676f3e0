"""The trainer's side of its observer: start the process, run the rendezvous, hold the handle.

    publisher = ProgressPublisher(RecordIdentity.from_environment(rank))
    handle = start_observer(publisher, group_ranks=tuple(range(world)), secret=secret,
                            rendezvous=StoreRendezvous(store, prefix), report_path="run/reports.jsonl")
    handle.wait_ready()     # before the training loop: the observer has joined and attached
    ...
    handle.check()          # each step: raises ObserverFailed if the observer died (or reports it)
    ...
    publisher.close(); handle.close()

:func:`start_observer` is collective over the group's trainers (the rendezvous). The observer is
a fresh interpreter (``python -m scout.observer.process``): never a fork of the trainer (unsafe
after CUDA initialisation) and never a ``multiprocessing`` spawn, which would re-import the
user's script and torch. Every wait here is bounded; a failure names the rank and what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import scout
from scout import reports
from scout.observer import wire
from scout.observer.progress import ProgressPublisher, process_start_ticks
from scout.observer.rendezvous import Rendezvous, RendezvousFailed, group_id, group_key, peer_record

__all__ = ["ObserverFailed", "ObserverHandle", "start_observer"]

CLOSE_TIMEOUT_S: Final = 5.0
#: DRIVER-6: how often a watching observer reads its trainer's record (at most; the observer
#: process lowers it to the shortest stage threshold). Between reads it wakes for what it must
#: act on -- a stall's threshold (the machine's WakeAt, DRIVER-4), a datagram, its trainer's
#: exit, a stop signal -- so a longer interval delays nothing; each wake-up costs CPU that a busy
#: host takes from its trainers (about 0.5 ms of the observer's on the 2-core development VM).
WATCH_INTERVAL_S: Final = 5.0
#: A bound on the watch interval a caller may ask for.
WATCH_INTERVAL_MAX_S: Final = 60.0
START_TIMEOUT_S: Final = 30.0
ON_HANG: Final = ("report", "restart")


class ObserverFailed(RuntimeError):
    """The rank's observer died or failed; hang detection for this rank is off."""


class ObserverHandle:
    """The trainer's view of its observer process."""

    def __init__(self, *, rank: int, job_id: str, generation: int, process: subprocess.Popen[bytes],
                 publisher: ProgressPublisher, on_report: Callable[[dict[str, Any]], None] | None,
                 on_failure: str, poll_interval_s: float) -> None:
        self.rank = rank
        self.job_id = job_id
        self.generation = generation
        self.process = process
        self.publisher = publisher
        self.on_report = on_report
        self.on_failure = on_failure
        self.poll_interval_s = poll_interval_s
        self.failure_reported = False
        self.closing = False
        self.reports: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._drain, name=f"scout-observer-reports-{rank}", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        for line in stream:  # ends at the observer's exit (end of file)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            record = message.get("report") if isinstance(message, dict) else None
            if not isinstance(record, dict):
                continue
            self.reports = [*self.reports[-63:], record]
            if self.on_report is not None:
                with contextlib.suppress(Exception):  # a failing callback must not kill the drain
                    self.on_report(record)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the observer has joined its group and attached to the record (it then
        holds the record's observer slot). Raises ObserverFailed if it exits or the wait times
        out: start the training loop only once every rank's observer is ready."""
        deadline = time.monotonic() + timeout_s
        while self.publisher.observer_pid() != self.process.pid:
            if self.process.poll() is not None:
                raise ObserverFailed(f"the observer of rank {self.rank} exited with code {self.process.returncode} "
                                     "before it was ready; its stderr line says why")
            if time.monotonic() >= deadline:
                raise ObserverFailed(f"the observer of rank {self.rank} was not ready within {timeout_s} s "
                                     "(attaching to the progress record did not complete)")
            time.sleep(0.01)

    def check(self) -> None:
        """Call once per step. If the observer is gone, raise :class:`ObserverFailed`
        (``on_failure="raise"``) or report ``observer_failure`` once (``"report"``)."""
        if self.closing or self.process.poll() is None:
            return
        reason = f"the observer of rank {self.rank} exited with code {self.process.returncode}"
        if self.on_failure == "raise":
            raise ObserverFailed(f"{reason}; hang detection for this rank is off. Restart the job, or "
                                 "start the observer with on_failure='report' to continue without it")
        if not self.failure_reported:
            self.failure_reported = True
            record = wire.failure_record(rank=self.rank, job_id=self.job_id, generation=self.generation,
                                         reason=reason, exit_code=self.process.returncode)
            print(reports.record_line(record), file=sys.stderr, flush=True)
            if self.on_report is not None:
                with contextlib.suppress(Exception):
                    self.on_report(record)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the observer (it exits by itself once the record is closed; else SIGTERM, a
        bounded wait, then SIGKILL) and the report thread."""
        self.closing = True
        if not self.publisher.closed:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        # The end of the control pipe ends the observer's wait at once (DRIVER-6): with the record
        # closed it is a clean exit, read as such. Closed only after the wait below, the observer
        # slept on to its watch interval, past that wait's bound, and was terminated: measured,
        # 1.2 s of every job's close on every rank.
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(min(timeout_s, 4 * self.poll_interval_s + 1.0))
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self._thread.join(timeout_s)
        if self.process.stdout is not None:
            with contextlib.suppress(OSError):
                self.process.stdout.close()


def _read_line(process: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any] | None:
    """The observer's first stdout line (its address), waiting at most ``timeout_s``."""
    stream = process.stdout
    assert stream is not None
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        return None
    line = stream.readline()
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _send(process: subprocess.Popen[bytes], value: dict[str, Any]) -> None:
    stream = process.stdin
    assert stream is not None
    stream.write((json.dumps(value, sort_keys=True) + "\n").encode())
    stream.flush()


def _environment() -> dict[str, str]:
    """The observer imports the same scout as the trainer, and nothing of the user's."""
    env = dict(os.environ)
    root = str(Path(scout.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def start_observer(
    publisher: ProgressPublisher,
    *,
    group_ranks: Sequence[int],
    rendezvous: Rendezvous,
    secret: bytes,
    config: dict[str, Any] | None = None,
    report_path: str | os.PathLike[str] | None = None,
    stats_path: str | os.PathLike[str] | None = None,
    rounds_path: str | os.PathLike[str] | None = None,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    on_failure: str = "raise",
    on_hang: str = "report",
    exclude_hosts_path: str | os.PathLike[str] | None = None,
    bind_host: str = "127.0.0.1",
    hostname: str | None = None,
    poll_interval_s: float = 0.05,
    watch_interval_s: float = WATCH_INTERVAL_S,
    kill_grace_s: float = 5.0,
    timeout_s: float = 120.0,
    restarts_left: int | None = None,
) -> ObserverHandle:
    """Start the observer of ``publisher``'s rank and run its group's rendezvous (collective over
    the group's trainers). ``config`` holds ObserverConfig fields other than position and group
    size (thresholds in seconds)."""
    if on_failure not in ("raise", "report"):
        raise ValueError(f"on_failure must be 'raise' or 'report', got {on_failure!r}")
    if on_hang not in ON_HANG:
        raise ValueError(f"on_hang must be one of {ON_HANG}, got {on_hang!r}")
    if not 0 < poll_interval_s <= 1.0:
        raise ValueError(f"poll_interval_s must be in (0, 1] seconds, got {poll_interval_s!r}")
    if not 0 < watch_interval_s <= WATCH_INTERVAL_MAX_S:
        raise ValueError(f"watch_interval_s must be in (0, {WATCH_INTERVAL_MAX_S:g}] seconds, got {watch_interval_s!r}")
    identity = publisher.identity
    group = tuple(int(r) for r in group_ranks)
    if identity.rank not in group:
        raise ValueError(f"rank {identity.rank} is not in group_ranks {list(group)}")
    if len(set(group)) != len(group) or len(group) < 2:
        raise ValueError(f"group_ranks must be at least 2 distinct ranks, got {list(group)}")
    position = group.index(identity.rank)
    gid = group_id(identity.job_id, identity.generation, group)
    host_name = hostname or socket.gethostname()
    spec = {
        "job_id": identity.job_id,
        "generation": identity.generation,
        "rank": identity.rank,
        "group_ranks": list(group),
        "group_id": gid.hex(),
        "group_key": group_key(secret, gid).hex(),
        "record_name": publisher.name,
        "record_token": publisher.token.hex(),
        "config": dict(config or {}),
        "trainer_pid": os.getpid(),
        "trainer_start_ticks": process_start_ticks(os.getpid()) or 0,
        "report_path": None if report_path is None else os.fspath(report_path),
        "stats_path": None if stats_path is None else os.fspath(stats_path),
        "rounds_path": None if rounds_path is None else os.fspath(rounds_path),
        "exclude_hosts_path": None if exclude_hosts_path is None else os.fspath(exclude_hosts_path),
        "poll_interval_s": poll_interval_s,
        "watch_interval_s": watch_interval_s,
        "bind_host": bind_host,
        "hostname": host_name,
        "on_hang": on_hang,
        "kill_grace_s": kill_grace_s,
        "restarts_left": restarts_left,  # the launcher's, after this attempt (RECOVERY-5); None: unknown
    }
    # PROGRESS-12: a session of its own, so that a launcher's signal to the trainer's process
    # group (torchrun's SIGINT or SIGTERM) does not end the observer before its trainer; it still
    # ends with its trainer (parent-death signal, OBS-8) and then removes a record left behind.
    process = subprocess.Popen(
        [sys.executable, "-m", "scout.observer.process"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=_environment(), close_fds=True, start_new_session=True,
    )
    try:
        _send(process, spec)
        started = _read_line(process, START_TIMEOUT_S)
        if started is None or "address" not in started:
            raise ObserverFailed(
                f"the observer of rank {identity.rank} did not report its address within {START_TIMEOUT_S} s "
                f"(exit code {process.poll()}); its stderr says why"
            )
        host, port = started["address"]
        record = peer_record(str(host), int(port), bytes.fromhex(started["nonce"]), host_name)
        try:
            records = rendezvous.exchange(position, len(group), record, timeout_s)
        except RendezvousFailed as error:
            _send(process, {"failed": str(error)})
            raise ObserverFailed(f"rank {identity.rank}: {error}") from error
        _send(process, {"peers": records})
    except BaseException:
        with contextlib.suppress(Exception):
            process.kill()
            process.wait(CLOSE_TIMEOUT_S)
        raise
    return ObserverHandle(rank=identity.rank, job_id=identity.job_id, generation=identity.generation,
                          process=process, publisher=publisher, on_report=on_report, on_failure=on_failure,
                          poll_interval_s=poll_interval_s)
