"""Optimizer-slice capture and replay (spec/replay.md OPT-1..OPT-5).

At a step where an optimizer recipe is due, a step *pre*-hook (``Optimizer.register_step_pre_hook``,
public) snapshots a bounded window of the optimizer's work: for each segment of the window
(``scout.core.recipes.optimizer_window``) the parameter slice before the update, its gradient
slice, the matching slices of every per-parameter state tensor (``exp_avg``...), the other state
(``step``) whole, and the parameter group's hyperparameters. Peers then

1. compare the snapshot they took locally (PARAMETERS: corrupt parameters, gradients or state
   of one replica are named here);
2. receive the source peer's snapshot and compare it (INPUT);
3. run a *fresh* optimizer of the same class on copies of the slices -- the live optimizer, its
   parameters and its state are never touched (OPT-3) -- and compare the updated slices and
   state (UPDATED);
4. compare the live parameters and state slices after the real step (LIVE_UPDATED).

The slice replay runs the optimizer's arithmetic on the slice as a standalone parameter. For
elementwise optimizers (SGD, Adam, AdamW, ...) that is exactly the live arithmetic; for
optimizers that couple elements (LAMB trust ratios, Shampoo, Muon) it is still a deterministic
function of identical inputs, so peers stay comparable, but it is not the live update.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import torch
from torch import nn

from scout.core.recipes import RecipeId, ReplayStatus, Segment, optimizer_window
from scout.replay.capture import CaptureFailure, is_sharded
from scout.replay.signature import structured_signature
from scout.replay.tree import describe
from scout.reports import guard
from scout.reports.guard import Part

__all__ = ["OptimizerCapture", "OptimizerSnapshot", "SegmentSnapshot"]


@attrs.define(eq=False)
class SegmentSnapshot:
    segment: Segment
    parameter: torch.Tensor  # 1-D slice, before the update
    gradient: torch.Tensor
    state_sliced: dict[str, torch.Tensor]  # per-element state, same slice
    state_whole: dict[str, torch.Tensor]  # other tensor state (e.g. Adam's step)
    state_plain: dict[str, Any]
    group: dict[str, Any]  # hyperparameters of the parameter's group, without "params"

    def tensors(self) -> list[torch.Tensor]:
        return [
            self.parameter,
            self.gradient,
            *(self.state_sliced[k] for k in sorted(self.state_sliced)),
            *(self.state_whole[k] for k in sorted(self.state_whole)),
        ]

    def describe(self) -> tuple[object, ...]:
        return (
            attrs.astuple(self.segment),
            describe(self.tensors()),
            tuple(sorted(self.state_sliced)),
            tuple(sorted(self.state_whole)),
            describe(dict(self.state_plain)),
            describe(dict(self.group)),
        )


@attrs.define(eq=False)
class OptimizerSnapshot:
    recipe: RecipeId
    step: int
    check_index: int
    optimizer_class: str
    segments: list[SegmentSnapshot]
    byte_count: int

    def tensors(self) -> list[torch.Tensor]:
        return [t for segment in self.segments for t in segment.tensors()]

    def describe(self) -> tuple[object, ...]:
        return (
            str(self.recipe),
            self.step,
            self.check_index,
            self.optimizer_class,
            tuple(s.describe() for s in self.segments),
        )

    def local_evidence(self) -> int:
        """PARAMETERS: the parameter, gradient and state slices this peer holds."""
        return structured_signature(
            [
                (s.parameter, s.gradient, s.state_sliced, s.state_whole, s.state_plain)
                for s in self.segments
            ]
        )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """OPT-4: a sharded (DTensor) parameter or state is sliced in its local shard -- the part
    this rank updates, identical on every replica of the same shard -- never redistributed."""
    return tensor.to_local() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def _flat_slice(tensor: torch.Tensor, segment: Segment) -> torch.Tensor:
    return _local(tensor).detach().reshape(-1)[segment.start : segment.stop].clone()


class OptimizerCapture:
    """Snapshots the armed optimizer window in a step pre-hook (OPT-1)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, slice_numel: int, max_capture_bytes: int
    ) -> None:
        if slice_numel < 1:
            raise ValueError(f"optimizer_slice_numel must be >= 1, got {slice_numel}")
        self.optimizer = optimizer
        self.slice_numel = slice_numel
        self.max_capture_bytes = max_capture_bytes
        self._armed: tuple[RecipeId, int, int] | None = None  # recipe, step, check index
        self._record: OptimizerSnapshot | CaptureFailure | None = None
        self._handle = optimizer.register_step_pre_hook(self._hook)

    def _parameters(self) -> list[tuple[nn.Parameter, dict[str, Any]]]:
        return [(p, group) for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def held_bytes(self) -> int:
        return self._record.byte_count if isinstance(self._record, OptimizerSnapshot) else 0

    def arm(self, recipe: RecipeId | None, step: int, check_index: int) -> None:
        self._record = None
        self._armed = None if recipe is None else (recipe, step, check_index)

    def get(self, recipe: RecipeId, step: int) -> OptimizerSnapshot | CaptureFailure:
        record = self._record
        if record is not None and record.step == step and record.recipe == recipe:
            return record
        return CaptureFailure(
            recipe, step, ReplayStatus.NOT_READY, f"optimizer.step() was not called in step {step}"
        )

    def release(self) -> None:
        self._record = None

    def close(self) -> None:
        self._handle.remove()
        self._record = None

    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._armed is None or self._record is not None or not guard.running(Part.REPLAY):
            return
        recipe, step, check_index = self._armed
        try:
            if guard.INJECTING:
                guard.inject("replay.optimizer_hook")
            self._record = self._snapshot(recipe, step, check_index)
        except Exception as exc:  # CAP-6: never into the training loop; GUARD-3: a failure of the part
            self._record = CaptureFailure(
                recipe, step, ReplayStatus.NOT_READY, f"optimizer capture failed: {exc!r}"
            )
            guard.failed(Part.REPLAY, exc, "optimizer hook")

    def window(self, check_index: int) -> tuple[Segment, ...]:
        numels = [_local(p).numel() for p, _ in self._parameters()]
        return optimizer_window(check_index, numels, self.slice_numel)

    def _snapshot(
        self, recipe: RecipeId, step: int, check_index: int
    ) -> OptimizerSnapshot | CaptureFailure:
        parameters = self._parameters()
        segments = []
        for segment in self.window(check_index):
            parameter, group = parameters[segment.parameter_index]
            if parameter.grad is None:
                return CaptureFailure(
                    recipe,
                    step,
                    ReplayStatus.NOT_READY,
                    f"parameter {segment.parameter_index} of the optimizer has no gradient",
                )
            sliced, whole, plain = {}, {}, {}
            for key, value in self.optimizer.state.get(parameter, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == parameter.shape:
                    sliced[str(key)] = _flat_slice(value, segment)
                elif isinstance(value, torch.Tensor):
                    whole[str(key)] = _local(value).detach().clone()
                else:
                    plain[str(key)] = copy.deepcopy(value)
            segments.append(
                SegmentSnapshot(
                    segment=segment,
                    parameter=_flat_slice(parameter, segment),
                    gradient=_flat_slice(parameter.grad, segment),
                    state_sliced=sliced,
                    state_whole=whole,
                    state_plain=plain,
                    group={k: copy.deepcopy(v) for k, v in group.items() if k != "params"},
                )
            )
        byte_count = sum(t.numel() * t.element_size() for s in segments for t in s.tensors())
        if byte_count > self.max_capture_bytes:
            return CaptureFailure(
                recipe,
                step,
                ReplayStatus.CAPTURE_TOO_LARGE,
                f"optimizer slice needs {byte_count} bytes, max_capture_bytes="
                f"{self.max_capture_bytes}",
            )
        cls = type(self.optimizer)
        return OptimizerSnapshot(
            recipe, step, check_index, f"{cls.__module__}.{cls.__qualname__}", segments, byte_count
        )

    def live_evidence(self, snapshot: OptimizerSnapshot) -> int:
        """LIVE_UPDATED: the live parameter and state slices after the real step."""
        parameters = self._parameters()
        live = []
        for segment_snapshot in snapshot.segments:
            segment = segment_snapshot.segment
            parameter, _ = parameters[segment.parameter_index]
            state = self.optimizer.state.get(parameter, {})
            live.append(
                (
                    _flat_slice(parameter, segment),
                    {
                        str(k): _flat_slice(v, segment)
                        for k, v in state.items()
                        if isinstance(v, torch.Tensor) and v.shape == parameter.shape
                    },
                )
            )
        return structured_signature(live)

    def replay(self, snapshot: OptimizerSnapshot) -> int:
        """UPDATED: run a fresh optimizer of the live class on copies of the slices (OPT-3)."""
        copies = []
        groups = []
        for segment_snapshot in snapshot.segments:
            parameter = nn.Parameter(segment_snapshot.parameter.clone())
            parameter.grad = segment_snapshot.gradient.clone()
            copies.append((parameter, segment_snapshot))
            groups.append({**copy.deepcopy(segment_snapshot.group), "params": [parameter]})
        isolated = _fresh_optimizer(self.optimizer, groups)
        for parameter, segment_snapshot in copies:
            state: dict[str, Any] = {}
            state.update({k: v.clone() for k, v in segment_snapshot.state_sliced.items()})
            state.update({k: v.clone() for k, v in segment_snapshot.state_whole.items()})
            state.update(copy.deepcopy(segment_snapshot.state_plain))
            if state:
                isolated.state[parameter] = state
        isolated.step()
        return structured_signature(
            [(p.detach(), dict(isolated.state.get(p, {}))) for p, _ in copies]
        )


def _fresh_optimizer(
    live: torch.optim.Optimizer, groups: list[dict[str, Any]]
) -> torch.optim.Optimizer:
    factory: Any = type(live)
    try:
        return factory(groups)  # type: ignore[no-any-return]
    except TypeError:  # a constructor with required hyperparameters
        return factory(groups, **live.defaults)  # type: ignore[no-any-return]
