"""The trainer's side of scout's ops (spec/ops.md): one collective at attach, the node's sidecar
started by its lowest rank, and each rank's small stats file.

    ops = NodeOps.start(config, run_dir=..., publisher=..., group=control_group, rank=..., host=...)
    ...
    ops.after_step(step, costs, trackers)          # once per job.step(); writes at most once a second
    ...
    ops.close()

:meth:`NodeOps.start` is collective over ``group`` (every rank calls it with the same
configuration) and returns None when neither ``metrics_port`` nor ``on_report`` is set. Nothing
here can stop training: a sidecar that fails to start is logged, and the job runs without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch.distributed as dist

from scout.observer.launch import _environment
from scout.observer.progress import ProgressPublisher, process_start_ticks
from scout.ops import paths

__all__ = ["NodeOps", "observer_rounds_path", "ops_enabled"]

logger = logging.getLogger("scout")

START_TIMEOUT_S: Final = 30.0
#: close() waits this long for the sidecar's last reads and hooks, then leaves it to end by
#: itself (OPS-2 bounds that).
CLOSE_WAIT_S: Final = 5.0
#: A rank rewrites its stats file at most this often.
STATS_INTERVAL_S: Final = 1.0
POLL_INTERVAL_S: Final = 0.25


def ops_enabled(config: Any) -> bool:
    return config.metrics_port is not None or config.on_report is not None


def observer_rounds_path(config: Any, run_dir: str | os.PathLike[str], rank: int) -> Path | None:
    """Where the rank's observer writes its round latencies: only when metrics are on."""
    return paths.rounds_path(run_dir, rank) if config.metrics_port is not None else None


def _node_key(host: str) -> str:
    """Which ranks share a node (and so its shared memory and process ids): the host name, the
    launcher's node index (torchrun's GROUP_RANK: two agents on one host are two nodes) and the
    kernel's boot id (two machines that report the same host name are not one node)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = ""
    return f"{host}|{os.environ.get('GROUP_RANK', '')}|{boot}"


def _straggler_values(rank: int, trackers: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """This rank's performance ratio (the median of its trail) and confirmation score in each
    straggler tracker that holds it."""
    out: dict[str, dict[str, Any]] = {}
    for kind, tracker in trackers.items():
        ranks = tuple(getattr(tracker, "ranks", ()))
        if tracker is None or rank not in ranks:
            continue
        position = ranks.index(rank)
        out[kind] = {"performance_ratio": tracker.performance_ratios()[position],
                     "score": int(tracker.state.scores[position]),
                     "confirmed": position in tracker.confirmed}
    return out


class NodeOps:
    """scout's ops on one rank: its stats file, and on the node's lowest rank the sidecar."""

    def __init__(self, *, rank: int, run_dir: Path, write_stats: bool, process: subprocess.Popen[bytes] | None,
                 metrics_address: tuple[str, int] | None) -> None:
        self.rank = rank
        self.run_dir = run_dir
        self.write_stats = write_stats
        self.process = process
        self.metrics_address = metrics_address
        self._first_s: float | None = None
        self._written_s = -STATS_INTERVAL_S

    @classmethod
    def start(cls, config: Any, *, run_dir: str | os.PathLike[str], publisher: ProgressPublisher, group: Any,
              rank: int, host: str) -> NodeOps | None:
        """Collective over ``group``. Starts the node's sidecar on its lowest rank."""
        if not ops_enabled(config):
            return None
        mine = {"rank": rank, "host": host, "node": _node_key(host), "record_name": publisher.name,
                "record_token": publisher.token.hex(), "pid": os.getpid(),
                "start_ticks": process_start_ticks(os.getpid()) or 0}
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, mine, group=group)
        local = sorted((entry for entry in gathered if entry["node"] == mine["node"]), key=lambda entry: entry["rank"])
        run_path = Path(run_dir)
        process, address = None, None
        if local[0]["rank"] == rank:
            spec = {"run_dir": str(run_path), "host": host, "job_id": publisher.identity.job_id,
                    "generation": publisher.identity.generation, "ranks": local,
                    "has_rank_zero": any(entry["rank"] == 0 for entry in local),
                    "metrics_port": config.metrics_port, "metrics_addr": config.metrics_addr,
                    "on_report": config.on_report, "on_report_timeout_s": config.on_report_timeout_s,
                    "poll_interval_s": POLL_INTERVAL_S}
            process, address = _start_sidecar(spec)
        return cls(rank=rank, run_dir=run_path, write_stats=config.metrics_port is not None, process=process,
                   metrics_address=address)

    def after_step(self, step: int, costs: Mapping[str, float], trackers: Mapping[str, Any]) -> None:
        """Once per ``job.step()``: rewrite this rank's stats file if a second has passed.
        ``trackers``: the straggler trackers by kind (``device``, ``communication``, ``loop``, ``forward``)."""
        if not self.write_stats:
            return
        now = time.monotonic()
        if self._first_s is None:
            # The first step's end starts the wall clock: a file written now would say 0 s, and
            # a ratio over 0 s is no ratio. The second step writes at once (``_written_s``), so a
            # rank that hangs a second after its start still has a replay cost on the metrics
            # page -- a reporter rank whose start-up took longer used to show none (OPS-1).
            self._first_s = now
            return
        if now - self._written_s < STATS_INTERVAL_S:
            return
        self._written_s = now
        value = {"rank": self.rank, "step": int(step), "wall_s": now - self._first_s, "costs": dict(costs),
                 "stragglers": _straggler_values(self.rank, trackers), "time": time.time()}
        try:
            paths.write_state(paths.rank_stats_path(self.run_dir, self.rank), value)
        except (OSError, TypeError, ValueError) as error:
            logger.warning("scout: could not write rank %d's ops stats: %s", self.rank, error)
            self.write_stats = False

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """The sidecar ends by itself once every trainer of its node closed its record (OPS-2);
        wait for that a bounded time, so its last hooks run before this process exits."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            logger.info("scout: the ops sidecar (pid %d) still runs %.0f s after close; it ends once its node's "
                        "trainers are gone", process.pid, wait_s)
        if process.stdout is not None:
            with contextlib.suppress(OSError):
                process.stdout.close()
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()


def _start_sidecar(spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes] | None, tuple[str, int] | None]:
    """Start ``python -m scout.ops.sidecar`` and wait (bounded) until it serves; on failure log
    why and return no process: the job runs on without metrics or hooks."""
    process = subprocess.Popen([sys.executable, "-m", "scout.ops.sidecar"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=_environment(), close_fds=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write((json.dumps(spec, sort_keys=True) + "\n").encode())
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        line = process.stdout.readline() if ready else b""
        message = json.loads(line) if line.strip() else {}
    except (OSError, ValueError) as error:
        message = {"error": str(error)}
    if not message.get("ready"):
        why = message.get("error") or f"no answer within {START_TIMEOUT_S:g} s (exit code {process.poll()})"
        logger.warning("scout: the ops sidecar on %s did not start (%s); metrics and on_report are off on this node",
                       spec["host"], why)
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5.0)
        return None, None
    address = message.get("metrics_address")
    if message.get("metrics_error"):
        # OPS-9: only the metrics are off; the sidecar runs on_report (and writes its node file).
        logger.warning("scout: the ops sidecar on %s %s; metrics are off on this node%s (pick another metrics_port, "
                       "or 0 for any free port)", spec["host"], message["metrics_error"],
                       ", on_report still runs" if spec.get("on_report") else "")
    if address:
        logger.info("scout: metrics of %s at http://%s:%d/metrics", spec["host"], address[0], address[1])
    return process, (str(address[0]), int(address[1])) if address else None
