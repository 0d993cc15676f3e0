"""The trainer's progress record: one fixed-layout shared-memory segment per rank.

The trainer (single writer) publishes where it is -- step, op counter, the fingerprint of the
collective in flight, the active stage with monotonic timestamps -- and the rank's out-of-band
observer reads it, while the trainer is blocked, spinning, stopped or dead (docs/design.md §2.2). No
torch here: an MPI program calls :class:`ProgressPublisher` directly.

Theory of operation
-------------------
*Consistency (seqlock).* The writer makes the sequence word odd, writes the payload in one
``pack_into``, then makes it even. A reader copies the sequence, the payload, and the sequence
again, and accepts the copy only if both sequence reads are equal and even. It retries a
bounded number of times; a writer stopped in the middle of a publish (SIGSTOP) leaves the word
odd, and the reader then returns ``None`` ("no consistent snapshot") instead of spinning. The
argument relies on stores becoming visible in program order (x86-64 TSO); in addition every
payload carries a checksum of its fields, so a torn copy is also rejected on weakly ordered CPUs.

*Completion section (PROGRESS-8).* A second seqlock section, after the first, holds the rank's
completion coordinates, one per tracked process group (PROGRESS-9): written only by the trainer's
completion watcher thread (:class:`CompletionWriter`, one per record), with its own sequence word
on its own cache line and its own checksum, read by the same rule. A record whose completion
section was never written (an MPI program, tracking switched off) reads as "no completion
evidence". One word apart from both sections holds the rank's host contract (PROGRESS-13).

*Ownership.* The header holds the owner's pid, the owner's process start time (so a recycled
pid is not mistaken for the owner) and a random 16-byte token. A segment name is derived from
(job id, restart generation, rank), so two jobs, two generations or two ranks never share one.
Creating or claiming a segment happens under a short ``flock`` on one lock file per user, so two
processes can never both decide a stale segment is theirs:

- the name is free: create it;
- it exists and its owner is alive: refuse (:class:`RecordInUse`) -- never attach to a live
  owner's segment;
- it exists and its owner is dead (or the header was never completed): unlink and recreate.

The observer claims the record the same way (observer pid, start time, token in the header):
a second live observer for the same rank is refused with :class:`ObserverAlreadyAttached`.
A reader attaches only if the magic, layout version, size and the owner token it was given all
match, so it can never read another job's or an older generation's record.

*Lifetime.* The writer unlinks the name on :meth:`ProgressPublisher.close` if the token is still
its own. If the trainer dies without closing, its observer (which sees the owner dead) or the
next claimant of the same name reclaims the segment. Segments are not left to
``multiprocessing``'s resource tracker: it would unlink a live trainer's segment when a reader
exits (Python < 3.13 registers readers too) and warn about every trainer that was killed. Nor
is the tracker started at all (:class:`_Segment` maps the segment itself): on Python < 3.13
``SharedMemory`` starts one tracker process per trainer and per observer even when its
registration is undone at once -- two more interpreters per rank, ~50 ms of CPU each at a job's
start, for nothing.
"""

from __future__ import annotations

import _posixshmem  # the C module under multiprocessing.shared_memory (POSIX)
import contextlib
import enum
import errno
import fcntl
import hashlib
import mmap
import os
import secrets
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from scout.core.guards import whole_number
from scout.core.observer import (
    COMPLETION_GROUPS_MAX,
    Completion,
    HostContract,
    PendingState,
    Progress,
    Stage,
)

__all__ = [
    "COMPLETION_HEARTBEAT_S",
    "COMPLETION_STALE_S",
    "LAYOUT_VERSION",
    "RECORD_BYTES",
    "COMPLETION_GROUPS_MAX",
    "CompletionSlot",
    "CompletionSnapshot",
    "CompletionWriter",
    "ObserverAlreadyAttached",
    "ProgressError",
    "ProgressPublisher",
    "ProgressReader",
    "RecordIdentity",
    "RecordInUse",
    "RecordMismatch",
    "RecordNotFound",
    "Snapshot",
    "Stage",
    "process_alive",
    "process_start_ticks",
    "launcher_job_id",
    "record_name",
    "remove_dead_records",
]


class ProgressError(RuntimeError):
    """Base of the errors this module raises on purpose."""


class RecordInUse(ProgressError):
    """A live process already owns the record for this (job, generation, rank)."""


class ObserverAlreadyAttached(ProgressError):
    """A live observer already watches this rank's record."""


class RecordNotFound(ProgressError):
    """No record of that name exists (yet)."""


class RecordMismatch(ProgressError):
    """A segment of that name exists but is not the record the caller was told to expect."""


class _Life(enum.IntEnum):
    """PROGRESS-11: where the trainer is in its life."""

    RUNNING = 1
    CLOSED = 2  # scout was closed: a clean end
    EXITING = 3  # leaving by an exception; absorbing (later publishes keep it)


MAGIC: Final = b"SCOUTPR1"
LAYOUT_VERSION: Final = 4
RECORD_BYTES: Final = 1280
TOKEN_BYTES: Final = 16

# Header: magic, version, size, owner pid/start/token, observer pid/start/token, rank, generation.
_HEADER: Final = struct.Struct("<8sIIqQ16sqQ16siI")
_OWNER: Final = struct.Struct("<qQ16s")
_OBSERVER: Final = struct.Struct("<qQ16s")
_OWNER_OFFSET: Final = 16
_OBSERVER_OFFSET: Final = 48
# The sequence word sits on its own cache line, apart from the header the observer writes.
_SEQ_OFFSET: Final = 128
_SEQ: Final = struct.Struct("<Q")
_PAYLOAD_OFFSET: Final = 136
# step, op, fingerprint, stage, life, stage key, stage sequence, stage start ns, publish ns,
# collectives entered, last completed stage, its key, its duration ns, checksum.
_PAYLOAD: Final = struct.Struct("<qqQIIQQqqQIxxxxQqQ")
_CHECKSUM_MASK: Final = 2**64 - 1
# PROGRESS-13: the host contract, one aligned word after the header (written by the trainer's
# tracking, never lowered; a single aligned 8-byte store, so a reader sees the old or the new).
_CONTRACT_OFFSET: Final = 112
_CONTRACT: Final = struct.Struct("<Q")
# The completion section (PROGRESS-8): its own sequence word on its own cache line, then how many
# coordinates, publish ns, changed ns (the publish that first carried these coordinates), the
# coordinates -- source, enqueued, completed, pending fingerprint, completed fingerprint, pending
# state, flags (1: point-to-point), pending since ns -- and a checksum.
_COMPLETION_SEQ_OFFSET: Final = 256
_COMPLETION_HEAD_OFFSET: Final = 264
_COMPLETION_HEAD: Final = struct.Struct("<IIqq")
_COMPLETION_SLOT: Final = struct.Struct("<QQQQQIIq")
_COMPLETION_SLOTS_OFFSET: Final = _COMPLETION_HEAD_OFFSET + _COMPLETION_HEAD.size
_COMPLETION_CHECKSUM_OFFSET: Final = _COMPLETION_SLOTS_OFFSET + COMPLETION_GROUPS_MAX * _COMPLETION_SLOT.size
_POINT_TO_POINT: Final = 1
assert _HEADER.size <= _CONTRACT_OFFSET and _CONTRACT_OFFSET + _CONTRACT.size <= _SEQ_OFFSET
assert _PAYLOAD_OFFSET + _PAYLOAD.size <= _COMPLETION_SEQ_OFFSET
assert _COMPLETION_CHECKSUM_OFFSET + _SEQ.size <= RECORD_BYTES

# PROGRESS-10: the watcher republishes an unchanged coordinate at least this often, and a
# reader counts a section not published for COMPLETION_STALE_S as absent.
COMPLETION_HEARTBEAT_S: Final = 0.25
COMPLETION_STALE_S: Final = 1.0
COMPLETION_STALE_NS: Final = round(COMPLETION_STALE_S * 1e9)
# A reader gives up on one read after this many attempts (a few microseconds each): a writer
# that stays mid-publish that long is stopped, and the caller keeps its last snapshot.
READ_ATTEMPTS_MAX: Final = 1000
NAME_PREFIX: Final = "scout_"
_NAME_HEX_CHARS: Final = 24  # 96 bits; the whole name fits macOS's 31-character limit


@attrs.frozen
class RecordIdentity:
    """Who a record belongs to. The segment name is derived from these three values."""

    job_id: str
    generation: int
    rank: int

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise ValueError(f"job_id must be a non-empty string, got {self.job_id!r}")
        for name, value in (("generation", self.generation), ("rank", self.rank)):
            if not whole_number(value) or not 0 <= value < 2**31:
                raise ValueError(f"{name} must be an int in [0, 2**31), got {value!r}")

    @property
    def name(self) -> str:
        return record_name(self.job_id, self.generation, self.rank)

    @classmethod
    def from_environment(cls, rank: int, environ: Mapping[str, str] | None = None, *,
                         job_id: str | None = None) -> RecordIdentity:
        """Job id and restart generation from the launcher: stable across the restarts of one
        launch, distinct for two jobs on one host (see :func:`launcher_job_id`)."""
        env = os.environ if environ is None else environ
        generation = int(env.get("SCOUT_GENERATION") or env.get("TORCHELASTIC_RESTART_COUNT") or 0)
        return cls(job_id or launcher_job_id(env), generation, rank)


def launcher_job_id(environ: Mapping[str, str]) -> str:
    """The launcher's name for this job, the same in every restart of it: ``SCOUT_JOB_ID``,
    torchrun's ``TORCHELASTIC_RUN_ID`` (its default ``none`` is qualified by the rendezvous
    endpoint, which two jobs on one host cannot share), Slurm's job and step, MPI's namespace
    (``PMIX_NAMESPACE``: Open MPI 5, PRRTE, Slurm's PMIx; ``OMPI_MCA_orte_ess_jobid``: Open MPI
    4). MPICH's and Intel MPI's ``mpiexec`` (Hydra: ``PMI_RANK`` set) export no name for the
    job: there it is ``mpi@`` and the rendezvous endpoint. Last, the rendezvous endpoint or the
    launching process. docs/attach.md ("Job identity") lists the same, in the same order."""
    env = environ
    endpoint = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env and "MASTER_PORT" in env else ""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id == "none":
        run_id = f"none@{endpoint or os.getppid()}"
    slurm = env.get("SLURM_JOB_ID", "")
    if slurm and env.get("SLURM_STEP_ID"):
        slurm = f"{slurm}.{env['SLURM_STEP_ID']}"
    hydra = f"mpi@{endpoint}" if endpoint and "PMI_RANK" in env else ""
    return (env.get("SCOUT_JOB_ID") or run_id or slurm or env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_orte_ess_jobid")
            or hydra or endpoint or f"local-{os.getppid()}")


def record_name(job_id: str, generation: int, rank: int) -> str:
    """The shared-memory name of a record: unique per (job id, restart generation, rank)."""
    key = f"{job_id}\x00{generation}\x00{rank}".encode()
    return NAME_PREFIX + hashlib.blake2b(key, digest_size=_NAME_HEX_CHARS // 2).hexdigest()


# --------------------------------------------------------------------------------------------
# Process identity
# --------------------------------------------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), 0 where the
    platform cannot tell, None if there is no such process (or it is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        return None
    except OSError:
        return 0 if _pid_exists(pid) else None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_alive(pid: int, start_ticks: int) -> bool:
    """True if ``pid`` runs and is the same process that recorded ``start_ticks`` (a pid the
    kernel recycled for another process counts as dead)."""
    if pid <= 0:
        return False
    if not os.path.isdir("/proc/self"):
        return _pid_exists(pid)
    current = process_start_ticks(pid)
    if current is None:
        return False
    return start_ticks in (0, current) or current == 0


# --------------------------------------------------------------------------------------------
# Segments
# --------------------------------------------------------------------------------------------


def _lock_path() -> str:
    """The lock lives where the records do (PROGRESS-12): every process that can see a record
    must take the same lock, and ``TMPDIR`` differs between processes that share ``/dev/shm``
    (two torchrun agents on one host, two jobs). The temporary directory only where the
    platform has no ``/dev/shm``."""
    directory = SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else tempfile.gettempdir()
    return os.path.join(directory, f"scout-progress-{os.getuid()}.lock")


@contextlib.contextmanager
def _claim_lock(timeout_s: float = 5.0) -> Iterator[None]:
    """Serialise create/reclaim/claim decisions across processes of this user. Held for
    microseconds; bounded wait so a wedged holder cannot hang a trainer."""
    fd = os.open(_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ProgressError(
                        f"could not take the progress lock {_lock_path()} within {timeout_s} s; "
                        "another process holds it: check for a wedged scout process"
                    ) from None
                time.sleep(0.001)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class _Segment:
    """One POSIX shared-memory segment (``/dev/shm/<name>``), mapped read-write: what
    ``multiprocessing.shared_memory.SharedMemory`` does for this module, without its resource
    tracker (module docstring, *Lifetime*). ``size``: the segment's size in bytes (0 for an
    empty segment, which is not mapped and reads as an empty buffer)."""

    def __init__(self, name: str, *, create: bool, size: int = 0) -> None:
        if create and size <= 0:
            raise ValueError(f"a new shared-memory segment needs a positive size, got {size!r}")
        self.name = name
        self._name = "/" + name  # the name shm_open and shm_unlink take (a leading slash)
        fd = _posixshmem.shm_open(self._name, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self._mmap: mmap.mmap | None = mmap.mmap(fd, size) if size else None
        except BaseException:
            if create:  # a half-made segment of ours is nobody's record
                with contextlib.suppress(FileNotFoundError):
                    _posixshmem.shm_unlink(self._name)
            raise
        finally:
            os.close(fd)  # the mapping holds the segment; no descriptor stays open
        self.size = size
        self._buf: memoryview | None = memoryview(self._mmap) if self._mmap is not None else memoryview(b"")

    @property
    def buf(self) -> memoryview | None:
        return self._buf

    def close(self) -> None:
        """Unmap (idempotent); the name stays until :func:`_unlink_segment`."""
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None


def _open_segment(name: str, create: bool) -> _Segment:
    return _Segment(name, create=create, size=RECORD_BYTES if create else 0)


def _buffer_of(segment: _Segment) -> memoryview:
    buffer = segment.buf
    if buffer is None:  # pragma: no cover - only after close(), which we never read past
        raise ProgressError(f"shared memory {segment.name} is closed")
    return buffer


def _unlink_name(name: str) -> None:
    try:
        segment = _open_segment(name, create=False)
    except FileNotFoundError:
        return
    segment.close()
    with contextlib.suppress(FileNotFoundError):
        _unlink_segment(segment)


def _unlink_segment(segment: _Segment) -> None:
    _posixshmem.shm_unlink(segment._name)


@attrs.frozen
class _Header:
    magic: bytes
    version: int
    size: int
    owner_pid: int
    owner_start: int
    owner_token: bytes
    observer_pid: int
    observer_start: int
    observer_token: bytes
    rank: int
    generation: int

    @classmethod
    def read(cls, buffer: Any) -> _Header:
        return cls(*_HEADER.unpack_from(buffer, 0))

    @property
    def valid(self) -> bool:
        return self.magic == MAGIC and self.version == LAYOUT_VERSION and self.size == RECORD_BYTES

    @property
    def owner_alive(self) -> bool:
        return process_alive(self.owner_pid, self.owner_start)

    @property
    def observer_alive(self) -> bool:
        return process_alive(self.observer_pid, self.observer_start)


def _self_identity() -> tuple[int, int]:
    pid = os.getpid()
    return pid, process_start_ticks(pid) or 0


@attrs.frozen
class CompletionSlot:
    """One group's coordinate in the completion section (PROGRESS-9): ``pending_state`` is a
    :class:`scout.core.observer.PendingState` value; ``pending_since_ns`` is when the oldest
    pending collective was enqueued (monotonic, 0 when none)."""

    source: int
    enqueued: int
    completed: int
    pending_fingerprint: int
    completed_fingerprint: int
    pending_state: int
    pending_since_ns: int
    point_to_point: bool = False

    def completion(self) -> Completion:
        """The machine's value; ValueError where the slot breaks PROGRESS-9."""
        return Completion(self.source, self.enqueued, self.completed, self.pending_fingerprint,
                          PendingState(self.pending_state), self.completed_fingerprint, self.point_to_point)


@attrs.frozen
class CompletionSnapshot:
    """One consistent copy of the completion section: its coordinates, one per tracked group."""

    sequence: int
    slots: tuple[CompletionSlot, ...]
    publish_ns: int
    #: PROGRESS-10: when a coordinate last changed -- the publish that first carried them all as
    #: they are; a heartbeat moves ``publish_ns``, never this.
    changed_ns: int

    def slot(self, source: int) -> CompletionSlot | None:
        for item in self.slots:
            if item.source == source:
                return item
        return None


@attrs.frozen
class Snapshot:
    """One consistent copy of the record's payload (and of its completion section, when the
    trainer tracks completion)."""

    sequence: int
    step: int
    op: int
    fingerprint: int
    stage: Stage
    closed: bool  # the trainer closed the record (clean exit)
    stage_key: int
    stage_sequence: int
    stage_start_ns: int
    publish_ns: int  # monotonic (CLOCK_MONOTONIC, comparable across processes of one host)
    collectives_entered: int
    completed_stage: Stage
    completed_stage_key: int
    completed_stage_duration_ns: int
    completion: CompletionSnapshot | None = None
    exiting: bool = False  # the trainer is leaving by an exception (PROGRESS-11)
    contract: HostContract = HostContract.BLOCKING  # PROGRESS-13

    @property
    def leaving(self) -> bool:
        """The trainer closed the record or is exiting: its observer stops judging it."""
        return self.closed or self.exiting

    @property
    def coordinate(self) -> tuple[int, int]:
        return (self.step, self.op)

    def progress(self, now_ns: int | None = None) -> Progress:
        """The observer machine's view of this snapshot (times on the monotonic clock in
        seconds). A completion section whose values break PROGRESS-9 counts as absent; one not
        published for ``COMPLETION_STALE_S`` before ``now_ns`` counts as absent and *stale*
        (PROGRESS-10: its watcher cannot run, so it may lag what the trainer did)."""
        section = self.completion
        stale = section is not None and now_ns is not None and now_ns - section.publish_ns > COMPLETION_STALE_NS
        completions: tuple[Completion, ...] = ()
        since: tuple[float, ...] = ()
        if section is not None and not stale:
            try:
                completions = tuple(slot.completion() for slot in section.slots)
                since = tuple(slot.pending_since_ns / 1e9 if c.pending else 0.0
                              for slot, c in zip(section.slots, completions, strict=True))
                Progress(0, 0, completions=completions)  # one coordinate per group (PROGRESS-9)
            except ValueError:
                completions, since = (), ()
        return Progress(self.step, self.op, self.fingerprint, self.stage, completions, since, self.contract, stale)


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


class ProgressPublisher:
    """The one owner of a rank's record. Publishes are serialised by a lock, so the training
    loop and the autograd engine's threads (DDP's communication hook) may both publish; the
    seqlock then still sees one writer at a time.

    Progress coordinate: ``(step, op)`` where ``op`` counts publishes within the step (layer
    hooks, collective entry and exit, stage changes) and restarts at 0 on each new step.

    *Asynchronous collectives* (DDP's gradient buckets: launched during backward, completed by
    a communication thread, all waited for before backward returns) are published by
    :meth:`enter_async_collective` only: each launch counts one op and sets the fingerprint.
    Their completions are not published -- they happen on other threads in an order that
    differs from rank to rank -- so the coordinate and fingerprint of a rank stuck in backward
    are the same on every healthy rank. The next publish from the training loop (which comes
    after backward, so after every bucket completed) leaves the collective stage.
    """

    def __init__(self, identity: RecordIdentity) -> None:
        self.identity = identity
        self.name = identity.name
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._segment = self._claim()
        self._buffer: Any = _buffer_of(self._segment)
        self._pack_seq = _SEQ.pack_into
        self._pack_payload = _PAYLOAD.pack_into
        self._now_ns = time.monotonic_ns
        self._seq = 0
        self._step = 0
        self._op = 0
        self._fingerprint = 0
        self._stage = int(Stage.IDLE)
        self._life = int(_Life.RUNNING)
        self._stage_key = 0
        self._stage_sequence = 0
        self._stage_start_ns = 0
        self._collectives = 0
        self._done_stage = int(Stage.IDLE)
        self._done_key = 0
        self._done_ns = 0
        # One level of stage nesting: a collective inside a checkpoint write returns to it.
        self._outer_stage = int(Stage.IDLE)
        self._outer_key = 0
        self._outer_start_ns = 0
        self._async = False  # an asynchronous collective was launched and not yet left
        self._lock = threading.Lock()
        self._completion_writer: CompletionWriter | None = None
        self._publish()

    # -- claiming ---------------------------------------------------------------------------

    def _claim(self) -> _Segment:
        pid, start = _self_identity()
        with _claim_lock():
            segment = self._create_or_reclaim()
            try:
                # Header last-but-magic: a segment whose creator died mid-initialisation has
                # no magic and counts as stale.
                header = _HEADER.pack(
                    b"\x00" * 8, LAYOUT_VERSION, RECORD_BYTES, pid, start, self.token,
                    0, 0, b"\x00" * TOKEN_BYTES, self.identity.rank, self.identity.generation,
                )
                buffer = _buffer_of(segment)
                buffer[: _HEADER.size] = header
                buffer[0:8] = MAGIC
                # What was written is what a reader reads back: a valid header naming this process.
                written = _Header.read(buffer)
                assert written.valid and (written.owner_pid, written.owner_token, written.rank) == (
                    pid, self.token, self.identity.rank), written
            except BaseException:
                segment.close()
                _unlink_segment(segment)
                raise
        return segment

    def _create_or_reclaim(self) -> _Segment:
        try:
            return _open_segment(self.name, create=True)
        except FileExistsError:
            pass
        existing = _open_segment(self.name, create=False)
        try:
            header = _Header.read(_buffer_of(existing)) if existing.size >= _HEADER.size else None
        finally:
            existing.close()
        if header is not None and header.valid and header.owner_alive:
            raise RecordInUse(
                f"progress record {self.name} for job {self.identity.job_id!r} generation "
                f"{self.identity.generation} rank {self.identity.rank} is owned by live process "
                f"{header.owner_pid}: two trainers publish for one rank. Give each rank its own "
                "rank number, or bump the restart generation (SCOUT_GENERATION) for a new launch"
            )
        _unlink_name(self.name)
        return _open_segment(self.name, create=True)

    # -- publishing -------------------------------------------------------------------------

    def _publish(self) -> None:
        now = self._now_ns()
        fields = (
            self._step, self._op, self._fingerprint, self._stage, self._life, self._stage_key,
            self._stage_sequence, self._stage_start_ns, now, self._collectives,
            self._done_stage, self._done_key, self._done_ns,
        )
        seq = self._seq + 1
        buffer = self._buffer
        self._pack_seq(buffer, _SEQ_OFFSET, seq)
        # The checksum only has to make a torn copy (fields of two publishes) fail, not resist
        # an adversary; Python's hash of a tuple of ints is not randomised per process.
        self._pack_payload(buffer, _PAYLOAD_OFFSET, *fields, hash(fields) & _CHECKSUM_MASK)
        self._seq = seq + 1
        self._pack_seq(buffer, _SEQ_OFFSET, seq + 1)

    def _settle_async(self) -> None:
        """Leave the collective stage of launched asynchronous collectives (lock held)."""
        if self._async:
            self._async = False
            self._fingerprint = 0
            self._stage, self._stage_key, self._stage_start_ns = (
                self._outer_stage, self._outer_key, self._outer_start_ns,
            )

    def begin_step(self, step: int) -> None:
        """A new training step starts: the op counter restarts at 0."""
        with self._lock:
            self._settle_async()
            self._step = step
            self._op = 0
            self._publish()

    def advance(self) -> None:
        """One unit of visible progress inside the step (e.g. a layer's forward)."""
        with self._lock:
            self._settle_async()
            self._op += 1
            self._publish()

    def _enter(self, fingerprint: int) -> None:
        if not self._async:
            self._outer_stage, self._outer_key, self._outer_start_ns = (
                self._stage, self._stage_key, self._stage_start_ns,
            )
        self._op += 1
        self._collectives += 1
        self._fingerprint = fingerprint
        self._stage = int(Stage.COLLECTIVE)
        self._stage_key = fingerprint
        self._stage_start_ns = self._now_ns()
        self._publish()

    def enter_collective(self, fingerprint: int) -> None:
        """The trainer is about to block in the collective ``fingerprint`` (never 0)."""
        with self._lock:
            self._settle_async()
            self._enter(fingerprint)

    def enter_async_collective(self, fingerprint: int) -> None:
        """An asynchronous collective ``fingerprint`` was launched (see the class docstring);
        safe from any thread."""
        with self._lock:
            self._enter(fingerprint)
            self._async = True

    def exit_collective(self) -> None:
        with self._lock:
            self._async = False
            self._op += 1
            self._fingerprint = 0
            self._stage, self._stage_key, self._stage_start_ns = (
                self._outer_stage, self._outer_key, self._outer_start_ns,
            )
            self._publish()

    def begin_stage(self, stage: Stage, key: int = 0) -> None:
        """Enter a stage (compute, data loading, checkpoint read/write). ``key`` names the
        instance (e.g. which data loader); stages do not nest, except collectives inside them."""
        if stage is Stage.COLLECTIVE:
            raise ValueError("use enter_collective(fingerprint) for collectives, not begin_stage")
        with self._lock:
            self._settle_async()
            self._op += 1
            self._stage = int(stage)
            self._stage_key = key
            self._stage_sequence += 1
            self._stage_start_ns = self._now_ns()
            self._publish()

    def end_stage(self) -> None:
        """Leave the current stage; its duration becomes the last completed stage."""
        with self._lock:
            self._settle_async()
            now = self._now_ns()
            self._op += 1
            self._done_stage, self._done_key, self._done_ns = (
                self._stage, self._stage_key, now - self._stage_start_ns,
            )
            self._stage = int(Stage.COMPUTE)
            self._stage_key = 0
            self._stage_start_ns = now
            self._publish()

    @property
    def coordinate(self) -> tuple[int, int]:
        return (self._step, self._op)

    def raise_contract(self, contract: HostContract) -> None:
        """PROGRESS-13: the rank's host contract is ``contract`` from now on, unless it is
        ``enqueue`` already (never lowered). Safe from any thread."""
        buffer = self._buffer
        if buffer is None:
            return
        with self._lock:
            (current,) = _CONTRACT.unpack_from(buffer, _CONTRACT_OFFSET)
            if int(contract) > current:
                _CONTRACT.pack_into(buffer, _CONTRACT_OFFSET, int(contract))

    def completion_writer(self) -> CompletionWriter:
        """The one writer of the completion section (PROGRESS-8). A second live writer is
        refused: release the first (:meth:`CompletionWriter.release`) before taking another."""
        with self._lock:
            if self._completion_writer is not None:
                raise ProgressError(
                    f"the completion section of record {self.name} already has a live writer; it has "
                    "exactly one (the completion watcher): release it before taking another"
                )
            writer = CompletionWriter(self)
            self._completion_writer = writer
            return writer

    def _release_completion_writer(self, writer: CompletionWriter) -> None:
        with self._lock:
            if self._completion_writer is writer:
                self._completion_writer = None

    def observer_pid(self) -> int | None:
        """The pid of the live observer attached to this record, or None."""
        if self._buffer is None:
            return None
        header = _Header.read(self._buffer)
        return header.observer_pid if header.observer_pid and header.observer_alive else None

    @property
    def closed(self) -> bool:
        return self._buffer is None

    def mark_exiting(self, lock_timeout_s: float = 1.0) -> bool:
        """PROGRESS-11: the trainer is leaving by an exception; its observer stops judging it.
        Absorbing: later publishes keep it. Waits at most ``lock_timeout_s`` for a publish of
        another thread (DDP's hook) to end; False if it could not mark (the record is closed,
        or the lock was not free: the observer then learns of the exit when the process ends)."""
        if self._buffer is None or not self._lock.acquire(timeout=lock_timeout_s):
            return False
        try:
            if self._buffer is None:
                return False
            if self._life == _Life.RUNNING:
                self._life = int(_Life.EXITING)
                self._publish()
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Mark the record closed (so the observer knows the exit was clean) and unlink it if
        it is still ours. Idempotent."""
        if self._buffer is None:
            return
        with self._lock:
            self._life = int(_Life.CLOSED)
            self._publish()
            self._buffer = None
        with _claim_lock():
            header = _Header.read(_buffer_of(self._segment))
            self._segment.close()
            if header.owner_token == self.token:
                with contextlib.suppress(FileNotFoundError):
                    _unlink_segment(self._segment)

    def __enter__(self) -> ProgressPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CompletionWriter:
    """Publishes the rank's completion coordinates into the record's completion section
    (PROGRESS-8, PROGRESS-9). Exactly one per record, used by one thread (the completion
    watcher); its publishes never take the publisher's lock, so they neither wait for nor delay
    the training thread's. After the record is closed a publish does nothing."""

    def __init__(self, publisher: ProgressPublisher) -> None:
        self._publisher = publisher
        self._seq = 0
        self._released = False
        self._coordinates: tuple[tuple[int, ...], ...] | None = None  # the last published, without times
        self._changed_ns = 0

    def publish(self, source: int, enqueued: int, completed: int, pending_fingerprint: int, pending_state: int,
                pending_since_ns: int, completed_fingerprint: int = 0) -> None:
        """One group's consistent completion coordinate: ``completed <= enqueued``, and the
        pending fields are zero exactly when ``enqueued == completed`` (PROGRESS-9)."""
        self.publish_slots([CompletionSlot(source, enqueued, completed, pending_fingerprint, completed_fingerprint,
                                           pending_state, pending_since_ns)])

    def publish_slots(self, slots: list[CompletionSlot] | tuple[CompletionSlot, ...]) -> None:
        """Every tracked group's coordinate, at most ``COMPLETION_GROUPS_MAX``, each consistent
        (PROGRESS-9), no group twice."""
        if self._released:
            raise ProgressError("this completion writer was released; take a new one from the publisher")
        if len(slots) > COMPLETION_GROUPS_MAX:
            raise ValueError(f"{len(slots)} completion coordinates exceed COMPLETION_GROUPS_MAX="
                             f"{COMPLETION_GROUPS_MAX}; publish the groups that matter most")
        for slot in slots:
            if not 0 < slot.source < 2**64 or not 0 <= slot.completed <= slot.enqueued < 2**63:
                raise ValueError(
                    f"a completion coordinate needs 0 < source and 0 <= completed <= enqueued, got source={slot.source}, "
                    f"completed={slot.completed}, enqueued={slot.enqueued}"
                )
            if (slot.enqueued == slot.completed) != (slot.pending_state == 0):
                raise ValueError(
                    f"pending state {slot.pending_state} contradicts enqueued={slot.enqueued}, "
                    f"completed={slot.completed}: it is 0 exactly when nothing is pending"
                )
        if len({slot.source for slot in slots}) != len(slots):
            raise ValueError(f"completion coordinates name a group twice: {[hex(s.source) for s in slots]}")
        buffer = self._publisher._buffer
        if buffer is None:
            return
        rows = tuple((slot.source, slot.enqueued, slot.completed, slot.pending_fingerprint, slot.completed_fingerprint,
                      slot.pending_state, _POINT_TO_POINT if slot.point_to_point else 0, slot.pending_since_ns)
                     for slot in slots)
        now_ns = time.monotonic_ns()
        if rows != self._coordinates:
            self._coordinates, self._changed_ns = rows, now_ns
        head = (len(rows), 0, now_ns, self._changed_ns)
        seq = self._seq + 1
        _SEQ.pack_into(buffer, _COMPLETION_SEQ_OFFSET, seq)
        _COMPLETION_HEAD.pack_into(buffer, _COMPLETION_HEAD_OFFSET, *head)
        for index, row in enumerate(rows):
            _COMPLETION_SLOT.pack_into(buffer, _COMPLETION_SLOTS_OFFSET + index * _COMPLETION_SLOT.size, *row)
        _SEQ.pack_into(buffer, _COMPLETION_CHECKSUM_OFFSET, hash((head, rows)) & _CHECKSUM_MASK)
        self._seq = seq + 1
        _SEQ.pack_into(buffer, _COMPLETION_SEQ_OFFSET, seq + 1)

    def withdraw(self) -> None:
        """Clear the section: readers see "no completion evidence" again (the watcher could not
        keep the coordinates, PROGRESS-8)."""
        buffer = self._publisher._buffer
        if buffer is not None:
            _SEQ.pack_into(buffer, _COMPLETION_SEQ_OFFSET, 0)
        self._seq = 0
        self._coordinates = None

    def release(self) -> None:
        """Give the section back (the watcher stopped). Idempotent."""
        if not self._released:
            self._released = True
            self._publisher._release_completion_writer(self)


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------


class ProgressReader:
    """An observer's view of one rank's record; it claims the observer slot."""

    def __init__(self, name: str, token: bytes, *, claim: bool = True) -> None:
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"token must be {TOKEN_BYTES} bytes, got {len(token)}")
        self.name = name
        self.token = token
        self.claimed = False
        self.last_snapshot: Snapshot | None = None
        self.last_completion: CompletionSnapshot | None = None
        self.failed_reads = 0  # reads that found no consistent snapshot (writer mid-publish)
        self._observer_token = b""
        try:
            self._segment = _open_segment(name, create=False)
        except FileNotFoundError:
            raise RecordNotFound(
                f"no progress record {name}: the trainer has not created it yet (or has exited)"
            ) from None
        try:
            self._check_header()
            if claim:
                self._claim()
        except BaseException:
            self._segment.close()
            raise
        self._buffer: Any = _buffer_of(self._segment)

    def _check_header(self) -> None:
        if self._segment.size < RECORD_BYTES:
            raise RecordMismatch(f"segment {self.name} is {self._segment.size} bytes, a record is {RECORD_BYTES}")
        header = _Header.read(_buffer_of(self._segment))
        if not header.valid:
            raise RecordMismatch(
                f"segment {self.name} is not a scout progress record of layout {LAYOUT_VERSION} "
                f"(magic {header.magic!r}, version {header.version}, size {header.size})"
            )
        if header.owner_token != self.token:
            raise RecordMismatch(
                f"segment {self.name} belongs to another owner (pid {header.owner_pid}); the "
                "token given to this observer does not match, so it is a stale or foreign record"
            )

    def _claim(self) -> None:
        pid, start = _self_identity()
        token = secrets.token_bytes(TOKEN_BYTES)
        with _claim_lock():
            header = _Header.read(_buffer_of(self._segment))
            if header.observer_pid not in (0, pid) and header.observer_alive:
                raise ObserverAlreadyAttached(
                    f"rank {header.rank} (record {self.name}) already has a live observer, pid "
                    f"{header.observer_pid}; start one observer per trainer rank"
                )
            _OBSERVER.pack_into(_buffer_of(self._segment), _OBSERVER_OFFSET, pid, start, token)
        self._observer_token = token
        self.claimed = True

    @property
    def header(self) -> _Header:
        return _Header.read(_buffer_of(self._segment))

    def owner_alive(self) -> bool:
        return self.header.owner_alive

    def read(self, attempts_max: int = READ_ATTEMPTS_MAX) -> Snapshot | None:
        """One consistent snapshot, or None if every attempt overlapped a publish (the writer
        is stopped mid-publish or publishing faster than we can copy)."""
        buffer = self._buffer
        if buffer is None:
            raise ProgressError(f"reader of {self.name} is closed")
        unpack_seq = _SEQ.unpack_from
        unpack_payload = _PAYLOAD.unpack_from
        for _ in range(attempts_max):
            (before,) = unpack_seq(buffer, _SEQ_OFFSET)
            if before & 1:
                continue
            fields = unpack_payload(buffer, _PAYLOAD_OFFSET)
            (after,) = unpack_seq(buffer, _SEQ_OFFSET)
            if before != after or before == 0:
                continue
            values = fields[:-1]
            if hash(values) & _CHECKSUM_MASK != fields[-1]:
                continue
            snapshot = Snapshot(
                before, values[0], values[1], values[2], Stage(values[3]),
                values[4] == _Life.CLOSED, values[5], values[6], values[7], values[8],
                values[9], Stage(values[10]), values[11], values[12], self._read_completion(buffer, attempts_max),
                values[4] == _Life.EXITING, self.contract(),
            )
            self.last_snapshot = snapshot
            return snapshot
        self.failed_reads += 1
        return None

    def _read_completion(self, buffer: Any, attempts_max: int) -> CompletionSnapshot | None:
        """The completion section by PROGRESS-2's rule (PROGRESS-8); the last consistent copy
        when the watcher is stopped mid-publish; None while it was never written."""
        unpack_seq = _SEQ.unpack_from
        for _ in range(attempts_max):
            (before,) = unpack_seq(buffer, _COMPLETION_SEQ_OFFSET)
            if before == 0:
                return None
            if before & 1:
                continue
            head = _COMPLETION_HEAD.unpack_from(buffer, _COMPLETION_HEAD_OFFSET)
            count = head[0]
            if count > COMPLETION_GROUPS_MAX:
                continue
            rows = tuple(_COMPLETION_SLOT.unpack_from(buffer, _COMPLETION_SLOTS_OFFSET + i * _COMPLETION_SLOT.size)
                         for i in range(count))
            (checksum,) = unpack_seq(buffer, _COMPLETION_CHECKSUM_OFFSET)
            (after,) = unpack_seq(buffer, _COMPLETION_SEQ_OFFSET)
            if before != after or hash((head, rows)) & _CHECKSUM_MASK != checksum:
                continue
            slots = tuple(CompletionSlot(r[0], r[1], r[2], r[3], r[4], r[5], r[7], bool(r[6] & _POINT_TO_POINT))
                          for r in rows)
            self.last_completion = CompletionSnapshot(before, slots, head[2], head[3])
            return self.last_completion
        self.failed_reads += 1
        return self.last_completion

    def contract(self) -> HostContract:
        """PROGRESS-13: the rank's host contract (an unknown value reads as ``enqueue``: the
        careful reading)."""
        buffer = self._buffer
        if buffer is None:
            raise ProgressError(f"reader of {self.name} is closed")
        (value,) = _CONTRACT.unpack_from(buffer, _CONTRACT_OFFSET)
        try:
            return HostContract(value)
        except ValueError:
            return HostContract.ENQUEUE

    def close(self, *, unlink_if_orphaned: bool = False) -> None:
        """Release the observer slot; with ``unlink_if_orphaned`` also remove the record when
        its owner is dead (the trainer was killed and cannot clean up). Idempotent."""
        if self._buffer is None:
            return
        self._buffer = None
        with _claim_lock():
            header = _Header.read(_buffer_of(self._segment))
            if self.claimed and header.observer_pid == os.getpid():
                _OBSERVER.pack_into(_buffer_of(self._segment), _OBSERVER_OFFSET, 0, 0, b"\x00" * TOKEN_BYTES)
            orphaned = header.owner_token == self.token and not header.owner_alive
            self._segment.close()
            if unlink_if_orphaned and orphaned:
                try:
                    _unlink_segment(self._segment)
                except OSError as error:
                    if error.errno != errno.ENOENT:
                        raise

    def __enter__(self) -> ProgressReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reclaim_stale_records(identity: RecordIdentity) -> int:
    """Remove this rank's records of earlier generations of the job whose owners are dead (a
    crash or a kill that left no observer to clean up). Returns how many were removed."""
    removed = 0
    for generation in range(max(0, identity.generation - 8), identity.generation):
        name = record_name(identity.job_id, generation, identity.rank)
        with _claim_lock():
            try:
                segment = _open_segment(name, create=False)
            except FileNotFoundError:
                continue
            try:
                header = _Header.read(_buffer_of(segment)) if segment.size >= _HEADER.size else None
            finally:
                segment.close()
            if header is None or not header.valid or not header.owner_alive:
                _unlink_name(name)
                removed += 1
    return removed


#: Where Linux keeps POSIX shared memory (PROGRESS-12's sweep lists it; elsewhere it is skipped).
SHM_DIR: Final = "/dev/shm"
#: The sweep looks at no more names than this per start (a bound on its cost).
SWEEP_NAMES_MAX: Final = 4096


def remove_dead_records(directory: str = SHM_DIR) -> int:
    """PROGRESS-12: at a start, remove every record of this user, of any job, whose owner and
    observer are both dead (or whose creator died before writing its header). A record of
    another layout version is left alone: its owner may be a live process of another scout.
    Returns how many were removed."""
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries if entry.name.startswith(NAME_PREFIX)][:SWEEP_NAMES_MAX]
    except OSError:
        return 0
    uid, removed = os.getuid(), 0
    for name in names:
        try:
            if os.stat(os.path.join(directory, name)).st_uid != uid:
                continue
        except OSError:
            continue
        with _claim_lock():
            try:
                segment = _open_segment(name, create=False)
            except OSError:  # gone, or another user's
                continue
            try:
                header = _Header.read(_buffer_of(segment)) if segment.size >= _HEADER.size else None
            finally:
                segment.close()
            # An empty segment is one whose creator died before sizing it (the sweep holds the
            # creators' lock, so no live one is in between): never written, like a blank header.
            never_written = header is None or header.magic == b"\x00" * len(MAGIC)
            dead = header is not None and header.valid and not header.owner_alive and not header.observer_alive
            if never_written or dead:
                _unlink_name(name)
                removed += 1
    return removed
