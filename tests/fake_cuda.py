"""A stand-in for the parts of ``torch.cuda`` scout uses, with CUDA's documented contract, so
that the GPU code paths run on a CPU-only machine (spec/replay.md TIMING-2, docs/gate.md RNG).

* Events: ``Event(enable_timing=True)``, ``record(stream)``, ``query()`` (True once the device
  got past it), ``elapsed_time(end)`` in milliseconds -- which, like CUDA's, fails on an event
  that has not completed ("device not ready"). The device advances only when the test says so
  (:meth:`FakeCuda.run_until`, :meth:`FakeCuda.complete`), or, with ``auto_run``, runs all the
  work queued so far whenever an event is queried; :meth:`FakeCuda.launch` queues a "kernel" of
  some milliseconds, so an event recorded after it completes that much later.
* Draining is forbidden unless allowed: ``synchronize`` of the device, a stream or an event
  counts the call and raises :class:`Drained`, so a test proves that code never drains.
* RNG: ``get_rng_state_all()`` / ``set_rng_state_all(states)``, one uint8 state per device.
* Streams and CUDA graph capture (spec/observer.md INSTR-13): ``Stream(device)`` and
  ``set_stream(stream)`` give the calling thread a current stream of its own;
  ``cuda.CUDAGraph()``'s ``capture_begin(capture_error_mode=...)`` captures the calling thread's
  current stream (never the default one) until ``capture_end``; ``is_current_stream_capturing()``
  answers for the calling thread's current stream. As in CUDA, an event query while a capture is
  under way -- from any thread in ``global`` mode, from the capturing thread in ``thread_local``
  mode -- fails and invalidates the capture (``capture_end`` then raises); an event recorded on
  a capturing stream becomes part of the graph, and querying it later fails.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


class Drained(AssertionError):
    """Code under test called a synchronize it must not call."""


class FakeStream:
    def __init__(self, cuda: FakeCuda, device_index: int, name: str) -> None:
        self.cuda = cuda
        self.device_index = device_index
        self.name = name

    def synchronize(self) -> None:
        self.cuda.drains += 1
        raise Drained(f"stream {self.name} of cuda:{self.device_index} was synchronized")


class FakeCapture:
    """A stream capture under way: who began it, in which mode, and whether it was spoiled."""

    def __init__(self, stream: FakeStream, mode: str) -> None:
        self.stream = stream
        self.mode = mode
        self.thread = threading.get_ident()
        self.invalidated = False


class FakeCUDAGraph:
    """``torch.cuda.CUDAGraph`` for a :class:`FakeCuda` (each fake has its own subclass, so a
    test that wraps its methods touches no other test's)."""

    cuda: FakeCuda

    def __init__(self) -> None:
        self.capture: FakeCapture | None = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        stream = self.cuda.current_stream()
        if stream is self.cuda.default_stream(stream.device_index):
            raise RuntimeError("CUDA graphs must be captured on a non-default stream.")
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise RuntimeError(f"unknown capture_error_mode {capture_error_mode!r}")
        self.capture = FakeCapture(stream, capture_error_mode)
        self.cuda.captures.append(self.capture)

    def capture_end(self) -> None:
        capture = self.capture
        if capture is None or capture not in self.cuda.captures:
            raise RuntimeError("capture_end() called before capture_begin().")
        self.cuda.captures.remove(capture)
        if capture.invalidated:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture "
                               "(cudaErrorStreamCaptureInvalidated)")


class FakeEvent:
    def __init__(self, cuda: FakeCuda, enable_timing: bool = False) -> None:
        self.cuda = cuda
        self.enable_timing = enable_timing
        self.stream: FakeStream | None = None
        self.completed_at_ms: float | None = None
        self.due_ms = 0.0  # when the device reaches it: after everything launched before it
        self.queries = 0
        self.captured = False  # last recorded on a capturing stream: a node of the graph

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream if stream is not None else self.cuda.current_stream()
        self.completed_at_ms = None
        self.captured = any(c.stream is self.stream for c in self.cuda.captures)
        if self.captured:
            self.cuda.recorded_in_capture += 1
            return
        self.due_ms = max(self.cuda.now_ms, self.cuda.stream_ms)
        self.cuda.pending.append(self)

    def query(self) -> bool:
        self.queries += 1
        self.cuda.check_unsafe_call("cudaEventQuery")
        if self.captured:
            raise RuntimeError("CUDA error: operation not permitted on an event last recorded in a capturing stream")
        if self.cuda.auto_run:
            self.cuda.run_all()
        return self.stream is None or self.completed_at_ms is not None

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.completed_at_ms is None or end.completed_at_ms is None:
            # What CUDA answers (cudaErrorNotReady) when elapsed_time meets a pending event.
            raise RuntimeError("CUDA error: device not ready")
        return end.completed_at_ms - self.completed_at_ms

    def synchronize(self) -> None:
        self.cuda.drains += 1
        raise Drained("an event was synchronized")


class FakeCuda:
    """``torch.cuda`` for ``device_count`` fake devices; the device clock is in milliseconds."""

    def __init__(self, device_count: int = 1) -> None:
        self._device_count = device_count
        self.now_ms = 0.0
        self.stream_ms = 0.0  # when the work launched so far ends
        self.auto_run = False
        self.pending: list[FakeEvent] = []
        self.drains = 0
        self._streams = {i: FakeStream(self, i, "default") for i in range(device_count)}
        self._local = threading.local()  # each thread's current streams, by device
        self.current_index = 0
        self.captures: list[FakeCapture] = []
        self.unsafe_calls = 0  # calls that spoiled a capture
        self.recorded_in_capture = 0
        self.CUDAGraph = type("CUDAGraph", (FakeCUDAGraph,), {"cuda": self})  # noqa: N806 - torch's name
        self.initialized = True  # whether this process "has initialized CUDA"
        generator = torch.Generator().manual_seed(1234)
        self.rng_states = [
            torch.randint(0, 256, (16,), dtype=torch.uint8, generator=generator)
            for _ in range(device_count)
        ]

    # -- devices and streams
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self._device_count

    def current_device(self) -> int:
        return self.current_index

    def current_stream(self, device: Any = None) -> FakeStream:
        index = self.current_index if device is None else int(getattr(device, "index", device))
        chosen: dict[int, FakeStream] = getattr(self._local, "streams", {})
        return chosen.get(index, self._streams[index])

    def default_stream(self, device: Any = None) -> FakeStream:
        index = self.current_index if device is None else int(getattr(device, "index", device))
        return self._streams[index]

    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802 - torch's name
        index = self.current_index if device is None else int(getattr(device, "index", device))
        return FakeStream(self, index, f"side-{id(self)}-{index}")

    def set_stream(self, stream: FakeStream) -> None:
        """The calling thread's current stream on the stream's device."""
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        self._local.streams[stream.device_index] = stream

    def is_current_stream_capturing(self) -> bool:
        stream = self.current_stream()
        return any(c.stream is stream for c in self.captures)

    def check_unsafe_call(self, what: str) -> None:
        """CUDA's rule for a potentially unsafe call during a capture: prohibited -- failing,
        and spoiling the capture -- while any thread captures in ``global`` mode, or this thread
        in ``thread_local`` mode."""
        me = threading.get_ident()
        for capture in self.captures:
            if capture.mode == "global" or (capture.mode == "thread_local" and capture.thread == me):
                capture.invalidated = True
                self.unsafe_calls += 1
                raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({what})")

    def synchronize(self, device: Any = None) -> None:
        self.drains += 1
        raise Drained(f"device {device!r} was synchronized")

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent(self, enable_timing=enable_timing)

    # -- the device makes progress when the test says so
    def launch(self, ms: float) -> None:
        """Queue a kernel of ``ms`` milliseconds on the stream."""
        self.stream_ms = max(self.now_ms, self.stream_ms) + ms

    def run_all(self) -> None:
        """The device runs everything queued: each event completes at its due time."""
        for event in self.pending:
            event.completed_at_ms = event.due_ms
        self.now_ms = max([self.now_ms, self.stream_ms, *(e.due_ms for e in self.pending)])
        self.pending.clear()

    def run_until(self, ms: float) -> None:
        """The device runs for ``ms`` ms and completes everything queued (in order)."""
        self.now_ms += ms
        for event in self.pending:
            event.completed_at_ms = self.now_ms
        self.pending.clear()

    def complete(self, event: FakeEvent, after_ms: float) -> None:
        """The device runs ``after_ms`` ms and gets past ``event`` (and what precedes it)."""
        self.now_ms += after_ms
        index = self.pending.index(event)
        for earlier in self.pending[: index + 1]:
            earlier.completed_at_ms = self.now_ms
        del self.pending[: index + 1]

    # -- RNG
    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [state.clone() for state in self.rng_states]

    def set_rng_state_all(self, states: Any) -> None:
        states = list(states)
        if len(states) != self._device_count:
            raise RuntimeError(
                f"set_rng_state_all: {len(states)} states for {self._device_count} devices"
            )
        self.rng_states = [torch.as_tensor(s, dtype=torch.uint8).clone() for s in states]
