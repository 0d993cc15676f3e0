"""Where the ops files live in a run directory, and how they are written and read.

``run_dir/ops/`` holds small JSON files, each rewritten whole (write to a temporary name, then
``os.replace``: a reader sees the old or the new file, never half of one). They are state for
the sidecar and the page, not a record: no fsync, and a lost one is rewritten a second later.

- ``rank-<r>.json``: trainer rank r's own numbers (step, scout's costs, straggler ratios);
- ``rounds-<r>.json``: the observer of rank r, its round latencies (OPS-5);
- ``node-<host>-r<rank>.json``: the sidecar of a node (named by its host and its lowest rank),
  its ranks' progress and its metrics address.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Final

__all__ = ["OPS_DIR", "STATE_BYTES_MAX", "node_status_path", "rank_stats_path", "read_state", "rounds_path",
           "write_state"]

OPS_DIR: Final = "ops"
#: An ops file is read at most this far; a larger one is refused (a reader's memory is bounded).
STATE_BYTES_MAX: Final = 1 << 20
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")


def rank_stats_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / OPS_DIR / f"rank-{int(rank)}.json"


def rounds_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / OPS_DIR / f"rounds-{int(rank)}.json"


def node_status_path(run_dir: str | os.PathLike[str], host: str, lowest_rank: int) -> Path:
    """One file per sidecar (two launcher agents on one host are two nodes); in the host name
    anything but ``[A-Za-z0-9._-]`` becomes ``_``."""
    return Path(run_dir) / OPS_DIR / f"node-{_UNSAFE.sub('_', host)[:120] or 'host'}-r{int(lowest_rank)}.json"


def write_state(path: str | os.PathLike[str], value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON, atomically (readers never see a partial file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, sort_keys=True, separators=(",", ":")), encoding="utf-8")
    os.replace(temporary, target)


def read_state(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, too large or not a JSON object."""
    try:
        with open(path, "rb") as file:
            data = file.read(STATE_BYTES_MAX + 1)
    except OSError:
        return None
    if len(data) > STATE_BYTES_MAX:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
