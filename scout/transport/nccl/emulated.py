"""A torch.distributed backend with NCCL's contract, on CPU (spec/observer.md INSTR-10;
docs/observer.md "The device-semantics mode").

On NCCL a collective call returns once its kernel is queued; the kernel runs later on the
communicator's stream, after whatever was queued there before it; the host learns of completion
only when it asks (``Work.is_completed``) or blocks (``Work.wait``, a synchronize); a timed wait
that expires aborts the communicator, and every later collective on it fails. scout's CPU tests
need exactly that contract, and a way to break it on one rank the way a GPU breaks. This module
gives both, by wrapping gloo:

* :class:`EmulatedProcessGroup` -- a Python ``ProcessGroup`` registered as backend
  ``"scoutemu"`` (:func:`register`). Each collective is queued on the group's *stream* (one
  worker thread, in order) and the call returns at once with an :class:`EmulatedWork`. The
  stream runs the collective with the wrapped gloo group when it reaches it.
* :class:`EmulatedWork` -- ``is_completed`` never blocks; ``wait()`` returns at once, as NCCL's
  does from torch 2.8 (the stream waits for the collective, not the host), and so do
  synchronous calls (``async_op=False``); ``wait(timeout)`` blocks the host until the
  collective completed and, when the timeout passes first, aborts the communicator as NCCL
  does and raises (``TORCH_NCCL_BLOCKING_WAIT=1`` or ``blocking_wait=True``: every wait
  blocks); ``synchronize()`` blocks the host until completion -- the host's sync point, as
  ``.item()`` or a synchronize is on a GPU; ``get_future`` completes when the collective
  completed. The module's :func:`synchronize` is ``cuda.synchronize()``: every stream of the
  process.
* point-to-point ``send`` and ``recv``, launched in order on the group's stream without
  holding it (a send waits for its receiver; two ranks that both send first must not deadlock
  the emulation, as they do not on NCCL's point-to-point streams), completed in order.
* a mark clock per group (:meth:`EmulatedProcessGroup.mark_clock`): a mark is a no-op queued
  on the group's stream, completed when the stream passed it and every point-to-point
  operation launched before it completed -- NCCL's CUDA events for completion tracking's
  markers (INSTR-11, INSTR-14).
* a recorder in Flight Recorder format (:meth:`EmulatedProcessGroup.flight_recorder_dump`):
  per collective scheduled / started / completed, per group the last enqueued, started and
  completed sequence numbers -- what completion tracking reads (INSTR-12).
* fault injectors, per rank: :meth:`~EmulatedProcessGroup.stall_stream` (a kernel that never ends
  before the next collective: a GPU-side hang), :meth:`~EmulatedProcessGroup.withhold_launch`
  (the next collective's kernel is not launched although the stream reached it),
  :meth:`~EmulatedProcessGroup.withhold_completion` (the next collective starts but does not
  complete: a kernel spinning on a peer that sent something else). Each is released after a
  bound, so a test job ends.

What it does not emulate: the host's own compute is synchronous (CPU torch), so a host that
reads a collective's output before a sync point reads what the stream wrote so far (a program
for this backend syncs before it reads, as a GPU kernel reading another stream's output would
have to); DDP's communication-hook future completes at completion, not at enqueue as NCCL's
does (docs/observer.md says what that leaves untested).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from scout.transport.nccl.groups import group_name

__all__ = [
    "BACKEND",
    "CommunicatorAborted",
    "EmulatedProcessGroup",
    "EmulatedWork",
    "emulated_group",
    "group_name",
    "register",
    "synchronize",
]

#: The backend name for ``init_process_group`` / ``new_group``.
BACKEND: Final = "scoutemu"
#: Entries the recorder keeps (a ring, like Flight Recorder's).
RECORDER_ENTRIES_MAX: Final = 256
#: Ops queued on one stream at once; a host that enqueues past it blocks, as a CUDA launch
#: queue that is full blocks the launching thread.
STREAM_DEPTH_MAX: Final = 1024
#: How long a fault may withhold anything before it releases itself.
FAULT_SECONDS_MAX: Final = 600.0

# torch's stubs type the C++ process groups' overloads, not the Python subclassing protocol they
# implement (torch's own test_c10d_pypg.py is the reference for it): untyped bases here.
_c10d: Any = torch._C._distributed_c10d
_WorkBase: Any = dist._Work  # type: ignore[attr-defined]
_ProcessGroupBase: Any = dist.ProcessGroup


class CommunicatorAborted(RuntimeError):
    """The emulated communicator was aborted (a timed wait expired, or :meth:`abort`)."""


class EmulatedWork(_WorkBase):  # type: ignore[misc]
    """One queued collective (see the module docstring)."""

    def __init__(self, group: EmulatedProcessGroup, outputs: list[torch.Tensor], record: dict[str, Any]) -> None:
        super().__init__()
        self._group = group
        self._outputs = outputs
        self._record = record
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._future: Any = torch.futures.Future()

    # -- the stream's side --------------------------------------------------------------------

    def _finish(self, error: BaseException | None) -> None:
        if self._done.is_set():
            return
        self._error = error
        self._done.set()
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)

    # -- the host's side ----------------------------------------------------------------------

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """NCCL's ``Work.wait`` (torch 2.8 and later) as a synchronous call makes it: without a
        timeout, called by torch.distributed's own synchronous path (``async_op=False``), it
        returns at once -- the stream waits for the collective, the host does not (INSTR-14) --
        unless the group blocks on waits (``blocking_wait``). Any other wait (a program's own
        ``work.wait()``, torch's C++ reading a result it gathered, DDP's start-up checks) is
        the host reading the result -- on a GPU a copy to the host that synchronizes -- and
        blocks until the collective completed; a timeout that passes first aborts the
        communicator and raises."""
        seconds = _seconds(timeout)
        if not seconds and not self._group.blocking_wait and _synchronous_call(sys._getframe(1)):
            if self._error is not None:
                raise self._error
            return True
        self._block(seconds or self._group.timeout_s)
        return True

    def synchronize(self, timeout_s: float | None = None) -> None:
        """The host's sync point (``.item()`` on the output, an event's synchronize): block until
        the collective completed; past ``timeout_s`` (default: the group's timeout) abort and
        raise as a timed wait does."""
        self._block(self._group.timeout_s if timeout_s is None else timeout_s)

    def _block(self, seconds: float) -> None:
        if not self._done.wait(seconds):
            reason = (f"{self._record['profiling_name']} #{self._record['collective_seq_id']} did not complete "
                      f"within {seconds:g} s")
            self._group.abort(reason)
            raise CommunicatorAborted(f"emulated NCCL: {reason}; the communicator was aborted")
        if self._error is not None:
            raise self._error

    def get_future(self) -> Any:
        return self._future


#: torch.distributed's Python module, whose synchronous wrappers wait on the Work they issued.
_C10D_FILE: Final = dist.distributed_c10d.__file__


def _synchronous_call(frame: Any) -> bool:
    """Whether ``frame`` (the caller of ``wait``) is a synchronous collective of
    torch.distributed's Python API (``all_reduce(async_op=False)``, ``send``, ...)."""
    return frame is not None and frame.f_code.co_filename == _C10D_FILE


def _seconds(timeout: datetime.timedelta | float | None) -> float:
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


class _Fault:
    """A withheld step of the stream: released by :meth:`release` or after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        if not 0 < seconds <= FAULT_SECONDS_MAX:
            raise ValueError(f"a fault is released within (0, {FAULT_SECONDS_MAX}] seconds, got {seconds!r}")
        self.seconds = seconds
        self.released = threading.Event()

    def hold(self, aborted: threading.Event) -> None:
        deadline = time.monotonic() + self.seconds
        while not self.released.is_set() and not aborted.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.released.wait(min(left, 0.05))

    def release(self) -> None:
        self.released.set()


class _Mark:
    """A point on a group's stream (INSTR-14): passed when the stream ran the no-op queued for it
    and every point-to-point operation launched before it completed."""

    __slots__ = ("p2p_launched", "passed")

    def __init__(self, p2p_launched: int) -> None:
        self.passed = threading.Event()
        self.p2p_launched = p2p_launched


class EmulatedMarkClock:
    """Completion tracking's mark clock on an emulated group's stream (INSTR-11's CUDA events)."""

    def __init__(self, group: EmulatedProcessGroup) -> None:
        self._group = weakref.ref(group)

    def record(self) -> _Mark:
        group = self._group()
        if group is None:
            raise RuntimeError("the emulated process group is gone")
        return group._mark()

    def completed(self, mark: _Mark) -> bool:
        group = self._group()
        return mark.passed.is_set() and (group is None or group._p2p_completed >= mark.p2p_launched)


#: Every emulated group of this process, for :func:`synchronize`.
_GROUPS: weakref.WeakSet[EmulatedProcessGroup] = weakref.WeakSet()


def synchronize(timeout_s: float = 120.0) -> None:
    """``cuda.synchronize()``: block the host until every emulated group's stream ran everything
    queued so far and their point-to-point operations completed."""
    for group in list(_GROUPS):
        if not group.aborted:
            group.synchronize(timeout_s)


def _blocking_wait_default() -> bool:
    return os.environ.get("TORCH_NCCL_BLOCKING_WAIT", "0").strip().lower() in ("1", "true")


class EmulatedProcessGroup(_ProcessGroupBase):  # type: ignore[misc]
    """A process group with NCCL's contract over gloo (see the module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta,
                 *, blocking_wait: bool | None = None) -> None:
        super().__init__(rank, size)
        self.timeout_s = timeout.total_seconds()
        #: INSTR-14: whether ``Work.wait()`` blocks the host (``TORCH_NCCL_BLOCKING_WAIT=1``).
        self.blocking_wait = _blocking_wait_default() if blocking_wait is None else blocking_wait
        # The wrapped gloo group's own timeout is the emulated one: a collective whose peers never
        # come fails there, like NCCL's watchdog timeout, and aborts the communicator.
        self._gloo: Any = _c10d.ProcessGroupGloo(_c10d.PrefixStore("scoutemu", store), rank, size, timeout)
        self._rank = rank
        self._size = size
        self._name = ""
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._queued = threading.Condition()
        self._aborted = threading.Event()
        self._abort_reason = ""
        self._sequence = 0
        self._status = {"last_enqueued_collective": 0, "last_started_collective": 0, "last_completed_collective": 0}
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECORDER_ENTRIES_MAX)
        self._record_lock = threading.Lock()
        self._pending_faults: dict[str, _Fault] = {}
        # Point-to-point: launched on the stream, completed in order by their own thread.
        self._p2p_sequence = 0
        self._p2p_launched = 0
        self._p2p_completed = 0
        self._p2p_queue: collections.deque[tuple[Any, EmulatedWork, dict[str, Any]]] = collections.deque()
        self._p2p_ready = threading.Condition()
        self._stream = threading.Thread(target=self._run_stream, name=f"scoutemu-stream-{rank}", daemon=True)
        self._stream.start()
        self._p2p_thread = threading.Thread(target=self._run_p2p, name=f"scoutemu-p2p-{rank}", daemon=True)
        self._p2p_thread.start()
        _GROUPS.add(self)

    # -- what torch.distributed asks of a backend ---------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    @property
    def group_name(self) -> str:
        """The name torch.distributed registered the group under (a Python process group's own is
        never set; DeviceMesh and functional collectives look groups up by it)."""
        name = dist.distributed_c10d._world.pg_names.get(self)
        if not name:
            raise RuntimeError("ProcessGroup name not set")
        return str(name)

    @property
    def registered_name(self) -> str:
        """The group's name as torch.distributed registered it (a Python group's own
        ``group_name`` is never set); looked up once it is known (a failed lookup costs a C++
        exception)."""
        if not self._name:
            self._name = group_name(self)
        return self._name

    def _get_sequence_number_for_group(self) -> int:
        return self._sequence

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        return self._enqueue("all_reduce", tensors, tensors, lambda: self._gloo.allreduce(tensors, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        return self._enqueue("broadcast", tensors, tensors, lambda: self._gloo.broadcast(tensors, opts))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        flat = [t for group in outputs for t in group]
        return self._enqueue("all_gather", inputs, flat, lambda: self._gloo.allgather(outputs, inputs, opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> EmulatedWork:  # noqa: A002
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        return self._enqueue("all_gather_into_tensor", [input], [output],
                             lambda: self._gloo._allgather_base(output, input, opts))

    _allgather_base = all_gather_single  # the name older torch calls

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        flat = [t for group in inputs for t in group]
        return self._enqueue("reduce_scatter", flat, outputs, lambda: self._gloo.reduce_scatter(outputs, inputs, opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> EmulatedWork:  # noqa: A002
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        return self._enqueue("reduce_scatter_tensor", [input], [output],
                             lambda: self._gloo._reduce_scatter_base(output, input, opts))

    _reduce_scatter_base = reduce_scatter_single

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],  # noqa: A002
                          input_splits: list[int], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        return self._enqueue("all_to_all_single", [input], [output],
                             lambda: self._gloo.alltoall_base(output, input, output_splits, input_splits, opts))

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else _c10d.BarrierOptions()
        return self._enqueue("barrier", [], [], lambda: self._gloo.barrier(opts))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> EmulatedWork:
        return self._enqueue_p2p("send", tensors, [], lambda: self._gloo.send(tensors, dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> EmulatedWork:
        return self._enqueue_p2p("recv", [], tensors, lambda: self._gloo.recv(tensors, src, tag))

    # -- the stream ---------------------------------------------------------------------------

    def _enqueue(self, op: str, inputs: Sequence[torch.Tensor], outputs: list[torch.Tensor],
                 launch: Callable[[], Any]) -> EmulatedWork:
        if self._aborted.is_set():
            raise CommunicatorAborted(f"emulated NCCL: the communicator was aborted ({self._abort_reason})")
        with self._record_lock:
            self._sequence += 1
            record = {
                "record_id": self._sequence - 1, "pg_id": 0, "process_group": (self.registered_name, "scoutemu"),
                "thread_name": threading.current_thread().name, "thread_id": str(threading.get_ident()),
                "collective_seq_id": self._sequence, "p2p_seq_id": 0, "op_id": self._sequence,
                "profiling_name": f"{BACKEND}:{op}", "time_created_ns": time.time_ns(),
                "input_sizes": [list(t.shape) for t in inputs], "input_dtypes": [str(t.dtype) for t in inputs],
                "output_sizes": [list(t.shape) for t in outputs], "output_dtypes": [str(t.dtype) for t in outputs],
                "state": "scheduled", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
                "retired": False, "timeout_ms": int(self.timeout_s * 1000), "is_p2p": False,
            }
            self._entries.append(record)
            self._status["last_enqueued_collective"] = self._sequence
            launch_fault = self._pending_faults.pop("launch", None)
            completion_fault = self._pending_faults.pop("completion", None)
        work = EmulatedWork(self, outputs, record)

        def run() -> None:
            if launch_fault is not None:
                launch_fault.hold(self._aborted)  # the stream is here, the kernel is not launched
            self._set_state(record, "started")
            error: BaseException | None = None
            try:
                if completion_fault is not None:
                    completion_fault.hold(self._aborted)  # started, spinning: it does not complete
                if self._aborted.is_set():
                    raise CommunicatorAborted(f"emulated NCCL: the communicator was aborted ({self._abort_reason})")
                launch().wait()
            except BaseException as failure:  # noqa: BLE001 - the Work carries it to the host
                error = failure if isinstance(failure, Exception) else RuntimeError(str(failure))
                self.abort(f"{op} #{record['collective_seq_id']} failed: {failure}")
            self._set_state(record, "completed")
            work._finish(error)

        self._push(run)
        return work

    def _enqueue_p2p(self, op: str, inputs: Sequence[torch.Tensor], outputs: list[torch.Tensor],
                     launch: Callable[[], Any]) -> EmulatedWork:
        """A send or receive: recorded (point-to-point numbering), launched when the stream
        reaches it, completed by the point-to-point thread once gloo's operation completed."""
        if self._aborted.is_set():
            raise CommunicatorAborted(f"emulated NCCL: the communicator was aborted ({self._abort_reason})")
        with self._record_lock:
            self._p2p_sequence += 1
            record = {
                "record_id": self._sequence + self._p2p_sequence, "pg_id": 0,
                "process_group": (self.registered_name, "scoutemu"), "thread_name": threading.current_thread().name,
                "thread_id": str(threading.get_ident()), "collective_seq_id": 0, "p2p_seq_id": self._p2p_sequence,
                "op_id": self._p2p_sequence, "profiling_name": f"{BACKEND}:{op}", "time_created_ns": time.time_ns(),
                "input_sizes": [list(t.shape) for t in inputs], "input_dtypes": [str(t.dtype) for t in inputs],
                "output_sizes": [list(t.shape) for t in outputs], "output_dtypes": [str(t.dtype) for t in outputs],
                "state": "scheduled", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
                "retired": False, "timeout_ms": int(self.timeout_s * 1000), "is_p2p": True,
            }
            self._entries.append(record)
        work = EmulatedWork(self, outputs, record)

        def run() -> None:
            try:
                if self._aborted.is_set():
                    raise CommunicatorAborted(f"emulated NCCL: the communicator was aborted ({self._abort_reason})")
                handle = launch()
            except BaseException as failure:  # noqa: BLE001 - the Work carries it to the host
                work._finish(failure if isinstance(failure, Exception) else RuntimeError(str(failure)))
                with self._p2p_ready:  # it is over: count it, so later marks are not held by it
                    self._p2p_launched += 1
                    self._p2p_completed += 1
                    self._p2p_ready.notify_all()
                return
            with self._record_lock:
                record["state"], record["time_discovered_started_ns"] = "started", time.time_ns()
            with self._p2p_ready:
                self._p2p_launched += 1
                self._p2p_queue.append((handle, work, record))
                self._p2p_ready.notify_all()

        self._push(run)
        return work

    def _run_p2p(self) -> None:
        while True:
            with self._p2p_ready:
                self._p2p_ready.wait_for(lambda: bool(self._p2p_queue))
                handle, work, record = self._p2p_queue[0]
            error: BaseException | None = None
            try:
                handle.wait()
            except BaseException as failure:  # noqa: BLE001 - the Work carries it to the host
                error = failure if isinstance(failure, Exception) else RuntimeError(str(failure))
            with self._record_lock:
                record["state"], record["retired"] = "completed", True
                record["time_discovered_completed_ns"] = time.time_ns()
            work._finish(error)
            with self._p2p_ready:
                self._p2p_queue.popleft()
                self._p2p_completed += 1
                self._p2p_ready.notify_all()

    def _mark(self) -> _Mark:
        # Every send and receive enqueued before the mark -- launched or still queued on the
        # stream ahead of it -- must complete first (they complete in order, failed ones too).
        with self._record_lock:
            mark = _Mark(self._p2p_sequence)
        self._push(mark.passed.set)
        return mark

    def mark_clock(self) -> EmulatedMarkClock:
        """INSTR-14: a mark clock on this group's stream, for completion tracking's markers."""
        return EmulatedMarkClock(self)

    def _set_state(self, record: dict[str, Any], state: str) -> None:
        with self._record_lock:
            record["state"] = state
            key = "time_discovered_started_ns" if state == "started" else "time_discovered_completed_ns"
            record[key] = time.time_ns()
            if state == "started":
                self._status["last_started_collective"] = record["collective_seq_id"]
            else:
                record["retired"] = True
                self._status["last_completed_collective"] = record["collective_seq_id"]

    def _push(self, item: Callable[[], None]) -> None:
        with self._queued:
            if not self._queued.wait_for(lambda: len(self._queue) < STREAM_DEPTH_MAX or self._aborted.is_set(),
                                         timeout=self.timeout_s):
                raise CommunicatorAborted(f"emulated NCCL: the stream stayed full for {self.timeout_s:g} s")
            self._queue.append(item)
            self._queued.notify_all()

    def _run_stream(self) -> None:
        while True:
            with self._queued:
                self._queued.wait_for(lambda: bool(self._queue))
                item = self._queue[0]
            item()
            with self._queued:
                self._queue.popleft()
                self._queued.notify_all()

    def synchronize(self, timeout_s: float | None = None) -> None:
        """Block the host until the stream ran everything queued so far (``cuda.synchronize``);
        past ``timeout_s`` (default: the group's timeout) raise without aborting."""
        marker = self._mark()
        seconds = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + seconds
        if not marker.passed.wait(seconds):
            raise TimeoutError(f"emulated stream did not drain within {seconds:g} s")
        with self._p2p_ready:
            if not self._p2p_ready.wait_for(lambda: self._p2p_completed >= marker.p2p_launched or self._aborted.is_set(),
                                            timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"emulated point-to-point operations did not complete within {seconds:g} s")

    # -- faults (one rank's device going wrong) -----------------------------------------------

    def stall_stream(self, seconds: float) -> _Fault:
        """Queue a kernel that runs for ``seconds`` (until released): every collective queued
        after it waits -- a GPU-side hang, the stream never reaching the next collective."""
        fault = _Fault(seconds)
        self._push(lambda: fault.hold(self._aborted))
        return fault

    def withhold_launch(self, seconds: float) -> _Fault:
        """The next collective's kernel is not launched for ``seconds`` although the stream
        reached it: it stays scheduled, never started."""
        fault = _Fault(seconds)
        with self._record_lock:
            self._pending_faults["launch"] = fault
        return fault

    def withhold_completion(self, seconds: float) -> _Fault:
        """The next collective starts but does not complete for ``seconds`` (its kernel spins,
        as on a peer that sent something else)."""
        fault = _Fault(seconds)
        with self._record_lock:
            self._pending_faults["completion"] = fault
        return fault

    def abort(self, reason: str = "aborted") -> None:
        """Abort the communicator: queued and later collectives fail (NCCL's ``ncclCommAbort``)."""
        if self._aborted.is_set():
            return
        self._abort_reason = reason
        self._aborted.set()
        with self._queued:
            self._queued.notify_all()
        with self._p2p_ready:
            self._p2p_ready.notify_all()
        # Best effort: gloo's own timeout ends an operation blocked on a peer anyway.
        with contextlib.suppress(Exception):
            self._gloo.abort()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    # -- the recorder -------------------------------------------------------------------------

    def flight_recorder_dump(self, collectives: bool = True) -> dict[str, Any]:
        """This group's collectives in Flight Recorder's format (version 2.10's fields that
        completion tracking reads, INSTR-12); without ``collectives`` only the status, as
        ``_dump_fr_trace(includeCollectives=False)``."""
        with self._record_lock:
            entries = [dict(e) for e in self._entries] if collectives else []
            status = dict(self._status)
        dump: dict[str, Any] = {
            "version": "2.10",
            "pg_config": {self.registered_name: {"name": self.registered_name, "desc": "scoutemu",
                                                 "ranks": str(list(range(self._size)))}},
            "pg_status": {"0": status},
        }
        if collectives:
            dump["entries"] = entries
        return dump


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> EmulatedProcessGroup:
    return EmulatedProcessGroup(store, rank, size, timeout)


_REGISTERED = threading.Lock()


def register() -> None:
    """Make ``init_process_group(backend="scoutemu")`` available in this process. Idempotent."""
    with _REGISTERED:
        if BACKEND.upper() in dist.Backend._plugins:
            return
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def emulated_group(group: Any = None) -> EmulatedProcessGroup:
    """The emulated group behind ``group`` (None: the default group); TypeError otherwise."""
    found = dist.group.WORLD if group is None else group
    if not isinstance(found, EmulatedProcessGroup):
        raise TypeError(f"the process group is {type(found).__name__}, not the emulated backend {BACKEND!r}")
    return found
