"""Opt-in fault injection for tests and the demo (spec/replay.md FAULT-1..FAULT-8).

Nothing here is active unless called. Each injector returns a handle with ``remove()``.

* :func:`flip_output_bit` -- a module whose output has one bit flipped on every call, live
  and replayed alike: the model of a faulty arithmetic unit (FAULT-1).
* :func:`flip_tensor_bit_` -- flip one bit of a parameter, gradient or optimizer-state tensor
  once, in place: the model of a memory upset (FAULT-2).
* :func:`slow_module` -- a module that computes ``delay_s`` longer on every call (FAULT-3).
* :func:`slow_compute` -- a replayer whose every replay compute takes ``factor`` times as
  long as it measured: a proportional compute straggler (FAULT-3).
* :class:`SlowOps` -- every tensor operation of this process computes ``factor`` times as
  long, forward, backward, optimizer and replay alike: a slow device (FAULT-5).
* :class:`SlowLoop` -- the training loop of this process waits ``factor - 1`` times the
  duration of a block of it, outside any module: a slow host side, e.g. a slow data path
  (FAULT-6).
* :func:`slow_communication` -- a peer whose every replay collective enters ``delay_s`` late,
  on its own side of the communication path (FAULT-4).
* :func:`faulty_kernel` -- every call of one torch function (by name, e.g. ``gelu``) has one
  bit of its output flipped, wherever it runs -- training, replay and canary alike: a kernel
  that miscomputes after a library or driver change. Injected on every rank it is common mode,
  which no vote can see (FAULT-7, CANARY-*).
* :class:`LiveFault` -- a module whose output has a bit flipped only while the training loop is
  in the phases the fault is entered for (the forward, or the forward and the backward): a unit
  that miscomputes under the live step's power or heat, and never in a replay (FAULT-8).

A compute slowdown *computes*: it spins on the thread's CPU clock, so it costs CPU time like
real work and is seen by replay's CPU-time clock on CPU devices (STRAG-1). A loop slowdown
*waits* (it sleeps), like a rank blocked on I/O.
"""

from __future__ import annotations

import math
import threading
import time
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.hooks import RemovableHandle

from scout.core.guards import whole_number
from scout.replay.collectives import EntryHookHandle, OwnWallClock, RunQueueDelay

__all__ = [
    "LiveFault",
    "SlowLoop",
    "SlowOps",
    "compute_for",
    "faulty_kernel",
    "flip_output_bit",
    "flip_tensor_bit_",
    "slow_communication",
    "slow_compute",
    "slow_module",
]

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flip_tensor_bit_(tensor: torch.Tensor, element: int, bit: int) -> None:
    """Flip bit ``bit`` (0 = least significant) of flat element ``element``, in place."""
    size = tensor.element_size()
    if size not in _INT_VIEW:
        raise ValueError(f"cannot flip bits of dtype {tensor.dtype} (element size {size})")
    if not 0 <= bit < 8 * size:
        raise ValueError(f"bit {bit} outside 0..{8 * size - 1} for dtype {tensor.dtype}")
    if not 0 <= element < tensor.numel():
        raise ValueError(f"element {element} outside a tensor of {tensor.numel()} elements")
    if not tensor.is_contiguous():
        raise ValueError("flip_tensor_bit_ needs a contiguous tensor")
    with torch.no_grad():
        words = tensor.detach().reshape(-1).view(_INT_VIEW[size])
        mask = torch.tensor(1 << bit if bit < 8 * size - 1 else -(1 << bit), dtype=words.dtype)
        words[element] ^= mask.to(words.device)


class _FlipBit(torch.autograd.Function):
    """Forward: a copy with one bit flipped (exactly). Backward: the gradient passes through,
    as it would through a unit that computed a wrong value."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, element: int, bit: int) -> torch.Tensor:
        corrupted = tensor.clone(memory_format=torch.contiguous_format)
        flip_tensor_bit_(corrupted, element, bit)
        return corrupted

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return gradient, None, None


def _flip(tensor: torch.Tensor, element: int, bit: int) -> torch.Tensor:
    result: torch.Tensor = _FlipBit.apply(tensor, element, bit)  # type: ignore[no-untyped-call]
    return result


def flip_output_bit(module: nn.Module, *, element: int = 0, bit: int = 20) -> RemovableHandle:
    """Every call of ``module`` returns its first output tensor (the output itself, or the
    first item of a tuple/list output) with bit ``bit`` of element ``element`` flipped."""

    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return _flip(output, element, bit)
        if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
            return type(output)([_flip(output[0], element, bit), *output[1:]])
        raise TypeError(
            f"flip_output_bit: {type(_module).__name__} returned {type(output).__name__}; "
            "expected a tensor or a tuple/list starting with one"
        )

    return module.register_forward_hook(hook)


class _FlipRow(torch.autograd.Function):
    """Forward: a copy with bit ``bit`` of every element of batch row ``row`` flipped (exactly).
    Backward: the gradient passes through."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, row: int, bit: int) -> torch.Tensor:
        if not 0 <= row < (tensor.shape[0] if tensor.dim() else 0):
            raise ValueError(f"row {row} outside an output of shape {tuple(tensor.shape)}")
        corrupted = tensor.clone(memory_format=torch.contiguous_format)
        size = corrupted.element_size()
        if size not in _INT_VIEW or not 0 <= bit < 8 * size:
            raise ValueError(f"cannot flip bit {bit} of dtype {corrupted.dtype}")
        with torch.no_grad():
            words = corrupted[row].reshape(-1).view(_INT_VIEW[size])
            words ^= torch.tensor(1 << bit if bit < 8 * size - 1 else -(1 << bit), dtype=words.dtype,
                                  device=words.device)
        return corrupted

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return gradient, None, None


def _flip_row(tensor: torch.Tensor, row: int, bit: int) -> torch.Tensor:
    result: torch.Tensor = _FlipRow.apply(tensor, row, bit)  # type: ignore[no-untyped-call]
    return result


class LiveFault:
    """FAULT-8: a fault of the live step's phases only. A forward hook on ``module`` flips bit
    ``bit`` of flat element ``element`` of its first output -- or of every element of batch row
    ``row`` -- on the calls made while the fault is entered (``enter()`` ... ``exit()``, or
    ``with fault:``), only on the first ``calls`` of each entered span when ``calls`` is given.
    Outside (replays, a self-check at the optimizer's pre-step hook) the module computes
    correctly: a unit that miscomputes under the forward's (or the backward's) power or heat.
    Gradients pass through. ``struck`` counts the calls it flipped."""

    def __init__(self, module: nn.Module, *, bit: int = 12, element: int = 0, row: int | None = None,
                 calls: int | None = None) -> None:
        if calls is not None and (not whole_number(calls) or calls < 1):
            raise ValueError(f"calls must be an int >= 1 or None (every call), got {calls!r}")
        if row is not None and (not whole_number(row) or row < 0):
            raise ValueError(f"row must be an int >= 0 or None (one element), got {row!r}")
        self.bit, self.element, self.row, self.calls = bit, element, row, calls
        self.struck = 0
        self._entered = 0
        self._in_span = 0  # calls struck in the current entered span
        self._lock = threading.Lock()  # a backward's recomputation may call the module from another thread
        self._handle: RemovableHandle | None = module.register_forward_hook(self._hook)

    def enter(self) -> LiveFault:
        """The phases the fault strikes begin (a new span: ``calls`` counts from here)."""
        with self._lock:
            if self._entered == 0:
                self._in_span = 0
            self._entered += 1
        return self

    def exit(self) -> None:
        with self._lock:
            if self._entered == 0:
                raise RuntimeError("LiveFault.exit() without enter()")
            self._entered -= 1

    def __enter__(self) -> LiveFault:
        return self.enter()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.exit()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _strikes(self) -> bool:
        with self._lock:
            if not self._entered or (self.calls is not None and self._in_span >= self.calls):
                return False
            self._in_span += 1
            self.struck += 1
            return True

    def _hook(self, module: nn.Module, _args: Any, output: Any) -> Any:
        first = output if isinstance(output, torch.Tensor) else (
            output[0] if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) else None)
        if first is None:
            raise TypeError(f"LiveFault: {type(module).__name__} returned {type(output).__name__}; expected a "
                            "tensor or a tuple/list starting with one")
        if not self._strikes():
            return None
        flipped = _flip_row(first, self.row, self.bit) if self.row is not None else _flip(first, self.element, self.bit)
        return flipped if isinstance(output, torch.Tensor) else type(output)([flipped, *output[1:]])


def compute_for(cpu_s: float) -> None:
    """Burn ``cpu_s`` seconds of this thread's CPU time (a slower device's extra work)."""
    if cpu_s <= 0:
        return
    clock = time.thread_time
    end = clock() + cpu_s
    while clock() < end:
        pass


def slow_module(module: nn.Module, delay_s: float) -> RemovableHandle:
    """Every call of ``module`` first computes for ``delay_s`` of CPU time (a compute
    straggler)."""
    if not delay_s >= 0:
        raise ValueError(f"delay_s must be >= 0, got {delay_s}")

    def hook(_module: nn.Module, _args: Any) -> None:
        compute_for(delay_s)

    return module.register_forward_pre_hook(hook)


def slow_compute(replayer: Any, factor: float) -> RemovableHandle:
    """Every replay compute of ``replayer`` (this peer only) takes ``factor`` times its own
    measured duration: after the work it computes for ``(factor - 1)`` times the time measured
    (on the replay clock), inside the timed span (FAULT-3, proportional). ``factor`` 1 changes
    nothing."""
    _check_factor(factor)
    add = getattr(replayer, "add_compute_hook", None)
    if add is None:
        raise TypeError(f"slow_compute needs a Replayer, got {type(replayer).__name__}")

    def hook(elapsed_s: float) -> None:
        compute_for((factor - 1.0) * elapsed_s)

    handle: RemovableHandle = add(hook)
    return handle


def _check_factor(factor: float) -> float:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise TypeError(f"factor must be a number, got {type(factor).__name__}")
    if not (factor >= 1 and math.isfinite(factor)):
        raise ValueError(f"factor must be finite and >= 1, got {factor}")
    return float(factor)


#: Operator namespaces SlowOps leaves alone: collectives (a slow device does not make its
#: peers' messages slower) and profiler bookkeeping.
_UNSLOWED_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "profiler"})


class SlowOps(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """FAULT-5: a slow CPU device. While active (``with SlowOps(1.5):``, or ``enter()`` ...
    ``exit()`` around a whole training loop), this process's thread computes ``factor``
    times as long -- forward, backward, optimizer, replay: after each tensor operation it
    dispatches, the thread computes for ``(factor - 1)`` times the CPU time the operation used,
    plus the Python since the previous one ended when that gap is at most ``gap_max_s`` (as on a
    slower core). Collective operators are not slowed, nor is time spent blocked, nor a gap of
    more than ``gap_max_s`` of CPU without any operation (its extra time would be paid late,
    inside whatever the next operation belongs to -- a collective's entry, say). The operation
    itself is always slowed, however long it takes: on a slower CPU a matmul may take longer
    than ``gap_max_s``, and must not escape the fault (a CI run once saw no slowdown at all).
    ``operations`` counts the operations seen.

    ``waits=True``: the thread *waits* for the extra time instead (a device that answers late, a
    throttled or descheduled rank): it owes ``(factor - 1)`` times each operation's time and
    sleeps once it owes ``wait_quantum_s`` (a sleep of a few microseconds per operation would
    take far longer than asked); an oversleep is paid back by the next operations. The time
    slept is measured on STRAG-1's own clock (a wait for a CPU after waking is not the fault's).
    ``waited_s`` sums the time slept."""

    def __init__(self, factor: float, *, gap_max_s: float = 200e-6, waits: bool = False,
                 wait_quantum_s: float = 500e-6) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.factor = _check_factor(factor)
        if not gap_max_s >= 0:
            raise ValueError(f"gap_max_s must be >= 0, got {gap_max_s}")
        if not (math.isfinite(wait_quantum_s) and wait_quantum_s > 0):
            raise ValueError(f"wait_quantum_s must be a finite number > 0, got {wait_quantum_s}")
        self.gap_max_s = gap_max_s
        self.waits = bool(waits)
        self.wait_quantum_s = wait_quantum_s
        self.operations = 0
        self.waited_s = 0.0
        self._local = threading.local()  # per thread: CPU time when its last operation ended, time owed
        self._own_ns = OwnWallClock()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        clock = time.thread_time
        started = clock()
        result = func(*args, **(kwargs or {}))
        if func.namespace in _UNSLOWED_NAMESPACES:
            return result
        now = clock()
        spent = now - started
        last = getattr(self._local, "last", None)
        if last is not None and started - last <= self.gap_max_s:
            spent += started - last  # the Python between two operations (FAULT-5)
        if self.factor > 1.0 and self.waits:
            self._wait((self.factor - 1.0) * spent)
        elif self.factor > 1.0:
            compute_for((self.factor - 1.0) * spent)
        self._local.last = clock()
        self.operations += 1
        return result

    def _wait(self, seconds: float) -> None:
        owed = getattr(self._local, "owed", 0.0) + seconds
        if owed >= self.wait_quantum_s:
            # Slept time on the own clock (STRAG-1): the wait after waking for a CPU the host
            # gave to another process is contention, not this fault's.
            began = self._own_ns()
            time.sleep(owed)
            slept = (self._own_ns() - began) / 1e9
            self.waited_s += slept
            owed -= slept
        self._local.owed = owed

    def enter(self) -> SlowOps:
        """Activate the mode on this thread until :meth:`exit` (for loops that cannot be
        wrapped in ``with``)."""
        self.__enter__()  # type: ignore[no-untyped-call]
        return self

    def exit(self) -> None:
        self.__exit__(None, None, None)  # type: ignore[no-untyped-call]


class SlowLoop:
    """FAULT-6: a block of the training loop (``with slow_loop:``) is followed by a wait of
    ``factor - 1`` times its duration -- host-side time outside any module and any tensor
    operation, like a data path that delivers batches slowly. The duration does not count
    time the host kept the thread waiting for a CPU (run-queue delay, where Linux reports
    it), as the loop timer does not (LOOP-1). ``waited_s`` sums the waits."""

    def __init__(self, factor: float) -> None:
        self.factor = _check_factor(factor)
        self.waited_s = 0.0
        self._started: tuple[float, float] | None = None
        self._run_queue_delay = RunQueueDelay()

    def __enter__(self) -> SlowLoop:
        self._started = (time.perf_counter(), self._run_queue_delay())
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        started, self._started = self._started, None
        if started is None or kind is not None:
            return
        wall_s = time.perf_counter() - started[0]
        own_s = max(0.0, wall_s - (self._run_queue_delay() - started[1]))
        wait_s = (self.factor - 1.0) * own_s
        time.sleep(wait_s)
        self.waited_s += wait_s


def slow_communication(peers: Any, delay_s: float) -> EntryHookHandle:
    """Every collective of the replay peer group ``peers`` (this peer only) sleeps ``delay_s``
    after it is called and before it is handed to the backend: a communication straggler
    (FAULT-4). Compute is untouched. ``peers`` must have a ``timer`` (TorchPeerGroup and
    TransportPeerGroup do)."""
    if not delay_s >= 0:
        raise ValueError(f"delay_s must be >= 0, got {delay_s}")
    timer = getattr(peers, "timer", None)
    if timer is None:
        raise TypeError(
            f"slow_communication needs a peer group with a timer, got {type(peers).__name__}"
        )

    def hook(_operation: str) -> None:
        time.sleep(delay_s)

    handle: EntryHookHandle = timer.add_entry_hook(hook)
    return handle


class _FaultyKernel(torch.overrides.TorchFunctionMode):
    def __init__(self, name: str, element: int, bit: int) -> None:
        super().__init__()
        self.name, self.element, self.bit = name, element, bit

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == self.name and isinstance(result, torch.Tensor) and result.numel():
            result = _flip(result, self.element % result.numel(), self.bit)
        return result


class FaultyKernelHandle:
    """Removes a :func:`faulty_kernel` injection (``remove()`` is idempotent)."""

    def __init__(self, mode: _FaultyKernel) -> None:
        self._mode: _FaultyKernel | None = mode

    def remove(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self._mode = None


def faulty_kernel(name: str, *, element: int = 0, bit: int = 20) -> FaultyKernelHandle:
    """FAULT-7: from now on, in this process, every call of the torch function ``name`` (e.g.
    ``"gelu"``) returns its output with one bit flipped (gradients pass through)."""
    mode = _FaultyKernel(name, element, bit)
    mode.__enter__()  # type: ignore[no-untyped-call]
    return FaultyKernelHandle(mode)
