"""The durable gate manifest: the one I/O module of :mod:`scout.gate` (docs/design.md §1, 2.3).

One writer persists the gate's state and every trust transition; any rank reads it; a job that
restarts resumes its gate from it. The payload is an opaque JSON object (the gate's codec makes
it); this module only makes it durable, keeps a second record of every trust transition, and
tells a good file from a damaged or missing one. The gate-specific reading of what survives is
:mod:`scout.gate.fold`. Standard library only, so a reader needs nothing but Python.

Theory of operation (spec/gate.md GATE-30..34; docs/gate.md, "The manifest on disk"):

- Every commit writes a new *generation* ``manifest.<generation>.json`` (12 digits), in four
  steps: write a temporary file in the same directory, fsync it, ``os.replace`` it onto its
  final name, fsync the directory. A commit counts once the directory fsync returned; a crash
  at any earlier point leaves either no new file or a complete one (GATE-M1).
- A file is ``MAGIC sha256=<hex> bytes=<n>`` on its first line, then ``n`` bytes of JSON. The
  digest covers those bytes exactly, so a torn write or a flipped bit anywhere is detected
  (GATE-M2). The JSON holds ``format_version``, ``job_id``, ``generation`` and the payload.
- After the generation is durable the writer appends the commit's trust transitions to the
  append-only ``trust.log`` (one checksummed line each, fsynced), then replaces ``manifest.head``
  (the newest generation's number and digest). Both are second records written *after* the
  generation, so a crash between the steps leaves them behind the generations, never ahead: a
  generation they name that is absent or does not verify was lost, not torn (GATE-31).
- Readers read the head, then the log, then every generation file (in that order: whatever the
  head or the log name was durable before they named it, and the newest generation is never
  pruned, so a reader racing the writer cannot mistake a commit for a loss). They get a
  :class:`ManifestSet`: every good generation, the skipped ones, the log, and the generations
  that are *lost* -- named by a damaged or set-aside file, the head or the log, and newer than
  the newest good one. A lost generation means the reader must fail closed (GATE-31).
- Every file is read with a size cap, as a regular file only (a FIFO or a device is refused
  before any read), and a permission error is one line naming the file (GATE-34).
- A verified file of another job, or of a newer format, is an error naming the value, never a
  fallback: silently using an older generation there would hide a misconfiguration (GATE-M4).
- One writer: :class:`ManifestWriter` holds an exclusive ``flock`` on ``.writer.lock`` for its
  lifetime (released by the kernel if the writer dies). On opening it moves damaged newer
  generation files aside (``*.damaged``, still a witness of the loss), cuts a torn last line off
  the log and removes stale temporary files; its next generation number is above every number
  any file names, so no number is ever reused (GATE-32).
- A failed commit removes its temporary file and changes nothing in memory; the same commit
  can be retried. A commit whose generation was renamed into place before the failure has used
  its number, and the retry takes the next one (GATE-33).

What is tested, and what is assumed. A crash of the writing process is tested with real
processes killed by SIGKILL between every pair of steps and at random points
(``tests/unit/test_manifest_crash.py``). A crash of the machine (power loss, kernel panic) cannot
be staged here: what is tested is the order of durability calls a commit makes before it returns
-- the file fsynced whole, then renamed, then the directory fsynced
(``tests/unit/test_manifest_durability.py``, which intercepts the calls). That this order
survives a machine crash is the POSIX contract of fsync and rename, assumed of the file system
and storage below, not tested.
Loss and damage of every file at every generation: ``tests/unit/test_manifest_damage.py``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from scout.core.guards import whole_number
from scout.core.io_errors import name_write_error

__all__ = [
    "FORMAT_VERSION",
    "HEAD_NAME",
    "LOG_NAME",
    "MAX_FILE_BYTES",
    "HeadRecord",
    "LoadedManifest",
    "LostGeneration",
    "ManifestBusy",
    "ManifestDamaged",
    "ManifestError",
    "ManifestFailClosedWarning",
    "ManifestFallbackWarning",
    "ManifestFormatTooNew",
    "ManifestJobMismatch",
    "ManifestRepairWarning",
    "ManifestSet",
    "ManifestUnreadable",
    "ManifestWriter",
    "SkippedFile",
    "WRITE_STAGES",
    "decode_manifest",
    "encode_manifest",
    "generation_path",
    "load_manifest",
    "read_manifest_file",
    "read_manifest_set",
    "read_regular_file",
]

#: The body format this code writes and the newest it reads.
FORMAT_VERSION: Final = 1
MAGIC: Final = "scout-gate-manifest"
HEAD_MAGIC: Final = "scout-gate-head"
LOG_MAGIC: Final = "scout-trust"
HEAD_NAME: Final = "manifest.head"
LOG_NAME: Final = "trust.log"
#: Every manifest file is read with this cap unless the caller gives another (GATE-34). A gate
#: state grows by a few KB per checkpoint; a quarter GiB is far above any real manifest and far
#: below what would hurt a training host.
MAX_FILE_BYTES: Final = 256 * 2**20
_HEADER_RE: Final = re.compile(rb"\A([a-z-]+) sha256=([0-9a-f]{64}) bytes=([0-9]{1,12})\n")
_LOG_LINE_RE: Final = re.compile(rb"\Ascout-trust sha256=([0-9a-f]{64}) (\{.*\})\Z")
_NAME_RE: Final = re.compile(r"\Amanifest\.([0-9]{12})\.json\Z")
_ASIDE_RE: Final = re.compile(r"\Amanifest\.([0-9]{12})\.json\.damaged\Z")
_TEMP_PREFIX: Final = ".manifest."
_LOCK_NAME: Final = ".writer.lock"
_DAMAGED_SUFFIX: Final = ".damaged"
# A header line is short; anything longer is not a manifest.
_HEADER_BYTES_MAX: Final = 128
GENERATION_MAX: Final = 10**12 - 1
# A reader that finds a listed generation gone (pruned under it) lists the directory again, at
# most this many times in all; pruning only ever removes generations older than the newest.
_LIST_ATTEMPTS: Final = 3
#: The points between write steps where a test hook may pause, fail or kill the writer.
WRITE_STAGES: Final = ("temp-written", "temp-fsynced", "renamed", "dir-fsynced", "log-appended",
                       "head-written", "pruned")

WriteHook = Callable[[str, int], None]


class ManifestError(RuntimeError):
    """Base class of every manifest error; the message names the file and the value."""


class ManifestDamaged(ManifestError):
    """No generation in the directory verifies (torn, truncated or bit-flipped files), or none
    is left while the head or the trust log name one."""


class ManifestUnreadable(ManifestError):
    """A manifest file cannot be read at all: permissions, not a regular file, over the cap."""


class ManifestJobMismatch(ManifestError):
    """A verified manifest belongs to another job."""


class ManifestFormatTooNew(ManifestError):
    """A verified manifest was written in a newer format than this code reads."""


class ManifestBusy(ManifestError):
    """Another writer holds the directory."""


class ManifestFallbackWarning(UserWarning):
    """A newer generation was damaged and an older good one was used."""


class ManifestFailClosedWarning(ManifestFallbackWarning):
    """The newest generation is lost: readers fail closed (GATE-31)."""


class ManifestRepairWarning(UserWarning):
    """A second record (trust log, head) could not be written or read; the generations are
    intact and the writer repairs it at its next commit."""


@dataclass(frozen=True)
class SkippedFile:
    path: Path
    why: str
    generation: int = 0


@dataclass(frozen=True)
class LoadedManifest:
    """One good generation, and (for the newest) the newer files that were skipped (damaged)."""

    path: Path
    generation: int
    job_id: str
    format_version: int
    payload: dict[str, Any]
    skipped: tuple[SkippedFile, ...] = field(default=())
    sha256: str = ""


@dataclass(frozen=True)
class HeadRecord:
    """``manifest.head``: the newest generation the writer committed, and its body's digest."""

    generation: int
    sha256: str


@dataclass(frozen=True)
class LostGeneration:
    """A generation some file names that no good file holds, newer than the newest good one."""

    generation: int
    why: str


@dataclass(frozen=True)
class ManifestSet:
    """Everything readable in a manifest directory (GATE-30, GATE-31)."""

    directory: Path
    good: tuple[LoadedManifest, ...] = ()  # newest first
    skipped: tuple[SkippedFile, ...] = ()  # generation files that do not verify, newest first
    head: HeadRecord | None = None
    log: tuple[dict[str, Any], ...] = ()  # verified trust-log records, in file order
    problems: tuple[str, ...] = ()  # a damaged head, bad log lines: second records only
    lost: tuple[LostGeneration, ...] = ()
    highest_named: int = 0  # the highest generation number any file names
    named_anything: bool = False  # any generation file, head or log exists

    @property
    def newest(self) -> LoadedManifest | None:
        return self.good[0] if self.good else None

    @property
    def lost_reason(self) -> str | None:
        """Why the reader must fail closed, or None (GATE-31)."""
        if not self.lost:
            return None
        return "; ".join(f"generation {lost.generation}: {lost.why}" for lost in self.lost)


def generation_path(directory: Path, generation: int) -> Path:
    return directory / f"manifest.{generation:012d}.json"


def _canonical_json(value: object) -> bytes:
    # sort_keys + indent: deterministic bytes that a person can still read with `less`.
    return (json.dumps(value, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode(
        "ascii"
    )


def _framed(magic: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return f"{magic} sha256={digest} bytes={len(body)}\n".encode("ascii") + body


def encode_manifest(job_id: str, generation: int, payload: Mapping[str, Any]) -> bytes:
    """The exact bytes of one generation file."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
    if not (whole_number(generation) and 1 <= generation <= GENERATION_MAX):
        raise ValueError(f"generation must be an int in 1..{GENERATION_MAX}, got {generation!r}")
    if not isinstance(payload, Mapping):
        raise ValueError(f"manifest payload must be a JSON object (a mapping), got {type(payload).__name__}")
    document = {
        "format_version": FORMAT_VERSION,
        "job_id": job_id,
        "generation": generation,
        "payload": dict(payload),
    }
    try:
        body = _canonical_json(document)
    except (TypeError, ValueError) as error:
        raise ValueError(f"manifest payload is not plain JSON (generation {generation}): {error}") from error
    data = _framed(MAGIC, body)
    # What is written is what is read back: the reader's framing and digest accept these bytes (a
    # change that broke the pair would otherwise surface only as a "damaged" manifest after a
    # restart). 2.4 ms on a 1.7 MB manifest whose encoding takes 120 ms; parsing the body again
    # (another 100 ms) is left out.
    try:
        read_back = _unframe(data, MAGIC)
    except _Damaged as error:
        raise AssertionError(f"a manifest generation does not read back as written: {error}") from None
    assert read_back == body
    return data


class _Damaged(Exception):
    """One file failed verification or could not be read; the reader decides whether that is
    fatal."""


def _unframe(data: bytes, magic: str) -> bytes:
    header = _HEADER_RE.match(data[:_HEADER_BYTES_MAX])
    if header is None or header.group(1).decode("ascii") != magic:
        raise _Damaged(f"first line is not '{magic} sha256=<64 hex> bytes=<n>' (torn or not a {magic} file)")
    body = data[header.end() :]
    declared_bytes = int(header.group(3))
    if len(body) != declared_bytes:
        raise _Damaged(f"body is {len(body)} bytes, header says {declared_bytes} (truncated or extended)")
    digest = hashlib.sha256(body).hexdigest()
    if digest != header.group(2).decode("ascii"):
        raise _Damaged(f"sha256 of the body is {digest}, header says {header.group(2).decode('ascii')} (altered)")
    return body


class _Undecodable(ValueError):
    """A verified body that is not JSON this reader can hold (GATE-38)."""


#: GATE-38: the deepest nesting a manifest document may have. scout writes 12 levels (a
#: certificate inside a checkpoint entry inside the payload; measured on tests/gate_story.py).
#: The bound is checked on the raw text before parsing: deep nesting is damage, never a
#: RecursionError.
NESTING_MAX: Final = 64


_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _nesting_depth(body: bytes) -> int:
    """The deepest bracket nesting of a JSON text, strings left out (numpy: a manifest may be
    hundreds of MiB)."""
    import numpy as np

    codes = np.frombuffer(_JSON_STRING.sub(b'""', body), dtype=np.uint8)
    steps = (codes == ord("[")).astype(np.int64) + (codes == ord("{")) - (codes == ord("]")) - (codes == ord("}"))
    return int(np.cumsum(steps).max(initial=0))


def _json_document(body: bytes) -> Any:
    """Parse a verified JSON body; any failure -- not ASCII, not JSON, nesting deeper than
    ``NESTING_MAX``, an integer too long for Python to convert -- is :class:`_Undecodable`, so
    the reader treats the file as damaged and fails closed instead of crashing (GATE-38)."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError as error:
        raise _Undecodable(f"not ASCII ({error.reason} at byte {error.start})") from None
    depth = _nesting_depth(body)
    if depth > NESTING_MAX:
        raise _Undecodable(f"nested {depth} levels deep, more than {NESTING_MAX}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:  # JSONDecodeError; int digits over the limit
        raise _Undecodable(str(error)[:200]) from None


def _document(body: bytes) -> dict[str, Any]:
    try:
        document = _json_document(body)
    except _Undecodable as error:
        # The digest matched, so whoever wrote this wrote bad JSON on purpose: not a crash artefact.
        raise _Damaged(f"verified body is not JSON scout can read: {error}") from None
    if not isinstance(document, dict):
        raise _Damaged(f"verified body is {type(document).__name__}, not a JSON object")
    version = document.get("format_version")
    if not whole_number(version) or version < 1:
        raise _Damaged(f"format_version is {version!r}, not a positive int")
    return document


def _check_job(found_job: object, job_id: str | None, path: Path, what: str) -> str:
    if not isinstance(found_job, str) or not found_job:
        raise _Damaged(f"job_id is {found_job!r}, not a non-empty string")
    if job_id is not None and found_job != job_id:
        raise ManifestJobMismatch(
            f"{path}: {what} belongs to job_id {found_job!r}, not {job_id!r}; point this job "
            "at its own manifest directory (or pass the job id that wrote it)"
        )
    return found_job


def decode_manifest(data: bytes, path: Path, job_id: str | None) -> LoadedManifest:
    """Verify and parse one generation file. ``job_id`` None accepts any job (inspection tools).

    Raises ``_Damaged`` (internal) for a torn or altered file, :class:`ManifestJobMismatch` and
    :class:`ManifestFormatTooNew` for a verified file this job must not use.
    """
    body = _unframe(data, MAGIC)
    document = _document(body)
    version = document["format_version"]
    if version > FORMAT_VERSION:
        raise ManifestFormatTooNew(
            f"{path}: manifest format_version {version} is newer than this scout reads "
            f"({FORMAT_VERSION}); upgrade scout on every rank before resuming this job"
        )
    found_job = _check_job(document.get("job_id"), job_id, path, "manifest")
    generation = document.get("generation")
    payload = document.get("payload")
    if not whole_number(generation):
        raise _Damaged(f"generation is {generation!r}, not an int")
    if not isinstance(payload, dict):
        raise _Damaged(f"payload is {type(payload).__name__}, not a JSON object")
    name = _NAME_RE.match(path.name)
    if name is not None and int(name.group(1)) != generation:
        raise _Damaged(f"file name says generation {int(name.group(1))}, content says {generation} (renamed?)")
    return LoadedManifest(path, generation, found_job, version, payload, sha256=hashlib.sha256(body).hexdigest())


# ------------------------------------------------------------------------------------------
# Reading files: regular files only, with a size cap, one clear line on failure (GATE-34)
# ------------------------------------------------------------------------------------------


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``. Raises :class:`ManifestUnreadable`
    (one line naming the file and what to do) for a missing file, a permission error, anything
    that is not a regular file (a FIFO is opened non-blocking, so it is refused, never waited
    on) and a file over the cap (refused before reading, and re-checked while reading)."""
    if not whole_number(max_bytes) or max_bytes < 1:
        raise ValueError(f"max_bytes must be an int >= 1, got {max_bytes!r}")
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ManifestUnreadable(f"{where}: no such file") from None
    except PermissionError:
        raise ManifestUnreadable(f"{where}: permission denied; give the reading user read access "
                                 "to the file and its directory") from None
    except OSError as error:
        raise ManifestUnreadable(f"{where}: cannot open: {error.strerror or error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ManifestUnreadable(f"{where}: is {_kind(info.st_mode)}, not a regular file; a manifest "
                                     "is a regular file written by scout")
        if info.st_size > max_bytes:
            raise ManifestUnreadable(f"{where}: {info.st_size} bytes, over the {max_bytes}-byte limit of a "
                                     "manifest file; this is not a scout manifest")
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            except OSError as error:
                raise ManifestUnreadable(f"{where}: read failed: {error.strerror or error}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise ManifestUnreadable(f"{where}: grew past the {max_bytes}-byte limit while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_manifest_file(path: str | os.PathLike[str], job_id: str | None,
                       max_bytes: int = MAX_FILE_BYTES) -> LoadedManifest:
    """One generation file, verified (inspection tools). Raises :class:`ManifestError` naming
    the file for anything but a good generation."""
    data = read_regular_file(path, max_bytes)
    try:
        return decode_manifest(data, Path(path), job_id)
    except _Damaged as damage:
        raise ManifestDamaged(f"{os.fspath(path)}: not a good manifest generation: {damage}") from None


def _read_or_damaged(path: Path, max_bytes: int) -> bytes:
    """File bytes; FileNotFoundError passes through (a pruned file); anything else unreadable is
    ``_Damaged``, the same as a file that does not verify: either way its content is unknown."""
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(path)
    try:
        return read_regular_file(path, max_bytes)
    except ManifestUnreadable as error:
        if not path.exists() and not path.is_symlink():
            raise FileNotFoundError(path) from None
        raise _Damaged(str(error).removeprefix(f"{path}: ")) from None


def _list_directory(directory: Path) -> list[str] | None:
    """Names in the directory; None when it does not exist. Raises ManifestUnreadable (one line)
    for a permission error or a path that is not a directory."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise ManifestUnreadable(f"{directory}: not a directory; pass the manifest directory") from None
    except PermissionError:
        raise ManifestUnreadable(f"{directory}: permission denied listing the manifest directory; give "
                                 "the reading user read and execute access to it") from None
    except OSError as error:
        raise ManifestUnreadable(f"{directory}: cannot list: {error.strerror or error}") from None


def _read_head(directory: Path, job_id: str | None, max_bytes: int) -> tuple[HeadRecord | None, str | None, bool]:
    """(head, problem, exists)."""
    path = directory / HEAD_NAME
    try:
        data = _read_or_damaged(path, max_bytes)
        document = _document(_unframe(data, HEAD_MAGIC))
        _check_job(document.get("job_id"), job_id, path, "manifest head")
        generation, digest = document.get("generation"), document.get("sha256")
        if not whole_number(generation) or not 1 <= generation <= GENERATION_MAX:
            raise _Damaged(f"generation is {generation!r}, not an int in 1..{GENERATION_MAX}")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _Damaged(f"sha256 is {digest!r}, not 64 hex digits")
        return HeadRecord(generation, digest), None, True
    except FileNotFoundError:
        return None, None, False
    except _Damaged as damage:
        return None, f"{path}: {damage}; ignored (the generations themselves are read)", True


def log_line(record: Mapping[str, Any]) -> bytes:
    """One checksummed line of the trust log."""
    body = json.dumps(dict(record), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")
    line = f"{LOG_MAGIC} sha256={hashlib.sha256(body).hexdigest()} ".encode("ascii") + body + b"\n"
    # The reader's pattern and checksum accept the line as written (one line: no newline inside).
    match = _LOG_LINE_RE.match(line[:-1])
    assert match is not None and match.group(2) == body and line.count(b"\n") == 1, line
    return line


def _parse_log(data: bytes, path: Path, job_id: str | None) -> tuple[list[dict[str, Any]], list[str], int]:
    """(records, problems, length of the complete lines). A last line without its newline is a
    write in progress or torn by a crash: not a problem, and not a record."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    lines = data.split(b"\n")
    complete = lines[:-1]
    good_length = len(data) - len(lines[-1])
    for number, line in enumerate(complete, start=1):
        match = _LOG_LINE_RE.match(line)
        if match is None:
            problems.append(f"{path} line {number}: not a '{LOG_MAGIC} sha256=<hex> {{...}}' line; skipped")
            continue
        body = match.group(2)
        if hashlib.sha256(body).hexdigest() != match.group(1).decode("ascii"):
            problems.append(f"{path} line {number}: checksum does not match (altered); skipped")
            continue
        try:
            record = _json_document(body)
        except _Undecodable as error:
            problems.append(f"{path} line {number}: verified line is not JSON scout can read ({error}); skipped")
            continue
        if not isinstance(record, dict):
            problems.append(f"{path} line {number}: verified line is {type(record).__name__}, not a JSON object; "
                            "skipped")
            continue
        sequence, generation = record.get("sequence"), record.get("generation")
        if any(not whole_number(v) or v < 1 for v in (sequence, generation)):
            problems.append(f"{path} line {number}: sequence {sequence!r} / generation {generation!r} are not "
                            "ints >= 1; skipped")
            continue
        _check_job(record.get("job_id"), job_id, path, f"trust log line {number}")
        records.append(record)
    return records, problems, good_length


def _read_log(directory: Path, job_id: str | None, max_bytes: int) -> tuple[list[dict[str, Any]], list[str], bool]:
    path = directory / LOG_NAME
    try:
        data = _read_or_damaged(path, max_bytes)
    except FileNotFoundError:
        return [], [], False
    except _Damaged as damage:
        return [], [f"{path}: {damage}; ignored (every generation carries the whole trust-transition log)"], True
    records, problems, _length = _parse_log(data, path, job_id)
    return records, problems, True


def read_manifest_set(directory: str | os.PathLike[str], job_id: str | None, *,
                      max_bytes: int = MAX_FILE_BYTES) -> ManifestSet:
    """Read everything in a manifest directory (never writes). See the module header for the
    order of the reads and why it cannot mistake a concurrent commit for a loss."""
    path = Path(directory)
    for attempt in range(_LIST_ATTEMPTS):
        if _list_directory(path) is None:
            return ManifestSet(path)
        head, head_problem, head_exists = _read_head(path, job_id, max_bytes)
        log, problems, log_exists = _read_log(path, job_id, max_bytes)
        if head_problem is not None:
            problems.insert(0, head_problem)
        names = _list_directory(path) or []
        generations: list[tuple[int, Path]] = []
        aside: list[tuple[int, str]] = []
        for name in names:
            match = _NAME_RE.match(name)
            if match is not None:
                generations.append((int(match.group(1)), path / name))
            aside_match = _ASIDE_RE.match(name)
            if aside_match is not None:
                aside.append((int(aside_match.group(1)), name))
        generations.sort(reverse=True)
        good: list[LoadedManifest] = []
        skipped: list[SkippedFile] = []
        vanished = False
        for generation, file_path in generations:
            try:
                data = _read_or_damaged(file_path, max_bytes)
                good.append(decode_manifest(data, file_path, job_id))
            except FileNotFoundError:
                vanished = True  # pruned between listing and reading
            except _Damaged as damage:
                skipped.append(SkippedFile(file_path, str(damage), generation))
        if vanished and attempt + 1 < _LIST_ATTEMPTS and (not good or good[0].generation < generations[0][0]):
            continue  # the newest listed file went away: list again
        break
    newest = good[0].generation if good else 0
    lost: list[LostGeneration] = []
    for bad in skipped:
        if bad.generation > newest:
            lost.append(LostGeneration(bad.generation, f"{bad.path.name} does not verify ({bad.why})"))
    for generation, name in aside:
        if generation > newest:
            lost.append(LostGeneration(generation, f"{name} was set aside as damaged and no good generation "
                                                   "followed it"))
    if head is not None and head.generation > newest:
        lost.append(LostGeneration(head.generation, f"{HEAD_NAME} names it, but no good generation file "
                                                    f"holds it (the newest good one is {newest or 'none'}): deleted?"))
    if head is not None and good and head.generation == newest and head.sha256 != good[0].sha256:
        lost.append(LostGeneration(head.generation, f"{good[0].path.name} is not the file the writer committed "
                                                    f"({HEAD_NAME} records another digest): replaced?"))
    log_newest = max((int(record["generation"]) for record in log), default=0)
    if log_newest > newest:
        lost.append(LostGeneration(log_newest, f"{LOG_NAME} records trust changes committed in it, but no good "
                                               f"generation file holds it (the newest good one is {newest or 'none'})"))
    highest = max([newest, log_newest, *(g for g, _ in generations), *(g for g, _ in aside),
                   *([head.generation] if head is not None else [])])
    merged: dict[int, list[str]] = {}
    for witness in lost:
        merged.setdefault(witness.generation, []).append(witness.why)
    lost = [LostGeneration(generation, "; ".join(merged[generation])) for generation in sorted(merged, reverse=True)]
    return ManifestSet(path, tuple(good), tuple(skipped), head, tuple(log), tuple(problems), tuple(lost),
                       highest, bool(generations or aside or head_exists or log_exists))


def _no_good_generation(found: ManifestSet) -> ManifestDamaged:
    listed = "; ".join(f"{item.path}: {item.why}" for item in found.skipped)
    if found.lost_reason is not None and not listed:
        listed = found.lost_reason
    return ManifestDamaged(
        f"{found.directory}: no manifest generation verifies ({listed or 'no generation file is left'}); "
        "restore a copy of the directory or start the gate afresh with a new job id"
    )


def load_manifest(directory: str | os.PathLike[str], job_id: str | None, *,
                  max_bytes: int = MAX_FILE_BYTES) -> LoadedManifest | None:
    """The newest good generation in ``directory``, or None when it holds no manifest at all.
    ``job_id`` None accepts the job the newest good file names (for inspection tools).

    Any rank may call this at any time; it never writes. Damaged newer generations are skipped
    with a :class:`ManifestFallbackWarning` naming each file (GATE-M3); a lost newest generation
    is a :class:`ManifestFailClosedWarning` (the gate's reader, :func:`scout.gate.recorder.read_gate`,
    then fails closed: GATE-31). Raises :class:`ManifestDamaged` when files exist but none
    verifies, and the errors of :func:`decode_manifest` for another job's or a newer format's
    manifest (GATE-M4).
    """
    found = read_manifest_set(directory, job_id, max_bytes=max_bytes)
    loaded = found.newest
    if loaded is None:
        if found.named_anything:
            raise _no_good_generation(found)
        return None
    newer = tuple(item for item in found.skipped if item.generation > loaded.generation)
    for problem in found.problems:
        warnings.warn(ManifestRepairWarning(problem), stacklevel=2)
    if found.lost_reason is not None:
        warnings.warn(
            ManifestFailClosedWarning(
                f"{found.directory}: the newest manifest generation is lost ({found.lost_reason}); the last "
                f"good one is {loaded.path} (generation {loaded.generation}); the gate's reader fails closed"
            ),
            stacklevel=2,
        )
    return LoadedManifest(loaded.path, loaded.generation, loaded.job_id, loaded.format_version, loaded.payload,
                          newer, loaded.sha256)


# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class ManifestWriter:
    """The single writer of one manifest directory.

    ``commit(payload, log_records)`` makes the payload durable as the next generation, appends
    the records to the trust log and returns the generation's number; when it returns, a crash
    of this process cannot lose it, and the file and directory fsyncs a machine crash depends on
    have returned (module docstring: what is tested). ``hook(stage, generation)`` is called after
    each write step (``WRITE_STAGES``); tests use it to pause, fail or kill the writer there.
    ``reading`` is what the directory held when the writer opened it (the gate's recorder folds
    it, GATE-32). Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        job_id: str,
        *,
        generations_kept: int = 3,
        hook: WriteHook | None = None,
        max_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        if not whole_number(generations_kept) or generations_kept < 2:
            # One good generation behind the newest is what a damaged newest falls back to.
            raise ValueError(f"generations_kept must be an int >= 2, got {generations_kept!r}")
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
        self.directory = Path(directory)
        self.job_id = job_id
        self.generations_kept = generations_kept
        self.max_bytes = max_bytes
        self._hook = hook
        # Records whose log append failed: written first at the next commit (GATE-33).
        self._pending_log: list[dict[str, Any]] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd: int | None = os.open(self.directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            raise ManifestUnreadable(f"{self.directory}: permission denied creating the manifest directory or "
                                     f"its {_LOCK_NAME}; the writer needs write access to the directory") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(self._lock_fd)
            self._lock_fd = None
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ManifestBusy(
                    f"{self.directory}: another manifest writer holds {_LOCK_NAME}; a job has one "
                    "writer (the gate leader); open a reader with load_manifest instead"
                ) from None
            raise
        try:
            self.resumed = self._resume()
        except BaseException:
            self.close()
            raise

    def _resume(self) -> LoadedManifest | None:
        found = read_manifest_set(self.directory, self.job_id, max_bytes=self.max_bytes)
        loaded = found.newest
        if loaded is None and found.named_anything:
            raise _no_good_generation(found)
        newer = [item for item in found.skipped if loaded is not None and item.generation > loaded.generation]
        for item in newer:
            # Set aside so readers stop re-verifying it; the *.damaged name still witnesses the
            # loss until a newer good generation exists (GATE-31).
            os.replace(item.path, item.path.with_name(item.path.name + _DAMAGED_SUFFIX))
        if newer:
            assert loaded is not None
            listed = "; ".join(f"{item.path}: {item.why}" for item in newer)
            warnings.warn(
                ManifestFallbackWarning(
                    f"{self.directory}: damaged manifest generation(s) set aside as *{_DAMAGED_SUFFIX} "
                    f"({listed}); the last good one is {loaded.path} (generation {loaded.generation})"
                ),
                stacklevel=3,
            )
        for name in os.listdir(self.directory):
            if name.startswith(_TEMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)
        self._cut_torn_log_tail()
        if newer:
            _fsync_directory(self.directory)
        self.reading = found
        # Above every number any file names: a lost generation's number is never reused (GATE-32).
        self.generation = found.highest_named
        return loaded

    def _cut_torn_log_tail(self) -> None:
        """A crash mid-append leaves a last line without its newline; the next append would glue
        a good record onto it. Cut it off (it never verified, so nothing is lost)."""
        path = self.directory / LOG_NAME
        try:
            data = _read_or_damaged(path, self.max_bytes)
        except (FileNotFoundError, _Damaged):
            return
        _records, _problems, good_length = _parse_log(data, path, self.job_id)
        if good_length < len(data):
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, good_length)
                os.fsync(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> ManifestWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _stage(self, stage: str, generation: int) -> None:
        if self._hook is not None:
            self._hook(stage, generation)

    def commit(self, payload: Mapping[str, Any], log_records: Sequence[Mapping[str, Any]] = ()) -> int:
        """Write ``payload`` as the next generation; durable when this returns (GATE-M1). Then
        append ``log_records`` (each a JSON object with an int ``sequence``) to the trust log and
        update the head. A failure before the generation is durable raises, removes the
        temporary file and leaves the writer ready for a retry (GATE-33); a failure of the
        second records after it is a :class:`ManifestRepairWarning`, repaired next commit."""
        if self._lock_fd is None:
            raise ManifestError(f"{self.directory}: commit after close(); open a new ManifestWriter")
        generation = self.generation + 1
        data = encode_manifest(self.job_id, generation, payload)
        records = [self._log_record(record, generation) for record in log_records]
        final = generation_path(self.directory, generation)
        temp = self.directory / f"{_TEMP_PREFIX}{generation:012d}.{os.getpid()}.tmp"
        renamed = False
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)  # left by an attempt that failed where even the cleanup failed
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, data)
                self._stage("temp-written", generation)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._stage("temp-fsynced", generation)
            os.replace(temp, final)
            renamed = True
            # The number is used from here on, durable or not: a retry takes the next one.
            self.generation = generation
            self._stage("renamed", generation)
            _fsync_directory(self.directory)
        except BaseException as error:
            if not renamed:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
            if isinstance(error, OSError):
                # spec/ops.md OPS-13: name the file and what to do (ENOSPC alone names neither).
                named = name_write_error(error, final if renamed else temp, f"committing gate manifest generation "
                                                                             f"{generation}")
                if named is not error:
                    raise named from error
            raise
        self._stage("dir-fsynced", generation)
        self._append_log([*self._pending_log, *records])
        self._stage("log-appended", generation)
        self._write_head(generation, hashlib.sha256(data[data.index(b"\n") + 1 :]).hexdigest())
        self._stage("head-written", generation)
        self._prune()
        self._stage("pruned", generation)
        return generation

    def _log_record(self, record: Mapping[str, Any], generation: int) -> dict[str, Any]:
        sequence = record.get("sequence") if isinstance(record, Mapping) else None
        if not whole_number(sequence) or sequence < 1:
            raise ValueError(f"a trust-log record needs an int 'sequence' >= 1, got {record!r}")
        out = dict(record)
        out["job_id"] = self.job_id
        out.setdefault("generation", generation)
        log_line(out)  # plain JSON or ValueError, before anything is written
        return out

    def _append_log(self, records: list[dict[str, Any]]) -> None:
        if not records:
            self._pending_log = []
            return
        path = self.directory / LOG_NAME
        try:
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                _write_all(fd, b"".join(log_line(record) for record in records))
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_directory(self.directory)
        except OSError as error:
            self._pending_log = records
            warnings.warn(ManifestRepairWarning(
                f"{path}: appending {len(records)} trust record(s) failed ({error.strerror or error}); the "
                "generation is committed and carries them; the append is retried at the next commit"),
                stacklevel=3)
            return
        self._pending_log = []

    def _write_head(self, generation: int, digest: str) -> None:
        document = {"format_version": FORMAT_VERSION, "job_id": self.job_id, "generation": generation,
                    "sha256": digest}
        data = _framed(HEAD_MAGIC, _canonical_json(document))
        temp = self.directory / f"{_TEMP_PREFIX}head.{os.getpid()}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                # No fsync (of the file or the directory): after a crash the head is the old one, or
                # a torn one that does not verify, and either names no generation newer than the
                # durable ones, so it can cost a warning but never a false loss (GATE-31). What it
                # guards against is a later fault, and the writer rewrites it on resume.
                _write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(temp, self.directory / HEAD_NAME)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            warnings.warn(ManifestRepairWarning(
                f"{self.directory / HEAD_NAME}: writing the head failed ({error.strerror or error}); the "
                "generation is committed; the head is rewritten at the next commit"), stacklevel=3)

    def _prune(self) -> None:
        # Files are only ever removed once newer good generations are durable.
        listed = _list_directory(self.directory) or []
        generations = sorted(
            ((int(match.group(1)), self.directory / name) for name in listed
             if (match := _NAME_RE.match(name)) is not None),
            reverse=True,
        )
        for generation, path in generations[self.generations_kept :]:
            if generation < self.generation:
                with contextlib.suppress(OSError):
                    os.unlink(path)
