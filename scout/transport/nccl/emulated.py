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
* :class:`EmulatedWork` -- ``is_completed`` never blocks; ``wait`` blocks the host until the
  collective completed (the CPU reads the result: this is the host's sync point, as
  ``.item()`` or a synchronize is on a GPU) and, when ``timeout`` passes first, aborts the
  communicator as NCCL does and raises; ``get_future`` completes when the collective completed.
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
reads a collective's output must wait for it first; DDP's communication-hook future therefore
completes at completion, not at enqueue as NCCL's does (docs/observer.md says what that leaves
untested). Point-to-point calls are not provided.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import threading
import time
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
        """Block until the collective completed. A timeout (``timedelta`` or seconds; none or
        zero: the group's timeout) that passes first aborts the communicator and raises, as a
        timed wait on NCCL does."""
        seconds = _seconds(timeout) or self._group.timeout_s
        if not self._done.wait(seconds):
            reason = (f"{self._record['profiling_name']} #{self._record['collective_seq_id']} did not complete "
                      f"within {seconds:g} s")
            self._group.abort(reason)
            raise CommunicatorAborted(f"emulated NCCL: {reason}; the communicator was aborted")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> Any:
        return self._future


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


class EmulatedProcessGroup(_ProcessGroupBase):  # type: ignore[misc]
    """A process group with NCCL's contract over gloo (see the module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self.timeout_s = timeout.total_seconds()
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
        self._stream = threading.Thread(target=self._run_stream, name=f"scoutemu-stream-{rank}", daemon=True)
        self._stream.start()

    # -- what torch.distributed asks of a backend ---------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

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
        marker = threading.Event()
        self._push(marker.set)
        seconds = self.timeout_s if timeout_s is None else timeout_s
        if not marker.wait(seconds):
            raise TimeoutError(f"emulated stream did not drain within {seconds:g} s")

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
