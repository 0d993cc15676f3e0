"""Reports: one versioned JSON schema for every finding scout makes, one line each in
``run_dir/reports.jsonl`` (schema file: ``scout/reports/report.schema.json``).

Every report kind -- a hang or desync from the observers, an SDC or a straggler from replay, a
checkpoint trust change from the gate, a restart decision -- is built by :func:`make_record`
(which checks it against the schema's rules and refuses a bad field naming it) and appended by
:func:`append_record` (one ``write`` of one line under an exclusive lock, then ``fsync``: a
crash never leaves half a line, and several processes on one host can append to one file).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from scout.core.guards import whole_number
from scout.reports.kinds import Reason, ReportKind, Source

__all__ = [
    "KINDS",
    "REPORTS_FILE",
    "REPORT_BYTES_MAX",
    "SCHEMA",
    "SOURCES",
    "ReportError",
    "ReportKind",
    "append_hosts",
    "append_record",
    "make_record",
    "read_records",
    "record_line",
    "utc_now",
]

SCHEMA: Final = "scout.report/1"
REPORTS_FILE: Final = "reports.jsonl"
#: Every ``kind`` a report may have (:class:`~scout.reports.kinds.ReportKind` says what each means).
KINDS: Final = tuple(kind.value for kind in ReportKind)
SOURCES: Final = tuple(source.value for source in Source)
#: One report line is at most this long; a longer one is refused (a reader's memory is bounded).
REPORT_BYTES_MAX: Final = 1 << 20
#: A report file is read at most this far (scout report, restore).
REPORTS_FILE_BYTES_MAX: Final = 1 << 30
_REASON: Final = re.compile(r"^[a-z][a-z0-9_\-:.]*$")
_LOCK_TIMEOUT_S: Final = 5.0


class ReportError(ValueError):
    """A report that does not follow the schema; the message names the field and the value."""


def utc_now() -> str:
    """Now, as UTC ISO 8601 with milliseconds (the ``time`` field)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _int_list(name: str, value: object) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ReportError(f"report field {name!r} must be a list of ints, got {value!r}")
    out = []
    for item in value:
        if not whole_number(item) or item < 0:
            raise ReportError(f"report field {name!r} must hold ints >= 0, got {item!r}")
        out.append(int(item))
    return out


def make_record(
    kind: ReportKind | str,
    *,
    source: Source | str | None = None,
    reason: str,
    job_id: str,
    generation: int,
    ranks: Sequence[int] = (),
    hosts: Sequence[str] = (),
    step: int | None = None,
    evidence: Mapping[str, Any] | None = None,
    reporter_rank: int | None = None,
    time: str | None = None,
) -> dict[str, Any]:
    """One report in the ``scout.report/1`` schema. ``ranks`` are the global ranks at fault
    (empty when group-scoped), ``hosts`` their hosts, ``reason`` a stable code (lower case,
    ``[a-z0-9_-:.]``), ``evidence`` a kind-specific JSON object."""
    if kind not in KINDS:
        raise ReportError(f"report kind {kind!r} is not one of {', '.join(KINDS)}")
    kind = ReportKind(kind)
    if source is None:
        source = kind.source
    if source not in SOURCES:
        raise ReportError(f"report source {source!r} is not one of {', '.join(SOURCES)}")
    source = Source(source)
    if source is not kind.source:
        raise ReportError(f"report source {source.value!r} does not write kind {kind.value!r}: its source is "
                          f"{kind.source.value!r} (scout.reports.kinds)")
    if isinstance(reason, Reason):
        reason = reason.value  # the code itself: a record holds plain JSON values
    if not isinstance(reason, str) or not _REASON.match(reason) or len(reason) > 120:
        raise ReportError(f"report reason {reason!r} must be a stable code matching {_REASON.pattern} (<= 120)")
    if not isinstance(job_id, str) or not job_id:
        raise ReportError(f"report job_id must be a non-empty string, got {job_id!r}")
    if not whole_number(generation) or generation < 0:
        raise ReportError(f"report generation must be an int >= 0, got {generation!r}")
    if step is not None and (not whole_number(step) or step < 0):
        raise ReportError(f"report step must be an int >= 0 or None, got {step!r}")
    if reporter_rank is not None and (not whole_number(reporter_rank) or reporter_rank < 0):
        raise ReportError(f"report reporter_rank must be an int >= 0 or None, got {reporter_rank!r}")
    host_list = list(hosts)
    if not all(isinstance(host, str) for host in host_list):
        raise ReportError(f"report hosts must be strings, got {host_list!r}")
    if evidence is not None and not isinstance(evidence, Mapping):
        raise ReportError(f"report evidence must be a JSON object, got {type(evidence).__name__}")
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": kind.value,
        "source": source.value,
        "ranks": _int_list("ranks", ranks),
        "hosts": sorted(set(host_list)),
        "step": step,
        "reason": reason,
        "time": time or utc_now(),
        "job_id": job_id,
        "generation": generation,
        "reporter_rank": reporter_rank,
        "evidence": dict(evidence or {}),
    }
    line = json.dumps(record, sort_keys=True)
    if len(line) > REPORT_BYTES_MAX:
        raise ReportError(f"report of kind {kind.value!r} is {len(line)} bytes, over REPORT_BYTES_MAX={REPORT_BYTES_MAX}")
    return record


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    import time as clock

    deadline = clock.monotonic() + _LOCK_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if clock.monotonic() >= deadline:
                raise OSError(f"could not lock the report file within {_LOCK_TIMEOUT_S} s") from None
            clock.sleep(0.001)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def append_record(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one report line durably: one write under an exclusive lock, then fsync."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    if len(line) > REPORT_BYTES_MAX:
        raise ReportError(f"report line of {len(line)} bytes is over REPORT_BYTES_MAX={REPORT_BYTES_MAX}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with _locked(fd):
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {target}: {written} of {len(line)} bytes")
            os.fsync(fd)
    finally:
        os.close(fd)
    audit = os.environ.get("SCOUT_REPORT_AUDIT_FILE")
    if audit:  # tests: every report any process writes is validated against the schema at the end
        fd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every report in a reports file, in order. A missing file is no reports; a line that is
    not a JSON object (a torn write from a crash elsewhere) is skipped; the file is read at most
    ``REPORTS_FILE_BYTES_MAX`` bytes far."""
    target = Path(path)
    if not target.exists():
        return []
    if not target.is_file():
        raise ReportError(f"{target} is not a regular file; a reports file is a JSON-lines file")
    records: list[dict[str, Any]] = []
    with target.open("rb") as file:
        data = file.read(REPORTS_FILE_BYTES_MAX)
    for raw in data.splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("schema") == SCHEMA:
            records.append(value)
    return records


def record_line(record: Mapping[str, Any]) -> str:
    """One readable line for a person (stderr, ``scout report``)."""
    where = f" at step {record['step']}" if record.get("step") is not None else ""
    who = f" rank(s) {record['ranks']}" if record.get("ranks") else ""
    hosts = f" on {', '.join(record['hosts'])}" if record.get("hosts") else ""
    return f"scout: {record['kind']}{who}{hosts}{where}: {record['reason']}"


def append_hosts(path: str | os.PathLike[str], hosts: list[str]) -> None:
    """Add hosts to an exclude-hosts file (one per line, each once), durably."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with _locked(fd):
            known = set(os.pread(fd, 1 << 20, 0).decode("utf-8", "replace").split())
            new = [host for host in dict.fromkeys(hosts) if host and host not in known]
            if new:
                os.write(fd, "".join(f"{host}\n" for host in new).encode())
                os.fsync(fd)
    finally:
        os.close(fd)
