"""Reports: one versioned JSON schema for every finding scout makes, one line each in
``run_dir/reports.jsonl`` (schema file: ``scout/reports/report.schema.json``).

Every report kind -- a hang or desync from the observers, an SDC or a straggler from replay, a
checkpoint trust change from the gate, a restart decision -- is built by :func:`make_record`
(which checks it against the schema's rules and refuses a bad field naming it) and appended by
:func:`append_record` (one ``write`` of one line under an exclusive lock, then ``fsync``; several
processes on one host can append to one file). A crash -- or a full disk -- can still leave a
torn last line: the next append starts on a fresh line, so the torn one costs only itself
(spec/ops.md OPS-11). Readers take a line as a report only when :func:`parse_record` accepts it
(every field of the schema with its type), so one damaged or forged line never stops a reader
(OPS-12); :func:`read_reports` also counts the lines it skipped.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import attrs

from scout.core.guards import whole_number
from scout.core.io_errors import name_write_error
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
    "ReportReading",
    "append_record",
    "fresh_line_prefix",
    "make_record",
    "parse_record",
    "read_records",
    "read_reports",
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


def fresh_line_prefix(fd: int, path: str | os.PathLike[str]) -> bytes:
    """OPS-11: ``b"\\n"`` when the regular file open on ``fd`` (for appending, at ``path``) does
    not end with a newline -- a line torn by a crash or a full disk -- so that what is appended
    next starts a line of its own instead of being glued to the torn one (and lost with it);
    else ``b""``. The last byte is read through a descriptor of its own, so ``fd`` stays
    write-only (a FIFO or a device in the file's place is written as before, never read)."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_size == 0:
        return b""
    reader = os.open(path, os.O_RDONLY)
    try:
        last = os.pread(reader, 1, status.st_size - 1)
    finally:
        os.close(reader)
    return b"" if last in (b"\n", b"") else b"\n"


def _write_synced(fd: int, data: bytes) -> None:
    """One write of ``data`` at the end of ``fd``, then fsync; a short write is an OSError
    (ENOSPC when part was written -- a full disk -- else EIO)."""
    written = os.write(fd, data)
    if written != len(data):
        raise OSError(errno.ENOSPC if written else errno.EIO, f"short write: {written} of {len(data)} bytes")
    os.fsync(fd)


def _raise_named(error: OSError, target: Path, doing: str) -> NoReturn:
    """OPS-13: re-raise ``error`` as the OSError that names ``target`` and what was being done."""
    named = name_write_error(error, target, doing)
    if named is error:
        raise error
    raise named from error


def append_record(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one report line durably: one write under an exclusive lock, then fsync. It starts
    on a fresh line (OPS-11). A failure raises an OSError that names the file (OPS-13)."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    if len(line) > REPORT_BYTES_MAX:
        raise ReportError(f"report line of {len(line)} bytes is over REPORT_BYTES_MAX={REPORT_BYTES_MAX}")
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            with _locked(fd):
                _write_synced(fd, fresh_line_prefix(fd, target) + line)
        finally:
            os.close(fd)
    except OSError as error:
        _raise_named(error, target, "appending a report")
    audit = os.environ.get("SCOUT_REPORT_AUDIT_FILE")
    if audit:  # tests: every report any process writes is validated against the schema at the end
        fd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _natural(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return whole_number(value) and value >= 0


def parse_record(raw: bytes | str) -> dict[str, Any] | None:
    """OPS-12: the report on one line of a reports file, or None when the line is not one --
    torn, not JSON, another schema, or a ``scout.report/1`` tag on fields of the wrong type
    (every field :func:`make_record` writes is checked, except what ``evidence`` holds, which
    each kind defines). Readers skip (and count) what this refuses instead of failing on it."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("schema") != SCHEMA:
        return None
    ranks, hosts = value.get("ranks"), value.get("hosts")
    valid = (
        # A kind or source this version does not know may come from a newer one: a string is
        # kept (readers ask ReportKind and pass over what it does not name).
        isinstance(value.get("kind"), str)
        and isinstance(value.get("source"), str)
        and isinstance(value.get("reason"), str)
        and isinstance(value.get("time"), str)
        and isinstance(value.get("job_id"), str)
        and isinstance(ranks, list) and all(_natural(rank) for rank in ranks)
        and isinstance(hosts, list) and all(isinstance(host, str) for host in hosts)
        and _natural(value.get("step"), optional=True)
        and _natural(value.get("generation"))
        and _natural(value.get("reporter_rank"), optional=True)
        and isinstance(value.get("evidence"), dict)
    )
    return value if valid else None


@attrs.frozen
class ReportReading:
    """What :func:`read_reports` found: the reports in file order, and the non-empty lines it
    skipped (torn by a crash or a full disk, or not ``scout.report/1`` records: OPS-12)."""

    records: tuple[dict[str, Any], ...]
    skipped: int


def read_reports(path: str | os.PathLike[str]) -> ReportReading:
    """Every report in a reports file, in order, and the lines skipped. A missing file is no
    reports; the file is read line by line, at most ``REPORTS_FILE_BYTES_MAX`` bytes far."""
    target = Path(path)
    if not target.exists():
        return ReportReading((), 0)
    if not target.is_file():
        raise ReportError(f"{target} is not a regular file; a reports file is a JSON-lines file")
    records: list[dict[str, Any]] = []
    skipped = 0
    read = 0
    with target.open("rb") as file:
        for raw in file:
            read += len(raw)
            if read > REPORTS_FILE_BYTES_MAX:
                break
            if not raw.strip():
                continue
            record = parse_record(raw)
            if record is None:
                skipped += 1
            else:
                records.append(record)
    return ReportReading(tuple(records), skipped)


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every report in a reports file, in order (:func:`read_reports` without the count of
    skipped lines)."""
    return list(read_reports(path).records)


def record_line(record: Mapping[str, Any]) -> str:
    """One readable line for a person (stderr, ``scout report``)."""
    where = f" at step {record['step']}" if record.get("step") is not None else ""
    who = f" rank(s) {record['ranks']}" if record.get("ranks") else ""
    hosts = f" on {', '.join(record['hosts'])}" if record.get("hosts") else ""
    return f"scout: {record['kind']}{who}{hosts}{where}: {record['reason']}"


def append_hosts(path: str | os.PathLike[str], hosts: list[str]) -> None:
    """Add hosts to an exclude-hosts file (one per line, each once), durably; on a fresh line
    (OPS-11). A failure raises an OSError that names the file (OPS-13)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            with _locked(fd):
                known = set(os.pread(fd, 1 << 20, 0).decode("utf-8", "replace").split())
                new = [host for host in dict.fromkeys(hosts) if host and host not in known]
                if new:
                    _write_synced(fd, fresh_line_prefix(fd, target) + "".join(f"{host}\n" for host in new).encode())
        finally:
            os.close(fd)
    except OSError as error:
        _raise_named(error, target, "adding hosts")
