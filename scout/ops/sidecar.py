"""The per-node sidecar: ``python -m scout.ops.sidecar``, started by the lowest rank of each
node at ``scout.attach`` when ``metrics_port`` or ``on_report`` is set (spec/ops.md).

It is not a trainer (OPS-1): it reads what the trainers and their observers leave -- the node's
progress records (shared memory, read without taking the observer's slot), ``reports.jsonl``
as it grows, the ranks' and observers' ops files, the gate's manifest -- so a trainer that is
frozen, spinning or dead never freezes the metrics. It serves them on ``metrics_addr:
metrics_port`` (prometheus_client's server thread), runs ``on_report`` for each new report
(OPS-4), and writes ``run_dir/ops/node-<host>-r<rank>.json`` (its ranks' progress and the metrics
address) once a second for ``scout serve`` and for people.

A metrics port it cannot bind (taken by another job on the host) switches off the metrics
only: the hook runs and the node file is written all the same (OPS-9). A report it cannot count
is logged and skipped; the reports after it are counted and hooked (OPS-12).

It ends when every trainer of its node is gone (record closed, or process dead) or on SIGTERM:
a last read of the reports (so their hooks run), queued hooks get ``on_report_timeout_s``, and a
watchdog ends the process ``EXIT_DEADLINE_S`` after that whatever the loop is blocked on (OPS-2).

Protocol with the trainer that starts it: stdin, one JSON line (the spec: run directory, the
node's ranks with their record names and tokens, settings); stdout, one JSON line once it
runs (``{"ready": true, "metrics_address": [host, port] | null, "metrics_error": "..." | null}``)
or fails (``{"error": "..."}``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Final

from scout import reports
from scout.observer.progress import ProgressError, ProgressReader, process_alive
from scout.ops import paths
from scout.ops.hooks import OnReportRunner
from scout.ops.state import NodeState, RankProgress
from scout.ops.tail import ReportTail

__all__ = ["EXIT_DEADLINE_S", "Sidecar", "main"]

EXIT_FAILED: Final = 3
SPEC_BYTES_MAX: Final = 1 << 20
SPEC_TIMEOUT_S: Final = 30.0
#: OPS-2: after its trainers are gone (and its hooks had their time) the sidecar is ended this
#: long later if its loop has not finished by itself.
EXIT_DEADLINE_S: Final = 3.0
#: How often the node file is rewritten and the gate's manifest looked at.
NODE_FILE_INTERVAL_S: Final = 1.0
GATE_INTERVAL_S: Final = 2.0


def _log(host: str, message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"scout: ops sidecar on {host}: {message}", file=sys.stderr, flush=True)


class _RankSource:
    """One local rank: its progress record (read-only), its ops files."""

    def __init__(self, entry: dict[str, Any], run_dir: Path) -> None:
        self.rank = int(entry["rank"])
        self.record_name = str(entry["record_name"])
        self.token = bytes.fromhex(entry["record_token"])
        self.pid = int(entry["pid"])
        self.start_ticks = int(entry["start_ticks"])
        self.stats_path = paths.rank_stats_path(run_dir, self.rank)
        self.rounds_path = paths.rounds_path(run_dir, self.rank)
        self.reader: ProgressReader | None = None
        self.stats_mtime_ns = 0
        self.rounds_mtime_ns = 0
        self.rounds_seen = 0
        self.closed = False

    def progress(self, now_ns: int) -> RankProgress | None:
        if self.reader is None:
            try:
                self.reader = ProgressReader(self.record_name, self.token, claim=False)
            except (ProgressError, OSError, ValueError):
                return None
        try:
            snapshot = self.reader.read() or self.reader.last_snapshot
        except ProgressError:
            return None
        if snapshot is None:
            return None
        self.closed = self.closed or snapshot.closed
        alive = process_alive(self.pid, self.start_ticks)
        return RankProgress(snapshot.step, max(0.0, (now_ns - snapshot.publish_ns) / 1e9), alive, snapshot.closed)

    def gone(self) -> bool:
        return self.closed or not process_alive(self.pid, self.start_ticks)

    def close(self) -> None:
        if self.reader is not None:
            with contextlib.suppress(ProgressError, OSError):
                self.reader.close()
            self.reader = None


class Sidecar:
    """One node's sidecar, driven by :meth:`tick` (also called at each scrape, under the lock)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.run_dir = Path(spec["run_dir"])
        self.host = str(spec["host"])
        self.ranks = [_RankSource(entry, self.run_dir) for entry in spec["ranks"]]
        if not self.ranks:
            raise ValueError("the sidecar's spec names no rank of its node")
        local = frozenset(source.rank for source in self.ranks)
        self.state = NodeState(str(spec["job_id"]), int(spec["generation"]), self.host, local,
                               bool(spec.get("has_rank_zero", 0 in local)))
        self.lock = threading.Lock()
        self.tail = ReportTail(self.run_dir / reports.REPORTS_FILE, from_end=True)
        self.hooks: OnReportRunner | None = None
        if spec.get("on_report"):
            self.hooks = OnReportRunner(shlex.split(spec["on_report"]), timeout_s=float(spec["on_report_timeout_s"]),
                                        log=lambda message: _log(self.host, message),
                                        env={**os.environ, "SCOUT_RUN_DIR": str(self.run_dir)})
        self.metrics_address: tuple[str, int] | None = None
        self._server: Any = None
        self._gate_checked_s = -GATE_INTERVAL_S
        self._gate_mtime_ns = -1
        self._node_written_s = -NODE_FILE_INTERVAL_S

    # -- serving ------------------------------------------------------------------------------

    def serve_metrics(self) -> None:
        port = self.spec.get("metrics_port")
        if port is None:
            return
        from prometheus_client import start_http_server

        from scout.ops.metrics import NodeCollector, registry_for

        hooks = self.hooks
        collector = NodeCollector(self.state, self.lock, self.refresh,
                                  (lambda: dict(hooks.counts)) if hooks is not None else None)
        server, _thread = start_http_server(int(port), addr=str(self.spec.get("metrics_addr") or "127.0.0.1"),
                                            registry=registry_for(collector))
        self._server = server
        host, bound = server.server_address[:2]
        self.metrics_address = (str(host), int(bound))

    def stop_serving(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
            self._server = None

    # -- reading ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read what changed: new reports (counted, hooks queued), progress, ops files."""
        with self.lock:
            self._read_reports()
            now_ns = time.monotonic_ns()
            for source in self.ranks:
                progress = source.progress(now_ns)
                if progress is not None:
                    self.state.progress[source.rank] = progress
                self._read_rank_files(source)

    def _read_reports(self) -> None:
        for record in self.tail.read():
            # OPS-12: the tail hands over well-typed reports only; should one still fail to count,
            # it is logged and the rest of the read is counted and hooked all the same.
            try:
                counted = self.state.add_record(record, _unix_time(record.get("time")))
            except Exception as error:
                _log(self.host, f"a report it cannot count was skipped ({error!r}): {str(record)[:200]}")
                continue
            if counted and self.hooks is not None:
                self.hooks.submit(record)

    def _read_rank_files(self, source: _RankSource) -> None:
        try:
            mtime_ns = source.stats_path.stat().st_mtime_ns
        except OSError:
            mtime_ns = 0
        if mtime_ns and mtime_ns != source.stats_mtime_ns:
            value = paths.read_state(source.stats_path)
            if value is not None:
                self.state.set_stats(source.rank, value)
                source.stats_mtime_ns = mtime_ns
        try:
            rounds_mtime_ns = source.rounds_path.stat().st_mtime_ns
        except OSError:
            return
        if rounds_mtime_ns == source.rounds_mtime_ns:
            return
        source.rounds_mtime_ns = rounds_mtime_ns
        rounds = paths.read_state(source.rounds_path)
        if rounds is not None:
            count = rounds.get("rounds")
            recent = rounds.get("recent")
            if isinstance(count, int) and isinstance(recent, list) and count > source.rounds_seen:
                # The file keeps the newest ROUNDS_KEPT latencies: observe the ones not yet seen.
                for latency_s in recent[-min(len(recent), count - source.rounds_seen):]:
                    if isinstance(latency_s, (int, float)) and not isinstance(latency_s, bool):
                        self.state.rounds.observe(float(latency_s))
                source.rounds_seen = count

    def _read_gate(self, now_s: float, *, force: bool = False) -> None:
        gate = self.run_dir / "gate"
        if not force and now_s - self._gate_checked_s < GATE_INTERVAL_S:
            return
        self._gate_checked_s = now_s
        try:
            mtime_ns = max((entry.stat().st_mtime_ns for entry in os.scandir(gate)), default=0)
        except OSError:
            return
        if mtime_ns == self._gate_mtime_ns:
            return
        from scout.gate.recorder import inspect_gate

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a fail-closed reading shows in the trust states
                reading = inspect_gate(gate, None)
        except Exception as error:  # a damaged manifest must not end the metrics
            _log(self.host, f"could not read the gate manifest {gate}: {error}")
            self._gate_mtime_ns = mtime_ns
            return
        self._gate_mtime_ns = mtime_ns
        if reading is not None:
            checkpoints = [(e.id.timeline, e.id.step, e.trust.value) for e in reading.state.context.checkpoints]
            with self.lock:
                self.state.set_checkpoints(checkpoints)

    def _write_node_file(self, now_s: float, *, force: bool = False) -> None:
        if not force and now_s - self._node_written_s < NODE_FILE_INTERVAL_S:
            return
        self._node_written_s = now_s
        with self.lock:
            ranks = {str(rank): {"step": p.step, "age_s": round(p.age_s, 3), "alive": p.alive and not p.closed}
                     for rank, p in sorted(self.state.progress.items())}
        value = {"host": self.host, "job_id": self.state.job_id, "generation": self.state.generation,
                 "metrics_address": list(self.metrics_address) if self.metrics_address else None,
                 "ranks": ranks, "time": time.time(), "pid": os.getpid()}
        try:
            paths.write_state(paths.node_status_path(self.run_dir, self.host, min(self.state.local_ranks)), value)
        except OSError as error:
            _log(self.host, f"could not write its node file: {error}")

    # -- the loop -----------------------------------------------------------------------------

    def tick(self) -> None:
        now_s = time.monotonic()
        self.refresh()
        self._read_gate(now_s)
        if self.hooks is not None:
            with self.lock:  # a scrape's refresh submits to the runner from the server's thread
                self.hooks.poll()
        self._write_node_file(now_s)

    def trainers_gone(self) -> bool:
        return all(source.gone() for source in self.ranks)

    def finish(self, hooks_deadline_s: float) -> None:
        """The trainers are gone: last reports and their hooks, the final node file."""
        self.refresh()
        self._read_gate(time.monotonic(), force=True)
        self._write_node_file(time.monotonic(), force=True)
        self.stop_serving()
        if self.hooks is not None:
            self.hooks.close(hooks_deadline_s)
        for source in self.ranks:
            source.close()


def _unix_time(text: Any) -> float | None:
    import datetime

    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _Flag:
    """Set by a signal handler; a plain attribute (see scout/observer/process.py's _Flag)."""

    def __init__(self) -> None:
        self.value = False


def _read_spec(timeout_s: float) -> dict[str, Any] | None:
    fd = sys.stdin.fileno()
    buffer = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buffer:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        if len(buffer) > SPEC_BYTES_MAX:
            return None
    try:
        value = json.loads(buffer.split(b"\n", 1)[0])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _say(value: dict[str, Any]) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
        sys.stdout.flush()


def main() -> int:
    spec = _read_spec(SPEC_TIMEOUT_S)
    if spec is None:
        print(f"scout: ops sidecar: no spec from the trainer on stdin within {SPEC_TIMEOUT_S:g} s", file=sys.stderr)
        return EXIT_FAILED
    stop = _Flag()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.value = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sidecar = Sidecar(spec)
    except (KeyError, TypeError, ValueError) as error:
        _say({"error": f"a spec it cannot use: {error!r}"})
        return EXIT_FAILED
    metrics_error = None
    try:
        sidecar.serve_metrics()
    except Exception as error:  # a taken port, a missing prometheus_client
        # OPS-9: the metrics are off on this node; the alerts (on_report) and the node file are not.
        metrics_error = f"cannot serve metrics on {spec.get('metrics_addr')}:{spec.get('metrics_port')}: {error}"
        _log(sidecar.host, f"{metrics_error}; metrics are off on this node, "
             + ("on_report still runs" if sidecar.hooks is not None else "its node file is still written")
             + " (OPS-9)")
    _say({"ready": True, "metrics_address": list(sidecar.metrics_address) if sidecar.metrics_address else None,
          "metrics_error": metrics_error})
    poll_interval_s = float(spec.get("poll_interval_s", 0.25))
    hook_timeout_s = float(spec.get("on_report_timeout_s", 10.0))
    finished = threading.Event()
    gone_since: list[float] = []

    def watchdog() -> None:
        while not finished.wait(0.1):
            if gone_since and time.monotonic() - gone_since[0] >= hook_timeout_s + EXIT_DEADLINE_S:
                _log(sidecar.host, f"its loop did not stop within {hook_timeout_s + EXIT_DEADLINE_S:g} s after its "
                     "trainers were gone; ending it (OPS-2)")
                os._exit(EXIT_FAILED)

    threading.Thread(target=watchdog, name="scout-ops-watchdog", daemon=True).start()
    while not stop.value and not sidecar.trainers_gone():
        try:
            sidecar.tick()
        except Exception as error:  # the metrics must not die of one bad read
            _log(sidecar.host, f"error in its loop (continuing): {error!r}")
        time.sleep(poll_interval_s)
    gone_since.append(time.monotonic())
    # On a stop signal the hooks get a short grace; when the trainers ended, their full time.
    sidecar.finish(time.monotonic() + (min(1.0, hook_timeout_s) if stop.value else hook_timeout_s))
    finished.set()
    return 0


if __name__ == "__main__":
    code = main()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
