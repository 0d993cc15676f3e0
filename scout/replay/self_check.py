"""The live path's self-check on one rank (spec/replay.md SELF-1..SELF-3, SELF-9): when a module
call is captured, keep what it used and its live output's signature; later, outside the live
forward and backward, replay it on this rank and compare, bit for bit.

Theory of operation. The capture's pre-hook (``scout.replay.capture``) registers a one-shot
forward hook for the call it captures, so that the hook runs after every forward hook the module
had when the call began -- FSDP2's post-forward, a user's hooks: it sees the *live output*, the
value the rest of the step consumes. There :func:`record_live_call`

1. refuses calls that cannot be reproduced by construction (SELF-3: a device without
   deterministic kernels on) -- UNCHECKED;
2. signs the *checked rows* of the live output: the rows the capture keeps (CAP-8), or all;
3. keeps what a re-execution needs (:class:`LiveCall`): detached views of the arguments (held,
   not copied), a copy of the buffers as the call left them, the parameters' version counters,
   the grad mode, autocast, deterministic-algorithm setting and thread count of the call.

Nothing is re-executed there: inside the live call a fault confined to the forward (a unit that
fails only under the forward's load, a hook that strikes only inside ``model(x)``) would strike
the re-execution alike and answer MATCH (SELF-9, issue 41). :func:`check_live_call` runs later --
at the optimizer's pre-step hook, or at the replay check of ``job.step()`` -- and

4. refuses state the live call did not use: an unsharded module's parameters replaced or changed
   in place since the call, arguments changed in place, another training flag -- UNCHECKED;
5. *cut replay* (``rows`` > 0 and a larger batch): replays the first rows -- about
   ``rows / batch`` of the call -- and answers MATCH if they equal the live rows. A smaller
   matrix may select other kernels, so a difference here is not evidence;
6. *exact replay* (otherwise): the whole call again, the same shapes and so the same kernels;
   equal checked rows: MATCH; a hook that changed the output's structure: UNCHECKED. Different:
   replayed once more -- two replays that differ from each other mean the call is not
   reproducible here (UNCHECKED, never a fault); two that agree and differ from the live
   output: DIFFER.

Every replay calls the module's ``forward`` without its own hooks (REPLAY-8; :class:`WithoutOwnHooks`)
on the live call's arguments and the parameters the live call used -- the module's own, or for a
sharded module the gathered copy CAP-7 took -- on copies of its buffers, from the RNG state the
live call consumed, in the live call's grad mode, autocast, algorithm settings and thread count;
the generator is left as it was. Nothing here raises into the training loop: a failure is
UNCHECKED with its reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
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

__all__ = ["DETERMINISTIC_CUBLAS", "LiveCall", "LiveOutcome", "WithoutOwnHooks", "changed_since", "check_live_call",
           "first_rows", "not_reproducible", "record_live_call"]

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


#: One parameter or buffer of a module: its dotted name, the dict that holds it (a submodule's
#: ``_parameters`` or ``_buffers``) and its key there.
_Slot = tuple[str, dict[str, Any], str]


def _slots(module: nn.Module) -> tuple[tuple[_Slot, ...], tuple[_Slot, ...]]:
    """Where ``module``'s parameters and buffers live at this call, read at every call (a walk of
    the module's submodules, small beside signing the output): a submodule replaced since an
    earlier call (an adapter swapped in, a layer rebuilt) must not leave the check on the old one's
    buffers and parameters (SELF-5: a healthy call would be DIFFER); a parameter replaced in its
    slot after the call is seen at the check (SELF-9)."""
    slots: tuple[list[_Slot], list[_Slot]] = ([], [])
    for prefix, sub in module.named_modules():
        for kind, owner in enumerate((sub._parameters, sub._buffers)):
            slots[kind].extend((f"{prefix}.{key}" if prefix else key, owner, key)
                               for key, value in owner.items() if value is not None)
    return tuple(slots[0]), tuple(slots[1])


class _StateChanged(Exception):
    """The state a re-execution needs is no longer the live call's (SELF-9): UNCHECKED."""


@attrs.define(eq=False)
class LiveCall:
    """What the one-shot hook kept of one live call for its re-execution (SELF-1, SELF-2,
    SELF-9): the checked rows' structure and signature, and the state the call used."""

    module: nn.Module
    call: tuple[tuple[Any, ...], dict[str, Any]]  # detached views of the arguments (held, not copied)
    versions: tuple[int, ...]  # of the argument tensors, in tensor_leaves order, at the call
    batch: int | None
    rows: int
    shape: int  # the live checked rows' structure (dtype and shape)
    signature: int  # and their structured signature
    rng: RngState
    # CAP-7: the gathered parameters and buffers of a sharded module (None: the module's own).
    parameters: Mapping[str, torch.Tensor] | None
    # The buffers as the live call left them: a copy the hook made (``owned``), or a sharded
    # module's CAP-7 copies (shared with the peers' replay: never written, copied per replay).
    buffers: dict[str, torch.Tensor]
    owned: bool
    # An unsharded module's own parameters and buffers at the call: (slot, tensor, version);
    # the copies' versions when the hook made them.
    own_parameters: tuple[tuple[_Slot, torch.Tensor, int], ...]
    own_buffers: tuple[tuple[_Slot, torch.Tensor, int], ...]
    copy_versions: tuple[int, ...]
    training: bool
    grad_enabled: bool
    autocast: tuple[str, bool, torch.dtype]
    deterministic: tuple[bool, bool]  # use_deterministic_algorithms: enabled, warn_only
    threads: int


def record_live_call(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    output: Any,
    *,
    rng: RngState,
    rows: int = 0,
    parameters: Mapping[str, torch.Tensor] | None = None,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> LiveCall | LiveOutcome:
    """SELF-1, SELF-9, in the live call's one-shot forward hook: sign the checked rows of
    ``output`` and keep what :func:`check_live_call` needs -- no re-execution here. ``rng``: the
    state the live call consumed (CAP-3); ``parameters``/``buffers``: the gathered copies of a
    sharded module (CAP-7), None for a module whose own are the ones the call used. A call that
    cannot be checked gives its UNCHECKED outcome instead."""
    try:
        leaves = list(tensor_leaves((args, dict(kwargs)))) or list(tensor_leaves(output))
        device = leaves[0].device if leaves else next((p.device for p in module.parameters()), torch.device("cpu"))
        why = not_reproducible(device)
        if why is not None:
            return LiveOutcome(LiveCheck.UNCHECKED, reason=why)
        batch = _batch_size((args, dict(kwargs)))
        live = map_tensors(lambda t: t.detach(), first_rows(output, batch, rows))
        call = _isolated((tuple(args), dict(kwargs)))
        own_parameters: tuple[tuple[_Slot, torch.Tensor, int], ...] = ()
        own_buffers: tuple[tuple[_Slot, torch.Tensor, int], ...] = ()
        if parameters is None:
            parameter_slots, buffer_slots = _slots(module)
            own_parameters = tuple((slot, slot[1][slot[2]], slot[1][slot[2]]._version) for slot in parameter_slots)
            own_buffers = tuple((slot, slot[1][slot[2]], slot[1][slot[2]]._version) for slot in buffer_slots)
        # SELF-2: buffers as the call left them. An unsharded module's are copied now: DDP rewrites
        # them in place at every forward, and a second micro-batch's would otherwise be replayed.
        kept = dict(buffers) if buffers is not None else {
            slot[0]: tensor.detach().clone() for slot, tensor, _ in own_buffers}
        return LiveCall(
            module, call, tuple(t._version for t in tensor_leaves(call)), batch, rows, _shape(live),
            structured_signature(live), rng, parameters, kept, buffers is None, own_parameters, own_buffers,
            tuple(b._version for b in kept.values()), module.training, torch.is_grad_enabled(),
            (device.type, torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)),
            (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
            torch.get_num_threads())
    except Exception as exc:  # CAP-6: never into the training loop
        return LiveOutcome(LiveCheck.UNCHECKED, reason=f"self-check failed: {exc!r}")


def changed_since(live: LiveCall) -> str | None:
    """SELF-9: why the state a re-execution would use now is not the live call's, or None."""
    for (name, owner, key), parameter, version in live.own_parameters:
        if owner.get(key) is not parameter or parameter._version != version:
            return (f"parameter {name!r} changed after the live call (an optimizer other than the one "
                    "scout was given, or the loop, stepped or replaced it before the check)")
    if tuple(t._version for t in tensor_leaves(live.call)) != live.versions:
        return "an argument of the live call was modified in place after it"
    if live.module.training != live.training:
        return f"the module's training flag changed after the live call (to {live.module.training})"
    return None


def _buffers_for_replay(live: LiveCall) -> dict[str, torch.Tensor]:
    """SELF-2: the buffers one replay runs on, as the live call left them. The hook's copy is
    used as it is while no replay has written it (a running statistic updated by a replay in
    training mode); then it is copied again from the module's own, if those have not changed
    since the hook; a sharded module's CAP-7 copies are copied for every replay."""
    if not live.owned:
        return {name: b.clone() for name, b in live.buffers.items()}
    if tuple(b._version for b in live.buffers.values()) == live.copy_versions:
        return live.buffers
    for (_, owner, key), tensor, version in live.own_buffers:
        if owner.get(key) is not tensor or tensor._version != version:
            raise _StateChanged("a replay updated the module's buffers and its own were rewritten after the "
                                "live call (DDP's buffer broadcast at a later forward)")
    live.buffers = {slot[0]: tensor.detach().clone() for slot, tensor, _ in live.own_buffers}
    live.copy_versions = tuple(b._version for b in live.buffers.values())
    return live.buffers


def check_live_call(live: LiveCall, *,
                    suspended: Callable[[], AbstractContextManager[Any]] | None = None) -> LiveOutcome:
    """SELF-2, SELF-3, SELF-9, outside the live forward and backward: the code of the call
    ``live`` recorded. ``suspended``: a context in which the capture hooks do nothing."""
    try:
        why = changed_since(live)
        if why is not None:
            return LiveOutcome(LiveCheck.UNCHECKED, reason=why)
        return _check(live, suspended)
    except _StateChanged as exc:
        return LiveOutcome(LiveCheck.UNCHECKED, reason=str(exc))
    except Exception as exc:  # CAP-6: never into the training loop
        return LiveOutcome(LiveCheck.UNCHECKED, reason=f"self-check failed: {exc!r}")


def _check(live: LiveCall, suspended: Callable[[], AbstractContextManager[Any]] | None) -> LiveOutcome:
    """SELF-3's cut and exact replays of a call whose state is the live call's."""
    def replay(call: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[int, int]:
        replayed = first_rows(_replay(live, call, suspended), live.batch, live.rows)
        replayed = map_tensors(lambda t: t.detach(), replayed)
        return _shape(replayed), structured_signature(replayed)

    cut = bool(live.rows) and live.batch is not None and live.batch > live.rows
    if cut and replay(first_rows(live.call, live.batch, live.rows)) == (live.shape, live.signature):
        return LiveOutcome(LiveCheck.MATCH, "cut")
    shape, signature = replay(live.call)
    if shape != live.shape:
        return LiveOutcome(LiveCheck.UNCHECKED, "exact", "a forward hook changed the output's structure "
                           "(dtype or shape), so no replay of the module can equal it")
    if signature == live.signature:
        return LiveOutcome(LiveCheck.MATCH, "exact")
    if replay(live.call)[1] != signature:
        return LiveOutcome(LiveCheck.UNCHECKED, "exact", "two replays of the call differ from each other: "
                           "it is not reproducible here (a nondeterministic kernel)")
    return LiveOutcome(LiveCheck.DIFFER, "exact", "the live output differs from two identical replays of the call")


def _as_now(live: LiveCall) -> bool:
    """Whether this process already runs in the live call's settings (the usual case: no
    context to enter)."""
    device_type, autocast_on, autocast_dtype = live.autocast
    return (torch.is_grad_enabled() == live.grad_enabled and torch.get_num_threads() == live.threads
            and (torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled()) == live.deterministic
            and torch.is_autocast_enabled(device_type) == autocast_on
            and (not autocast_on or torch.get_autocast_dtype(device_type) == autocast_dtype))


@contextlib.contextmanager
def _as_live(live: LiveCall) -> Iterator[None]:
    """The live call's grad mode, autocast, deterministic-algorithm setting and thread count,
    for the block only; the previous ones come back (SELF-2)."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    threads = torch.get_num_threads()
    device_type, autocast_on, autocast_dtype = live.autocast
    try:
        if (enabled, warn_only) != live.deterministic:
            torch.use_deterministic_algorithms(live.deterministic[0], warn_only=live.deterministic[1])
        if threads != live.threads:
            torch.set_num_threads(live.threads)
        same_autocast = (torch.is_autocast_enabled(device_type) == autocast_on
                         and (not autocast_on or torch.get_autocast_dtype(device_type) == autocast_dtype))
        with (contextlib.nullcontext() if torch.is_grad_enabled() == live.grad_enabled
              else torch.set_grad_enabled(live.grad_enabled)), \
                (contextlib.nullcontext() if same_autocast
                 else torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on)):
            yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled()) != (enabled, warn_only):
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _replay(live: LiveCall, call: tuple[tuple[Any, ...], dict[str, Any]],
            suspended: Callable[[], AbstractContextManager[Any]] | None) -> Any:
    """One replay of the call (SELF-2): the module's forward without its own hooks, on the
    parameters the call used, on fresh copies of its buffers as the call left them, from the RNG
    state it consumed; this process's generator state is restored afterwards."""
    substitutes = {WithoutOwnHooks.PREFIX + name: b for name, b in _buffers_for_replay(live).items()}
    if live.parameters is not None:
        substitutes.update({WithoutOwnHooks.PREFIX + name: p for name, p in live.parameters.items()})
    args, kwargs = call
    with (suspended() if suspended is not None else contextlib.nullcontext()), installed_rng_state(live.rng), \
            (contextlib.nullcontext() if _as_now(live) else _as_live(live)):
        return functional_call(WithoutOwnHooks(live.module), substitutes, args, kwargs, strict=False)
