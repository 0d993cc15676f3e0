"""The observer process: one per trainer rank, driving the pure machine of
:mod:`scout.core.observer` (table: spec/observer.toml).

Trainer side::

    handle = start_observer(publisher, rank=rank, group_ranks=tuple(range(world)),
                            secret=job_secret, rendezvous_dir=shared_dir,
                            config=dict(stall_threshold_s=30.0), report_path="reports.jsonl",
                            on_report=print, on_failure="raise")
    ...
    handle.check()          # each step: raises ObserverFailed if the observer died (or reports it)
    ...
    publisher.close(); handle.close()

The observer is a *spawned* process (never forked: forking after CUDA initialisation is unsafe).
It joins its group's observers over :class:`~scout.runtime.channel.UdpChannel`, attaches to the
trainer's progress record, and then loops every ``poll_interval_s``: read the record (a change
is a ``progress`` event), receive datagrams (``round_request``, ``answer``, ``decision``), tick.
It executes the machine's effects: send datagrams, write reports (a JSON line to
``report_path``, one readable line on stderr, the trainer's ``on_report`` callback).

It stops when its trainer exits: the record says "closed" (clean exit), the trainer process is
gone (Linux parent-death signal, plus polling the owner's pid and start time), or the handle
closes it. Every wait is bounded; every queue has a limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs

from scout.core.machine import Machine, MachineState, load_machine
from scout.core.observer import (
    Attached,
    EmitReport,
    Failed,
    Joined,
    JoinFailed,
    Noted,
    ObserverConfig,
    ObserverContext,
    Progress,
    ProgressSeen,
    Request,
    RoundClosed,
    Send,
    Stopped,
    Tick,
    TrainerExit,
    event_for,
    initial_context,
)
from scout.runtime import wire
from scout.runtime.channel import DirectoryRendezvous, RendezvousFailed, UdpChannel
from scout.runtime.progress import (
    ProgressError,
    ProgressPublisher,
    ProgressReader,
    RecordNotFound,
    Snapshot,
    process_alive,
)

__all__ = [
    "ObserverFailed", "ObserverHandle", "ObserverSpec", "load_observer_machine", "run_observer", "start_observer",
]

# The machine's table is read at run time from the repository's spec/ directory (the normative
# source; no copy is packaged, so an installed copy cannot drift from it).
SPEC_PATH: Final = Path(__file__).resolve().parents[2] / "spec" / "observer.toml"
REPORT_QUEUE_MAX: Final = 64
CLOSE_TIMEOUT_S: Final = 5.0
EXIT_FAILED: Final = 3
_PR_SET_PDEATHSIG: Final = 1


class ObserverFailed(RuntimeError):
    """The rank's observer died or failed; hang detection for this rank is off."""


_MACHINE: list[Machine[ObserverContext]] = []  # loaded once per process


def load_observer_machine(path: Path = SPEC_PATH) -> Machine[ObserverContext]:
    """The observer machine built from ``spec/observer.toml`` (cached). The table lives in the
    repository, not in the installed package: a missing file is a clear error naming the path."""
    if path == SPEC_PATH and _MACHINE:
        return _MACHINE[0]
    if not path.is_file():
        raise FileNotFoundError(
            f"the observer's machine table {path} does not exist: scout reads spec/observer.toml "
            "from its source checkout; run scout from a checkout (pip install -e .) rather than "
            "from a wheel that lacks spec/"
        )
    machine: Machine[ObserverContext] = load_machine(path)
    if path == SPEC_PATH:
        _MACHINE.append(machine)
    return machine


@attrs.frozen
class ObserverSpec:
    """Everything the observer process needs (it is pickled into the spawned process)."""

    job_id: str
    generation: int
    rank: int
    group_ranks: tuple[int, ...]
    record_name: str
    record_token: bytes = attrs.field(repr=False)
    secret: bytes = attrs.field(repr=False)
    rendezvous_dir: str
    config: ObserverConfig
    trainer_pid: int
    trainer_start_ticks: int
    report_path: str | None = None
    stats_path: str | None = None
    poll_interval_s: float = 0.05
    bind_host: str = "127.0.0.1"

    def __attrs_post_init__(self) -> None:
        if self.rank not in self.group_ranks:
            raise ValueError(f"rank {self.rank} is not in its group {list(self.group_ranks)}")
        if self.config.position != self.group_ranks.index(self.rank):
            raise ValueError(f"config.position {self.config.position} is not rank {self.rank}'s position")
        if not 0 < self.poll_interval_s <= 1.0:
            raise ValueError(f"poll_interval_s must be in (0, 1] seconds, got {self.poll_interval_s!r}")


# --------------------------------------------------------------------------------------------
# The observer process
# --------------------------------------------------------------------------------------------


def _set_parent_death_signal() -> None:
    """Ask Linux to send SIGTERM when the trainer (our parent) dies. Best effort elsewhere:
    polling the owner's pid covers it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _progress_of(snapshot: Snapshot) -> Progress:
    return Progress(snapshot.step, snapshot.op, snapshot.fingerprint, snapshot.stage)


class _Driver:
    def __init__(self, spec: ObserverSpec, reports: Any) -> None:
        self.spec = spec
        self.reports = reports
        self.machine = load_observer_machine()
        self.signalled = threading.Event()
        self.channel: UdpChannel | None = None
        self.reader: ProgressReader | None = None
        self.last_progress: Progress | None = None
        self.stats: dict[str, int] = {
            "messages_sent": 0, "messages_received": 0, "refused": 0, "undecodable": 0, "impersonated": 0,
            "rounds": 0, "reports": 0, "stale_replies": 0, "rounds_aborted": 0, "reports_dropped": 0,
        }
        self.exit_code = 0
        self.stopped_reason = ""

    # -- effects ----------------------------------------------------------------------------

    def step(self, state: MachineState[ObserverContext], event: Any) -> MachineState[ObserverContext]:
        state, effects = self.machine.step(state, event)
        for effect in effects:
            if isinstance(effect, Send):
                assert self.channel is not None
                body = wire.encode_message(effect.message)
                for position in effect.to:
                    self.channel.send(position, body)
                    self.stats["messages_sent"] += 1
            elif isinstance(effect, EmitReport):
                record = wire.report_record(effect.report, group_ranks=self.spec.group_ranks,
                                            job_id=self.spec.job_id, generation=self.spec.generation)
                self.emit(record)
            elif isinstance(effect, RoundClosed):
                self.stats["rounds"] += 1
            elif isinstance(effect, Noted):
                key = {"stale_reply_ignored": "stale_replies", "round_aborted_by_progress": "rounds_aborted"}
                self.stats[key.get(effect.what, effect.what)] = self.stats.get(key.get(effect.what, effect.what), 0) + 1
            elif isinstance(effect, Failed):
                self.exit_code = EXIT_FAILED
                self.emit(wire.failure_report(rank=self.spec.rank, group_ranks=self.spec.group_ranks,
                                              job_id=self.spec.job_id, generation=self.spec.generation,
                                              reason=effect.reason))
            elif isinstance(effect, Stopped):
                self.stopped_reason = effect.reason
        return state

    def emit(self, record: dict[str, Any]) -> None:
        self.stats["reports"] += 1
        line = wire.dumps(record)
        if self.spec.report_path:
            with open(self.spec.report_path, "a", encoding="utf-8") as file:
                file.write(line + "\n")
        print(wire.report_line(record), file=sys.stderr, flush=True)
        try:
            self.reports.put_nowait(line)
        except (queue.Full, AttributeError, OSError, ValueError):
            self.stats["reports_dropped"] += 1

    # -- the world ----------------------------------------------------------------------------

    def trainer_exit(self, now: float) -> TrainerExit | None:
        if self.signalled.is_set() or os.getppid() != self.spec.trainer_pid:
            return TrainerExit(now, clean=False)
        if not process_alive(self.spec.trainer_pid, self.spec.trainer_start_ticks):
            return TrainerExit(now, clean=False)
        return None

    def run(self) -> int:
        spec = self.spec
        config = spec.config
        state = self.machine.initial_state(initial_context(config, time.monotonic()))
        self.channel = UdpChannel(spec.secret, config.position, host=spec.bind_host)
        state = self.join(state)
        state = self.attach(state)
        while state.control not in ("STOPPED", "FAILED"):
            state = self.poll(state)
        self.finish()
        return self.exit_code

    def join(self, state: MachineState[ObserverContext]) -> MachineState[ObserverContext]:
        assert self.channel is not None
        rendezvous = DirectoryRendezvous(self.spec.rendezvous_dir)
        deadline = state.context.started_s + self.spec.config.join_deadline_s
        rendezvous.publish(self.spec.config.position, self.channel.address)
        while state.control == "JOINING":
            now = time.monotonic()
            exit_event = self.trainer_exit(now)
            if exit_event is not None:
                return self.step(state, exit_event)
            try:
                self.channel.peers = rendezvous.collect(self.spec.config.group_size, min(deadline, now + 0.2))
            except RendezvousFailed as error:
                if time.monotonic() >= deadline:
                    return self.step(state, JoinFailed(time.monotonic(), str(error)))
                continue
            state = self.step(state, Joined(time.monotonic()))
        return state

    def attach(self, state: MachineState[ObserverContext]) -> MachineState[ObserverContext]:
        while state.control == "ATTACHING":
            now = time.monotonic()
            exit_event = self.trainer_exit(now)
            if exit_event is not None:
                return self.step(state, exit_event)
            try:
                self.reader = ProgressReader(self.spec.record_name, self.spec.record_token)
                snapshot = self.reader.read() or self.reader.last_snapshot
            except (RecordNotFound, ProgressError):
                snapshot = None
            if snapshot is not None:
                self.last_progress = _progress_of(snapshot)
                return self.step(state, Attached(now, self.last_progress))
            state = self.step(state, Tick(now))
            time.sleep(self.spec.poll_interval_s)
        return state

    def poll(self, state: MachineState[ObserverContext]) -> MachineState[ObserverContext]:
        assert self.channel is not None and self.reader is not None
        now = time.monotonic()
        exit_event = self.trainer_exit(now)
        snapshot = self.reader.read()
        if exit_event is None and snapshot is not None and snapshot.closed:
            exit_event = TrainerExit(now, clean=True)
        if exit_event is not None:
            return self.step(state, exit_event)
        if snapshot is not None:
            progress = _progress_of(snapshot)
            if progress != self.last_progress:
                self.last_progress = progress
                state = self.step(state, ProgressSeen(now, progress))
        for sender, body in self.channel.receive(self.spec.poll_interval_s):
            self.stats["messages_received"] += 1
            try:
                message = wire.decode_message(body, self.spec.config.group_size)
            except wire.WireError:
                self.stats["undecodable"] += 1
                continue
            claimed = message.round.initiator if isinstance(message, Request) else message.sender
            if claimed != sender:
                self.stats["impersonated"] += 1
                continue
            state = self.step(state, event_for(message, time.monotonic()))
            if state.control in ("STOPPED", "FAILED"):
                return state
        return self.step(state, Tick(time.monotonic()))

    def finish(self) -> None:
        if self.channel is not None:
            self.stats["refused"] = self.channel.refused
            self.channel.close()
        if self.reader is not None:
            self.reader.close(unlink_if_orphaned=True)
        if self.spec.stats_path:
            stats = {**self.stats, "rank": self.spec.rank, "exit_code": self.exit_code, "stopped": self.stopped_reason}
            Path(self.spec.stats_path).write_text(json.dumps(stats, sort_keys=True) + "\n", encoding="utf-8")


def run_observer(spec: ObserverSpec, reports: Any = None) -> None:
    """The spawned process's entry point."""
    _set_parent_death_signal()
    driver = _Driver(spec, reports)

    def on_signal(_signum: int, _frame: Any) -> None:
        driver.signalled.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        code = driver.run()
    except Exception as error:  # the observer must never die silently
        driver.emit(wire.failure_report(rank=spec.rank, group_ranks=spec.group_ranks, job_id=spec.job_id,
                                        generation=spec.generation, reason=f"observer crashed: {error!r}"))
        code = EXIT_FAILED
    # Exit without the interpreter's exit handlers: multiprocessing's finalizers join the report
    # queue's feeder thread without a bound, and an orphaned observer was once seen blocked there
    # for minutes after its trainer died. Flush what we can within a bound, then leave.
    _flush_reports(reports, timeout_s=2.0)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _flush_reports(reports: Any, timeout_s: float) -> None:
    """Hand queued reports to the trainer's pipe, waiting at most ``timeout_s``."""
    if reports is None or not hasattr(reports, "join_thread"):
        return
    flushed = threading.Event()

    def flush() -> None:
        with contextlib.suppress(Exception):
            reports.close()
            reports.join_thread()
        flushed.set()

    threading.Thread(target=flush, name="scout-report-flush", daemon=True).start()
    flushed.wait(timeout_s)


# --------------------------------------------------------------------------------------------
# The trainer side
# --------------------------------------------------------------------------------------------


class ObserverHandle:
    """The trainer's view of its observer process."""

    def __init__(self, spec: ObserverSpec, process: Any, reports: Any,
                 on_report: Callable[[dict[str, Any]], None] | None, on_failure: str,
                 publisher: ProgressPublisher) -> None:
        self.spec = spec
        self.publisher = publisher
        self.process = process
        self.reports = reports
        self.on_report = on_report
        self.on_failure = on_failure
        self.failure_reported = False
        self.closing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name=f"scout-observer-reports-{spec.rank}", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                line = self.reports.get(timeout=0.2)
            except (queue.Empty, EOFError, OSError, ValueError):
                continue
            if self.on_report is not None:
                with contextlib.suppress(Exception):  # a failing callback must not kill the drain
                    self.on_report(json.loads(line))

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid

    def alive(self) -> bool:
        return bool(self.process.is_alive())

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the observer has joined its group and attached to the record (it then
        holds the record's observer slot). Raises ObserverFailed if it exits or the wait times
        out: start the training loop only once every rank's observer is ready."""
        deadline = time.monotonic() + timeout_s
        while self.publisher.observer_pid() != self.process.pid:
            if not self.process.is_alive():
                raise ObserverFailed(f"the observer of rank {self.spec.rank} exited with code "
                                     f"{self.process.exitcode} before it was ready; see its stderr line")
            if time.monotonic() >= deadline:
                raise ObserverFailed(f"the observer of rank {self.spec.rank} was not ready within {timeout_s} s "
                                     "(rendezvous with the other observers, or attaching, did not complete)")
            time.sleep(0.01)

    def check(self) -> None:
        """Call once per step. If the observer is gone, raise :class:`ObserverFailed`
        (``on_failure="raise"``) or report ``observer_failure`` once (``"report"``)."""
        if self.closing or self.process.is_alive():
            return
        reason = f"the observer of rank {self.spec.rank} exited with code {self.process.exitcode}"
        if self.on_failure == "raise":
            raise ObserverFailed(f"{reason}; hang detection for this rank is off. Restart the job, or "
                                 "start the observer with on_failure='report' to continue without it")
        if not self.failure_reported:
            self.failure_reported = True
            record = wire.failure_report(rank=self.spec.rank, group_ranks=self.spec.group_ranks,
                                         job_id=self.spec.job_id, generation=self.spec.generation,
                                         reason=reason, exit_code=self.process.exitcode)
            print(wire.report_line(record), file=sys.stderr, flush=True)
            if self.on_report is not None:
                with contextlib.suppress(Exception):
                    self.on_report(record)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the observer (SIGTERM, bounded wait, then SIGKILL) and the report thread."""
        self.closing = True
        if not self.publisher.closed:
            self.process.terminate()
        # After publisher.close() the observer sees the closed record and exits by itself.
        self.process.join(min(timeout_s, 4 * self.spec.poll_interval_s + 0.5))
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout_s)
        # Reports still queued are delivered before the thread stops.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                if self.reports.empty():
                    break
            except OSError:
                break
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(timeout_s)


@contextlib.contextmanager
def _without_mpi_initialization() -> Any:
    """A spawned child re-imports the trainer's main module; in an MPI program that module
    imports mpi4py, whose import would initialise MPI in the observer (and fail: the launcher
    knows no such process). ``MPI4PY_RC_INITIALIZE=false`` stops that; only for this start."""
    name = "MPI4PY_RC_INITIALIZE"
    previous = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def start_observer(
    publisher: ProgressPublisher,
    *,
    group_ranks: tuple[int, ...],
    secret: bytes,
    rendezvous_dir: str | os.PathLike[str],
    config: dict[str, Any] | None = None,
    report_path: str | os.PathLike[str] | None = None,
    stats_path: str | os.PathLike[str] | None = None,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    on_failure: str = "raise",
    poll_interval_s: float = 0.05,
) -> ObserverHandle:
    """Spawn the observer of ``publisher``'s rank. ``config`` holds ObserverConfig fields other
    than position and group size (thresholds in seconds)."""
    if on_failure not in ("raise", "report"):
        raise ValueError(f"on_failure must be 'raise' or 'report', got {on_failure!r}")
    rank = publisher.identity.rank
    group = tuple(group_ranks)
    if rank not in group:
        raise ValueError(f"rank {rank} is not in group_ranks {list(group)}")
    from scout.runtime.progress import process_start_ticks

    spec = ObserverSpec(
        job_id=publisher.identity.job_id,
        generation=publisher.identity.generation,
        rank=rank,
        group_ranks=group,
        record_name=publisher.name,
        record_token=publisher.token,
        secret=secret,
        rendezvous_dir=os.fspath(rendezvous_dir),
        config=ObserverConfig(group.index(rank), len(group), **(config or {})),
        trainer_pid=os.getpid(),
        trainer_start_ticks=process_start_ticks(os.getpid()) or 0,
        report_path=None if report_path is None else os.fspath(report_path),
        stats_path=None if stats_path is None else os.fspath(stats_path),
        poll_interval_s=poll_interval_s,
    )
    context = multiprocessing.get_context("spawn")
    reports = context.Queue(maxsize=REPORT_QUEUE_MAX)
    process = context.Process(target=run_observer, args=(spec, reports), name=f"scout-observer-{rank}", daemon=True)
    with _without_mpi_initialization():
        process.start()
    return ObserverHandle(spec, process, reports, on_report, on_failure, publisher)
