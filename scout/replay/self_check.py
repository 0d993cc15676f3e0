"""The live path's self-check on one rank (spec/replay.md SELF-1..SELF-3): when a module call is
captured, replay it at once on this rank and compare with the live output, bit for bit.

Theory of operation. The capture's pre-hook (``scout.replay.capture``) registers a one-shot
forward hook for the call it captures, so that the hook runs after every forward hook the module
had when the call began -- FSDP2's post-forward, a user's hooks: it sees the *live output*, the
value the rest of the step consumes. There :func:`check_live_call`

1. refuses calls that cannot be reproduced by construction (SELF-3: a device without
   deterministic kernels on, a hook that changed the output's structure) -- UNCHECKED;
2. signs the *checked rows* of the live output: the rows the capture keeps (CAP-8), or all;
3. *cut replay* (``rows`` > 0 and a larger batch): replays the first rows -- about
   ``rows / batch`` of the call -- and answers MATCH if they equal the live rows. A smaller
   matrix may select other kernels, so a difference here is not evidence;
4. *exact replay* (otherwise): the whole call again, the same shapes and so the same kernels;
   equal checked rows: MATCH. Different: replayed once more -- two replays that differ from
   each other mean the call is not reproducible here (UNCHECKED, never a fault); two that agree
   and differ from the live output: DIFFER.

Every replay calls the module's ``forward`` without its own hooks (REPLAY-8; :class:`WithoutOwnHooks`)
on the live call's arguments (detached views: same storage, same ``requires_grad``) and the
parameters the live call used -- the module's own, or for a sharded module the gathered copy
CAP-7 took -- on copies of its buffers, from the RNG state the live call consumed, in the live
call's grad mode, autocast and algorithm settings; the generator is left as the live call left
it. Nothing here raises into the training loop: a failure is UNCHECKED with its reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

import attrs
import torch
from torch import nn
from torch.func import functional_call

from scout.core.self_check import LiveCheck
from scout.replay.rng import RngState, installed_rng_state
from scout.replay.signature import structured_signature
from scout.replay.tree import map_tensors, tensor_leaves

__all__ = ["DETERMINISTIC_CUBLAS", "LiveOutcome", "WithoutOwnHooks", "check_live_call", "first_rows",
           "not_reproducible"]

#: The cuBLAS workspace settings under which its results do not depend on the stream's workspace.
DETERMINISTIC_CUBLAS: Final = (":4096:8", ":16:8")


@attrs.frozen
class LiveOutcome:
    """One captured call's self-check on this rank: the code that travels (SELF-1), which
    replay decided it (``cut``, ``exact``, or ``""`` when none ran) and why, in words."""

    code: LiveCheck
    path: str = ""
    reason: str = ""


class WithoutOwnHooks(nn.Module):
    """Calls ``inner.forward`` directly: the inner module's own hooks do not run, its
    submodules' do (REPLAY-8, SELF-2). Holding ``inner`` as a child changes nothing in it."""

    PREFIX: Final = "inner."

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.forward(*args, **kwargs)


def not_reproducible(device: torch.device) -> str | None:
    """SELF-3: why a call on ``device`` cannot be reproduced bit for bit by construction, or None.
    A CPU runs the same kernels on the same data to the same bits for a given thread count; a
    GPU does only with deterministic algorithms on (atomics, split reductions) and, for cuBLAS,
    a fixed workspace."""
    if device.type == "cpu":
        return None
    if not torch.are_deterministic_algorithms_enabled():
        return (f"the live call ran on {device.type} without deterministic algorithms "
                "(torch.use_deterministic_algorithms(True)), so two runs of it may differ")
    if device.type == "cuda" and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_CUBLAS:
        return "cuBLAS is deterministic only with CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before CUDA starts"
    return None


def _batch_size(call: Any) -> int | None:
    """CAP-8: the batch size is the leading dimension of the call's first tensor."""
    tensors = [t for t in tensor_leaves(call) if t.dim() >= 1]
    return int(tensors[0].shape[0]) if tensors else None


def first_rows(value: Any, batch: int | None, rows: int) -> Any:
    """CAP-8: the first ``rows`` rows of every tensor of ``value`` whose leading dimension is the
    batch; other tensors whole. ``rows`` 0 (or no batch, or a batch of at most ``rows``): all."""
    if not rows or batch is None or batch <= rows:
        return value
    return map_tensors(lambda t: t[:rows] if t.dim() >= 1 and t.shape[0] == batch else t, value)


def _shape(value: Any) -> int:
    """The structure of a value without its contents or autograd flags: what a hook that casts
    or reshapes the output changes."""
    return structured_signature(map_tensors(lambda t: (str(t.dtype), tuple(t.shape)), value))


def _isolated(value: Any) -> Any:
    """Detached views of the live tensors (same storage and so the same kernels; same
    ``requires_grad``): a replay builds no graph on the live one."""
    def isolate(tensor: torch.Tensor) -> torch.Tensor:
        view = tensor.detach()
        if tensor.requires_grad and (view.is_floating_point() or view.is_complex()):
            view.requires_grad_(True)
        return view

    return map_tensors(isolate, value)


def check_live_call(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    output: Any,
    *,
    rng: RngState,
    rows: int = 0,
    parameters: Mapping[str, torch.Tensor] | None = None,
    buffers: Mapping[str, torch.Tensor] | None = None,
    suspended: Callable[[], AbstractContextManager[Any]] | None = None,
) -> LiveOutcome:
    """SELF-1..SELF-3 for one live call of ``module`` (module docstring). ``rng``: the state the
    live call consumed (CAP-3); ``parameters``/``buffers``: the gathered copies of a sharded
    module (CAP-7), None for a module whose own are the ones the call used; ``suspended``: a
    context in which the capture hooks do nothing."""
    try:
        leaves = list(tensor_leaves((args, dict(kwargs)))) or list(tensor_leaves(output))
        device = leaves[0].device if leaves else next((p.device for p in module.parameters()), torch.device("cpu"))
        why = not_reproducible(device)
        if why is not None:
            return LiveOutcome(LiveCheck.UNCHECKED, reason=why)
        batch = _batch_size((args, dict(kwargs)))
        live = map_tensors(lambda t: t.detach(), first_rows(output, batch, rows))
        live_shape, live_signature = _shape(live), structured_signature(live)

        def replay(call: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[int, int]:
            replayed = first_rows(_replay(module, call, rng, parameters, buffers, suspended), batch, rows)
            replayed = map_tensors(lambda t: t.detach(), replayed)
            return _shape(replayed), structured_signature(replayed)

        call = _isolated((tuple(args), dict(kwargs)))
        cut = bool(rows) and batch is not None and batch > rows
        if cut and replay(first_rows(call, batch, rows)) == (live_shape, live_signature):
            return LiveOutcome(LiveCheck.MATCH, "cut")
        shape, signature = replay(call)
        if shape != live_shape:
            return LiveOutcome(LiveCheck.UNCHECKED, "exact", "a forward hook changed the output's structure "
                               "(dtype or shape), so no replay of the module can equal it")
        if signature == live_signature:
            return LiveOutcome(LiveCheck.MATCH, "exact")
        if replay(call)[1] != signature:
            return LiveOutcome(LiveCheck.UNCHECKED, "exact", "two replays of the call differ from each other: "
                               "it is not reproducible here (a nondeterministic kernel)")
        return LiveOutcome(LiveCheck.DIFFER, "exact", "the live output differs from two identical replays of the call")
    except Exception as exc:  # CAP-6: never into the training loop
        return LiveOutcome(LiveCheck.UNCHECKED, reason=f"self-check failed: {exc!r}")


def _replay(module: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]], rng: RngState,
            parameters: Mapping[str, torch.Tensor] | None, buffers: Mapping[str, torch.Tensor] | None,
            suspended: Callable[[], AbstractContextManager[Any]] | None) -> Any:
    """One replay of the call (SELF-2): the module's forward without its own hooks, on the given
    parameters (None: its own), on copies of its buffers, from the RNG state ``rng``; this
    process's generator state is restored afterwards."""
    own_buffers = buffers if buffers is not None else dict(module.named_buffers())
    substitutes = {WithoutOwnHooks.PREFIX + name: b.clone() for name, b in own_buffers.items()}
    if parameters is not None:
        substitutes.update({WithoutOwnHooks.PREFIX + name: p for name, p in parameters.items()})
    args, kwargs = call
    with (suspended() if suspended is not None else contextlib.nullcontext()), installed_rng_state(rng):
        return functional_call(WithoutOwnHooks(module), substitutes, args, kwargs, strict=False)
