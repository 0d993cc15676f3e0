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
"""

from __future__ import annotations

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


class FakeEvent:
    def __init__(self, cuda: FakeCuda, enable_timing: bool = False) -> None:
        self.cuda = cuda
        self.enable_timing = enable_timing
        self.stream: FakeStream | None = None
        self.completed_at_ms: float | None = None
        self.due_ms = 0.0  # when the device reaches it: after everything launched before it
        self.queries = 0

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream if stream is not None else self.cuda.current_stream()
        self.completed_at_ms = None
        self.due_ms = max(self.cuda.now_ms, self.cuda.stream_ms)
        self.cuda.pending.append(self)

    def query(self) -> bool:
        self.queries += 1
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
        self.current_index = 0
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
        return self._streams[index]

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
