"""Timing observations: one line per straggler check -- loop, replay device, replay
communication -- in ``run_dir/timing.jsonl`` (spec/replay.md LOOP-6), so that a check that
confirms nobody still leaves its ratios where a person can read them (``scout report``).

It is observation, not a finding: nothing is decided from it, so it is a file of its own and
never part of ``reports.jsonl`` (``restore()`` classifies attempts from the reports). Only the
pipeline's reporter rank writes it (:class:`TimingLog`, one process), with one ``write`` of a
whole line per record and no fsync; a crash leaves at most a torn last line, which
:func:`read_timing` skips and counts, and the next append starts on a fresh line (spec/ops.md
OPS-11). A line tagged ``scout.timing/1`` whose fields have the wrong types is skipped and
counted the same way (OPS-12). The file is bounded in lines of each kind (so the replay's
checks, several per loop check, cannot crowd the loop's out) and in bytes, across attempts.
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

from scout.core.guards import whole_number
from scout.reports import ReportError, fresh_line_prefix, utc_now
from scout.reports.kinds import STRAGGLER_KINDS

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
#: LOOP-6: the kinds of check that write lines: the kinds of straggler (scout.reports.kinds).
TIMING_KINDS: Final = STRAGGLER_KINDS
#: LOOP-6: at most this many lines of each kind per file (100 000 loop checks: a million steps
#: at the default loop_check_steps of 10), counted across attempts ...
TIMING_LINES_MAX: Final = 100_000
#: ... and at most this many bytes (a line of a 1000-rank group is about 60 kB).
TIMING_FILE_BYTES_MAX: Final = 256 << 20
_LOG_RATIO_MAX: Final = 700.0


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
    # exp overflows past ~709 nepers; no two times a clock gives are that far apart.
    logs = [None if log is None or abs(log) > _LOG_RATIO_MAX else log for log in logs]
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
    if not whole_number(generation) or generation < 0:
        raise ReportError(f"timing record generation must be an int >= 0, got {generation!r}")
    return {"schema": TIMING_SCHEMA, "time": time or utc_now(), "job_id": job_id, "generation": generation,
            "reporter_rank": reporter_rank, **arguments}


def _kind_marker(kind: str) -> bytes:
    return json.dumps({"kind": kind}, sort_keys=True)[1:-1].encode()  # as a sorted-keys line holds it


def _count_lines(path: Path, bytes_max: int) -> tuple[dict[str, int], int]:
    """Lines of each kind and bytes already in ``path`` (an earlier attempt's), read at most
    ``bytes_max`` bytes far (past it nothing more is written anyway)."""
    counts = dict.fromkeys(TIMING_KINDS, 0)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return counts, 0
    markers = {kind: _kind_marker(kind) for kind in TIMING_KINDS}
    read = 0
    with path.open("rb") as file:
        for line in file:
            read += len(line)
            if read > bytes_max:
                break
            for kind, marker in markers.items():
                if marker in line:
                    counts[kind] += 1
                    break
    return counts, size


class TimingLog:
    """The reporter rank's ``timing.jsonl`` (LOOP-6): appends whole lines until a bound is
    reached -- ``lines_max`` lines of a kind, or ``bytes_max`` bytes in all -- then warns once
    (per kind) and writes nothing more of it. One writer process per file."""

    def __init__(self, path: str | os.PathLike[str], *, lines_max: int = TIMING_LINES_MAX,
                 bytes_max: int = TIMING_FILE_BYTES_MAX) -> None:
        for name, value in (("lines_max", lines_max), ("bytes_max", bytes_max)):
            if not whole_number(value) or value < 1:
                raise ValueError(f"TimingLog.{name} must be an int >= 1, got {value!r}")
        self.path = Path(path)
        self.lines_max = lines_max
        self.bytes_max = bytes_max
        self.lines: dict[str, int] | None = None  # by kind, counted once (count_existing)
        self.bytes = 0
        self.full: set[str] = set()  # kinds that write no more (all of them once the bytes are spent)

    def count_existing(self) -> dict[str, int]:
        """The lines of each kind an earlier attempt left (read once, up to ``bytes_max`` bytes).
        The job calls it at attach, so a restart does not pay for the scan inside a training step."""
        if self.lines is None:
            self.lines, self.bytes = _count_lines(self.path, self.bytes_max)
        return self.lines

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` as one line; False when its kind is full (or the file cannot be
        written: a warning, and the job goes on)."""
        kind = record.get("kind")
        if kind not in TIMING_KINDS:
            raise ReportError(f"timing kind {kind!r} is not one of {', '.join(TIMING_KINDS)}")
        if kind in self.full:
            return False
        line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
        lines = self.count_existing()
        if self.bytes + len(line) > self.bytes_max:
            self.full.update(TIMING_KINDS)
            logger.warning("scout: %s holds %d bytes, the bound is %d (spec/replay.md LOOP-6): no more timing lines "
                           "are written in this attempt", self.path, self.bytes, self.bytes_max)
            return False
        if lines[kind] + 1 > self.lines_max:
            self.full.add(kind)
            logger.warning("scout: %s holds %d %s lines, the bound is %d (spec/replay.md LOOP-6): no more are written "
                           "in this attempt", self.path, lines[kind], kind, self.lines_max)
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                # One write of the whole line (a crash tears the last line only), on a fresh line
                # after a torn one (OPS-11).
                data = fresh_line_prefix(fd, self.path) + line
                written = os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as error:
            self.full.update(TIMING_KINDS)
            logger.warning("scout: could not append to %s (%s): no more timing lines are written", self.path, error)
            return False
        lines[kind] += 1
        self.bytes += written
        return written == len(data)


def _natural(value: object) -> bool:
    return whole_number(value) and value >= 0


def _numbers(value: object, length: int) -> bool:
    return isinstance(value, list) and len(value) == length and all(
        item is None or (isinstance(item, (int, float)) and not isinstance(item, bool)) for item in value)


def _timing_record(value: object) -> bool:
    """OPS-12: a ``scout.timing/1`` record with every field the readers use of its type."""
    if not isinstance(value, dict) or value.get("schema") != TIMING_SCHEMA:
        return False
    ranks = value.get("ranks")
    if not isinstance(ranks, list) or not all(_natural(rank) for rank in ranks):
        return False
    slow_ratio = value.get("slow_ratio")
    confirmed = value.get("confirmed", [])
    return (value.get("kind") in TIMING_KINDS and _natural(value.get("step"))
            and (value.get("generation") is None or _natural(value.get("generation")))
            and all(_numbers(value.get(field), len(ranks)) for field in ("times_ms", "performance_ratio", "evidence"))
            and (slow_ratio is None or (isinstance(slow_ratio, (int, float)) and not isinstance(slow_ratio, bool)))
            and isinstance(confirmed, list) and all(_natural(rank) for rank in confirmed))


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
        except (ValueError, RecursionError):
            skipped += 1
            continue
        if _timing_record(value):
            records.append(value)
        else:
            skipped += 1
    return TimingReading(tuple(records), skipped)
