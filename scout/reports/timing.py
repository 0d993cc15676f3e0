"""Timing observations: one line per loop check in ``run_dir/timing.jsonl`` (spec/replay.md
LOOP-6), so that a check that confirms nobody still leaves its ratios where a person can read
them (``scout report``).

It is observation, not a finding: nothing is decided from it, so it is a file of its own and
never part of ``reports.jsonl`` (``restore()`` classifies attempts from the reports). Only the
pipeline's reporter rank writes it (:class:`TimingLog`, one process), with one ``write`` of a
whole line per record and no fsync; a crash leaves at most a torn last line, which
:func:`read_timing` skips and counts. The file is bounded in lines and bytes across attempts.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.reports import ReportError, utc_now

__all__ = [
    "TIMING_FILE",
    "TIMING_FILE_BYTES_MAX",
    "TIMING_KINDS",
    "TIMING_LINES_MAX",
    "TIMING_SCHEMA",
    "TimingLog",
    "TimingReading",
    "make_timing_record",
    "read_timing",
    "timing_arguments",
]

logger = logging.getLogger("scout")

TIMING_SCHEMA: Final = "scout.timing/1"
TIMING_FILE: Final = "timing.jsonl"
#: LOOP-6: what kinds of check write lines (the replay checks' timing is not written).
TIMING_KINDS: Final = ("loop",)
#: LOOP-6: at most this many lines per file (100 000 checks: a million steps at the default
#: loop_check_steps of 10), counted across attempts ...
TIMING_LINES_MAX: Final = 100_000
#: ... and at most this many bytes (a line of a 1000-rank group is about 60 kB).
TIMING_FILE_BYTES_MAX: Final = 256 << 20
_COUNT_CHUNK_BYTES: Final = 1 << 20


def _number(value: object) -> float | None:
    """A finite float, or None (JSON has no NaN, and a ratio of nothing is nothing)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def timing_arguments(
    kind: str,
    *,
    step: int,
    group: str,
    ranks: Sequence[int],
    times_ms: Sequence[float | None],
    evidence: Sequence[float | None],
    confirmed: Sequence[int],
    status: str,
    reason: str | None,
    slow_ratio: float,
) -> dict[str, Any]:
    """LOOP-6: one check's observation of one peer group, without the job's own fields (those
    :func:`make_timing_record` adds). ``times_ms`` and ``evidence`` are by peer position;
    ``confirmed`` are global ranks. The performance ratio is ``exp(evidence)`` (STRAG-2)."""
    if kind not in TIMING_KINDS:
        raise ReportError(f"timing kind {kind!r} is not one of {', '.join(TIMING_KINDS)}")
    if len(times_ms) != len(ranks) or len(evidence) != len(ranks):
        raise ReportError(f"a timing record needs one time and one evidence per rank of {list(ranks)}: got "
                          f"{len(times_ms)} times and {len(evidence)} evidence values")
    logs = [_number(value) for value in evidence]
    return {
        "kind": kind,
        "step": int(step),
        "group": str(group),
        "ranks": [int(rank) for rank in ranks],
        "times_ms": [_number(value) for value in times_ms],
        "performance_ratio": [None if log is None else math.exp(log) for log in logs],
        "evidence": logs,
        "confirmed": sorted(int(rank) for rank in confirmed),
        "status": str(status),
        "reason": reason,
        "slow_ratio": float(slow_ratio),
    }


def make_timing_record(arguments: Mapping[str, Any], *, job_id: str, generation: int,
                       reporter_rank: int | None, time: str | None = None) -> dict[str, Any]:
    """A ``scout.timing/1`` record: the check's :func:`timing_arguments` and the job's fields."""
    if not isinstance(job_id, str) or not job_id:
        raise ReportError(f"timing record job_id must be a non-empty string, got {job_id!r}")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ReportError(f"timing record generation must be an int >= 0, got {generation!r}")
    return {"schema": TIMING_SCHEMA, "time": time or utc_now(), "job_id": job_id, "generation": generation,
            "reporter_rank": reporter_rank, **arguments}


def _count_lines(path: Path) -> tuple[int, int]:
    """Lines and bytes already in ``path`` (an earlier attempt's), read at most the byte bound."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0, 0
    lines, left = 0, min(size, TIMING_FILE_BYTES_MAX)
    with path.open("rb") as file:
        while left > 0 and (chunk := file.read(min(_COUNT_CHUNK_BYTES, left))):
            lines += chunk.count(b"\n")
            left -= len(chunk)
    return lines, size


class TimingLog:
    """The reporter rank's ``timing.jsonl`` (LOOP-6): appends whole lines until a bound is
    reached, then warns once and writes nothing more. One writer process per file."""

    def __init__(self, path: str | os.PathLike[str], *, lines_max: int = TIMING_LINES_MAX,
                 bytes_max: int = TIMING_FILE_BYTES_MAX) -> None:
        for name, value in (("lines_max", lines_max), ("bytes_max", bytes_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TimingLog.{name} must be an int >= 1, got {value!r}")
        self.path = Path(path)
        self.lines_max = lines_max
        self.bytes_max = bytes_max
        self.lines: int | None = None  # counted at the first write (an earlier attempt's lines)
        self.bytes = 0
        self.full = False

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` as one line; False when the file is full (or cannot be written:
        a warning, and the job goes on)."""
        if self.full:
            return False
        line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
        if self.lines is None:
            self.lines, self.bytes = _count_lines(self.path)
        if self.lines + 1 > self.lines_max or self.bytes + len(line) > self.bytes_max:
            self.full = True
            logger.warning("scout: %s holds %d lines (%d bytes), the bound is %d lines and %d bytes "
                           "(spec/replay.md LOOP-6): no more timing lines are written in this attempt",
                           self.path, self.lines, self.bytes, self.lines_max, self.bytes_max)
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)  # one write of the whole line: a crash tears the last line only
            finally:
                os.close(fd)
        except OSError as error:
            self.full = True
            logger.warning("scout: could not append to %s (%s): no more timing lines are written", self.path, error)
            return False
        self.lines += 1
        self.bytes += written
        return written == len(line)


@attrs.frozen
class TimingReading:
    """What :func:`read_timing` found: the records in file order and how many lines it skipped."""

    records: tuple[dict[str, Any], ...]
    skipped: int


def read_timing(path: str | os.PathLike[str]) -> TimingReading:
    """Every ``scout.timing/1`` record of ``path`` (a missing file has none), read at most
    ``TIMING_FILE_BYTES_MAX`` bytes far; a line that is not such a record (a torn last line) is
    skipped and counted."""
    target = Path(path)
    if not target.exists():
        return TimingReading((), 0)
    if not target.is_file():
        raise ReportError(f"{target} is not a regular file; a timing file is a JSON-lines file")
    with target.open("rb") as file:
        data = file.read(TIMING_FILE_BYTES_MAX)
    records: list[dict[str, Any]] = []
    skipped = 0
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            skipped += 1
            continue
        if (isinstance(value, dict) and value.get("schema") == TIMING_SCHEMA and isinstance(value.get("step"), int)
                and isinstance(value.get("ranks"), list)
                and all(isinstance(value.get(f), list) and len(value[f]) == len(value["ranks"])
                        for f in ("times_ms", "performance_ratio", "evidence"))):
            records.append(value)
        else:
            skipped += 1
    return TimingReading(tuple(records), skipped)
