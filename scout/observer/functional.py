"""Functional collectives in completion tracking (spec/observer.md INSTR-17).

DTensor -- tensor parallelism, FSDP2's and TorchTitan's redistributions -- issues its collectives
through ``torch.distributed._functional_collectives`` (``funcol.all_reduce``,
``all_gather_single``, ``reduce_scatter_single``, ...), not through ``torch.distributed``'s own
functions: the wrappers of INSTR-1 never see them, and a rank waiting in one looked, to markers,
like a rank waiting in nothing -- its replicas then named it behind when its tensor-parallel
partner hung. Each of these functions returns at issue with an ``AsyncCollectiveTensor`` whose
first use calls the module's ``wait_tensor``; both are module attributes looked up at each call,
so they are wrapped like the collectives: a call is a marker entry of its group's tracker at
issue (its ``Work`` stand-in completes when ``wait_tensor`` returned for its output), and its
pending state is ``unknown`` on a blocking backend (the host may be inside the wait) -- a rank
with one pending waits for its peers there (COMPLETION-10). An output never waited stays pending
(torch's own work registry keeps it, and warns at exit): the rank then reads as waiting, which
can only keep it from being named.

Where the group's source is a recorder (Flight Recorder, the emulated backend's), the recorder
sees these collectives itself and nothing is wrapped for it. Calls under ``torch.compile``
(``wait_tensor`` emitted into a graph) are not seen.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint

__all__ = ["FUNCTIONAL_COLLECTIVES", "FunctionalTracking"]

#: INSTR-17: the functional collectives wrapped (those that issue on a group and return at issue;
#: the ``*_inplace`` ones call torch.distributed's functions, wrapped already).
FUNCTIONAL_COLLECTIVES: Final = (
    "broadcast", "all_reduce", "all_gather_single", "all_gather_single_autograd", "reduce_scatter_single",
    "reduce_scatter_single_autograd", "all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd", "all_reduce_coalesced", "all_gather_single_coalesced",
    "reduce_scatter_single_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "all_to_all_single_autograd", "permute_tensor",
)
#: Outputs issued and not yet waited for, at most; past the bound the oldest are forgotten (their
#: entries complete once their outputs are freed, INSTR-13's bound withdraws the rest).
OUTSTANDING_MAX: Final = 4096


class _Waited:
    """A functional collective's ``Work`` stand-in for the tracker: completed once ``wait_tensor``
    returned for one of its outputs, or once they are all freed."""

    __slots__ = ("done", "outputs")

    def __init__(self, outputs: list[Any]) -> None:
        self.done = False
        self.outputs = [weakref.ref(tensor) for tensor in outputs]

    def is_completed(self) -> bool:
        return self.done or all(ref() is None for ref in self.outputs)


class FunctionalTracking:
    """The wrappers of one instrumentation (scout.observer.instrument)."""

    def __init__(self, tracker_for: Callable[[Any], Any], enabled: Callable[[], bool],
                 failures: Callable[[], None]) -> None:
        self._tracker_for = tracker_for
        self._enabled = enabled
        self._failed = failures
        self._lock = threading.Lock()
        self._local = threading.local()
        self._outstanding: dict[int, _Waited] = {}
        self.patched: list[tuple[Any, str, Any, Any]] = []

    def patch(self) -> None:
        try:
            import torch.distributed._functional_collectives as funcol
        except ImportError:  # a torch without them
            return
        for name in FUNCTIONAL_COLLECTIVES:
            original = getattr(funcol, name, None)
            if original is None:
                continue
            try:
                parameters = list(inspect.signature(original).parameters)
                group_index, tag_index = parameters.index("group"), parameters.index("tag")
            except (TypeError, ValueError):
                continue
            wrapper = self._wrap(name, original, group_index, tag_index, funcol)
            setattr(funcol, name, wrapper)
            self.patched.append((funcol, name, original, wrapper))
        original_wait = getattr(funcol, "wait_tensor", None)
        if original_wait is not None:
            wait = self._wrap_wait(original_wait)
            funcol.wait_tensor = wait
            self.patched.append((funcol, "wait_tensor", original_wait, wait))

    def restore(self) -> None:
        for module, name, original, wrapper in reversed(self.patched):
            if getattr(module, name, None) is wrapper:
                setattr(module, name, original)
        self.patched.clear()
        with self._lock:
            self._outstanding.clear()

    def _group(self, funcol: Any, group: Any, tag: Any) -> Any:
        import torch.distributed as dist

        if isinstance(group, dist.ProcessGroup):
            return group
        name = funcol._resolve_group_name(group, tag or "")
        resolve: Any = dist.distributed_c10d._resolve_process_group  # type: ignore[attr-defined]
        return resolve(name)

    def _wrap(self, name: str, original: Callable[..., Any], group_index: int, tag_index: int,
              funcol: Any) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self._enabled() or getattr(self._local, "inside", False):
                return original(*args, **kwargs)  # one functional collective calling another counts once
            tracker = entry = None
            try:
                group = kwargs.get("group", args[group_index] if group_index < len(args) else None)
                tag = kwargs.get("tag", args[tag_index] if tag_index < len(args) else "")
                process_group = self._group(funcol, group, tag)
                tracker = self._tracker_for(process_group)
                if tracker is not None:
                    entry = tracker.begin(fingerprint(_describe(name, args, process_group)))
            except Exception:  # INSTR-6: never into the trainer
                self._failed()
                tracker = None
            self._local.inside = True
            try:
                result = original(*args, **kwargs)
            finally:
                self._local.inside = False
            if tracker is not None:
                try:
                    self._issued(tracker, entry, result)
                except Exception:
                    self._failed()
            return result

        wrapper.__scout_instrumented__ = True  # type: ignore[attr-defined]
        return wrapper

    def _issued(self, tracker: Any, entry: Any, result: Any) -> None:
        outputs = [_waitable(item) for item in (result if isinstance(result, (list, tuple)) else [result])]
        pending = [tensor for tensor in outputs if tensor is not None]
        if not pending:  # already waited (traced, or a synchronous path): over
            tracker.end(entry, _Done())
            return
        waited = _Waited(pending)
        with self._lock:
            for tensor in pending:
                self._outstanding[id(tensor)] = waited
            while len(self._outstanding) > OUTSTANDING_MAX:
                self._outstanding.pop(next(iter(self._outstanding)))
        tracker.end(entry, waited)

    def _wrap_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wait_tensor(tensor: Any) -> Any:
            out = original(tensor)
            if self._outstanding:
                with self._lock:
                    waited = self._outstanding.pop(id(tensor), None)
                if waited is not None and any(ref() is tensor for ref in waited.outputs):
                    waited.done = True
            return out

        wait_tensor.__scout_instrumented__ = True  # type: ignore[attr-defined]
        return wait_tensor


class _Done:
    @staticmethod
    def is_completed() -> bool:
        return True


def _waitable(value: Any) -> Any:
    """The tensor whose ``wait_tensor`` completes the collective: an AsyncCollectiveTensor's
    element; None for a plain tensor (waited already)."""
    return getattr(value, "elem", None) if type(value).__name__ == "AsyncCollectiveTensor" else None


def _describe(name: str, args: tuple[Any, ...], group: Any) -> CollectiveCall:
    import torch.distributed as dist

    first: Any = args[0] if args else None
    tensors: list[Any] = list(first) if isinstance(first, (list, tuple)) else [first]
    metas = tuple(TensorMeta(str(t.dtype), tuple(int(d) for d in t.shape)) for t in tensors if hasattr(t, "dtype"))
    ranks = None if group is dist.GroupMember.WORLD else tuple(int(r) for r in dist.get_process_group_ranks(group))
    return CollectiveCall(f"functional.{name}", ranks, metas)
