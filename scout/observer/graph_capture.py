"""The completion watcher's device queries kept out of CUDA graph captures (spec/observer.md
INSTR-13).

In CUDA's default capture mode (``cudaStreamCaptureModeGlobal``, the default of
``torch.cuda.graph``) a potentially unsafe call from *any* thread while a stream is capturing
-- an event query is one -- fails and invalidates the capture. The watcher thread queries events
(markers, NCCL's ``Work.is_completed``, and NCCL's recorder dump, which queries every active
entry's events) at times of its own choosing. ``torch.cuda.is_current_stream_capturing()``
cannot warn it: it answers for the calling thread's current stream, and the watcher's is not the
one being captured. PyTorch guards its own NCCL watchdog by counting the event queries the
watchdog still has to make; ``CUDAGraph::capture_begin`` waits for that count to reach zero
before the capture begins, and a collective issued during a capture is never handed to the
watchdog.

:class:`CaptureGate` is the same agreement from Python. It wraps ``capture_begin`` and
``capture_end`` of ``torch.cuda.CUDAGraph`` (through which ``torch.cuda.graph``,
``make_graphed_callables`` and torch.compile's CUDA graph trees capture) and of
``torch.accelerator.Graph``: a capture is announced before it begins, and waits -- at most
``CAPTURE_WAIT_S`` -- for a poll in progress to end; the watcher polls only while no capture is
announced, and counts the polls it skipped. A capture begun another way (``torch._C._CUDAGraph``
directly, or from C++) is not seen. Tests drive it with the fake CUDA of tests/fake_cuda.py,
whose events fail and invalidate a capture as CUDA's do.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

__all__ = ["CAPTURE_WAIT_S", "CaptureGate", "acquire", "graph_classes", "release"]

logger = logging.getLogger("scout")

#: How long a capture waits for a poll in progress to end. A poll takes microseconds (markers)
#: to milliseconds (a full recorder dump); one that takes longer is stuck, and the capture is
#: not held up by it (it is counted in ``CaptureGate.late_captures``).
CAPTURE_WAIT_S: Final = 2.0


class CaptureGate:
    """Captures announced, and the one poll that may run while none is (INSTR-13)."""

    def __init__(self, *, wait_s: float = CAPTURE_WAIT_S) -> None:
        if not 0 < wait_s <= 60:
            raise ValueError(f"wait_s must be in (0, 60] seconds, got {wait_s!r}")
        self.wait_s = wait_s
        self.late_captures = 0
        self._state = threading.Lock()  # guards _captures; never held while waiting
        self._polling = threading.Lock()  # held by a poll for its whole length
        self._captures = 0

    @property
    def capturing(self) -> bool:
        """Whether a capture is announced and not yet ended."""
        with self._state:
            return self._captures > 0

    @contextlib.contextmanager
    def poll(self) -> Iterator[bool]:
        """Hold the poll's place for its length; yields whether it may query the device (False
        while a capture is announced: the caller skips and counts). A capture announced during
        the poll waits for the poll to end before it begins."""
        with self._polling:
            with self._state:
                allowed = self._captures == 0
            yield allowed

    def capture_begins(self) -> None:
        """Announce a capture, then wait for a poll in progress to end (bounded)."""
        with self._state:
            self._captures += 1
        # A poll that checked before the announcement holds _polling until it ends; one that
        # checks after it sees the announcement and skips.
        if self._polling.acquire(timeout=self.wait_s):
            self._polling.release()
        else:
            self.late_captures += 1
            logger.warning("scout: a completion poll did not end within %.1f s; a CUDA graph capture begins "
                           "beside it", self.wait_s)

    def capture_ends(self) -> None:
        """A capture ended (or failed to begin). Never below zero: a ``capture_end`` without its
        ``capture_begin`` is the caller's error, raised by torch, not counted here."""
        with self._state:
            self._captures = max(0, self._captures - 1)


def graph_classes() -> list[type]:
    """The capture classes of this torch whose ``capture_begin``/``capture_end`` are Python."""
    found: list[type] = []
    with contextlib.suppress(Exception):
        import torch.cuda.graphs as cuda_graphs

        found.append(cuda_graphs.CUDAGraph)
    with contextlib.suppress(Exception):
        import torch.accelerator.graphs as accelerator_graphs

        found.append(accelerator_graphs.Graph)
    return [cls for cls in found if hasattr(cls, "capture_begin") and hasattr(cls, "capture_end")]


def _wrap(cls: Any, gate: CaptureGate) -> Callable[[], None]:
    """Wrap ``cls``'s capture methods; returns what puts the originals back."""
    begin: Any = getattr(cls, "capture_begin")  # noqa: B009 - read once, restored as read
    end: Any = getattr(cls, "capture_end")  # noqa: B009
    own = {name: name in vars(cls) for name in ("capture_begin", "capture_end")}

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate.capture_begins()
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            gate.capture_ends()  # it never began
            raise

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            gate.capture_ends()  # over, whether or not the graph came out valid

    capture_begin.__wrapped__ = begin  # type: ignore[attr-defined]
    capture_end.__wrapped__ = end  # type: ignore[attr-defined]
    cls.capture_begin = capture_begin
    cls.capture_end = capture_end

    def unwrap() -> None:
        for name, original, wrapper in (("capture_begin", begin, capture_begin), ("capture_end", end, capture_end)):
            if vars(cls).get(name) is not wrapper:
                continue  # someone wrapped ours since: theirs stays (ours only counts, harmlessly)
            if own[name]:
                setattr(cls, name, original)
            else:  # inherited: uncover the base class's again
                delattr(cls, name)

    return unwrap


class _Installed:
    def __init__(self, gate: CaptureGate, unwraps: list[Callable[[], None]]) -> None:
        self.gate = gate
        self.unwraps = unwraps
        self.users = 0


_LOCK = threading.Lock()
_INSTALLED: _Installed | None = None


def acquire(classes: list[type] | None = None) -> CaptureGate:
    """The process's one gate, its wrappers installed on first use (``classes``: the capture
    classes to wrap, default :func:`graph_classes`; tests pass the fake's). Every watcher that
    queries a device shares it; each :func:`acquire` is paired with one :func:`release`."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED is None:
            gate = CaptureGate()
            wanted = graph_classes() if classes is None else classes
            _INSTALLED = _Installed(gate, [_wrap(cls, gate) for cls in wanted])
        _INSTALLED.users += 1
        return _INSTALLED.gate


def release(gate: CaptureGate) -> None:
    """One user of ``gate`` is done; the last one puts torch's methods back."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED is None or _INSTALLED.gate is not gate:
            return
        _INSTALLED.users -= 1
        if _INSTALLED.users <= 0:
            for unwrap in _INSTALLED.unwraps:
                unwrap()
            _INSTALLED = None
