"""Capture of replay inputs through public module hooks (spec/replay.md CAP-1..CAP-6).

A forward *pre*-hook sits on every module of the recipe catalog. It does nothing (one set
lookup) unless its recipe is armed for the current step; then it records the call -- a
detached copy of every tensor argument, the plain arguments, which tensors required grad, the
autocast state, the module's training flag -- and the RNG state at that instant, which is the
state the live call is about to consume (CAP-3). Copies are by value (CAP-4): the training
loop may modify or free its activations afterwards.

For a module whose parameters are sharded (FSDP2: DTensor parameters outside its forward), the
hook also copies the module's parameters and buffers: FSDP2's own pre-forward hook, which runs
first, has just gathered them, so these are exactly the unsharded values the live call uses
(CAP-7). Replay uses them instead of gathering shards again -- no collective on the training
job's process groups, and none that one replica group could enter while another skips it.

With ``self_check`` on, the pre-hook of a captured call also registers a one-shot forward hook
for that call: it runs after every forward hook the module had when the call began, signs the
live output's checked rows and keeps what a re-execution needs (``scout.replay.self_check``,
SELF-1, SELF-2). The re-execution runs later, never inside the live forward or backward
(SELF-9): :meth:`ModuleCapture.check_pending` -- called from the optimizer's pre-step hook by the
replay executor, and by :meth:`ModuleCapture.live` at the latest -- checks every pending call of
the step once; the outcome is kept with the capture (:meth:`ModuleCapture.live`).

Memory is bounded (CAP-2): before copying, the bytes a capture would hold are added to what is
already held; over ``max_capture_bytes`` the capture is refused and recorded as
``CAPTURE_TOO_LARGE`` (the check is then *not ready*, never "corrupt"). ``held_bytes`` reports
what is held (CAP-5). A hook never raises into the training loop (CAP-6): any failure is
recorded as the recipe's capture status.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from scout.core.guards import whole_number
from scout.core.recipes import RecipeId, ReplayStatus
from scout.core.self_check import LiveCheck
from scout.replay.rng import RngState, capture_rng_state
from scout.replay.self_check import LiveCall, LiveOutcome, check_live_call, record_live_call
from scout.replay.tree import describe, map_tensors, tensor_leaves
from scout.reports import guard
from scout.reports.guard import Part
from scout.reports.hook_time import HOOK_TIME, now_ns

__all__ = ["Capture", "CaptureFailure", "ModuleCapture", "is_sharded"]

logger = logging.getLogger("scout.replay")


@attrs.frozen(eq=False)
class AutocastState:
    device_type: str
    enabled: bool
    dtype: torch.dtype

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


@attrs.define(eq=False)
class Capture:
    """One recorded module call (by value)."""

    recipe: RecipeId
    step: int
    module_class: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    requires_grad: tuple[bool, ...]  # per tensor leaf of (args, kwargs), in tensor_leaves order
    rng: RngState
    autocast: AutocastState
    training: bool
    byte_count: int
    # CAP-7: the module's own parameters and buffers at the call (sharded modules only).
    parameters: dict[str, torch.Tensor] | None = None
    buffers: dict[str, torch.Tensor] | None = None

    def tensors(self) -> list[torch.Tensor]:
        """Tensor leaves of the call, in the order every peer enumerates them."""
        return list(tensor_leaves((self.args, self.kwargs)))

    def describe(self) -> tuple[object, ...]:
        """READY-1: what peers must agree on before replaying this capture (no content)."""
        return (
            str(self.recipe),
            self.step,
            self.module_class,
            self.training,
            (self.autocast.device_type, self.autocast.enabled, str(self.autocast.dtype)),
            describe((self.args, self.kwargs)),
            self.requires_grad,
            tuple((str(t.dtype), tuple(t.shape)) for t in self.rng.tensors()),
            None if self.parameters is None else describe((self.parameters, self.buffers)),
        )


@attrs.frozen
class CaptureFailure:
    """A scheduled capture that did not happen, and why (the recipe is then not ready)."""

    recipe: RecipeId
    step: int
    status: ReplayStatus
    reason: str


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor (FSDP2, tensor parallel): its local shard is not the whole value."""
    return isinstance(tensor, _dtensor_type())


@functools.cache
def _dtensor_type() -> type:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed: nothing is sharded
        return type(None)
    return DTensor


def _device_of(module: nn.Module, tensors: list[torch.Tensor]) -> torch.device:
    if tensors:
        return tensors[0].device
    for parameter in module.parameters():
        return parameter.device
    return torch.device("cpu")


def _first_rows(call: tuple[Any, Any], rows: int) -> tuple[Any, Any]:
    """CAP-8: the first ``rows`` rows of the call's batch. The batch size is the leading
    dimension of the call's first tensor; every tensor argument with that leading size is cut
    alike (inputs, masks, positions), the others are kept whole. Every peer cuts the same
    way, so replays stay comparable; a module the cut does not suit fails its replay
    (Inconclusive, never SDC)."""
    tensors = [t for t in tensor_leaves(call) if t.dim() >= 1]
    if not tensors or tensors[0].shape[0] <= rows:
        return call
    batch = tensors[0].shape[0]
    return map_tensors(lambda t: t[:rows] if t.dim() >= 1 and t.shape[0] == batch else t, call)  # type: ignore[no-any-return]


class ModuleCapture:
    """Forward pre-hooks on the catalog modules; records the armed recipes' calls."""

    def __init__(
        self,
        modules: Mapping[RecipeId, nn.Module],
        max_capture_bytes: int,
        with_parameters: Iterable[RecipeId] = (),
        rows: int = 0,
        self_check: bool = False,
        not_self_checked: Mapping[RecipeId, str] | None = None,
    ) -> None:
        if max_capture_bytes < 0:
            raise ValueError(f"max_capture_bytes must be >= 0, got {max_capture_bytes}")
        if not whole_number(rows) or rows < 0:
            raise ValueError(f"rows must be an int >= 0 (0: the whole batch), got {rows!r}")
        self.max_capture_bytes = max_capture_bytes
        self.rows = rows
        self._modules = dict(modules)
        self._with_parameters = frozenset(with_parameters)  # CAP-7
        self._armed: frozenset[RecipeId] = frozenset()
        self._armed_step = 0
        self._records: dict[RecipeId, Capture | CaptureFailure] = {}
        self.self_check = self_check  # SELF-1
        #: Recipes whose calls are never self-checked, with the reason (TP-5).
        self._not_self_checked = dict(not_self_checked or {})
        self._live: dict[RecipeId, LiveOutcome] = {}
        self._watching: dict[RecipeId, Any] = {}  # one-shot hooks of calls whose forward has not returned
        self._unchecked: dict[RecipeId, LiveCall] = {}  # SELF-9: recorded, not re-executed yet
        self._suspended = 0
        # CAP-1: a pre-hook on the module of each armed recipe only (registered by ``arm``).
        self._handles: dict[RecipeId, RemovableHandle] = {}
        self._closed = False

    @property
    def held_bytes(self) -> int:
        """CAP-5: bytes held by the current captures."""
        return sum(r.byte_count for r in self._records.values() if isinstance(r, Capture))

    def module(self, recipe: RecipeId) -> nn.Module:
        return self._modules[recipe]

    def arm(self, step: int, recipes: Iterable[RecipeId]) -> None:
        """Capture ``recipes`` at their first call during ``step``; drop older captures."""
        armed = frozenset(recipes)
        unknown = armed - self._modules.keys()
        if unknown:
            raise ValueError(f"no module registered for recipes {sorted(map(str, unknown))}")
        self._drop_records()
        self._armed, self._armed_step = armed, step
        self._hook_armed()

    def _hook_armed(self) -> None:
        """CAP-1: a pre-hook on each armed recipe's module, none on the others."""
        for recipe in [r for r in self._handles if r not in self._armed]:
            self._handles.pop(recipe).remove()
        if self._closed:
            return
        for recipe in sorted(self._armed - self._handles.keys(), key=str):
            self._handles[recipe] = self._modules[recipe].register_forward_pre_hook(
                self._hook_for(recipe), with_kwargs=True)

    def get(self, recipe: RecipeId, step: int) -> Capture | CaptureFailure:
        """The capture of ``recipe`` at ``step``, or why there is none (CAP-1)."""
        record = self._records.get(recipe)
        if record is not None and record.step == step:
            return record
        if recipe not in self._modules:
            reason = f"no module for {recipe}"
        elif recipe in self._armed and self._armed_step == step:
            reason = f"{recipe} was armed for step {step} but its module was not called"
        else:
            reason = f"{recipe} was not armed for step {step}"
        return CaptureFailure(recipe, step, ReplayStatus.NOT_READY, reason)

    def check_pending(self) -> None:
        """SELF-9: re-execute every call of the step recorded and not checked yet, once each.
        Call it outside the live forward and backward (the optimizer's pre-step hook); never
        raises (CAP-6)."""
        while self._unchecked:
            recipe, recorded = self._unchecked.popitem()
            self._live[recipe] = check_live_call(recorded, suspended=self.suspended)

    def live(self, recipe: RecipeId, step: int) -> LiveOutcome:
        """SELF-1: the self-check of ``recipe``'s captured call at ``step`` (UNCHECKED with the
        reason when there is none). Pending re-executions run first (SELF-9, point 2)."""
        record = self._records.get(recipe)
        if isinstance(record, Capture) and record.step == step:
            self.check_pending()
        if not self.self_check:
            return LiveOutcome(LiveCheck.UNCHECKED, reason="self_check is off")
        if recipe in self._not_self_checked:
            return LiveOutcome(LiveCheck.UNCHECKED, reason=self._not_self_checked[recipe])
        if not isinstance(record, Capture) or record.step != step:
            return LiveOutcome(LiveCheck.UNCHECKED, reason=f"{recipe} has no capture at step {step}")
        return self._live.get(recipe, LiveOutcome(LiveCheck.UNCHECKED, reason=(
            f"the captured call of {recipe} did not return through its forward hooks")))

    def release(self) -> None:
        self._drop_records()

    def _drop_records(self) -> None:
        self._records.clear()
        self._live.clear()
        self._unchecked.clear()  # SELF-9: a capture released without a check is dropped unchecked
        for handle in self._watching.values():
            handle.remove()
        self._watching.clear()

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No capture while replaying (replay calls the same modules)."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def close(self) -> None:
        self._closed = True
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        self._drop_records()

    def _hook_for(self, recipe: RecipeId) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            started = now_ns()
            try:
                captured(module, args, kwargs)
            finally:  # spec/budget.md BUDGET-10
                HOOK_TIME.spent_ns += now_ns() - started

        def captured(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if recipe not in self._armed or self._suspended:
                return
            if recipe in self._records:
                watching = self._watching.pop(recipe, None)
                if watching is not None:  # the captured call raised: this later call is not it
                    watching.remove()
                    self._live[recipe] = LiveOutcome(LiveCheck.UNCHECKED, reason=(
                        f"the captured call of {recipe} raised before it returned"))
                return
            if not guard.running(Part.REPLAY):  # GUARD-3: no capture after a failure of replay here
                return
            try:
                if guard.INJECTING:
                    guard.inject("replay.capture")
                record = self._records[recipe] = self._record(recipe, module, args, kwargs)
                if self.self_check and isinstance(record, Capture) and recipe not in self._not_self_checked:
                    self._watch(recipe, module, record)
            except Exception as exc:  # CAP-6: never into the training loop; GUARD-3: a failure of the part
                logger.warning("scout: capture of %s failed: %r", recipe, exc)
                self._records[recipe] = CaptureFailure(
                    recipe, self._armed_step, ReplayStatus.NOT_READY, f"capture failed: {exc!r}"
                )
                guard.failed(Part.REPLAY, exc, "forward hook")

        return hook

    def _watch(self, recipe: RecipeId, module: nn.Module, capture: Capture) -> None:
        """SELF-1: a one-shot forward hook for this call, registered now so that it runs after
        every forward hook the module has (FSDP2's post-forward, a user's): it sees the output
        the step goes on with."""

        def after(hooked: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            started = now_ns()
            try:
                record_output(hooked, args, kwargs, output)
            finally:  # spec/budget.md BUDGET-10
                HOOK_TIME.spent_ns += now_ns() - started

        def record_output(hooked: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            handle.remove()
            self._watching.pop(recipe, None)
            if self._records.get(recipe) is capture:
                # SELF-9: only record here; the re-execution runs outside the live call.
                recorded = record_live_call(hooked, args, kwargs, output, rng=capture.rng, rows=self.rows,
                                            parameters=capture.parameters, buffers=capture.buffers)
                if isinstance(recorded, LiveCall):
                    self._unchecked[recipe] = recorded
                else:
                    self._live[recipe] = recorded

        handle = module.register_forward_hook(after, with_kwargs=True)
        self._watching[recipe] = handle

    def _record(
        self, recipe: RecipeId, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Capture | CaptureFailure:
        step = self._armed_step
        if self.rows:
            args, kwargs = _first_rows((args, dict(kwargs)), self.rows)
        live = list(tensor_leaves((args, kwargs)))
        devices = sorted({str(t.device) for t in live})
        if len(devices) > 1:
            return CaptureFailure(
                recipe,
                step,
                ReplayStatus.NOT_READY,
                f"the call of {recipe} mixes tensors on devices {devices}; replay needs one",
            )
        device = _device_of(module, live)
        rng = capture_rng_state(device).clone()
        own: list[torch.Tensor] = []
        if recipe in self._with_parameters:
            own = [*module.parameters(), *module.buffers()]
            still_sharded = [type(t).__name__ for t in own if is_sharded(t)]
            if still_sharded:
                return CaptureFailure(
                    recipe,
                    step,
                    ReplayStatus.NOT_READY,
                    f"the parameters of {recipe} are still sharded ({still_sharded[0]}) inside "
                    "its forward; replay needs them gathered (FSDP2 gathers them before the call; FSDP2 "
                    "with tensor parallel is not replayed yet, docs/layouts.md)",
                )
        byte_count = sum(t.numel() * t.element_size() for t in [*live, *rng.tensors(), *own])
        if self.held_bytes + byte_count > self.max_capture_bytes:
            return CaptureFailure(
                recipe,
                step,
                ReplayStatus.CAPTURE_TOO_LARGE,
                f"capturing {recipe} needs {byte_count} bytes; {self.held_bytes} held, "
                f"max_capture_bytes={self.max_capture_bytes}",
            )
        autocast = AutocastState(
            device.type,
            torch.is_autocast_enabled(device.type),
            torch.get_autocast_dtype(device.type),
        )
        copy_args, copy_kwargs = map_tensors(
            lambda t: t.detach().clone(memory_format=torch.contiguous_format), (args, dict(kwargs))
        )
        parameters = buffers = None
        if recipe in self._with_parameters:
            parameters = {
                name: p.detach().clone().requires_grad_(p.requires_grad)
                for name, p in module.named_parameters()
            }
            buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
        return Capture(
            recipe=recipe,
            step=step,
            module_class=f"{type(module).__module__}.{type(module).__qualname__}",
            args=tuple(copy_args),
            kwargs=copy_kwargs,
            requires_grad=tuple(t.requires_grad for t in live),
            rng=rng,
            autocast=autocast,
            training=module.training,
            byte_count=byte_count,
            parameters=parameters,
            buffers=buffers,
        )
