"""Publish a torch trainer's progress through public interfaces only (docs/observer.md).

What this module does, in a few lines of the user's training script::

    publisher = ProgressPublisher(RecordIdentity.from_environment(rank))
    instrument(publisher)                 # torch.distributed collectives: entry, exit, fingerprint
    instrument_module(model)              # forward pre/post hooks on the repeated layers
    instrument_optimizer(optimizer)       # a new step after every optimizer.step()
    loader = instrument_dataloader(loader, name="train")
    with checkpoint_io("write", name="step-100"): save(...)
    ...
    uninstrument()                        # everything back as it was

Collectives are wrapped by replacing the module attributes ``torch.distributed.<name>`` (and
the same names in ``torch.distributed.distributed_c10d``). Consequences, spelled out in
docs/observer.md: calls made from C++ (DDP's gradient all-reduces, NCCL calls inside FSDP's C++
paths) are not seen, nor are references taken with ``from torch.distributed import all_reduce``
before :func:`instrument` ran. An ``async_op=True`` call is "in flight" from its issue until it
returns its work handle; a hang inside ``work.wait()`` shows the op counter but no fingerprint.

Only the thread that called :func:`instrument` publishes host progress; calls from other threads
(FSDP2's backward on autograd threads, a communication thread) publish no host coordinate but
are counted by completion tracking (:mod:`scout.observer.completion`, INSTR-9..13), which
:func:`instrument` starts for the default process group. DDP's buffer broadcast
(``torch.distributed._broadcast_coalesced``, looked up by DDP at each forward) is wrapped like
the public collectives. Instrumentation never raises into the trainer: a call that cannot be
described is published with a fingerprint of its name alone.

torch is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.core.observer import HostContract
from scout.observer.completion import (
    CompletionTracker,
    CompletionTracking,
    Contract,
    contract_of,
    start_tracking,
)
from scout.observer.functional import FunctionalTracking
from scout.observer.progress import ProgressPublisher, Stage
from scout.reports import guard
from scout.reports.guard import Part
from scout.reports.hook_time import HOOK_TIME, now_ns

__all__ = [
    "COLLECTIVES",
    "GROUP_ARGUMENT",
    "add_collective_listener",
    "already_published",
    "InstrumentationError",
    "check_at_each_step",
    "checkpoint_io",
    "completion_tracker",
    "finish_at_completion",
    "describe_call",
    "instrument",
    "instrument_dataloader",
    "instrument_module",
    "instrument_optimizer",
    "instrumented",
    "mark_step",
    "stage_key",
    "stop_completion",
    "stop_publishing",
    "uninstrument",
]

#: The torch.distributed functions wrapped by :func:`instrument`.
COLLECTIVES: Final = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "_broadcast_coalesced",
)

#: Where each collective takes its process group (positional index, keyword); the ``async_op``
#: flag follows it. A test compares these with the installed torch's signatures. Point-to-point
#: calls are not in a group's collective sequence and are not tracked for completion.
GROUP_ARGUMENT: Final = {
    "all_reduce": (2, "group"),
    "all_gather": (2, "group"),
    "all_gather_into_tensor": (2, "group"),
    "reduce_scatter": (3, "group"),
    "reduce_scatter_tensor": (3, "group"),
    "broadcast": (2, "group"),
    "all_to_all": (2, "group"),
    "all_to_all_single": (4, "group"),
    "barrier": (0, "group"),
    "_broadcast_coalesced": (0, "process_group"),
}
#: INSTR-16: where each point-to-point call takes its group; its own numbering per rank. The
#: blocking ones (``send``, ``recv``) complete at return on a blocking backend, at the stream's
#: mark on a device backend; ``isend``/``irecv`` with their ``Work``; a batch with all of its own.
P2P_GROUP_ARGUMENT: Final = {"send": (2, "group"), "recv": (2, "group"), "isend": (2, "group"),
                             "irecv": (2, "group")}
_P2P_ASYNC: Final = frozenset({"isend", "irecv", "batch_isend_irecv"})


logger = logging.getLogger("scout")


class InstrumentationError(RuntimeError):
    """Misuse of the instrumentation API (e.g. instrumenting twice)."""


def stage_key(kind: str, name: str) -> int:
    """A stable 64-bit key naming one stage instance (``dataloader:train``), equal on all ranks."""
    return int.from_bytes(hashlib.blake2b(f"{kind}:{name}".encode(), digest_size=8).digest(), "little")


# --------------------------------------------------------------------------------------------
# Describing a call (rank-independent facts only; see scout.core.fingerprint)
# --------------------------------------------------------------------------------------------


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    if index < len(args):
        return args[index]
    return default


def _meta(tensor: Any, *, with_shape: bool = True) -> TensorMeta:
    return TensorMeta(str(tensor.dtype), tuple(int(d) for d in tensor.shape) if with_shape else None)


def _metas(tensors: Any, *, with_shape: bool = True) -> tuple[TensorMeta, ...]:
    return tuple(_meta(t, with_shape=with_shape) for t in tensors)


def _reduce_op(op: Any) -> str:
    name = getattr(op, "name", None)
    return name if isinstance(name, str) and name else str(op)


def _group_ranks(group: Any) -> tuple[int, ...] | None:
    if group is None:
        return None
    import torch.distributed as dist

    if group is dist.GroupMember.WORLD:
        return None
    return tuple(int(r) for r in dist.get_process_group_ranks(group))


#: The ops whose arguments are tensors, lists of tensors, groups and plain values, so that
#: :func:`call_key` can stand for their description; the others are described at every call.
KEYED_OPS: Final = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
    "all_to_all", "all_to_all_single", "barrier", "_broadcast_coalesced", "send", "recv", "isend", "irecv"})
#: At most this many keys are kept per instrumentation (then they are forgotten at once).
KNOWN_CALL_KEYS_MAX: Final = 1024


def _key_part(value: Any) -> Any:
    kind = type(value)
    if kind is int or kind is str or value is None:
        return value
    if kind is bool or kind is float:  # True == 1.0 == 1 as keys, not for describe_call's checks
        return kind, value
    if kind is list or kind is tuple:
        return tuple([_key_part(item) for item in value])
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):  # a tensor: what _meta reads of it
        return ("tensor", value.dtype, shape)
    return value


def call_key(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """A key of the call from which :func:`describe_call` reads everything it reads (equal keys,
    equal descriptions), or None for an op outside :data:`KEYED_OPS`. Hashing it raises
    TypeError where an argument is unhashable: then there is no key."""
    if op not in KEYED_OPS:
        return None
    return op, tuple([_key_part(a) for a in args]), tuple([(name, _key_part(v)) for name, v in kwargs.items()])


def describe_call(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CollectiveCall:
    """The rank-independent description of one torch.distributed call (its fingerprint input).

    Argument positions follow torch.distributed's public signatures; a test compares them with
    the installed torch so a signature change cannot go unnoticed.
    """
    a, k = args, kwargs
    if op == "all_reduce":
        return CollectiveCall(op, _group_ranks(_arg(a, k, 2, "group")), _metas([_arg(a, k, 0, "tensor")]),
                              reduce_op=_reduce_op(_arg(a, k, 1, "op", "SUM")))
    if op == "all_gather":
        return CollectiveCall(op, _group_ranks(_arg(a, k, 2, "group")), _metas([_arg(a, k, 1, "tensor")]),
                              _metas(_arg(a, k, 0, "tensor_list")))
    if op == "all_gather_into_tensor":
        return CollectiveCall(op, _group_ranks(_arg(a, k, 2, "group")), _metas([_arg(a, k, 1, "input_tensor")]),
                              _metas([_arg(a, k, 0, "output_tensor")]))
    if op == "reduce_scatter":
        return CollectiveCall(op, _group_ranks(_arg(a, k, 3, "group")), _metas(_arg(a, k, 1, "input_list")),
                              _metas([_arg(a, k, 0, "output")]), reduce_op=_reduce_op(_arg(a, k, 2, "op", "SUM")))
    if op == "reduce_scatter_tensor":
        return CollectiveCall(op, _group_ranks(_arg(a, k, 3, "group")), _metas([_arg(a, k, 1, "input")]),
                              _metas([_arg(a, k, 0, "output")]), reduce_op=_reduce_op(_arg(a, k, 2, "op", "SUM")))
    if op == "broadcast":
        src, group_src = _arg(a, k, 1, "src"), _arg(a, k, 4, "group_src")
        detail = (("root_is_group_relative", 1),) if src is None and group_src is not None else ()
        return CollectiveCall(op, _group_ranks(_arg(a, k, 2, "group")), _metas([_arg(a, k, 0, "tensor")]),
                              root=src if src is not None else group_src, detail=detail)
    if op == "all_to_all":
        # Per-peer chunk shapes may differ by rank (uneven splits): dtypes and counts only.
        return CollectiveCall(op, _group_ranks(_arg(a, k, 2, "group")),
                              _metas(_arg(a, k, 1, "input_tensor_list"), with_shape=False),
                              _metas(_arg(a, k, 0, "output_tensor_list"), with_shape=False))
    if op == "all_to_all_single":
        output, input_ = _arg(a, k, 0, "output"), _arg(a, k, 1, "input")
        uneven = _arg(a, k, 2, "output_split_sizes") is not None or _arg(a, k, 3, "input_split_sizes") is not None
        inputs: tuple[TensorMeta, ...]
        outputs: tuple[TensorMeta, ...]
        if uneven:
            # The first dimension is the sum of this rank's splits: rank-dependent, left out.
            inputs = (TensorMeta(str(input_.dtype), tuple(int(d) for d in input_.shape[1:])),)
            outputs = (TensorMeta(str(output.dtype), tuple(int(d) for d in output.shape[1:])),)
        else:
            inputs, outputs = _metas([input_]), _metas([output])
        return CollectiveCall(op, _group_ranks(_arg(a, k, 4, "group")), inputs, outputs,
                              detail=(("uneven_splits", int(uneven)),))
    if op == "barrier":
        return CollectiveCall(op, _group_ranks(_arg(a, k, 0, "group")))
    if op == "_broadcast_coalesced":
        # DDP's buffer (and parameter) broadcast: (process_group, tensors, buffer_size, src).
        return CollectiveCall("broadcast_coalesced", _group_ranks(_arg(a, k, 0, "process_group")),
                              _metas(_arg(a, k, 1, "tensors")), root=_arg(a, k, 3, "src"),
                              detail=(("buffer_size", int(_arg(a, k, 2, "buffer_size", 0))),))
    if op == "batch_isend_irecv":
        # A pipeline's batch of sends and receives: which and how many, not the peers.
        operations = _arg(a, k, 0, "p2p_op_list") or []
        return CollectiveCall(op, _group_ranks(getattr(operations[0], "group", None) if operations else None),
                              _metas([o.tensor for o in operations]),
                              detail=tuple((f"send{i}", int(getattr(o.op, "__name__", "") == "isend"))
                                           for i, o in enumerate(operations)))
    if op in ("send", "recv", "isend", "irecv"):
        # The peer is rank-dependent by nature; the tag and the tensor are not.
        return CollectiveCall(op, _group_ranks(_arg(a, k, 2, "group")), _metas([_arg(a, k, 0, "tensor")]),
                              detail=(("tag", int(_arg(a, k, 3, "tag", 0))),))
    raise ValueError(f"no description rule for collective {op!r}; known: {', '.join(COLLECTIVES)}")


# --------------------------------------------------------------------------------------------
# The installed instrumentation
# --------------------------------------------------------------------------------------------


class _Instrumentation:
    def __init__(self, publisher: ProgressPublisher) -> None:
        self.publisher = publisher
        self.thread_id = threading.get_ident()
        self.enabled = True
        # spec/guard.md GUARD-2: False once the instrumentation part is off -- collectives and
        # layers are no longer published; step marks and stages still are.
        self.publishing = True
        self.patched: list[tuple[Any, str, Any, Any]] = []  # (module, name, original, wrapper)
        self.hook_handles: list[Any] = []
        # Called at every step boundary, outside the no-raise guard: how the trainer learns at
        # its next step that its observer died (ObserverHandle.check may raise by design).
        self.step_checks: list[Callable[[], None]] = []
        self.failures = 0  # publishes that raised and were swallowed (diagnostics never crash)
        # A wrapped collective may call another one (all_gather_object -> all_gather): only the
        # outermost call of a thread publishes and is tracked, so entry and exit stay paired.
        self.local = threading.local()
        self._fallback: dict[str, int] = {}
        self._known_calls: dict[tuple[Any, ...], int] = {}  # call_key -> fingerprint (bounded)
        # Called at the entry of every published collective (loop stragglers, LOOP-5); each
        # returns the function to call when that collective completed.
        self.collective_listeners: list[Callable[..., Callable[[], None] | None]] = []
        # Completion tracking (INSTR-9..13), when it could be started; its tracker is fed here
        # when its source is markers.
        self.tracking: CompletionTracking | None = None
        # INSTR-17: functional collectives (DTensor's), counted by their groups' markers.
        self.functional = FunctionalTracking(self._functional_tracker, lambda: self.enabled, self._failed)

    def owns_thread(self) -> bool:
        return self.enabled and threading.get_ident() == self.thread_id

    def _functional_tracker(self, group: Any) -> CompletionTracker | None:
        return None if self.tracking is None else self.tracking.tracker_for(group)

    def _failed(self) -> None:
        self.failures += 1

    @property
    def depth(self) -> int:
        """How many wrapped or already-published collectives this thread is inside."""
        depth: int = getattr(self.local, "depth", 0)
        return depth

    @depth.setter
    def depth(self, value: int) -> None:
        self.local.depth = value

    def on_tracked_group(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this call is a collective on a group completion tracking follows (INSTR-9)."""
        tracking = self.tracking
        if tracking is None or op not in GROUP_ARGUMENT:
            return False
        index, name = GROUP_ARGUMENT[op]
        try:
            return tracking.tracks(_arg(args, kwargs, index, name))
        except Exception:  # INSTR-6, spec/guard.md GUARD-3: never into the trainer
            self.failures += 1
            return False

    def tracker_of(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompletionTracker | None:
        """The markers tracker that counts this call: its group's collectives (INSTR-11), or this
        rank's sends and receives on it (INSTR-16); None where another source counts them."""
        tracking = self.tracking
        if tracking is None:
            return None
        if op in GROUP_ARGUMENT:
            index, name = GROUP_ARGUMENT[op]
            return tracking.tracker_for(_arg(args, kwargs, index, name))
        if op in P2P_GROUP_ARGUMENT:
            index, name = P2P_GROUP_ARGUMENT[op]
            return tracking.p2p_tracker_for(_arg(args, kwargs, index, name))
        if op == "batch_isend_irecv":
            operations = _arg(args, kwargs, 0, "p2p_op_list") or []
            return tracking.p2p_tracker_for(getattr(operations[0], "group", None) if operations else None)
        return None

    def fingerprint_of(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        # Issue 38: a job calls the same few collectives at every step (DDP's buffer broadcast in
        # every forward); describing one costs ~8 us warm and ~40 us in a step's cold cache, a
        # look-up of its arguments' key ~1 us. The key holds everything describe_call reads --
        # every argument, a tensor by its dtype and shape -- so a hit is the same description.
        try:
            key = call_key(op, args, kwargs)
            known = None if key is None else self._known_calls.get(key)
        except Exception:  # an unhashable argument (or one whose shape raises): described at every call
            key = known = None
        if known is not None:
            return known
        try:
            value = fingerprint(describe_call(op, args, kwargs))
        except Exception:
            self.failures += 1
            if op not in self._fallback:
                self._fallback[op] = fingerprint(CollectiveCall(op, detail=(("undescribed", 1),)))
            return self._fallback[op]
        if key is not None:
            if len(self._known_calls) >= KNOWN_CALL_KEYS_MAX:
                self._known_calls.clear()
            self._known_calls[key] = value
        return value

    def safely(self, action: Callable[..., None], *args: Any, part: Part = Part.INSTRUMENTATION) -> None:
        try:
            if guard.INJECTING and part is Part.INSTRUMENTATION:
                guard.inject("instrumentation.publish")
            action(*args)
        except Exception as error:  # INSTR-6, spec/guard.md GUARD-3: recorded, never into the trainer
            self.failures += 1
            guard.failed(part, error, "instrumentation")

    def wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        index = GROUP_ARGUMENT.get(op, (0, ""))[0]

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            local = self.local  # the depth is read and written here directly: this runs at every call
            depth = getattr(local, "depth", 0)
            if not self.enabled or depth:
                return original(*args, **kwargs)
            publish = self.publishing and threading.get_ident() == self.thread_id
            tracked = self.on_tracked_group(op, args, kwargs)
            # INSTR-11, INSTR-16: markers where they are the source.
            tracker = self.safe_tracker(op, args, kwargs)
            if not publish and not tracked and tracker is None:
                return original(*args, **kwargs)
            started = now_ns()  # BUDGET-10: scout's part of the call, on the training thread
            # LOOP-5: the loop timer times every collective the host publishes and every one of a
            # tracked group, from any thread.
            fingerprint = self.fingerprint_of(op, args, kwargs)
            if publish:
                self.safely(self.publisher.enter_collective, fingerprint)
            entry = self.begin_tracked(tracker, fingerprint)
            asynchronous = op in _P2P_ASYNC or bool(_arg(args, kwargs, index + 1, "async_op", False))
            # LOOP-1: a call of the training thread without async_op blocks it (or its stream).
            finishers = self.started_listeners(blocking=publish and not asynchronous)
            local.depth = depth + 1
            result: Any = None
            called = now_ns()
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                returned = now_ns()
                local.depth = depth
                if tracker is not None:
                    self.safely(tracker.end, entry, result if asynchronous else None, part=Part.COMPLETION)
                if publish:
                    self.safely(self.publisher.exit_collective)
                work = result if asynchronous and hasattr(result, "get_future") else None
                self.safely(finish_at_completion, finishers, work)
                if publish:
                    HOOK_TIME.spent_ns += called - started + now_ns() - returned

        wrapper.__scout_instrumented__ = True  # type: ignore[attr-defined]
        return wrapper

    def safe_tracker(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompletionTracker | None:
        try:
            return self.tracker_of(op, args, kwargs)
        except Exception:  # INSTR-6
            self.failures += 1
            return None

    def started_listeners(self, *, blocking: bool) -> list[Callable[[], None]]:
        finishers = []
        for listener in self.collective_listeners:
            try:
                finish = listener(blocking=True) if blocking else listener()
            except Exception:
                self.failures += 1
                continue
            if finish is not None:  # None: nothing to call at completion
                finishers.append(finish)
        return finishers

    def begin_tracked(self, tracker: CompletionTracker | None, fingerprint: int) -> Any:
        if tracker is None:
            return None
        try:
            return tracker.begin(fingerprint)
        except Exception as error:
            self.failures += 1
            guard.failed(Part.COMPLETION, error, "collective wrapper")
            return None

    def patch_collectives(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for op in COLLECTIVES:
            original = getattr(dist, op, None)
            if original is None:
                continue
            wrapper = self.wrap(op, original)
            for module in (dist, c10d):
                if getattr(module, op, None) is original:
                    setattr(module, op, wrapper)
                    self.patched.append((module, op, original, wrapper))

    def restore(self) -> None:
        self.enabled = False
        self.functional.restore()
        if self.tracking is not None:
            self.tracking.stop()
            self.tracking = None
        for module, op, original, wrapper in reversed(self.patched):
            # If someone wrapped our wrapper since, leave theirs in place; ours is now a
            # pass-through because enabled is False.
            if getattr(module, op, None) is wrapper:
                setattr(module, op, original)
        self.patched.clear()
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles.clear()


_ACTIVE: _Instrumentation | None = None
_LOCK = threading.Lock()


def instrument(publisher: ProgressPublisher, *, collectives: bool = True, completion: bool = True,
               completion_source: str = "auto", device: Any = None) -> None:
    """Start publishing into ``publisher`` from the calling thread; wrap torch.distributed's
    collectives unless ``collectives=False`` (e.g. an MPI program that publishes by hand). With
    ``completion`` (and torch.distributed initialised) also track the completion of the default
    group's collectives (INSTR-9..13; ``completion_source``: ``auto``, ``flight-recorder`` or
    ``markers``; ``device``: the CUDA device of the job's module, where completion marks are
    recorded, INSTR-10)."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None:
            raise InstrumentationError(
                "scout instrumentation is already installed in this process; call uninstrument() "
                "first (one publisher per trainer process)"
            )
        active = _Instrumentation(publisher)
        _declare_contract(publisher)
        if collectives:
            active.patch_collectives()
            active.functional.patch()
            if completion:
                try:
                    active.tracking = start_tracking(publisher, source=completion_source, device=device)
                except Exception as error:  # INSTR-6: never into the trainer; the observer then has host progress
                    logger.warning("scout: completion tracking could not start (%s); the observer judges by host "
                                   "progress alone", error)
        _ACTIVE = active


def _declare_contract(publisher: ProgressPublisher) -> None:
    """PROGRESS-13: the default group's host contract, whether or not completion is tracked (a
    backend without a known contract counts as returning at enqueue: host coordinates then
    convict nobody, COMPLETION-9). Groups tracked later raise it."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    try:
        contract = contract_of(str(dist.get_backend()))
    except Exception:  # noqa: BLE001 - INSTR-6
        contract = None
    publisher.raise_contract(HostContract.BLOCKING if contract is Contract.BLOCKING else HostContract.ENQUEUE)


def completion_tracker(group: Any = None) -> CompletionTracker | None:
    """The completion tracker fed by markers for ``group``'s collectives (None: the default
    group) -- for hooks that issue collectives inside :func:`already_published` (DDP's buckets,
    ``scout/job/hooks.py``). None where markers are not the group's source."""
    active = _ACTIVE
    tracking = None if active is None else active.tracking
    if tracking is None:
        return None
    try:
        return tracking.tracker_for(group)
    except Exception:  # INSTR-6
        return None


def uninstrument() -> None:
    """Remove every wrapper and hook :func:`instrument` and friends installed. Idempotent.
    The publisher is left open: closing it is its owner's business."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None:
            _ACTIVE.restore()
            _ACTIVE = None


def instrumented() -> bool:
    return _ACTIVE is not None


def stop_publishing() -> None:
    """spec/guard.md GUARD-2: the instrumentation part is off -- the wrappers pass collectives
    through unpublished and the layer hooks publish nothing; step marks and stages stay."""
    active = _ACTIVE
    if active is not None:
        active.publishing = False


def stop_completion(reason: str) -> None:
    """spec/guard.md GUARD-2: the completion part is off -- the watcher withdraws the record's
    completion section (the observer judges by host progress, PROGRESS-8) and stops; the
    wrappers no longer feed a tracker."""
    active = _ACTIVE
    tracking = None if active is None else active.tracking
    if active is None or tracking is None:
        return
    active.tracking = None
    if tracking.watcher is not None:
        tracking.watcher.withdraw(reason)
    tracking.stop()


def _active(what: str) -> _Instrumentation:
    if _ACTIVE is None:
        raise InstrumentationError(f"{what} needs instrument(publisher) to be called first")
    return _ACTIVE


@contextlib.contextmanager
def already_published() -> Iterator[None]:
    """Collectives called inside the block (on this thread) were published and tracked by the
    caller already (e.g. DDP's communication hook, which published the bucket's launch): the
    wrappers pass them through."""
    active = _ACTIVE
    if active is None or not active.enabled:
        yield
        return
    active.depth += 1
    try:
        yield
    finally:
        active.depth -= 1


def add_collective_listener(listener: Callable[..., Callable[[], None] | None]) -> None:
    """Call ``listener()`` at the entry of every collective the wrappers publish or track (any
    thread, on the tracked group) -- ``listener(blocking=True)`` for a call of the training thread
    without ``async_op``, which blocks it (LOOP-1) --, and the
    function it returns when that collective completed: when the call returned, or for an
    ``async_op`` call when its work's future completed (LOOP-5: on NCCL that callback's current
    stream waits for the collective, so a mark recorded there completes with it). A listener
    that returns None has nothing to call (a loop body not timed, spec/replay.md LOOP-8)."""
    _active("add_collective_listener").collective_listeners.append(listener)


def finish_at_completion(finishers: list[Callable[[], None]], work: Any = None) -> None:
    """Call every finisher now (a blocking call returned), or when ``work`` completes."""
    if not finishers:
        return
    if work is None:
        for finish in finishers:
            _quietly(finish)
        return

    def completed(future: Any) -> None:
        for finish in finishers:
            _quietly(finish)

    work.get_future().then(completed)


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # diagnostics never break the training step (INSTR-6)
        logger.debug("scout: a collective listener failed", exc_info=True)


def mark_step(step: int) -> None:
    """Tell the observer a new training step started (op counter restarts), and run the step
    checks (see :func:`check_at_each_step`)."""
    active = _active("mark_step")
    if active.owns_thread():
        active.safely(active.publisher.begin_step, step)
        for check in active.step_checks:
            check()


def check_at_each_step(check: Callable[[], None]) -> None:
    """Run ``check`` at every step boundary (``mark_step`` or the optimizer hook), e.g.
    ``ObserverHandle.check``, which raises if the rank's observer died."""
    _active("check_at_each_step").step_checks.append(check)


def _repeated_layers(module: Any) -> list[Any]:
    """The members of the outermost ``ModuleList``/``Sequential`` containers (the repeated
    blocks); containers nested inside a chosen block are not descended into."""
    import torch.nn as nn

    layers: list[Any] = []
    chosen: list[str] = []
    for name, child in module.named_modules():
        if any(name.startswith(prefix) for prefix in chosen):
            continue
        if isinstance(child, (nn.ModuleList, nn.Sequential)):
            for child_name, member in child.named_children():
                layers.append(member)
                chosen.append(f"{name}.{child_name}." if name else f"{child_name}.")
            chosen.append(f"{name}." if name else "")
    if layers:
        return layers
    return list(module.children()) or [module]


def instrument_module(module: Any, *, layers: Iterable[Any] | None = None, before_forward: bool = False) -> int:
    """Publish one unit of progress after the forward of each layer (and before it, with
    ``before_forward=True``, to tell "inside layer k" from "between layers"): the given
    ``layers``, or by default the members of the outermost ``ModuleList``/``Sequential``
    containers in ``module`` (the repeated blocks), else its direct children. Returns how many
    layers are hooked. Each hook costs one publish (about 1 us) plus torch's hook dispatch."""
    active = _active("instrument_module")
    chosen = list(layers) if layers is not None else _repeated_layers(module)
    thread_id = active.thread_id
    advance = active.publisher.advance
    get_ident = threading.get_ident

    def publish() -> None:
        if active.enabled and active.publishing and get_ident() == thread_id:
            started = now_ns()
            try:
                if guard.INJECTING:
                    guard.inject("instrumentation.layer_hook")
                advance()
            except Exception as error:  # spec/guard.md GUARD-3: never into the forward
                active.failures += 1
                guard.failed(Part.INSTRUMENTATION, error, "layer hook")
            HOOK_TIME.spent_ns += now_ns() - started  # spec/budget.md BUDGET-10

    def before(_module: Any, _inputs: Any) -> None:
        publish()

    def after(_module: Any, _inputs: Any, _output: Any) -> None:
        publish()

    for layer in chosen:
        if before_forward:
            active.hook_handles.append(layer.register_forward_pre_hook(before))
        active.hook_handles.append(layer.register_forward_hook(after))
    return len(chosen)


def instrument_optimizer(optimizer: Any, *, first_step: int = 1) -> None:
    """Start a new progress step after every ``optimizer.step()`` (public post-step hook)."""
    active = _active("instrument_optimizer")
    counter = {"step": first_step}

    def after_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        started = now_ns()
        try:
            counter["step"] += 1
            if active.owns_thread():
                active.safely(active.publisher.begin_step, counter["step"])
                for check in active.step_checks:
                    check()
        finally:  # spec/budget.md BUDGET-10
            HOOK_TIME.spent_ns += now_ns() - started

    active.hook_handles.append(optimizer.register_step_post_hook(after_step))
    if active.owns_thread():
        active.safely(active.publisher.begin_step, first_step)


class _StagedIterator:
    def __init__(self, iterator: Iterator[Any], key: int) -> None:
        self._iterator = iterator
        self._key = key

    def __iter__(self) -> _StagedIterator:
        return self

    def __next__(self) -> Any:
        active = _ACTIVE
        if active is None or not active.owns_thread():
            return next(self._iterator)
        started = now_ns()
        active.safely(active.publisher.begin_stage, Stage.DATA_LOADING, self._key)
        fetching = now_ns()
        try:
            return next(self._iterator)
        finally:
            fetched = now_ns()
            active.safely(active.publisher.end_stage)
            HOOK_TIME.spent_ns += fetching - started + now_ns() - fetched  # spec/budget.md BUDGET-10


class _StagedLoader:
    """A transparent proxy: iterating publishes a DATA_LOADING stage around each ``next()``;
    every other attribute (``len``, ``sampler``, ``dataset``...) is the loader's own."""

    def __init__(self, loader: Any, key: int) -> None:
        self._scout_loader = loader
        self._scout_key = key

    def __iter__(self) -> _StagedIterator:
        return _StagedIterator(iter(self._scout_loader), self._scout_key)

    def __len__(self) -> int:
        return len(self._scout_loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scout_loader, name)


def instrument_dataloader(loader: Any, name: str = "train") -> Any:
    """Wrap an iterable (a DataLoader) so each batch fetch publishes a DATA_LOADING stage.
    Without :func:`instrument` the loader is returned unchanged."""
    if _ACTIVE is None:
        return loader
    return _StagedLoader(loader, stage_key("dataloader", name))


@contextlib.contextmanager
def checkpoint_io(operation: str, name: str = "checkpoint") -> Iterator[None]:
    """Publish a CHECKPOINT_READ or CHECKPOINT_WRITE stage around a block (``"read"`` or
    ``"write"``). A no-op without :func:`instrument`."""
    stages = {"read": Stage.CHECKPOINT_READ, "write": Stage.CHECKPOINT_WRITE}
    if operation not in stages:
        raise ValueError(f"checkpoint_io operation must be 'read' or 'write', got {operation!r}")
    active = _ACTIVE
    if active is None or not active.owns_thread():
        yield
        return
    active.safely(active.publisher.begin_stage, stages[operation], stage_key(f"checkpoint:{operation}", name))
    try:
        yield
    finally:
        active.safely(active.publisher.end_stage)
