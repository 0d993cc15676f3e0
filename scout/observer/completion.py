"""Completion tracking in the trainer: what the device finished, published for the observer
(spec/observer.md PROGRESS-8, PROGRESS-9, INSTR-9..13; docs/observer.md "What is seen on NCCL").

On NCCL a collective returns at enqueue and completes later on a stream; the host coordinate
(step, op) then says where the Python thread is, not what the device did. This module keeps,
for one tracked process group, the rank's *completion coordinate*: how many collectives were
enqueued, how many completed (a contiguous prefix), and the fingerprint, enqueue time and state
(enqueued, started, unknown) of the oldest pending one. A watcher thread
(:class:`CompletionWatcher`) polls a *source* every ``poll_interval_s`` and publishes the
coordinate into the record's completion section (its one writer, PROGRESS-8) when it changes.

Sources, picked once at start by what the process offers (INSTR-10), with one log line:

1. the emulated backend's recorder (:mod:`scout.transport.nccl.emulated`), in Flight Recorder
   format: every collective of the group, with scheduled/started/completed;
2. PyTorch's Flight Recorder (``TORCH_FR_BUFFER_SIZE`` or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` set
   before the process group was made): every collective of the group, from Python or C++;
   started is known on NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``;
3. *markers* (:class:`CompletionTracker`): the collectives scout's wrappers and DDP hook see,
   from any thread (INSTR-11). On a blocking backend (gloo, MPI) a call returns when its
   collective completed; an ``async_op`` call completes with its ``Work``. On a device backend
   (NCCL) a mark recorded on the current stream before the call tells that the stream reached
   it (started), and the ``Work`` (or a mark after a blocking call) tells that it completed.

The watcher runs while the training thread is blocked in a C call (torch's collective calls
release the GIL), holds no lock of the publisher, and costs one poll per interval
(``bench/completion_watcher.py``). torch is imported lazily.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import attrs

from scout.core.observer import COMPLETION_GROUPS_MAX, Completion, HostContract, PendingState
from scout.observer import graph_capture
from scout.observer.flight_recorder import TraceCoordinate, TraceError, coordinate_from_trace
from scout.observer.graph_capture import CaptureGate
from scout.observer.progress import (
    COMPLETION_HEARTBEAT_S,
    CompletionSlot,
    CompletionWriter,
    ProgressPublisher,
)
from scout.reports import guard
from scout.reports.guard import Part

__all__ = [
    "ENTRIES_MAX",
    "GroupTracking",
    "MultiSource",
    "contract_of",
    "POLL_INTERVAL_S",
    "RECORDER_DUMPS",
    "CompletionTracker",
    "CompletionTracking",
    "CompletionWatcher",
    "Contract",
    "MarkClock",
    "MarkerSource",
    "TraceSource",
    "module_device",
    "nccl_markers",
    "recorder_source",
    "source_key",
    "start_tracking",
    "tracking_device",
]

logger = logging.getLogger("scout")

#: INSTR-13: how often the watcher looks (a stall is judged in seconds; this is its resolution).
#: As often as it must publish anyway (the heartbeat, PROGRESS-10): each wake-up of a Python
#: thread costs about 0.13 ms of CPU on a 2-core VM (bench/completion_watcher.py), so 10 a second
#: cost a busy host 0.19 % of a core and 4 a second 0.08 %.
POLL_INTERVAL_S: Final = 0.25
#: INSTR-13: collectives the tracker holds at once. Completed ones leave from the front; a ring
#: full of pending ones (a device that stopped while the host enqueues on) withdraws the
#: completion section instead of publishing a coordinate it can no longer keep.
ENTRIES_MAX: Final = 4096
#: Consecutive failed polls after which the watcher withdraws the section and stops.
FAILED_POLLS_MAX: Final = 20
_FR_BUFFER_VARIABLES: Final = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


class Contract(enum.Enum):
    """What a returned collective call means on the tracked group's backend."""

    BLOCKING = "blocking"  # gloo, MPI: the call returns once the collective completed
    DEVICE = "device"  # NCCL: the call returns at enqueue; completion happens on a stream


class MarkClock(Protocol):
    """Marks in stream order (scout.transport.nccl.timing's ``Timer`` satisfies it)."""

    def record(self) -> Any:
        """A mark after the work issued so far on the current stream."""

    def completed(self, mark: Any) -> bool:
        """Whether the device got past ``mark``; never blocks."""


def source_key(kind: str, group_name: str, group_ranks: tuple[int, ...]) -> int:
    """The nonzero 64-bit ``Completion.source`` of a tracked group and numbering (equal on the
    ranks of a group that number its collectives the same way)."""
    text = f"{kind}\x00{group_name}\x00{','.join(map(str, group_ranks))}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") or 1


# --------------------------------------------------------------------------------------------
# Markers
# --------------------------------------------------------------------------------------------


class _Entry:
    """One collective the wrappers saw (mutable; guarded by the tracker's lock)."""

    __slots__ = ("end_mark", "enqueued_ns", "fingerprint", "returned", "sequence", "start_mark", "work")

    def __init__(self, sequence: int, fingerprint: int, enqueued_ns: int, start_mark: Any) -> None:
        self.sequence = sequence
        self.fingerprint = fingerprint
        self.enqueued_ns = enqueued_ns
        self.start_mark = start_mark
        self.end_mark: Any = None
        self.work: Any = None
        self.returned = False


class CompletionTracker:
    """The collectives scout's wrappers saw on the tracked group, numbered in enqueue order,
    each with its completion marker (INSTR-11). ``begin`` and ``end`` are called from any
    thread that issues a collective; :meth:`coordinate` by the watcher."""

    def __init__(self, contract: Contract, clock: MarkClock | None = None, *, entries_max: int = ENTRIES_MAX,
                 now_ns: Callable[[], int] = time.monotonic_ns,
                 stream_capturing: Callable[[], bool] | None = None) -> None:
        if entries_max < 1:
            raise ValueError(f"entries_max must be >= 1, got {entries_max}")
        self.contract = contract
        self.clock = clock
        self.entries_max = entries_max
        self.overflowed = False
        # INSTR-11: whether the issuing thread's current stream is capturing a CUDA graph
        # (torch.cuda.is_current_stream_capturing: the issuing thread is the one that asks).
        self._stream_capturing = stream_capturing
        self.captured = 0  # collectives issued inside a capture, not tracked
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self._entries: collections.deque[_Entry] = collections.deque()
        self._enqueued = 0
        self._completed = 0
        self._completed_fingerprint = 0

    def begin(self, fingerprint: int) -> _Entry | None:
        """A collective is about to be issued: give it the next sequence number. None once the
        tracker overflowed (its coordinate is withdrawn), or when the call is being captured into
        a CUDA graph: it runs at each replay, not now, and NCCL's watchdog does not track it
        either (INSTR-11); no event is recorded on the capturing stream."""
        if self._capturing():
            with self._lock:
                self.captured += 1
            return None
        start = self._record()
        with self._lock:
            if self.overflowed:
                return None
            if len(self._entries) >= self.entries_max:
                self._drain_locked()
                if len(self._entries) >= self.entries_max:
                    self.overflowed = True
                    self._entries.clear()
                    return None
            self._enqueued += 1
            entry = _Entry(self._enqueued, fingerprint, self._now_ns(), start)
            self._entries.append(entry)
            return entry

    def end(self, entry: _Entry | None, work: Any = None) -> None:
        """The call returned, with its ``Work`` for an ``async_op`` call. On a device backend a
        blocking call's completion is a mark recorded now (the current stream waits for it)."""
        if entry is None:
            return
        end_mark = self._record() if work is None and self.contract is Contract.DEVICE else None
        with self._lock:
            entry.work = work
            entry.end_mark = end_mark
            entry.returned = True

    def launched(self, fingerprint: int, work: Any) -> None:
        """An asynchronous collective issued with its ``Work`` (DDP's gradient buckets)."""
        self.end(self.begin(fingerprint), work)

    def _capturing(self) -> bool:
        if self._stream_capturing is None:
            return False
        try:
            return bool(self._stream_capturing())
        except Exception:  # no answer: track as before
            logger.debug("scout: could not ask whether the stream is capturing", exc_info=True)
            return False

    def _record(self) -> Any:
        if self.clock is None:
            return None
        try:
            return self.clock.record()
        except Exception:  # diagnostics never break the training step
            logger.debug("scout: could not record a completion mark", exc_info=True)
            return None

    def _done(self, entry: _Entry) -> bool:
        if not entry.returned:
            return False
        try:
            if isinstance(entry.work, list):  # a batch of sends and receives (INSTR-16)
                return all(bool(work.is_completed()) for work in entry.work)
            if entry.work is not None:
                return bool(entry.work.is_completed())
            if entry.end_mark is not None and self.clock is not None:
                return self.clock.completed(entry.end_mark)
        except Exception:  # a failed or aborted collective is over: it no longer blocks
            return True
        # A blocking backend's call returned (or a device call whose end mark failed to record).
        return self.contract is Contract.BLOCKING or entry.end_mark is None

    def _started(self, entry: _Entry) -> PendingState:
        if entry.start_mark is None or self.clock is None:
            return PendingState.UNKNOWN
        try:
            return PendingState.STARTED if self.clock.completed(entry.start_mark) else PendingState.ENQUEUED
        except Exception:
            return PendingState.UNKNOWN

    def _drain_locked(self) -> None:
        while self._entries and self._done(self._entries[0]):
            done = self._entries.popleft()
            self._completed, self._completed_fingerprint = done.sequence, done.fingerprint

    def coordinate(self) -> tuple[int, int, int, PendingState, int, int] | None:
        """(enqueued, completed, pending fingerprint, pending state, pending since ns, completed
        fingerprint), or None once the tracker overflowed."""
        with self._lock:
            if self.overflowed:
                return None
            self._drain_locked()
            if not self._entries:
                return (self._enqueued, self._completed, 0, PendingState.NONE, 0, self._completed_fingerprint)
            oldest = self._entries[0]
            return (self._enqueued, self._completed, oldest.fingerprint, self._started(oldest), oldest.enqueued_ns,
                    self._completed_fingerprint)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


class MarkerSource:
    """INSTR-11: the coordinate of the collectives scout's wrappers and hooks saw (INSTR-16:
    or of this rank's own sends and receives, ``point_to_point``)."""

    def __init__(self, tracker: CompletionTracker, key: int, *, point_to_point: bool = False) -> None:
        self.tracker = tracker
        self.key = key
        self.point_to_point = point_to_point

    def poll(self) -> tuple[Completion, int] | None:
        found = self.tracker.coordinate()
        if found is None:
            return None
        enqueued, completed, fingerprint, state, since_ns, completed_fingerprint = found
        return Completion(self.key, enqueued, completed, fingerprint, state, completed_fingerprint,
                          self.point_to_point), since_ns


class TraceSource:
    """INSTR-12: the coordinate a Flight Recorder-format dump gives for the tracked group.

    ``dump(collectives)`` returns the recorder's dump, with its entries or (``False``) only the
    groups' status. Each poll reads the status (microseconds); a full dump (milliseconds on a
    64-entry ring) is read only when the numbers stood still since the previous poll -- a
    possible stall, whose pending collective then gets its fingerprint and enqueue time -- and
    once per such coordinate. A healthy job, whose numbers move between polls, never pays for
    one."""

    def __init__(self, dump: Callable[[bool], Mapping[str, Any]], key: int, group_name: str,
                 group_ranks: tuple[int, ...] | None, *, started_known: bool) -> None:
        self.dump = dump
        self.key = key
        self.group_name = group_name
        self.group_ranks = group_ranks
        self.started_known = started_known
        self.full_dumps = 0
        # Read once: the recorder's enqueue times are wall clock; a per-poll offset would move
        # by the reads' jitter and make an unchanged coordinate look new.
        self.wall_minus_monotonic_ns = time.time_ns() - time.monotonic_ns()
        self._status_key: str | None = None
        self._previous: tuple[int, int, PendingState] | None = None
        self._described: TraceCoordinate | None = None
        self._last: tuple[TraceCoordinate, tuple[Completion, int]] | None = None

    def _read(self, collectives: bool) -> TraceCoordinate:
        found = coordinate_from_trace(self.dump(collectives), self.group_name, group_ranks=self.group_ranks,
                                      started_known=self.started_known,
                                      wall_minus_monotonic_ns=self.wall_minus_monotonic_ns,
                                      status_key=self._status_key)
        if collectives:
            self.full_dumps += 1
            if found.status_key is not None:
                self._status_key = found.status_key
        return found

    def poll(self) -> tuple[Completion, int] | None:
        # Until the group's status key is known, read entries: they name it.
        found = self._read(self._status_key is None)
        numbers = (found.enqueued, found.completed, found.pending_state)
        described = self._described
        if described is not None and (described.enqueued, described.completed, described.pending_state) == numbers:
            found = described
        elif numbers == self._previous and found.pending_fingerprint == 0 and found.completed_fingerprint == 0:
            full = self._read(True)
            if (full.enqueued, full.completed, full.pending_state) == numbers:
                found = self._described = full
        self._previous = numbers
        if self._last is not None and self._last[0] == found:
            return self._last[1]  # unchanged: the watcher publishes nothing
        completion = Completion(self.key, found.enqueued, found.completed, found.pending_fingerprint,
                                found.pending_state, found.completed_fingerprint)
        self._last = (found, (completion, found.pending_since_ns))
        return self._last[1]


class Source(Protocol):
    key: int

    def poll(self) -> Any:
        """One group's (coordinate, pending since ns), or a list of them (:class:`MultiSource`);
        None: the source overflowed and its section is withdrawn."""


# --------------------------------------------------------------------------------------------
# The watcher
# --------------------------------------------------------------------------------------------


class CompletionWatcher:
    """INSTR-13: one daemon thread that polls ``source`` every ``poll_interval_s`` and publishes
    the coordinate through ``writer`` when it changed, and at least every
    ``COMPLETION_HEARTBEAT_S`` (PROGRESS-10). A source that fails
    ``FAILED_POLLS_MAX`` times in a row, or overflows, withdraws the section and stops the
    watcher: the observer then judges by host coordinates alone, as without tracking.

    With ``capture_gate`` (a source that queries a CUDA device) a poll runs only while no CUDA
    graph capture is announced: one due during a capture is skipped and counted in
    ``skipped_polls`` (INSTR-13), and polling resumes when the capture ends."""

    def __init__(self, source: Source, writer: CompletionWriter, *, poll_interval_s: float = POLL_INTERVAL_S,
                 capture_gate: CaptureGate | None = None) -> None:
        if not 0 < poll_interval_s <= 1.0:
            raise ValueError(f"poll_interval_s must be in (0, 1] seconds, got {poll_interval_s!r}")
        self.source = source
        self.writer = writer
        self.poll_interval_s = poll_interval_s
        self.capture_gate = capture_gate
        self.skipped_polls = 0
        self.polls = 0
        self.publishes = 0
        self.failed_polls = 0
        self.withdrawn_reason: str | None = None
        self._last: tuple[tuple[Completion, int], ...] | None = None
        self._published_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scout-completion", daemon=True)

    def start(self) -> None:
        self.poll_once()
        self._thread.start()

    def poll_once(self) -> None:
        """One poll (the thread's body; tests call it directly)."""
        if self.withdrawn_reason is not None:
            return
        if self.capture_gate is None:
            self._poll()
            return
        with self.capture_gate.poll() as allowed:
            if not allowed:
                # INSTR-13: an event query now would invalidate the capture. Nothing is published
                # either: a capture longer than COMPLETION_STALE_S leaves the section stale, so
                # no evidence rather than an old coordinate dressed as a fresh one.
                self.skipped_polls += 1
                return
            self._poll()

    def _poll(self) -> None:
        self.polls += 1
        try:
            found = self.source.poll()
        except (TraceError, ValueError, RuntimeError, OSError, pickle.UnpicklingError) as error:
            self.failed_polls += 1
            if self.failed_polls >= FAILED_POLLS_MAX:
                self._withdraw(f"{FAILED_POLLS_MAX} polls of the completion source failed in a row, the last: {error}")
            return
        self.failed_polls = 0
        if found is None:
            self._withdraw(f"more than {ENTRIES_MAX} collectives pending at once")
            return
        coordinates = tuple(found) if isinstance(found, list) else (found,)
        now_s = time.monotonic()
        # PROGRESS-10: unchanged coordinates are published again as a heartbeat, so that a
        # reader can tell a watcher that cannot run from one with nothing new to say.
        # A wait may end a little before its interval: a heartbeat due within the next tenth of
        # it goes out now, so polls every COMPLETION_HEARTBEAT_S still beat every time.
        if coordinates != self._last or now_s - self._published_s >= 0.9 * COMPLETION_HEARTBEAT_S:
            self.writer.publish_slots([
                CompletionSlot(c.source, c.enqueued, c.completed, c.pending_fingerprint, c.completed_fingerprint,
                               int(c.pending_state), since_ns, c.point_to_point)
                for c, since_ns in coordinates
            ])
            self.publishes += 1
            self._last = coordinates
            self._published_s = now_s

    def _withdraw(self, reason: str) -> None:
        self.withdrawn_reason = reason
        self.writer.withdraw()
        logger.warning("scout: completion tracking stops (%s); the observer judges by host progress alone", reason)
        self._stop.set()

    def withdraw(self, reason: str) -> None:
        """Withdraw the section and stop polling (spec/guard.md: the completion part is off)."""
        if self.withdrawn_reason is None:
            self._withdraw(reason)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                if guard.INJECTING:
                    guard.inject("completion.poll")
                self.poll_once()
            except Exception as error:  # the watcher must never take the trainer down (spec/guard.md GUARD-3)
                guard.failed(Part.COMPLETION, error, "completion thread")

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (within one poll interval) and release the section. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self.writer.release()


# --------------------------------------------------------------------------------------------
# Every group (INSTR-9, INSTR-16)
# --------------------------------------------------------------------------------------------

#: Backends whose collective calls return once the collective completed (gloo, MPI; scout's own
#: gloo groups, scout/transport/gloo_groups.py).
_BLOCKING_BACKENDS: Final = frozenset({"gloo", "mpi", "scoutgloo"})
#: Backends whose calls return at enqueue (NCCL; the emulated backend, INSTR-14).
_DEVICE_BACKENDS: Final = frozenset({"nccl", "scoutemu"})


def contract_of(backend: str) -> Contract | None:
    """The completion contract of a backend name as ``dist.get_backend`` gives it (``nccl``,
    ``cpu:gloo,cuda:nccl``, ...): where any of its devices' backends returns at enqueue, the
    group's calls may. None: no known contract."""
    names = {part.rpartition(":")[2].strip() for part in backend.lower().split(",")}
    if names & _DEVICE_BACKENDS:
        return Contract.DEVICE
    if names and names <= _BLOCKING_BACKENDS:
        return Contract.BLOCKING
    return None


@attrs.define
class GroupTracking:
    """One tracked process group: its collectives' source and, for markers, their trackers."""

    group: Any
    name: str
    ranks: tuple[int, ...]
    backend: str
    contract: Contract | None
    source: Source | None  # None: no known contract, nothing tracked
    tracker: CompletionTracker | None = None  # set when the source is markers
    p2p: CompletionTracker | None = None  # INSTR-16: this rank's own sends and receives (markers)
    p2p_key: int = 0
    order: int = 0  # registration order: the default group first
    how: str = ""  # the source's name, as the start-up log line says it


class _SharedDump:
    """One recorder dump serves every group's :class:`TraceSource` within one poll (INSTR-12):
    the dump holds every group."""

    def __init__(self, dump: Callable[[bool], Mapping[str, Any]]) -> None:
        self._dump = dump
        self.epoch = 0
        self._cached: dict[bool, tuple[int, Mapping[str, Any]]] = {}

    def __call__(self, collectives: bool) -> Mapping[str, Any]:
        cached = self._cached.get(collectives)
        if cached is not None and cached[0] == self.epoch:
            return cached[1]
        found = self._dump(collectives)
        self._cached[collectives] = (self.epoch, found)
        return found


class MultiSource:
    """INSTR-9: every tracked group's coordinate in one poll, at most ``COMPLETION_GROUPS_MAX``
    -- the pending ones first, then those that changed last (a member that leaves a group out
    votes as missing on it, never as "not enqueued")."""

    key = 0  # several groups: no single source key

    def __init__(self, tracking: CompletionTracking) -> None:
        self.tracking = tracking
        self._changed: dict[int, tuple[Completion, int]] = {}  # source key -> (coordinate, poll it changed)
        self._polls = 0

    def poll(self) -> list[tuple[Completion, int]] | None:
        self._polls += 1
        tracking = self.tracking
        tracking.scan()
        for shared in tracking.shared_dumps.values():
            shared.epoch = self._polls
        found: list[tuple[int, tuple[Completion, int]]] = []
        for entry in tracking.entries():
            for source in (entry.source, _p2p_source(entry)):
                if source is None:
                    continue
                polled = source.poll()
                if polled is None:
                    if source is entry.source:
                        return None  # an overflowing tracker: withdraw rather than publish what cannot be kept
                    continue
                found.append((entry.order, polled))
        for _, (completion, _) in found:
            seen = self._changed.get(completion.source)
            if seen is None or seen[0] != completion:
                self._changed[completion.source] = (completion, self._polls)
        if len(found) > COMPLETION_GROUPS_MAX:
            ranked = sorted(found, key=lambda item: (not item[1][0].pending,
                                                     -self._changed[item[1][0].source][1], item[0]))
            kept = {id(item) for item in ranked[:COMPLETION_GROUPS_MAX]}
            found = [item for item in found if id(item) in kept]
        return [polled for _, polled in found]


def _p2p_source(entry: GroupTracking) -> MarkerSource | None:
    """INSTR-16: a group's point-to-point coordinate, once this rank sent or received on it."""
    if entry.p2p is None or entry.p2p.coordinate() in (None, (0, 0, 0, PendingState.NONE, 0, 0)):
        return None
    return MarkerSource(entry.p2p, entry.p2p_key, point_to_point=True)


class CompletionTracking:
    """The completion tracking of one process: every process group it is a member of (INSTR-9),
    the host contract they imply (PROGRESS-13), and the watcher that publishes them."""

    def __init__(self, publisher: ProgressPublisher, *, source: str, environ: Mapping[str, str],
                 only: Any = None, device: Any = None) -> None:
        self.publisher = publisher
        self.device = device  # the CUDA device of the job's module, for the marks (INSTR-10)
        self.capture_gate: CaptureGate | None = None  # INSTR-13: held while a source queries a CUDA device
        self.mode = source
        self.environ = environ
        self.only = only  # track this group alone (None: every group)
        self._lock = threading.Lock()
        self._groups: dict[int, GroupTracking] = {}
        self._registry_size = -1
        self.shared_dumps: dict[str, _SharedDump] = {}
        self.watcher: CompletionWatcher | None = None
        self.described: list[str] = []

    # -- the groups -----------------------------------------------------------------------

    def scan(self) -> None:
        """Track every group torch.distributed registered since the last scan (INSTR-9): one
        length check when nothing changed."""
        from torch.distributed import distributed_c10d

        registry = distributed_c10d._world.pg_map
        if len(registry) == self._registry_size:
            return
        self._registry_size = len(registry)
        groups = [self.only] if self.only is not None else [distributed_c10d._get_default_group(), *list(registry)]
        for group in groups:
            if group is not None and id(group) not in self._groups:
                self.register(group)

    def register(self, group: Any) -> GroupTracking | None:
        """Start tracking ``group`` (idempotent)."""
        import torch.distributed as dist

        with self._lock:
            known = self._groups.get(id(group))
            if known is not None:
                return known
            try:
                ranks = tuple(int(r) for r in dist.get_process_group_ranks(group))
                backend = str(dist.get_backend(group)).lower()
            except (RuntimeError, ValueError, KeyError):  # not a member (KeyError: NON_GROUP_MEMBER), or unknown (yet)
                return None
            from scout.transport.nccl.groups import group_name

            name = group_name(group)
            entry = self._make(group, name, ranks, backend)
            entry.order = len(self._groups)
            self._groups[id(group)] = entry
        self.publisher.raise_contract(HostContract.BLOCKING if entry.contract is Contract.BLOCKING
                                      else HostContract.ENQUEUE)
        return entry

    def _make(self, group: Any, name: str, ranks: tuple[int, ...], backend: str) -> GroupTracking:
        contract = contract_of(backend)
        label = f"group {name!r} ({len(ranks)} ranks, {backend})"
        rank = _own_rank()
        p2p_key = source_key("p2p", name, (*ranks, -1, rank))
        emulated = getattr(group, "flight_recorder_dump", None)
        if callable(emulated) and self.mode in ("auto", "flight-recorder"):
            source = TraceSource(emulated, source_key("emulated", name, ranks), name, ranks, started_known=True)
            self._say(label, "the emulated backend's recorder: every collective, scheduled/started/completed")
            return GroupTracking(group, name, ranks, backend, contract, source, p2p=CompletionTracker(Contract.DEVICE,
                                 _emulated_clock(group)), p2p_key=p2p_key, how="the emulated backend's recorder")
        recorded = (recorder_source(_recorder_backend(backend), name, ranks, self.environ, torch_c10d(), self._recorder)
                    if self.mode != "markers" and _flight_recorder_enabled(self.environ) else None)
        if recorded is not None:
            source, how = recorded
            self._say(label, how)
            tracker_contract = contract or Contract.DEVICE
            return GroupTracking(group, name, ranks, backend, contract, source,
                                 p2p=CompletionTracker(tracker_contract, self._clock(group, tracker_contract)),
                                 p2p_key=p2p_key, how="PyTorch's Flight Recorder")
        if self.mode == "flight-recorder":
            self._say(label, "nothing: the Flight Recorder is off (set TORCH_FR_BUFFER_SIZE before init_process_group)")
            return GroupTracking(group, name, ranks, backend, contract, None)
        if contract is None:
            self._say(label, f"nothing: no known completion contract for backend {backend!r}")
            return GroupTracking(group, name, ranks, backend, contract, None)
        if contract is Contract.DEVICE and _emulated_clock(group) is None:
            import torch

            tracker, marker_source, how = nccl_markers(name, ranks, self.environ, device=self.device, group=group,
                                                       cuda=torch.cuda)
            self._say(label, how)
            return GroupTracking(group, name, ranks, backend, contract, marker_source, tracker,
                                 CompletionTracker(contract, tracker.clock,
                                                   stream_capturing=getattr(torch.cuda, "is_current_stream_capturing",
                                                                            None)),
                                 p2p_key, how="markers")
        clock = self._clock(group, contract)
        tracker = CompletionTracker(contract, clock)
        how = ("markers: collectives called through torch.distributed, DDP's buckets and buffer broadcasts, from any "
               "thread; collectives issued only from C++ are not seen (set TORCH_FR_BUFFER_SIZE to see them)")
        if contract is Contract.DEVICE and clock is None:
            how += "; no event clock: started unknown"
        self._say(label, how)
        return GroupTracking(group, name, ranks, backend, contract, MarkerSource(tracker, source_key("markers", name, ranks)),
                             tracker, CompletionTracker(contract, clock), p2p_key, how="markers")

    def _clock(self, group: Any, contract: Contract) -> MarkClock | None:
        if contract is Contract.BLOCKING:
            return None
        emulated = _emulated_clock(group)
        if emulated is not None:
            return emulated
        import torch

        index, _ = tracking_device(device=self.device, group=group, environ=self.environ, cuda=torch.cuda)
        return _cuda_clock(index, torch.cuda)

    def _recorder(self, dump: Callable[[bool], Mapping[str, Any]], dump_name: str) -> Callable[[bool], Mapping[str, Any]]:
        """One dump per recorder per poll, shared by every group it records (INSTR-12)."""
        shared = self.shared_dumps.get(dump_name)
        if shared is None:
            shared = self.shared_dumps[dump_name] = _SharedDump(dump)
        return shared

    def _say(self, label: str, how: str) -> None:
        line = f"scout: completion tracking of {label} by {how}"
        self.described.append(line)
        logger.info("%s", line)

    def entries(self) -> list[GroupTracking]:
        with self._lock:
            return sorted(self._groups.values(), key=lambda entry: entry.order)

    def entry(self, group: Any) -> GroupTracking | None:
        """The tracking of ``group`` (None: the default group), registering it on first sight."""
        if group is None:
            import torch.distributed as dist

            group = dist.group.WORLD
        found = self._groups.get(id(group))
        if found is None and self.only is None:
            found = self.register(group)
        return found if found is None or self.only is None or group is self.only else None

    # -- what the wrappers ask ------------------------------------------------------------

    def tracks(self, group: Any) -> bool:
        """Whether a collective called with ``group`` (None: the default group) is tracked."""
        entry = self.entry(group)
        return entry is not None and entry.source is not None

    def tracker_for(self, group: Any) -> CompletionTracker | None:
        """The markers tracker of ``group``'s collectives (None where another source counts them)."""
        entry = self.entry(group)
        return None if entry is None else entry.tracker

    def p2p_tracker_for(self, group: Any) -> CompletionTracker | None:
        """INSTR-16: the tracker of this rank's sends and receives on ``group``."""
        entry = self.entry(group)
        return None if entry is None else entry.p2p

    @property
    def tracker(self) -> CompletionTracker | None:
        """The default group's markers tracker (kept for callers that track one group)."""
        import torch.distributed as dist

        return self.tracker_for(dist.group.WORLD if self.only is None else self.only)

    @property
    def source_name(self) -> str:
        """The first tracked group's source (the default group's), as the log line names it."""
        tracked = [entry.how for entry in self.entries() if entry.source is not None]
        return tracked[0] if tracked else "none"

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.capture_gate is not None:
            graph_capture.release(self.capture_gate)
            self.capture_gate = None


def _own_rank() -> int:
    import torch.distributed as dist

    return int(dist.get_rank())


def _emulated_clock(group: Any) -> MarkClock | None:
    """INSTR-14: the emulated backend's mark clock for ``group``'s stream, if it is one."""
    clock = getattr(group, "mark_clock", None)
    return clock() if callable(clock) else None


def _flight_recorder_enabled(environ: Mapping[str, str]) -> bool:
    for name in _FR_BUFFER_VARIABLES:
        try:
            if int(environ.get(name, "0") or 0) > 0:
                return True
        except ValueError:
            continue
    return False


def _cuda_index(device: Any) -> int | None:
    """The index of a CUDA ``device`` (a ``torch.device``, ``"cuda:1"``), None for anything else
    or for ``"cuda"`` without an index."""
    if isinstance(device, str):
        kind, _, number = device.partition(":")
        return int(number) if kind == "cuda" and number.isdigit() else None
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    index = getattr(device, "index", None)
    return int(index) if index is not None else None


def module_device(module: Any) -> Any:
    """The CUDA device of ``module``'s first parameter or buffer on one, else None (INSTR-10)."""
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.device.type == "cuda":
            return tensor.device
    return None


def tracking_device(*, device: Any = None, group: Any = None, environ: Mapping[str, str], cuda: Any) -> tuple[int, str]:
    """INSTR-10: the CUDA device whose current stream the marks are recorded on -- the one the
    job's collectives run after -- and what said so: the module's parameters (``device``), the
    group's bound device (``init_process_group(device_id=...)``), ``LOCAL_RANK`` (torchrun's, as
    an index of the visible devices; with one visible device, that one), and only then the
    current device, which is GPU 0 in a script that never calls ``set_device`` whatever its rank."""
    index = _cuda_index(device)
    if index is not None:
        return index, "the module's parameters"
    index = _cuda_index(getattr(group, "bound_device_id", None)) if group is not None else None
    if index is not None:
        return index, "the process group's device"
    count = int(cuda.device_count())
    local_rank = environ.get("LOCAL_RANK", "")
    if local_rank.isdigit() and int(local_rank) < count:
        return int(local_rank), "LOCAL_RANK"
    if local_rank.isdigit() and count == 1:
        return 0, "the one visible GPU"
    return int(cuda.current_device()), "the current device"


def _cuda_clock(index: int, cuda: Any) -> MarkClock | None:
    try:
        from scout.transport.nccl.timing import CudaEventTimer  # spec/replay.md TIMING-1..6

        clock: MarkClock = CudaEventTimer(index, cuda=cuda)
        return clock
    except Exception:  # noqa: BLE001 - no CUDA timer: completion by Work handles only
        logger.debug("scout: no CUDA event timer for completion marks", exc_info=True)
        return None


def nccl_markers(name: str, ranks: tuple[int, ...], env: Mapping[str, str], *, device: Any, group: Any,
                 cuda: Any) -> tuple[CompletionTracker, MarkerSource, str]:
    """INSTR-11's markers on NCCL: events on the current stream of the device INSTR-10 picks,
    no tracking of calls captured into a CUDA graph (INSTR-11). ``cuda``: ``torch.cuda``, or the
    fake of tests/fake_cuda.py."""
    index, why = tracking_device(device=device, group=group, environ=env, cuda=cuda)
    clock = _cuda_clock(index, cuda)
    tracker = CompletionTracker(Contract.DEVICE, clock,
                                stream_capturing=getattr(cuda, "is_current_stream_capturing", None))
    how = (f"markers: CUDA events on cuda:{index} (from {why}) and Work handles of the collectives called through "
           "torch.distributed and DDP's hook" + ("" if clock is not None else " (no event timer: started unknown)")
           + "; set TORCH_FR_BUFFER_SIZE and TORCH_NCCL_ENABLE_TIMING=1 to see C++-issued ones")
    return tracker, MarkerSource(tracker, source_key("markers", name, ranks)), how


def start_tracking(
    publisher: ProgressPublisher,
    *,
    group: Any = None,
    source: str = "auto",
    poll_interval_s: float = POLL_INTERVAL_S,
    environ: Mapping[str, str] | None = None,
    device: Any = None,
) -> CompletionTracking | None:
    """Start tracking the completion of every process group's collectives (INSTR-9; ``group``:
    that group alone) and publishing them into ``publisher``'s record. ``source``: ``auto``
    (INSTR-10's order), ``flight-recorder`` or ``markers``; ``device``: the CUDA device of the
    job's module, for the marks (INSTR-10). Returns None, with a log line saying why, where
    torch.distributed is not initialised."""
    if source not in ("auto", "flight-recorder", "markers"):
        raise ValueError(f"completion source must be 'auto', 'flight-recorder' or 'markers', got {source!r}")
    env = os.environ if environ is None else environ
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        logger.info("scout: no completion tracking: torch.distributed is not initialised")
        return None
    tracking = CompletionTracking(publisher, source=source, environ=env, only=group, device=device)
    tracking.scan()
    if not any(entry.source is not None for entry in tracking.entries()) and group is not None:
        return None
    # INSTR-13: NCCL's sources query CUDA events from the watcher thread (markers, Work handles,
    # the recorder's dump), which must stay out of CUDA graph captures. A job whose groups are
    # gloo and the emulated backend only has no such query.
    if any(_recorder_backend(entry.backend) == "nccl" for entry in tracking.entries()):
        tracking.capture_gate = graph_capture.acquire()
    watcher = CompletionWatcher(MultiSource(tracking), publisher.completion_writer(), poll_interval_s=poll_interval_s,
                                capture_gate=tracking.capture_gate)
    tracking.watcher = watcher
    try:
        watcher.start()
    except BaseException:
        tracking.stop()
        raise
    return tracking


#: INSTR-12: which dump reads the recorder that records a backend's collectives. torch keeps one
#: recorder per event type: NCCL's (CUDA events) is dumped by ``_dump_nccl_trace``; the CPU one
#: that gloo records into by ``_dump_fr_trace``, which on NCCL holds none of NCCL's collectives.
RECORDER_DUMPS: Final = {"nccl": "_dump_nccl_trace", "gloo": "_dump_fr_trace", "scoutgloo": "_dump_fr_trace"}


def recorder_source(backend: str, name: str, ranks: tuple[int, ...], env: Mapping[str, str], c10d: Any,
                    share: Callable[[Callable[[bool], Mapping[str, Any]], str], Callable[[bool], Mapping[str, Any]]]
                    | None = None) -> tuple[TraceSource, str] | None:
    """INSTR-12: the Flight Recorder source of group ``name`` on ``backend``, read with the dump of
    the recorder that backend records into (:data:`RECORDER_DUMPS`), and how it sees; None when
    this torch has no such dump (a CPU build has no ``_dump_nccl_trace``) or no recorder records
    the backend."""
    dump_name = RECORDER_DUMPS.get(backend)
    dump = getattr(c10d, dump_name, None) if dump_name is not None else None
    if dump is None or dump_name is None:
        logger.info("scout: no Flight Recorder dump for backend %r in this torch (%s); completion falls back to "
                    "markers", backend, dump_name or "no recorder records it")
        return None
    started_known = backend == "nccl" and env.get("TORCH_NCCL_ENABLE_TIMING", "0").lower() in ("1", "true")

    def read(collectives: bool) -> Mapping[str, Any]:
        # onlyActive: entries not yet completed (and, for gloo, every entry: it never sees one complete).
        trace: Mapping[str, Any] = pickle.loads(dump(collectives, False, True))  # noqa: S301 - torch's own dump
        return trace

    reader = read if share is None else share(read, dump_name)
    source = TraceSource(reader, source_key("flight-recorder", name, ranks), name, ranks, started_known=started_known)
    how = (f"PyTorch's Flight Recorder: every collective, from Python or C++, read with {dump_name}"
           + ("; started from its timing events" if started_known else "; started unknown"
              + (" (set TORCH_NCCL_ENABLE_TIMING=1 to see it)" if backend == "nccl" else "")))
    return source, how


def _recorder_backend(backend: str) -> str:
    """The recorder a group's backend records into: NCCL's where any of its devices runs NCCL
    (``cpu:gloo,cuda:nccl``), else its own name."""
    names = {part.rpartition(":")[2].strip() for part in backend.lower().split(",")}
    return "nccl" if "nccl" in names else backend.lower()


def torch_c10d() -> Any:
    import torch._C._distributed_c10d as c10d

    return c10d
