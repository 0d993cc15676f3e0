"""Opt-in fault injection for tests and the demo (spec/replay.md FAULT-1..FAULT-4).

Nothing here is active unless called. Each injector returns a handle with ``remove()``.

* :func:`flip_output_bit` -- a module whose output has one bit flipped on every call, live
  and replayed alike: the model of a faulty arithmetic unit (FAULT-1).
* :func:`flip_tensor_bit_` -- flip one bit of a parameter, gradient or optimizer-state tensor
  once, in place: the model of a memory upset (FAULT-2).
* :func:`slow_module` -- a module that takes ``delay_s`` longer on every call (FAULT-3).
* :func:`slow_compute` -- a replayer whose every replay compute takes ``factor`` times as
  long as it measured: a proportional compute straggler (FAULT-3).
* :func:`slow_communication` -- a peer whose every replay collective enters ``delay_s`` late,
  on its own side of the communication path (FAULT-4).
* :func:`faulty_kernel` -- every call of one torch function (by name, e.g. ``gelu``) has one
  bit of its output flipped, wherever it runs -- training, replay and canary alike: a kernel
  that miscomputes after a library or driver change. Injected on every rank it is common mode,
  which no vote can see (FAULT-5, CANARY-*).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from scout.replay.collectives import EntryHookHandle

__all__ = [
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


def slow_module(module: nn.Module, delay_s: float) -> RemovableHandle:
    """Every call of ``module`` first sleeps ``delay_s`` (a compute straggler)."""
    if not delay_s >= 0:
        raise ValueError(f"delay_s must be >= 0, got {delay_s}")

    def hook(_module: nn.Module, _args: Any) -> None:
        time.sleep(delay_s)

    return module.register_forward_pre_hook(hook)


def slow_compute(replayer: Any, factor: float) -> RemovableHandle:
    """Every replay compute of ``replayer`` (this peer only) takes ``factor`` times its own
    measured duration: after the work it sleeps ``(factor - 1)`` times the time measured, inside
    the timed span (FAULT-3, proportional). ``factor`` 1 changes nothing."""
    if not (factor >= 1 and math.isfinite(factor)):
        raise ValueError(f"factor must be finite and >= 1, got {factor}")
    add = getattr(replayer, "add_compute_hook", None)
    if add is None:
        raise TypeError(f"slow_compute needs a Replayer, got {type(replayer).__name__}")

    def hook(elapsed_s: float) -> None:
        time.sleep((factor - 1.0) * elapsed_s)

    handle: RemovableHandle = add(hook)
    return handle


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
    """FAULT-5: from now on, in this process, every call of the torch function ``name`` (e.g.
    ``"gelu"``) returns its output with one bit flipped (gradients pass through)."""
    mode = _FaultyKernel(name, element, bit)
    mode.__enter__()  # type: ignore[no-untyped-call]
    return FaultyKernelHandle(mode)
