"""The durable gate manifest: the one I/O module of :mod:`scout.gate` (docs/design.md §1, 2.3).

One writer persists the gate's state and every trust transition; any rank reads it; a job that
restarts resumes its gate from it. The payload is an opaque JSON object (the gate's codec makes
it); this module only makes it durable and tells a good file from a damaged one. Standard
library only, so a reader needs nothing but Python.

Theory of operation (docs/gate.md, "The manifest on disk"):

- Every commit writes a new *generation* ``manifest.<generation>.json`` (12 digits), in four
  steps: write a temporary file in the same directory, fsync it, ``os.replace`` it onto its
  final name, fsync the directory. A commit counts once the directory fsync returned; a crash
  at any earlier point leaves either no new file or a complete one (GATE-M1).
- A file is ``MAGIC sha256=<hex> bytes=<n>`` on its first line, then ``n`` bytes of JSON. The
  digest covers those bytes exactly, so a torn write or a flipped bit anywhere is detected
  (GATE-M2). The JSON holds ``format_version``, ``job_id``, ``generation`` and the payload.
- Readers take the newest generation that verifies. A damaged newer file is skipped with a
  :class:`ManifestFallbackWarning` naming it; the last ``generations_kept`` good generations
  stay on disk for exactly this (GATE-M3).
- A verified file of another job, or of a newer format, is an error naming the value, never a
  fallback: silently using an older generation there would hide a misconfiguration (GATE-M4).
- One writer: :class:`ManifestWriter` holds an exclusive ``flock`` on ``.writer.lock`` for its
  lifetime (released by the kernel if the writer dies). On opening it resumes from the newest
  good generation, moves damaged newer files aside (``*.damaged``) and removes stale temporary
  files, so the next generation number is never one a damaged file still holds.

What is tested, and what is assumed. A crash of the writing process is tested with real
processes killed by SIGKILL between every pair of steps and at random points
(``tests/unit/test_manifest_crash.py``). A crash of the machine (power loss, kernel panic) cannot
be staged here: what is tested is the order of durability calls a commit makes before it returns
-- the file fsynced whole, then renamed, then the directory fsynced
(``tests/unit/test_manifest_durability.py``, which intercepts the calls). That this order
survives a machine crash is the POSIX contract of fsync and rename, assumed of the file system
and storage below, not tested.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "FORMAT_VERSION",
    "LoadedManifest",
    "ManifestBusy",
    "ManifestDamaged",
    "ManifestError",
    "ManifestFallbackWarning",
    "ManifestFormatTooNew",
    "ManifestJobMismatch",
    "ManifestWriter",
    "SkippedFile",
    "WRITE_STAGES",
    "decode_manifest",
    "encode_manifest",
    "generation_path",
    "load_manifest",
]

#: The body format this code writes and the newest it reads.
FORMAT_VERSION: Final = 1
MAGIC: Final = "scout-gate-manifest"
_HEADER_RE: Final = re.compile(rb"\Ascout-gate-manifest sha256=([0-9a-f]{64}) bytes=([0-9]{1,12})\n")
_NAME_RE: Final = re.compile(r"\Amanifest\.([0-9]{12})\.json\Z")
_TEMP_PREFIX: Final = ".manifest."
_LOCK_NAME: Final = ".writer.lock"
_DAMAGED_SUFFIX: Final = ".damaged"
# A header line is short; anything longer is not a manifest.
_HEADER_BYTES_MAX: Final = 128
GENERATION_MAX: Final = 10**12 - 1
#: The points between write steps where a test hook may pause or kill the writer.
WRITE_STAGES: Final = ("temp-written", "temp-fsynced", "renamed", "dir-fsynced", "pruned")

WriteHook = Callable[[str, int], None]


class ManifestError(RuntimeError):
    """Base class of every manifest error; the message names the file and the value."""


class ManifestDamaged(ManifestError):
    """No generation in the directory verifies (torn, truncated or bit-flipped files)."""


class ManifestJobMismatch(ManifestError):
    """A verified manifest belongs to another job."""


class ManifestFormatTooNew(ManifestError):
    """A verified manifest was written in a newer format than this code reads."""


class ManifestBusy(ManifestError):
    """Another writer holds the directory."""


class ManifestFallbackWarning(UserWarning):
    """A newer generation was damaged and an older good one was used."""


@dataclass(frozen=True)
class SkippedFile:
    path: Path
    why: str


@dataclass(frozen=True)
class LoadedManifest:
    """The newest good generation, and the newer files that were skipped (damaged)."""

    path: Path
    generation: int
    job_id: str
    format_version: int
    payload: dict[str, Any]
    skipped: tuple[SkippedFile, ...] = field(default=())


def generation_path(directory: Path, generation: int) -> Path:
    return directory / f"manifest.{generation:012d}.json"


def _canonical_json(value: object) -> bytes:
    # sort_keys + indent: deterministic bytes that a person can still read with `less`.
    return (json.dumps(value, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode(
        "ascii"
    )


def encode_manifest(job_id: str, generation: int, payload: Mapping[str, Any]) -> bytes:
    """The exact bytes of one generation file."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
    if not (isinstance(generation, int) and 1 <= generation <= GENERATION_MAX):
        raise ValueError(f"generation must be an int in 1..{GENERATION_MAX}, got {generation!r}")
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
    digest = hashlib.sha256(body).hexdigest()
    return f"{MAGIC} sha256={digest} bytes={len(body)}\n".encode("ascii") + body


class _Damaged(Exception):
    """One file failed verification; the reader decides whether that is fatal."""


def decode_manifest(data: bytes, path: Path, job_id: str | None) -> LoadedManifest:
    """Verify and parse one generation file. ``job_id`` None accepts any job (inspection tools).

    Raises ``_Damaged`` (internal) for a torn or altered file, :class:`ManifestJobMismatch` and
    :class:`ManifestFormatTooNew` for a verified file this job must not use.
    """
    header = _HEADER_RE.match(data[:_HEADER_BYTES_MAX])
    if header is None:
        raise _Damaged(f"first line is not '{MAGIC} sha256=<64 hex> bytes=<n>' (torn or not a manifest)")
    body = data[header.end() :]
    declared_bytes = int(header.group(2))
    if len(body) != declared_bytes:
        raise _Damaged(f"body is {len(body)} bytes, header says {declared_bytes} (truncated or extended)")
    digest = hashlib.sha256(body).hexdigest()
    if digest != header.group(1).decode("ascii"):
        raise _Damaged(f"sha256 of the body is {digest}, header says {header.group(1).decode('ascii')} (altered)")
    try:
        document = json.loads(body.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        # The digest matched, so whoever wrote this wrote bad JSON on purpose: not a crash artefact.
        raise _Damaged(f"verified body is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise _Damaged(f"verified body is {type(document).__name__}, not a JSON object")
    version = document.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _Damaged(f"format_version is {version!r}, not a positive int")
    if version > FORMAT_VERSION:
        raise ManifestFormatTooNew(
            f"{path}: manifest format_version {version} is newer than this scout reads "
            f"({FORMAT_VERSION}); upgrade scout on every rank before resuming this job"
        )
    found_job = document.get("job_id")
    if not isinstance(found_job, str) or not found_job:
        raise _Damaged(f"job_id is {found_job!r}, not a non-empty string")
    if job_id is not None and found_job != job_id:
        raise ManifestJobMismatch(
            f"{path}: manifest belongs to job_id {found_job!r}, not {job_id!r}; point this job "
            "at its own manifest directory (or pass the job id that wrote it)"
        )
    generation = document.get("generation")
    payload = document.get("payload")
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise _Damaged(f"generation is {generation!r}, not an int")
    if not isinstance(payload, dict):
        raise _Damaged(f"payload is {type(payload).__name__}, not a JSON object")
    name = _NAME_RE.match(path.name)
    if name is not None and int(name.group(1)) != generation:
        raise _Damaged(f"file name says generation {int(name.group(1))}, content says {generation} (renamed?)")
    return LoadedManifest(path, generation, found_job, version, payload)


def _generation_files(directory: Path) -> list[tuple[int, Path]]:
    """Generation files, newest first. Temporary and set-aside files are ignored."""
    found: list[tuple[int, Path]] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        match = _NAME_RE.match(name)
        if match is not None:
            found.append((int(match.group(1)), directory / name))
    found.sort(reverse=True)
    return found


def _read_newest_good(directory: Path, job_id: str | None) -> tuple[LoadedManifest | None, list[SkippedFile]]:
    skipped: list[SkippedFile] = []
    for _generation, path in _generation_files(directory):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            # The writer pruned it between listing and reading; older ones follow.
            continue
        try:
            loaded = decode_manifest(data, path, job_id)
        except _Damaged as damage:
            skipped.append(SkippedFile(path, str(damage)))
            continue
        return LoadedManifest(
            loaded.path, loaded.generation, loaded.job_id, loaded.format_version, loaded.payload, tuple(skipped)
        ), skipped
    return None, skipped


def load_manifest(directory: str | os.PathLike[str], job_id: str | None) -> LoadedManifest | None:
    """The newest good generation in ``directory``, or None when it holds no manifest at all.
    ``job_id`` None accepts the job the newest good file names (for inspection tools).

    Any rank may call this at any time; it never writes. Damaged newer generations are skipped
    with a :class:`ManifestFallbackWarning` naming each file (GATE-M3). Raises
    :class:`ManifestDamaged` when files exist but none verifies, and the errors of
    :func:`decode_manifest` for another job's or a newer format's manifest (GATE-M4).
    """
    path = Path(directory)
    loaded, skipped = _read_newest_good(path, job_id)
    if loaded is None:
        if skipped:
            listed = "; ".join(f"{item.path}: {item.why}" for item in skipped)
            raise ManifestDamaged(
                f"{path}: no manifest generation verifies ({listed}); restore a copy of the "
                "directory or start the gate afresh with a new job id"
            )
        return None
    if skipped:
        listed = "; ".join(f"{item.path}: {item.why}" for item in skipped)
        warnings.warn(
            ManifestFallbackWarning(
                f"{path}: skipped damaged manifest generation(s) ({listed}); using the last good "
                f"one, {loaded.path} (generation {loaded.generation})"
            ),
            stacklevel=2,
        )
    return loaded


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ManifestWriter:
    """The single writer of one manifest directory.

    ``commit(payload)`` makes the payload durable as the next generation and returns its
    number; when it returns, a crash of this process cannot lose it, and the file and directory
    fsyncs a machine crash depends on have returned (module docstring: what is tested).
    ``hook(stage, generation)`` is called after each write step (``WRITE_STAGES``); tests use
    it to pause or kill the writer there. Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        job_id: str,
        *,
        generations_kept: int = 3,
        hook: WriteHook | None = None,
    ) -> None:
        if not isinstance(generations_kept, int) or generations_kept < 2:
            # One good generation behind the newest is what a damaged newest falls back to.
            raise ValueError(f"generations_kept must be an int >= 2, got {generations_kept!r}")
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
        self.directory = Path(directory)
        self.job_id = job_id
        self.generations_kept = generations_kept
        self._hook = hook
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = os.open(self.directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
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
        loaded, skipped = _read_newest_good(self.directory, self.job_id)
        if loaded is None and skipped:
            listed = "; ".join(f"{item.path}: {item.why}" for item in skipped)
            raise ManifestDamaged(
                f"{self.directory}: no manifest generation verifies ({listed}); restore a copy of "
                "the directory or start the gate afresh with a new job id"
            )
        for item in skipped:
            # Only damaged files newer than the good one are skipped; set them aside so the next
            # generation number is free and readers stop warning about them.
            os.replace(item.path, item.path.with_name(item.path.name + _DAMAGED_SUFFIX))
        if skipped:
            listed = "; ".join(f"{item.path}: {item.why}" for item in skipped)
            assert loaded is not None
            warnings.warn(
                ManifestFallbackWarning(
                    f"{self.directory}: damaged manifest generation(s) set aside as *{_DAMAGED_SUFFIX} "
                    f"({listed}); resuming from {loaded.path} (generation {loaded.generation})"
                ),
                stacklevel=3,
            )
        for name in os.listdir(self.directory):
            if name.startswith(_TEMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)
        if skipped:
            _fsync_directory(self.directory)
        self.generation = loaded.generation if loaded is not None else 0
        return loaded

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

    def commit(self, payload: Mapping[str, Any]) -> int:
        """Write ``payload`` as the next generation; durable when this returns (GATE-M1)."""
        if self._lock_fd is None:
            raise ManifestError(f"{self.directory}: commit after close(); open a new ManifestWriter")
        generation = self.generation + 1
        data = encode_manifest(self.job_id, generation, payload)
        final = generation_path(self.directory, generation)
        temp = self.directory / f"{_TEMP_PREFIX}{generation:012d}.{os.getpid()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            self._stage("temp-written", generation)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._stage("temp-fsynced", generation)
        os.replace(temp, final)
        self._stage("renamed", generation)
        _fsync_directory(self.directory)
        self.generation = generation
        self._stage("dir-fsynced", generation)
        self._prune()
        self._stage("pruned", generation)
        return generation

    def _prune(self) -> None:
        # Files are only ever removed once newer good generations are durable.
        for generation, path in _generation_files(self.directory)[self.generations_kept :]:
            if generation < self.generation:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
