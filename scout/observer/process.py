"""The observer process: ``python -m scout.observer.process``, one per trainer rank.

A fresh interpreter on scout's own entry point: it imports neither torch nor the user's script,
so it starts in well under a second and stays small. The trainer starts it
(:func:`scout.observer.launch.start_observer`) and talks to it over two pipes:

- stdin, line 1: the spec (JSON: rank, group, record name and token, group key, thresholds,
  report file, fault policy, and with metrics on the rounds file where it leaves the latency of
  each round it opened for the node's ops sidecar, spec/ops.md OPS-5); line 2, after the
  rendezvous: the peers of its group. Later the
  pipe stays open; its end-of-file means the trainer is gone;
- stdout, line 1: ``{"address": [host, port], "nonce": ...}`` once the UDP socket is bound; then
  one ``{"report": {...}}`` line per report, for the trainer's callbacks.

Then it runs the one observer driver (:func:`scout.observer.driver.drive`) over the real clock,
the progress record and the UDP channel. It stops when its trainer exits: the record says
"closed" (clean exit) or "exiting" (leaving by an exception, PROGRESS-11), or the trainer is gone (parent-death signal, the owner's pid and start
time, end of file on stdin). Every wait is bounded, and a watchdog thread ends the process
``EXIT_DEADLINE_S`` after the trainer is gone or a stop signal came, whatever the loop is blocked
on (OBS-8: an observer never outlives its trainer; it prints where it was stuck first).

*Fault policy* ``on_hang = "restart"``: after this observer emits a stall report it appends the
hosts at fault to ``exclude_hosts`` and ends its own trainer (SIGTERM, then SIGKILL after
``kill_grace_s``), so the launcher (``torchrun --max-restarts``) restarts the job instead of
waiting for the stuck collective's own timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

import attrs

from scout import reports
from scout.core.drive import Handler, drive
from scout.core.observer import ObserverConfig, Progress, StallReport
from scout.observer import driver, wire
from scout.observer.channel import UdpChannel
from scout.observer.driver import ObserverRun, Pause, Receive, Transmit
from scout.observer.progress import ProgressError, ProgressReader, RecordNotFound, process_alive
from scout.observer.rendezvous import RendezvousFailed, peers_from_records
from scout.reports.kinds import EXHAUSTED, ReportKind, at_fault_in_every_attempt

__all__ = ["EXIT_FAILED", "main"]

EXIT_FAILED: Final = 3
SPEC_BYTES_MAX: Final = 1 << 20
#: OBS-8 backstop: how long after its trainer is gone (or a stop signal) the observer's loop has
#: to stop by itself before the watchdog ends the process. The loop notices within one poll
#: interval; this only fires when it is blocked (a report file on a hung mount, a wedged lock).
EXIT_DEADLINE_S: Final = 3.0
WATCHDOG_INTERVAL_S: Final = 0.1
#: DRIVER-6: while the trainer lives, the watchdog sleeps on a pidfd of the trainer (readable when
#: it exits) and the signal wake-up pipe, and checks /proc only this often: polling every
#: WATCHDOG_INTERVAL_S cost a healthy observer more CPU than its loop. The pidfd and the pipes
#: wake it for every way the trainer can go, so the recheck is a backstop only: once a second it
#: cost as much as the whole watching loop (about 0.3 ms of CPU a second). Where pidfds do not
#: exist, it polls every WATCHDOG_INTERVAL_S.
WATCHDOG_RECHECK_S: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1
#: Round latencies kept in the rounds file (the ops sidecar reads it about once a second).
ROUNDS_KEPT: Final = 64


def _set_parent_death_signal() -> None:
    """Ask Linux to send SIGTERM when the trainer (our parent) dies. Best effort elsewhere:
    polling the owner's pid and stdin's end of file cover it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class _Control:
    """Lines from the trainer on stdin, read without blocking."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False

    def line(self, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, remaining))
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
                continue
            self.buffer += chunk
            if len(self.buffer) > SPEC_BYTES_MAX:
                raise ValueError(f"a control line from the trainer is over {SPEC_BYTES_MAX} bytes")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def closed(self) -> bool:
        """True once the trainer's end of the pipe is closed (it exited or died)."""
        if not self.eof:
            ready, _, _ = select.select([self.fd], [], [], 0)
            if ready:
                chunk = os.read(self.fd, 65536)
                if chunk:
                    self.buffer = (self.buffer + chunk)[-SPEC_BYTES_MAX:]
                else:
                    self.eof = True
        return self.eof


class _Out:
    """Lines to the trainer on stdout; a trainer that stopped reading loses them, nothing more."""

    def __init__(self) -> None:
        self.broken = False

    def send(self, value: dict[str, Any]) -> None:
        if self.broken:
            return
        try:
            sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            self.broken = True


class _Flag:
    """Set by a signal handler, read by the loop and the watchdog. A plain attribute, not a
    ``threading.Event``: Event.set takes a lock, and a second signal arriving inside the first
    handler (Ctrl-C to the process group, then the parent-death SIGTERM) would wait on that lock
    for ever."""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def is_set(self) -> bool:
        return self.value


def _trainer_gone(pid: int, start_ticks: int, signalled: _Flag) -> bool:
    """OBS-8: a stop signal came, or the trainer is dead (re-parented away, or its pid no longer
    names the process that started us). The loop and the watchdog both ask this."""
    return signalled.is_set() or os.getppid() != pid or not process_alive(pid, start_ticks)


class _Watchdog:
    """A daemon thread that ends the observer process ``EXIT_DEADLINE_S`` after its trainer is
    gone or a stop signal came, if the main loop has not finished by then (OBS-8). Before it
    ends the process it prints every thread's stack, so a blocked loop is named, not hidden."""

    def __init__(self, rank: int, trainer_pid: int, trainer_start_ticks: int, signalled: _Flag,
                 signal_fd: int | None = None) -> None:
        self.rank = rank
        self.trainer_pid = trainer_pid
        self.trainer_start_ticks = trainer_start_ticks
        self.signalled = signalled
        self.signal_fd = signal_fd  # readable once a stop signal came (the _Waker's pipe)
        self.finished = threading.Event()
        self._finish_read, self._finish_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"scout-observer-watchdog-{rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self.finished.set()
        with contextlib.suppress(OSError):
            os.write(self._finish_write, b"x")
        self._thread.join(WATCHDOG_RECHECK_S)

    def _until_gone(self) -> bool:
        """Sleep until the trainer is gone or a stop signal came (True), or finish() (False)."""
        pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(self.trainer_pid)  # Linux >= 5.3
        try:
            while not self.finished.is_set():
                if _trainer_gone(self.trainer_pid, self.trainer_start_ticks, self.signalled):
                    return True
                watched = [fd for fd in (self._finish_read, pidfd, self.signal_fd) if fd is not None]
                ready, _, _ = select.select(watched, [], [], WATCHDOG_RECHECK_S if pidfd is not None
                                            else WATCHDOG_INTERVAL_S)
                if (pidfd is not None and pidfd in ready) or (self.signal_fd is not None and self.signal_fd in ready):
                    return True
            return False
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _run(self) -> None:
        if not self._until_gone():
            return
        gone_since = time.monotonic()
        while not self.finished.wait(WATCHDOG_INTERVAL_S):
            if time.monotonic() - gone_since >= EXIT_DEADLINE_S:
                with contextlib.suppress(Exception):
                    print(f"scout: observer of rank {self.rank}: its trainer (pid {self.trainer_pid}) is gone or it "
                          f"was asked to stop, but its loop did not stop within {EXIT_DEADLINE_S} s; ending it "
                          "(OBS-8). Where each thread was:", file=sys.stderr, flush=True)
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(EXIT_FAILED)


class _World:
    """The real observer's :class:`~scout.observer.driver.ObserverWorld`."""

    def __init__(self, spec: dict[str, Any], channel: UdpChannel, control: _Control, out: _Out) -> None:
        self.spec = spec
        self.channel = channel
        self.control = control
        self.out = out
        self.rank: int = spec["rank"]
        self.group_ranks: tuple[int, ...] = tuple(spec["group_ranks"])
        self.hosts: tuple[str, ...] | None = None
        self.signalled = _Flag()
        self.reader: ProgressReader | None = None
        self.leaving = False  # the record says closed or exiting (PROGRESS-11)
        self._published_s: float | None = None
        self._last_host: tuple[Any, ...] | None = None
        self._last_completion: Any = None

    def now(self) -> float:
        return time.monotonic()

    def trainer_exit(self) -> bool | None:
        if self.leaving:
            return True
        if _trainer_gone(self.spec["trainer_pid"], self.spec["trainer_start_ticks"], self.signalled):
            return False
        if self.control.closed():
            return self._closed_record()
        return None

    def _closed_record(self) -> bool:
        """At the trainer's end: a clean exit closed the record first (or marked it exiting)."""
        if self.reader is not None:
            snapshot = self.reader.read()
            return bool(snapshot is not None and snapshot.leaving)
        return False

    def read_progress(self) -> Progress | None:
        if self.reader is None:
            try:
                self.reader = ProgressReader(self.spec["record_name"], bytes.fromhex(self.spec["record_token"]))
            except (RecordNotFound, ProgressError):
                return None
        snapshot = self.reader.read() or self.reader.last_snapshot
        if snapshot is None:
            return None
        if snapshot.leaving:  # PROGRESS-11: closed, or leaving by an exception; never judged again
            self.leaving = True
        progress = snapshot.progress(time.monotonic_ns())
        self._published_s = self._changed_at(snapshot, progress)
        return progress

    def _changed_at(self, snapshot: Any, progress: Progress) -> float | None:
        """DRIVER-4: when what changed since the last read was published, in seconds of
        CLOCK_MONOTONIC (the clock of now()): the host fields at the record's publish, the
        completion coordinate at the publish that first carried it (PROGRESS-10's
        ``changed_ns``: a heartbeat since then would date it as late as the read), a section
        gone stale at its last publish; None when neither publish time is known."""
        host = (progress.step, progress.op, progress.fingerprint, progress.stage)
        times = []
        if host != self._last_host and snapshot.publish_ns > 0:
            times.append(snapshot.publish_ns)
        completion = (progress.completions, progress.completion_stale)
        if completion != self._last_completion and snapshot.completion is not None:
            section = snapshot.completion
            times.append(section.changed_ns if progress.completions else section.publish_ns)
        self._last_host, self._last_completion = host, completion
        return max(times) / 1e9 if times else None

    def published_s(self) -> float | None:
        return self._published_s

    def join(self) -> bool | str:
        try:
            line = self.control.line(0.0)
        except ValueError as error:
            return str(error)
        if line is None:
            return "the trainer closed the control pipe before the rendezvous" if self.control.eof else False
        try:
            message = json.loads(line)
        except ValueError:
            return f"unreadable rendezvous line from the trainer: {line[:200]!r}"
        if "failed" in message:
            return f"the trainers' rendezvous failed: {message['failed']}"
        try:
            peers = peers_from_records(message["peers"])
            self.channel.set_peers(peers)
        except (RendezvousFailed, ValueError, KeyError) as error:
            return str(error)
        self.hosts = tuple(peers[p].hostname for p in range(len(peers)))
        return True

    def emit(self, report: StallReport) -> None:
        record = wire.report_record(report, group_ranks=self.group_ranks, job_id=self.spec["job_id"],
                                    generation=self.spec["generation"], hosts=self.hosts)
        self._publish(record)
        if self.spec.get("on_hang") == "restart" and ReportKind(record["kind"]).on_hang_restart:
            self._restart(record)

    def fail(self, reason: str) -> None:
        host = self.spec.get("hostname") or None
        self._publish(wire.failure_record(rank=self.rank, job_id=self.spec["job_id"],
                                          generation=self.spec["generation"], reason=reason, host=host))

    def _publish(self, record: dict[str, Any]) -> None:
        path = self.spec.get("report_path")
        if path:
            try:
                reports.append_record(path, record)
            except OSError as error:
                print(f"scout: observer of rank {self.rank} could not append to {path}: {error}",
                      file=sys.stderr, flush=True)
        print(reports.record_line(record), file=sys.stderr, flush=True)
        self.out.send({"report": record})

    def _exhausted(self, record: dict[str, Any]) -> None:
        """RECOVERY-5: the launcher has no restart left, so ending the trainer ends the job; say
        so once, naming who was at fault in every attempt."""
        path = self.spec.get("report_path")
        try:
            earlier = reports.read_records(path) if path else []
        except (OSError, ValueError):
            earlier = []
        ranks, hosts = at_fault_in_every_attempt(earlier, self.spec["generation"], record["ranks"], record["hosts"])
        attempts = self.spec["generation"] + 1
        self._publish(reports.make_record(
            ReportKind.RESTART, reason=EXHAUSTED, job_id=self.spec["job_id"], generation=self.spec["generation"],
            ranks=ranks, hosts=list(hosts), step=record["step"], reporter_rank=self.rank,
            evidence={"policy": "on_hang=restart", "fault": record["kind"], "fault_ranks": record["ranks"],
                      "fault_hosts": record["hosts"], "attempts": attempts}))
        print(f"scout: restarts are spent: the job stops at step {record['step']} after {attempts} attempt(s) "
              f"({record['kind']} on rank(s) {record['ranks']}); at fault in every attempt: rank(s) {list(ranks)}",
              file=sys.stderr, flush=True)
        self.spec["restarts_left"] = None  # said once

    def _restart(self, record: dict[str, Any]) -> None:
        """on_hang = restart: name the hosts at fault for the scheduler, then end our trainer."""
        exclude = self.spec.get("exclude_hosts_path")
        if exclude and record["hosts"]:
            reports.append_hosts(exclude, record["hosts"])
        spent = self.spec.get("restarts_left") == 0
        if spent:
            self._exhausted(record)
        pid = self.spec["trainer_pid"]
        then = "; the restarts are spent, so the job stops" if spent else " so the launcher restarts the job"
        print(f"scout: on_hang=restart: ending trainer rank {self.rank} (pid {pid}){then}", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + float(self.spec.get("kill_grace_s", 5.0))
        while time.monotonic() < deadline and process_alive(pid, self.spec["trainer_start_ticks"]):
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if process_alive(pid, self.spec["trainer_start_ticks"]):
                os.kill(pid, signal.SIGKILL)


class _Waker:
    """DRIVER-6: a wait for datagrams that also ends when the trainer's control pipe becomes
    readable (its end of file: the trainer is gone) or a signal arrives (``signal.set_wakeup_fd``
    writes a byte to a pipe of ours), so the driver's next poll comes at once, not after
    ``watch_interval_s``."""

    def __init__(self, channel: UdpChannel, control: _Control) -> None:
        self.channel = channel
        self.control = control
        self.signals_read, self.signals_write = os.pipe()
        os.set_blocking(self.signals_read, False)
        os.set_blocking(self.signals_write, False)
        signal.set_wakeup_fd(self.signals_write, warn_on_full_buffer=False)

    def receive(self, timeout_s: float) -> list[tuple[int, bytes]]:
        watched: list[Any] = [self.channel.socket, self.signals_read]
        if not self.control.eof:
            watched.append(self.control.fd)
        ready, _, _ = select.select(watched, [], [], max(0.0, timeout_s))
        if self.signals_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self.signals_read, 4096)
        return self.channel.receive(0.0) if self.channel.socket in ready else []

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        os.close(self.signals_read)
        os.close(self.signals_write)


def _answers(channel: UdpChannel, waker: _Waker) -> dict[type, Handler]:
    """The driver's ops (``DriverOp``) answered with the UDP channel and the real clock."""
    return {
        Receive: lambda op: waker.receive(op.timeout_s),
        Transmit: lambda op: channel.send(op.to, op.body),
        Pause: lambda op: time.sleep(op.timeout_s),
    }


class _RoundLog:
    """The latencies of the rounds this observer opened, for the node's ops sidecar (spec/ops.md
    OPS-5): one small file rewritten whole at each round's end (rounds come only while a rank
    is stuck, seconds apart), holding the count and the newest ``ROUNDS_KEPT`` latencies."""

    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.rounds = 0
        self.recent: list[float] = []
        self.broken = False

    def closed(self, latency_s: float) -> None:
        self.rounds += 1
        self.recent = [*self.recent[-(ROUNDS_KEPT - 1):], round(latency_s, 6)]
        if self.broken:
            return
        target = Path(self.path)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps({"rank": self.rank, "rounds": self.rounds, "recent": self.recent}),
                                 encoding="utf-8")
            os.replace(temporary, target)
        except OSError as error:
            self.broken = True  # said once; the observer's own job goes on
            print(f"scout: observer of rank {self.rank} cannot write {self.path}: {error}", file=sys.stderr, flush=True)


def _config(spec: dict[str, Any]) -> ObserverConfig:
    group = list(spec["group_ranks"])
    return ObserverConfig(group.index(spec["rank"]), len(group), **spec.get("config", {}))


def main() -> int:
    _set_parent_death_signal()
    control = _Control(sys.stdin.fileno())
    out = _Out()
    line = control.line(30.0)
    if line is None:
        print("scout: observer: no spec from the trainer on stdin within 30 s", file=sys.stderr, flush=True)
        return EXIT_FAILED
    spec: dict[str, Any] = json.loads(line)
    channel = UdpChannel(bytes.fromhex(spec["group_key"]), bytes.fromhex(spec["group_id"]),
                         list(spec["group_ranks"]).index(spec["rank"]), host=spec.get("bind_host", "127.0.0.1"))
    world = _World(spec, channel, control, out)

    def on_signal(_signum: int, _frame: Any) -> None:
        world.signalled.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    waker = _Waker(channel, control)
    watchdog = _Watchdog(world.rank, spec["trainer_pid"], spec["trainer_start_ticks"], world.signalled,
                         waker.signals_read)
    watchdog.start()
    out.send({"address": list(channel.address), "nonce": channel.nonce.hex(), "pid": os.getpid()})
    run = ObserverRun(-1)
    code = 0
    try:
        config = _config(spec)
        poll_s = float(spec.get("poll_interval_s", 0.05))
        # DRIVER-4: a watch interval longer than the shortest stage threshold would delay reports.
        watch_s = min(float(spec.get("watch_interval_s", poll_s)), config.stall_threshold_s,
                      config.data_stall_threshold_s, config.checkpoint_stall_threshold_s)
        rounds_path = spec.get("rounds_path")
        on_round = _RoundLog(rounds_path, world.rank).closed if rounds_path else None
        run = drive(driver.drive(config, world, poll_interval_s=poll_s, watch_interval_s=watch_s,
                                 on_round_closed=on_round),
                    _answers(channel, waker), who="the observer process")
        run.rank = world.rank
        code = EXIT_FAILED if run.failed else 0
    except Exception as error:  # the observer must never die silently
        world.fail(f"observer crashed: {error!r}")
        code = EXIT_FAILED
    finally:
        channel.close()
        if world.reader is not None:
            world.reader.close(unlink_if_orphaned=True)
    stats_path = spec.get("stats_path")
    if stats_path:
        stats = attrs.asdict(run)
        stats.update(rank=world.rank, exit_code=code, refused=dict(channel.refused),
                     refused_total=sum(channel.refused.values()), sent=channel.sent, received=channel.received)
        Path(stats_path).write_text(json.dumps(stats, sort_keys=True, default=str) + "\n", encoding="utf-8")
    watchdog.finish()
    waker.close()  # after the watchdog: it may be waiting on the waker's signal pipe
    return code


if __name__ == "__main__":
    code = main()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    # Skip interpreter teardown: nothing is left to flush, and an exit handler must never keep an
    # orphaned observer alive.
    os._exit(code)
