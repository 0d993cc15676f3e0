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

from scout.core.observer import Completion, PendingState
from scout.observer.flight_recorder import TraceCoordinate, TraceError, coordinate_from_trace
from scout.observer.progress import COMPLETION_HEARTBEAT_S, CompletionWriter, ProgressPublisher
from scout.reports import guard
from scout.reports.guard import Part

__all__ = [
    "ENTRIES_MAX",
    "POLL_INTERVAL_S",
    "CompletionTracker",
    "CompletionTracking",
    "CompletionWatcher",
    "Contract",
    "MarkClock",
    "MarkerSource",
    "TraceSource",
    "source_key",
    "start_tracking",
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
                 now_ns: Callable[[], int] = time.monotonic_ns) -> None:
        if entries_max < 1:
            raise ValueError(f"entries_max must be >= 1, got {entries_max}")
        self.contract = contract
        self.clock = clock
        self.entries_max = entries_max
        self.overflowed = False
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self._entries: collections.deque[_Entry] = collections.deque()
        self._enqueued = 0
        self._completed = 0
        self._completed_fingerprint = 0

    def begin(self, fingerprint: int) -> _Entry | None:
        """A collective is about to be issued: give it the next sequence number. None once the
        tracker overflowed (its coordinate is withdrawn)."""
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
    """INSTR-11: the coordinate of the collectives scout's wrappers and hooks saw."""

    def __init__(self, tracker: CompletionTracker, key: int) -> None:
        self.tracker = tracker
        self.key = key

    def poll(self) -> tuple[Completion, int] | None:
        found = self.tracker.coordinate()
        if found is None:
            return None
        enqueued, completed, fingerprint, state, since_ns, completed_fingerprint = found
        return Completion(self.key, enqueued, completed, fingerprint, state, completed_fingerprint), since_ns


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

    def poll(self) -> tuple[Completion, int] | None: ...


# --------------------------------------------------------------------------------------------
# The watcher
# --------------------------------------------------------------------------------------------


class CompletionWatcher:
    """INSTR-13: one daemon thread that polls ``source`` every ``poll_interval_s`` and publishes
    the coordinate through ``writer`` when it changed, and at least every
    ``COMPLETION_HEARTBEAT_S`` (PROGRESS-10). A source that fails
    ``FAILED_POLLS_MAX`` times in a row, or overflows, withdraws the section and stops the
    watcher: the observer then judges by host coordinates alone, as without tracking."""

    def __init__(self, source: Source, writer: CompletionWriter, *, poll_interval_s: float = POLL_INTERVAL_S) -> None:
        if not 0 < poll_interval_s <= 1.0:
            raise ValueError(f"poll_interval_s must be in (0, 1] seconds, got {poll_interval_s!r}")
        self.source = source
        self.writer = writer
        self.poll_interval_s = poll_interval_s
        self.polls = 0
        self.publishes = 0
        self.failed_polls = 0
        self.withdrawn_reason: str | None = None
        self._last: tuple[Completion, int] | None = None
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
        now_s = time.monotonic()
        # PROGRESS-10: an unchanged coordinate is published again as a heartbeat, so that a
        # reader can tell a watcher that cannot run from one with nothing new to say.
        # A wait may end a little before its interval: a heartbeat due within the next tenth of
        # it goes out now, so polls every COMPLETION_HEARTBEAT_S still beat every time.
        if found != self._last or now_s - self._published_s >= 0.9 * COMPLETION_HEARTBEAT_S:
            completion, since_ns = found
            self.writer.publish(completion.source, completion.enqueued, completion.completed,
                                completion.pending_fingerprint, int(completion.pending_state), since_ns,
                                completion.completed_fingerprint)
            self.publishes += 1
            self._last = found
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
# Start-up: feature detection
# --------------------------------------------------------------------------------------------


@attrs.define
class CompletionTracking:
    """The tracking of one process: what it tracks, how, and its watcher."""

    group: Any
    group_ranks: tuple[int, ...]
    source_name: str
    watcher: CompletionWatcher
    tracker: CompletionTracker | None  # set when the source is markers (the wrappers feed it)

    def tracks(self, group: Any) -> bool:
        """Whether a collective called with ``group`` (None: the default group) is tracked."""
        if group is None:
            import torch.distributed as dist

            group = dist.group.WORLD
        return group is self.group

    def stop(self) -> None:
        self.watcher.stop()


def _flight_recorder_enabled(environ: Mapping[str, str]) -> bool:
    for name in _FR_BUFFER_VARIABLES:
        try:
            if int(environ.get(name, "0") or 0) > 0:
                return True
        except ValueError:
            continue
    return False


def _cuda_clock() -> MarkClock | None:
    try:
        import torch

        from scout.transport.nccl.timing import timer_for  # spec/replay.md TIMING-1..6

        clock: MarkClock = timer_for(torch.device("cuda", torch.cuda.current_device()))
        return clock
    except Exception:  # noqa: BLE001 - no CUDA timer: completion by Work handles only
        logger.debug("scout: no CUDA event timer for completion marks", exc_info=True)
        return None


def start_tracking(
    publisher: ProgressPublisher,
    *,
    group: Any = None,
    source: str = "auto",
    poll_interval_s: float = POLL_INTERVAL_S,
    environ: Mapping[str, str] | None = None,
) -> CompletionTracking | None:
    """Start tracking the completion of ``group``'s collectives (default: the default group) and
    publishing it into ``publisher``'s record. ``source``: ``auto`` (INSTR-10's order),
    ``flight-recorder`` or ``markers``. Returns None, with a log line saying why, where nothing
    can be tracked (no process group, a backend without a known contract)."""
    if source not in ("auto", "flight-recorder", "markers"):
        raise ValueError(f"completion source must be 'auto', 'flight-recorder' or 'markers', got {source!r}")
    env = os.environ if environ is None else environ
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        logger.info("scout: no completion tracking: torch.distributed is not initialised")
        return None
    group = dist.group.WORLD if group is None else group
    ranks = tuple(int(r) for r in dist.get_process_group_ranks(group))
    from scout.transport.nccl.groups import group_name

    name = group_name(group)
    backend = str(dist.get_backend(group)).lower()
    label = f"group {name!r} ({len(ranks)} ranks, {backend})"
    emulated = getattr(group, "flight_recorder_dump", None)
    chosen: Source | None = None
    tracker: CompletionTracker | None = None
    how = ""
    if callable(emulated) and source in ("auto", "flight-recorder"):
        chosen = TraceSource(emulated, source_key("emulated", name, ranks), name, ranks, started_known=True)
        how = "the emulated backend's recorder: every collective, scheduled/started/completed"
    elif source != "markers" and _flight_recorder_enabled(env) and hasattr(torch_c10d(), "_dump_fr_trace"):
        started_known = backend == "nccl" and env.get("TORCH_NCCL_ENABLE_TIMING", "0").lower() in ("1", "true")
        dump = torch_c10d()._dump_fr_trace

        def read(collectives: bool) -> Mapping[str, Any]:
            # onlyActive: entries not yet completed (and, for gloo, every entry: it never sees one complete).
            trace: Mapping[str, Any] = pickle.loads(dump(collectives, False, True))  # noqa: S301 - torch's own dump
            return trace

        chosen = TraceSource(read, source_key("flight-recorder", name, ranks), name, ranks, started_known=started_known)
        how = ("PyTorch's Flight Recorder: every collective, from Python or C++"
               + ("; started from its timing events" if started_known else "; started unknown"
                  + (" (set TORCH_NCCL_ENABLE_TIMING=1 to see it)" if backend == "nccl" else "")))
    elif source == "flight-recorder":
        logger.warning("scout: no completion tracking for %s: the Flight Recorder is off (set TORCH_FR_BUFFER_SIZE "
                       "before init_process_group)", label)
        return None
    elif backend in ("gloo", "mpi"):
        tracker = CompletionTracker(Contract.BLOCKING)
        chosen = MarkerSource(tracker, source_key("markers", name, ranks))
        how = ("markers: collectives called through torch.distributed, DDP's buckets and buffer broadcasts, from any "
               "thread; collectives issued only from C++ are not seen (set TORCH_FR_BUFFER_SIZE to see them)")
    elif backend == "nccl":
        clock = _cuda_clock()
        tracker = CompletionTracker(Contract.DEVICE, clock)
        chosen = MarkerSource(tracker, source_key("markers", name, ranks))
        how = ("markers: CUDA events and Work handles of the collectives called through torch.distributed and DDP's "
               "hook" + ("" if clock is not None else " (no event timer: started unknown)")
               + "; set TORCH_FR_BUFFER_SIZE and TORCH_NCCL_ENABLE_TIMING=1 to see C++-issued ones")
    else:
        logger.info("scout: no completion tracking for %s: no known completion contract for backend %r", label, backend)
        return None
    watcher = CompletionWatcher(chosen, publisher.completion_writer(), poll_interval_s=poll_interval_s)
    try:
        watcher.start()
    except BaseException:
        watcher.stop()
        raise
    logger.info("scout: completion tracking of %s by %s", label, how)
    return CompletionTracking(group, ranks, how.split(":", 1)[0], watcher, tracker)


def torch_c10d() -> Any:
    import torch._C._distributed_c10d as c10d

    return c10d
