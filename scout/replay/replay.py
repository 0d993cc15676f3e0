"""In-situ replay of the dense recipes: hidden layers, the embedding and the head, optimizer
slices (spec/replay.md READY-*, REPLAY-*, EVID-*, OPT-*).

The protocol is the replay round (``scout.core.replay_round``) driven by
``scout.replay.runner.ReplayRunner``: it decides from the step alone which recipes are due,
exchanges readiness in one fixed-size all-gather, has the source broadcast its captured inputs,
replays on isolated copies under deterministic algorithms (timed, STRAG-1), exchanges the
evidence in a second fixed-size all-gather and decides each recipe with the one verdict rule.
This module holds what is particular to the dense recipes: where the modules are
(:class:`RecipeModules`), what is captured (module calls and optimizer slices) and how each is
described, signed and replayed (:class:`DenseExecutor`). :class:`Replayer` is the runner bound
to that executor.

Every wait is bounded by the peer group's deadline. A deadline makes the replay group unusable
(contract guarantee 3), so the replayer disables itself and every later due recipe is
reported Inconclusive with the reason -- peers that are late converge on the same state when
their own deadlines pass, and the training job's own process group is never involved.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.hooks import RemovableHandle

from scout.core.recipes import (
    Catalog,
    DueRecipe,
    EvidenceKind,
    Intervals,
    RecipeClass,
    RecipeId,
    ReplayStatus,
    Schedule,
)
from scout.core.replay_round import EVIDENCE_ROW_LENGTH, READINESS_ROW_LENGTH, own_communication_ms
from scout.core.self_check import LiveCheck
from scout.core.straggler import DEFAULT_SEQUENTIAL_CONFIG, SequentialConfig
from scout.core.straggler.tracking import StragglerTracker
from scout.core.verdict import DEFAULT_TIMING_CONFIG, TimingConfig
from scout.replay.capture import Capture, CaptureFailure, ModuleCapture, is_sharded
from scout.replay.collectives import PeerGroup
from scout.replay.determinism import (
    NondeterministicReplay,
    deterministic_algorithms,
    fixed_cotangent,
)
from scout.replay.optimizer import OptimizerCapture, OptimizerSnapshot
from scout.replay.rng import installed_rng_state
from scout.replay.runner import TIMING_CLOCKS, ReplayRun, ReplayRunner, RunnerSettings, StepReport
from scout.replay.self_check import WithoutOwnHooks
from scout.replay.signature import structured_signature
from scout.replay.tensor_parallel import TP_NOT_SELF_CHECKED, LocalCollectives
from scout.replay.tree import map_tensors, tensor_leaves

__all__ = [
    "EVIDENCE_ROW_LENGTH",
    "READINESS_ROW_LENGTH",
    "DenseExecutor",
    "NondeterministicReplay",
    "RecipeModules",
    "ReplayConfig",
    "Replayer",
    "StepReport",
    "deterministic_algorithms",
    "own_communication_ms",
]

logger = logging.getLogger("scout.replay")

#: COMM-2: a peer's own time inside collectives is small; scheduler noise on a shared host is
#: of the order of a millisecond, so communication rounds use a higher absolute floor.
DEFAULT_COMMUNICATION_TIMING: Final = TimingConfig(absolute_floor_ms=5.0)


@attrs.frozen
class ReplayConfig:
    intervals: Intervals = Intervals()
    source_position: int = 0  # REPLAY-1: the peer whose captured inputs everyone replays
    max_capture_bytes: int = 256 * 2**20  # CAP-2
    optimizer_slice_numel: int = 65536  # OPT-1, REC-6
    optimizer_slices_per_cycle: int = 1
    deterministic: bool = True  # REPLAY-4
    cotangent_seed: int = 2608  # REPLAY-5: the fixed output gradient used for backward replay
    history_limit: int = 4096  # results kept for coverage queries
    timing: TimingConfig = DEFAULT_TIMING_CONFIG
    communication_timing: TimingConfig = DEFAULT_COMMUNICATION_TIMING  # COMM-2
    # STRAG-1: untimed warm-up runs, then timed repetitions of each replay; the check's compute
    # time is the median of the repetitions (the first run gives the evidence either way), on
    # the clock ``timing_clock`` picks: "auto" (on a CPU the wall clock less the time the host
    # kept the thread waiting for a CPU, "own"; CUDA events on an accelerator), "own", "cpu"
    # (the thread's CPU time, blind to a rank that waits) or "wall".
    timing_warmup_runs: int = 1
    timing_repetitions: int = 3
    timing_clock: str = "auto"
    # TIMING-6: how long a replay waits for the device to reach the end of a timed run.
    timing_resolve_timeout_s: float = 60.0
    straggler: SequentialConfig = DEFAULT_SEQUENTIAL_CONFIG  # STRAG-4: the sequential test
    # STRAG-2: added to every compute time and centre of a log ratio: differences well below
    # it (the clocks' jitter) carry almost no evidence. Communication evidence uses
    # communication_timing's absolute floor.
    device_floor_ms: float = 0.1
    straggler_trail_checks: int = 16  # STRAG-21: checks of evidence a report carries
    replay_rows: int = 0  # CAP-8: replay the first rows of the captured batch (0: all of it)
    # SELF-1: each captured module call is also replayed on its own rank -- outside the live
    # forward and backward, at the optimizer's pre-step hook (SELF-9) -- and compared with its
    # live output (a transient fault in the live path); False: no rank takes part.
    self_check: bool = True

    def __attrs_post_init__(self) -> None:
        if self.source_position < 0:
            raise ValueError(f"source_position must be >= 0, got {self.source_position}")
        if self.max_capture_bytes < 0:
            raise ValueError(f"max_capture_bytes must be >= 0, got {self.max_capture_bytes}")
        if self.optimizer_slice_numel < 1:
            raise ValueError(
                f"optimizer_slice_numel must be >= 1, got {self.optimizer_slice_numel}"
            )
        if self.optimizer_slices_per_cycle < 0:
            raise ValueError(
                f"optimizer_slices_per_cycle must be >= 0, got {self.optimizer_slices_per_cycle}"
            )
        if self.history_limit < 1:
            raise ValueError(f"history_limit must be >= 1, got {self.history_limit}")
        if self.timing_warmup_runs < 0:
            raise ValueError(f"timing_warmup_runs must be >= 0, got {self.timing_warmup_runs}")
        if self.timing_repetitions < 1:
            raise ValueError(
                f"timing_repetitions must be >= 1 (the replay that gives the evidence), got "
                f"{self.timing_repetitions}"
            )
        if not (math.isfinite(self.timing_resolve_timeout_s) and self.timing_resolve_timeout_s > 0):
            raise ValueError(
                f"timing_resolve_timeout_s must be a finite number > 0, got "
                f"{self.timing_resolve_timeout_s!r}"
            )
        if self.timing_clock not in TIMING_CLOCKS:
            raise ValueError(
                f"timing_clock must be one of {', '.join(TIMING_CLOCKS)}, got {self.timing_clock!r}"
            )
        if not isinstance(self.straggler, SequentialConfig):
            raise TypeError(
                f"straggler must be a SequentialConfig, got {type(self.straggler).__name__}"
            )
        if not (math.isfinite(self.device_floor_ms) and self.device_floor_ms >= 0):
            raise ValueError(f"device_floor_ms must be a finite number >= 0, got {self.device_floor_ms}")
        if self.straggler_trail_checks < 1:
            raise ValueError(
                f"straggler_trail_checks must be >= 1, got {self.straggler_trail_checks}"
            )
        if not isinstance(self.self_check, bool):
            raise TypeError(f"self_check must be True or False, got {self.self_check!r}")


    def runner_settings(self) -> RunnerSettings:
        return RunnerSettings(self.source_position, self.timing, self.communication_timing, self.timing_warmup_runs,
                              self.timing_repetitions, self.timing_clock, self.timing_resolve_timeout_s,
                              self.straggler, self.device_floor_ms,
                              self.straggler_trail_checks, self.history_limit)


_HIDDEN_PATHS = ("layers", "model.layers", "transformer.h", "transformer.layers", "blocks", "h")
_OUTPUT_NAMES = ("lm_head", "output", "head", "output_layer")


def _unwrap(model: nn.Module) -> nn.Module:
    for _ in range(8):  # DDP and similar wrappers nest the real model under .module
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _attribute_path(model: nn.Module, path: str) -> Any:
    value: Any = model
    for name in path.split("."):
        value = getattr(value, name, None)
        if value is None:
            return None
    return value


@attrs.frozen
class RecipeModules:
    """The modules of the catalog. ``None`` embedding/output = not applicable on this rank."""

    embedding: nn.Module | None = None
    hidden: tuple[nn.Module, ...] = ()
    output: nn.Module | None = None

    @classmethod
    def discover(cls, model: nn.Module) -> RecipeModules:
        """Find the repeated layers, the token embedding and the output head by convention.

        Raises ValueError naming the model class when no repeated layers are found.
        """
        root = _unwrap(model)
        hidden: tuple[nn.Module, ...] = ()
        for path in _HIDDEN_PATHS:
            candidate = _attribute_path(root, path)
            if isinstance(candidate, (nn.ModuleList, nn.Sequential)) and len(candidate) > 0:
                hidden = tuple(candidate)
                break
        if not hidden:
            for module in root.modules():
                children = list(module.children())
                if (
                    isinstance(module, (nn.ModuleList, nn.Sequential))
                    and len(children) > 1
                    and len({type(c) for c in children}) == 1
                ):
                    hidden = tuple(children)
                    break
        if not hidden:
            raise ValueError(
                f"no repeated layers found in {type(root).__qualname__}: looked for "
                f"{', '.join(_HIDDEN_PATHS)} and for a ModuleList of one layer type; pass "
                "RecipeModules(hidden=(...), embedding=..., output=...) explicitly"
            )
        embedding = next((m for m in root.modules() if isinstance(m, nn.Embedding)), None)
        output = None
        for name in _OUTPUT_NAMES:
            candidate = getattr(root, name, None)
            if isinstance(candidate, nn.Module):
                output = candidate
                break
        return cls(embedding=embedding, hidden=hidden, output=output)

    def by_recipe(self) -> dict[RecipeId, nn.Module]:
        modules: dict[RecipeId, nn.Module] = {}
        if self.embedding is not None:
            modules[RecipeId(RecipeClass.EMBEDDING)] = self.embedding
        for index, layer in enumerate(self.hidden):
            modules[RecipeId(RecipeClass.HIDDEN, index)] = layer
        if self.output is not None:
            modules[RecipeId(RecipeClass.OUTPUT)] = self.output
        return modules


class DenseExecutor:
    """The dense recipes' executor: module calls captured by forward pre-hooks (CAP-*), optimizer
    slices by a step pre-hook (OPT-1), replayed on isolated copies (REPLAY-5, OPT-3)."""

    schedule_tag = "scout-replay-schedule"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, modules: RecipeModules,
                 config: ReplayConfig) -> None:
        self.config = config
        self.modules = modules
        self.catalog = Catalog(
            hidden_layer_count=len(modules.hidden),
            has_embedding=modules.embedding is not None,
            has_output=modules.output is not None,
            optimizer_slice_count=config.optimizer_slices_per_cycle if optimizer else 0,
        )
        by_recipe = modules.by_recipe()
        sharded = frozenset(
            recipe for recipe, module in by_recipe.items() if any(is_sharded(p) for p in module.parameters())
        )
        # REPLAY-8: modules with sharded (FSDP2) parameters replay on the gathered parameters
        # their own forward used, captured with the inputs (CAP-7). Without FSDP2 a module's
        # DTensor parameters are tensor-parallel shards: replayed as they are, on their local
        # shards, every collective replaced by a local stand-in (TP-1), and not self-checked
        # (TP-5: the live call's collectives cannot be reproduced on one rank).
        fsdp = _uses_fsdp(model)
        self.sharded_recipes = sharded if fsdp else frozenset()
        self.tensor_parallel_recipes = frozenset() if fsdp else sharded
        # CAP-7: FSDP2 over a tensor-parallel block gathers only FSDP2's dimension; the call still
        # sees tensor-parallel shards, so such a recipe is never ready (attach says so).
        self.never_ready_recipes = frozenset(
            recipe for recipe in self.sharded_recipes
            if any(_sharded_dimensions(p) > 1 for p in by_recipe[recipe].parameters())
        )
        self.capture = ModuleCapture(by_recipe, config.max_capture_bytes, with_parameters=self.sharded_recipes,
                                     rows=config.replay_rows, self_check=config.self_check,
                                     not_self_checked={recipe: TP_NOT_SELF_CHECKED
                                                       for recipe in self.tensor_parallel_recipes})
        self.optimizer = (OptimizerCapture(optimizer, config.optimizer_slice_numel, config.max_capture_bytes)
                          if optimizer is not None else None)
        # SELF-9: the live calls' re-executions run before the optimizer steps -- after the
        # backward, outside every live forward -- on the parameters the calls used.
        self._self_check_hook = (optimizer.register_step_pre_hook(self._check_live_calls)
                                 if optimizer is not None and config.self_check else None)
        self._records: dict[RecipeId, Capture | OptimizerSnapshot | CaptureFailure] = {}
        self._unchecked_reasons: set[str] = set()

    def _check_live_calls(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.capture.check_pending()  # never raises (CAP-6)

    def self_check_before(self, optimizer: torch.optim.Optimizer) -> None:
        """SELF-9: re-execute the live calls at ``optimizer``'s pre-step hook -- an optimizer that
        steps the model but is not replayed (DeepSpeed's inner optimizer under ZeRO, which then
        writes the model's parameters through ``.data``: no version counter tells, so a check
        after it would find every rank's live path "not reproducible")."""
        if self._self_check_hook is None and self.config.self_check:
            self._self_check_hook = optimizer.register_step_pre_hook(self._check_live_calls)

    def held_bytes(self) -> int:
        """CAP-5: bytes currently held by captures."""
        return self.capture.held_bytes + (self.optimizer.held_bytes if self.optimizer else 0)

    def arm(self, step: int, due: Sequence[DueRecipe]) -> None:
        self.capture.arm(step, [d.recipe for d in due if d.recipe.recipe_class is not RecipeClass.OPTIMIZER])
        if self.optimizer is not None:
            optimizer_due = [d for d in due if d.recipe.recipe_class is RecipeClass.OPTIMIZER]
            if optimizer_due:
                self.optimizer.arm(optimizer_due[0].recipe, step, optimizer_due[0].check_index)
            else:
                self.optimizer.arm(None, step, 0)

    def prepare(self, due: DueRecipe) -> tuple[ReplayStatus, tuple[object, ...]]:
        recipe = due.recipe
        record: Capture | OptimizerSnapshot | CaptureFailure
        if recipe.recipe_class is RecipeClass.OPTIMIZER:
            assert self.optimizer is not None
            record = self.optimizer.get(recipe, due.step)
        else:
            record = self.capture.get(recipe, due.step)
        self._records[recipe] = record
        if isinstance(record, CaptureFailure):
            return record.status, ("not-ready", str(recipe), due.step, record.reason)
        description = record.describe()
        if isinstance(record, Capture):
            module = self.capture.module(recipe)
            description += (
                tuple((n, str(p.dtype), tuple(p.shape)) for n, p in module.named_parameters()),
                tuple((n, str(b.dtype), tuple(b.shape)) for n, b in module.named_buffers()),
            ) + ((("tensor-parallel", 1),) if recipe in self.tensor_parallel_recipes else ())
        return ReplayStatus.OK, description

    def _record(self, due: DueRecipe) -> Capture | OptimizerSnapshot:
        record = self._records[due.recipe]
        assert not isinstance(record, CaptureFailure), "only ready recipes are executed (READY-2)"
        return record

    def local_evidence(self, due: DueRecipe) -> list[Callable[[], dict[EvidenceKind, int]]]:
        record = self._record(due)
        if isinstance(record, OptimizerSnapshot):
            optimizer = self.optimizer
            assert optimizer is not None
            return [lambda: {EvidenceKind.PARAMETERS: record.local_evidence()},
                    lambda: {EvidenceKind.LIVE_UPDATED: optimizer.live_evidence(record)}]
        module = self.capture.module(due.recipe)
        return [lambda: {EvidenceKind.PARAMETERS: _module_state_signature(module)},
                lambda: {EvidenceKind.LIVE: self._live_code(due)}]

    def _live_code(self, due: DueRecipe) -> int:
        """SELF-1: this rank's self-check code for the captured call; a DIFFER, and each new
        reason a rank cannot check, is logged here (the vote decides what it means)."""
        outcome = self.capture.live(due.recipe, due.step)
        if outcome.code is LiveCheck.DIFFER:
            logger.warning("scout: %s at step %d: the live output differs from its own replay on this rank (%s)",
                           due.recipe, due.step, outcome.reason)
        elif outcome.code is LiveCheck.UNCHECKED and outcome.reason not in self._unchecked_reasons:
            self._unchecked_reasons.add(outcome.reason)
            logger.info("scout: %s at step %d: the live path is not self-checked on this rank: %s",
                        due.recipe, due.step, outcome.reason)
        return int(outcome.code)

    def payload(self, due: DueRecipe) -> list[torch.Tensor]:
        record = self._record(due)
        if isinstance(record, OptimizerSnapshot):
            return record.tensors()
        return record.tensors() + record.rng.tensors()

    def replay(self, due: DueRecipe) -> ReplayRun:
        record = self._record(due)
        if isinstance(record, OptimizerSnapshot):
            return self._replay_optimizer(record)
        return self._replay_module(self.capture.module(due.recipe), record,
                                   tensor_parallel=due.recipe in self.tensor_parallel_recipes)

    def release(self) -> None:
        self._records.clear()
        self.capture.release()
        if self.optimizer is not None:
            self.optimizer.release()

    def close(self) -> None:
        if self._self_check_hook is not None:
            self._self_check_hook.remove()
            self._self_check_hook = None
        self.capture.close()
        if self.optimizer is not None:
            self.optimizer.close()

    def _replay_optimizer(self, record: OptimizerSnapshot) -> ReplayRun:
        optimizer = self.optimizer
        assert optimizer is not None
        inputs = record.local_evidence()  # OPT-2: the snapshot after the broadcast

        def run() -> int:
            with deterministic_algorithms(self.config.deterministic):
                return optimizer.replay(record)

        device = record.segments[0].parameter.device if record.segments else torch.device("cpu")
        return ReplayRun(device, run, lambda updated: {EvidenceKind.INPUT: inputs, EvidenceKind.UPDATED: updated})

    def _replay_module(self, module: nn.Module, capture: Capture, *, tensor_parallel: bool = False) -> ReplayRun:
        signed = {
            EvidenceKind.INPUT: structured_signature((capture.args, capture.kwargs)),
            EvidenceKind.RNG: structured_signature(capture.rng.as_structure()),
        }
        flags = {id(t): flag for t, flag in zip(capture.tensors(), capture.requires_grad, strict=True)}

        def fresh(tensor: torch.Tensor) -> torch.Tensor:
            copy = tensor.detach().clone()
            if flags[id(tensor)] and (copy.is_floating_point() or copy.is_complex()):
                copy.requires_grad_(True)
            return copy

        args, kwargs = map_tensors(fresh, (capture.args, capture.kwargs))
        grad_inputs = [t for t in tensor_leaves((args, kwargs)) if t.requires_grad]
        # REPLAY-5: isolated copies; the live parameters and buffers are never handed out.
        if capture.parameters is not None and capture.buffers is not None:
            # REPLAY-8: a sharded module replays on the parameters its live forward used, and
            # without its own hooks (FSDP2's would gather and reshard the live parameters and
            # reduce-scatter gradients into them); its submodules' hooks still run.
            own_parameters, own_buffers = capture.parameters, capture.buffers
            target: nn.Module = WithoutOwnHooks(module)
            prefix = WithoutOwnHooks.PREFIX
        else:
            own_parameters = dict(module.named_parameters())
            own_buffers = dict(module.named_buffers())
            target, prefix = module, ""
        parameters = {name: p.detach().clone().requires_grad_(p.requires_grad) for name, p in own_parameters.items()}
        buffers = {name: b.detach().clone() for name, b in own_buffers.items()}
        trainable = [(n, p) for n, p in parameters.items() if p.requires_grad]
        device = next(iter(parameters.values())).device if parameters else torch.device("cpu")
        substitutes = {prefix + name: t for name, t in {**parameters, **buffers}.items()}
        targets = grad_inputs + [p for _, p in trainable]

        def run() -> tuple[Any, Sequence[torch.Tensor | None]]:
            # One forward and backward on the isolated copies; every run installs the captured
            # RNG state, so the warm-up and the repetitions draw the same dropout masks.
            with (
                self.capture.suspended(),
                installed_rng_state(capture.rng),
                deterministic_algorithms(self.config.deterministic),
                capture.autocast.context(),
                torch.enable_grad(),
                LocalCollectives() if tensor_parallel else contextlib.nullcontext(),  # TP-1
            ):
                output = functional_call(target, substitutes, tuple(args), kwargs, strict=bool(prefix))
                outputs = [o for o in tensor_leaves(output) if o.requires_grad]
                gradients: Sequence[torch.Tensor | None] = ()
                if outputs and targets:
                    cotangents = [fixed_cotangent(o, index, self.config.cotangent_seed)
                                  for index, o in enumerate(outputs)]
                    gradients = torch.autograd.grad(outputs, targets, cotangents, allow_unused=True,
                                                    materialize_grads=False)
            return output, gradients

        def evidence(first: tuple[Any, Sequence[torch.Tensor | None]]) -> dict[EvidenceKind, int]:
            output, gradients = first
            gradients = list(gradients) or [None] * len(targets)
            return {
                **signed,
                EvidenceKind.OUTPUT: structured_signature(map_tensors(lambda t: t.detach(), output)),
                EvidenceKind.INPUT_GRADIENT: structured_signature(list(gradients[: len(grad_inputs)])),
                EvidenceKind.PARAMETER_GRADIENT: structured_signature(
                    {name: g for (name, _), g in zip(trainable, gradients[len(grad_inputs):], strict=True)}),
            }

        return ReplayRun(device, run, evidence)


class Replayer(ReplayRunner):
    """Attach replay to a model and optimizer; call :meth:`after_optimizer_step` every step.

    Construction is collective over ``peers`` (the schedule contract, READY-1).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        peers: PeerGroup,
        config: ReplayConfig | None = None,
        modules: RecipeModules | None = None,
    ) -> None:
        self.config = config if config is not None else ReplayConfig()
        if self.config.source_position >= peers.size:
            raise ValueError(f"source_position {self.config.source_position} is outside the peer group of {peers.size}")
        self.modules = modules if modules is not None else RecipeModules.discover(model)
        self.dense = DenseExecutor(model, optimizer, self.modules, self.config)
        self.sharded_recipes = self.dense.sharded_recipes
        if (self.config.deterministic and not os.environ.get("CUBLAS_WORKSPACE_CONFIG")
                and any(p.is_cuda for p in model.parameters())):
            logger.warning(
                "scout: replay runs under deterministic algorithms (REPLAY-4), and cuBLAS is "
                "deterministic only with CUBLAS_WORKSPACE_CONFIG=:4096:8 set before CUDA starts; "
                "without it GPU replays are Inconclusive 'nondeterministic'"
            )
        if peers.size == 1:
            logger.warning(
                "scout: the replay peer group has one member; nothing can be compared, so "
                "every recipe will be Inconclusive and nothing can be certified"
            )
        super().__init__(self.dense, peers, Schedule(self.dense.catalog, self.config.intervals),
                         self.config.runner_settings())

    @property
    def capture_bytes(self) -> int:
        """CAP-5: bytes currently held by captures."""
        return self.dense.held_bytes()

    @property
    def communication_stragglers(self) -> StragglerTracker:
        assert self.stragglers is not None
        return self.stragglers.communication

    def add_compute_hook(self, hook: Callable[[float], None]) -> RemovableHandle:
        """Call ``hook(elapsed_s)`` at the end of every timed replay repetition, inside its
        timed span, with the time measured so far on the replay clock (STRAG-1; opt-in, for
        faults: FAULT-3's ``slow_compute``)."""
        return self.timer.add_hook(hook)

    def after_optimizer_step(self) -> StepReport:
        """Finish step ``step_count + 1``: run its due checks, arm the next step."""
        return self.step()

    def self_check_before(self, optimizer: torch.optim.Optimizer) -> None:
        """SELF-9's check point for an optimizer scout does not replay (:meth:`DenseExecutor.self_check_before`)."""
        self.dense.self_check_before(optimizer)


def _sharded_dimensions(parameter: torch.Tensor) -> int:
    """How many mesh dimensions a DTensor parameter is sharded along (0 for a plain tensor)."""
    placements = getattr(parameter, "placements", ()) if is_sharded(parameter) else ()
    return sum(1 for placement in placements if placement.is_shard())


def _uses_fsdp(model: nn.Module) -> bool:
    """Whether FSDP2 manages any of the model's modules (its DTensor parameters are then FSDP's
    shards, gathered at each forward; otherwise they are tensor-parallel shards)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed: no FSDP2
        return False
    return any(isinstance(module, FSDPModule) for module in model.modules())


def _module_state_signature(module: nn.Module) -> int:
    """PARAMETERS: the live parameters and buffers of a module (REPLAY-3)."""
    return structured_signature({"parameters": dict(module.named_parameters()), "buffers": dict(module.named_buffers())})
