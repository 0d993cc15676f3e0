"""MoE expert replay (spec/moe.md MOE-1..MOE-3, MOE-8): capture one expert's packed input,
materialize it at ``n_exec`` rows, replay it on every expert-data-parallel replica of that
expert, and vote with the one verdict rule; and the all-to-all dispatch/combine replay.

Theory of operation. A routed MoE layer packs the tokens the router sent to each local expert
end to end and calls its *grouped experts* module as ``experts(x, num_tokens_per_expert)``
(TorchTitan's ``GroupedExperts`` and the test models do). Every parameter whose leading
dimension is the number of local experts holds one slice per expert. An expert recipe
``expert.<slot>@<n_exec>`` (slot = MoE layer major, local expert minor) is due by the same
step-only schedule as every recipe (REC-3). A forward pre-hook on that layer's grouped module
records, at the armed step, the expert's own rows of the packed input (MOE-2: all rows if it
received none), materialized at ``n_exec`` rows -- truncated or repeated cyclically, the counts
validated first (MOE-3). At the step's end every replica of the expert -- the ranks that hold
the same experts, i.e. that share every mesh coordinate outside the expert-data-parallel
dimensions (PEER-1 with the EP dimension kept) -- exchanges readiness, receives the source's
rows, and runs the module on copies of its parameters with the one-hot count vector
(``n_exec`` rows for that expert, 0 for the others). PARAMETERS signs that expert's slice of
every grouped parameter, so a corrupt expert is named together with its rank; OUTPUT, INPUT,
INPUT_GRADIENT and PARAMETER_GRADIENT are voted separately, as for any module (EVID-*).

Every exchange has one fixed size (READY-3), every wait is bounded by the peer group's
deadline (READY-4), and a failure after the decision is a status code, never a skipped
collective (REPLAY-7).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch import nn
from torch.func import functional_call

from scout.core.guards import whole_number
from scout.core.moe import balanced_traffic, expert_rows, materialize_rows, validate_counts
from scout.core.recipes import (
    Catalog,
    DueRecipe,
    EvidenceKind,
    Intervals,
    RecipeClass,
    RecipeId,
    RecipeResult,
    ReplayStatus,
    Schedule,
    combine_evidence,
)
from scout.replay.collectives import PeerGroup
from scout.replay.determinism import deterministic_algorithms, fixed_cotangent
from scout.replay.replay import ReplayConfig
from scout.replay.runner import ReplayRun, ReplayRunner, StepReport
from scout.replay.signature import structured_signature, tensor_signature
from scout.reports import guard
from scout.reports.guard import Part

__all__ = [
    "AllToAllReplay",
    "ExpertExecutor",
    "ExpertLayers",
    "ExpertReplayConfig",
    "ExpertReplayer",
    "ExpertStepReport",
    "expert_parameter_slices",
    "local_expert_count",
]

logger = logging.getLogger("scout.replay")

def local_expert_count(module: nn.Module) -> int:
    """The number of local experts of a grouped module: the leading dimension of its first
    parameter with at least 3 dimensions (``[experts, out, in]``)."""
    for parameter in module.parameters():
        if parameter.dim() >= 3:
            return int(parameter.shape[0])
    raise ValueError(
        f"{type(module).__qualname__} has no grouped parameter ([experts, ...] with >= 3 dims): "
        "it is not a grouped-experts module"
    )


def expert_parameter_slices(module: nn.Module, expert: int) -> dict[str, torch.Tensor]:
    """Expert ``expert``'s slice of every grouped parameter (leading dim = local experts)."""
    count = local_expert_count(module)
    return {name: _local(p)[expert] for name, p in module.named_parameters()
            if p.dim() >= 3 and p.shape[0] == count}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor's own shard (SIG-1)
    return to_local() if callable(to_local) else tensor


@attrs.frozen
class ExpertLayers:
    """The grouped-experts modules of the model, one per MoE layer, in layer order. Slot
    ``s`` is local expert ``s % experts`` of layer ``s // experts`` (every layer has the same
    number of local experts)."""

    layers: tuple[nn.Module, ...]

    def __attrs_post_init__(self) -> None:
        if not self.layers:
            raise ValueError("no grouped-experts modules: give at least one MoE layer's experts")
        counts = {local_expert_count(m) for m in self.layers}
        if len(counts) != 1:
            raise ValueError(f"MoE layers have different numbers of local experts: {sorted(counts)}")

    @property
    def experts_per_layer(self) -> int:
        return local_expert_count(self.layers[0])

    @property
    def slot_count(self) -> int:
        return self.experts_per_layer * len(self.layers)

    def locate(self, slot: int) -> tuple[int, int]:
        """``(layer, local expert)`` of a slot."""
        if not 0 <= slot < self.slot_count:
            raise ValueError(f"expert slot {slot} outside 0..{self.slot_count - 1}")
        return divmod(slot, self.experts_per_layer)

    @classmethod
    def discover(cls, model: nn.Module, names: Sequence[str] = ()) -> ExpertLayers:
        """The grouped-experts modules of ``model`` in module order (spec/moe.md MOE-9): the
        modules ``names`` names (a DDP wrapper's ``module.`` prefix optional); else every module
        whose class or a base class is named ``GroupedExperts``; else, by structure, every
        module outside ``torch.nn``'s own layers that directly owns a parameter with >= 3 dims.
        Raises ValueError naming the value and the candidates found by structure."""
        modules = dict(model.named_modules())
        if names:
            found: list[nn.Module] = []
            for name in names:
                module = modules.get(name, modules.get(f"module.{name}"))
                if module is None:
                    raise ValueError(f"moe_experts names {name!r}, which is not a module of "
                                     f"{type(model).__qualname__}; grouped-experts modules found by structure: "
                                     f"{_structural_names(modules) or 'none'}")
                local_expert_count(module)  # a module with no grouped parameter is refused, named
                found.append(module)
            return cls(tuple(found))
        named = tuple(m for m in modules.values()
                      if any(base.__name__ == "GroupedExperts" for base in type(m).__mro__))
        if named:
            return cls(named)
        structural = tuple(modules[name] for name in _structural_names(modules))
        if not structural:
            raise ValueError(
                f"no grouped-experts module in {type(model).__qualname__} (none named GroupedExperts, none "
                "owning a parameter of >= 3 dims [experts, out, in]); name them with moe_experts="
                "'layers.0.experts,...' (the modules called as experts(x, num_tokens_per_expert))")
        return cls(structural)


def _structural_names(modules: dict[str, nn.Module]) -> list[str]:
    """MOE-9: modules that directly own a parameter of >= 3 dims, outside ``torch.nn``'s own
    layer classes (a convolution's weight is 4-D and is not a stack of experts)."""
    return [name for name, m in modules.items()
            if not type(m).__module__.startswith("torch.nn.")
            and any(p.dim() >= 3 for p in m.parameters(recurse=False))]


@attrs.frozen
class ExpertReplayConfig:
    """Expert replay's settings; timing, the straggler test's and the error handling's are the
    dense replay's (:class:`~scout.replay.replay.ReplayConfig`, REPLAY-9)."""

    expert_steps: int = 50  # REC-2: steps between two expert checks
    expert_recipes_per_check: int = 1  # REC-3, MOE-10: expert recipes replayed at each check
    source_position: int = 0  # REPLAY-1
    max_capture_bytes: int = 64 * 2**20  # CAP-2
    deterministic: bool = True  # REPLAY-4
    cotangent_seed: int = 2608  # REPLAY-5
    history_limit: int = 4096
    timing_warmup_runs: int = 1  # STRAG-1
    timing_repetitions: int = 3
    timing_clock: str = "auto"

    def __attrs_post_init__(self) -> None:
        if self.expert_steps < 0 or self.source_position < 0 or self.max_capture_bytes < 0:
            raise ValueError(f"expert replay settings must be >= 0: {self}")
        if not whole_number(self.expert_recipes_per_check) \
                or self.expert_recipes_per_check < 1:
            raise ValueError(f"expert_recipes_per_check must be an int >= 1, got {self.expert_recipes_per_check!r}")
        self.replay_config()  # the shared settings are checked where the dense replay checks them

    def replay_config(self) -> ReplayConfig:
        return ReplayConfig(source_position=self.source_position, max_capture_bytes=self.max_capture_bytes,
                            deterministic=self.deterministic, cotangent_seed=self.cotangent_seed,
                            history_limit=self.history_limit, timing_warmup_runs=self.timing_warmup_runs,
                            timing_repetitions=self.timing_repetitions, timing_clock=self.timing_clock)


@attrs.define
class _ExpertCapture:
    recipe: RecipeId
    step: int
    rows: torch.Tensor | None  # [n_exec, ...] materialized input (MOE-2)
    status: ReplayStatus
    reason: str = ""


class ExpertExecutor:
    """The expert recipes' executor (MOE-1..MOE-3): a forward pre-hook on each MoE layer's
    grouped module records the due expert's rows, materialized at ``n_exec``; the replay runs
    the module on copies of its parameters with the one-hot count vector."""

    schedule_tag = "scout-expert-schedule"

    def __init__(self, experts: ExpertLayers, expert_keys: Sequence[tuple[int, int]],
                 config: ExpertReplayConfig) -> None:
        self.experts = experts
        self.config = config
        for slot, _ in expert_keys:
            experts.locate(slot)
        self.catalog = Catalog(hidden_layer_count=0, has_embedding=False, has_output=False,
                               optimizer_slice_count=0, expert_keys=tuple(expert_keys))
        # REC-3, MOE-10: the expert recipes due at the armed step (several when a check replays
        # more than one) and their captures, by recipe.
        self._armed: tuple[DueRecipe, ...] = ()
        self._captures: dict[RecipeId, _ExpertCapture] = {}
        self._suspended = False
        self._handles = [m.register_forward_pre_hook(self._hook_for(layer), with_kwargs=True)
                         for layer, m in enumerate(experts.layers)]

    # -- capture (MOE-2, MOE-3) ---------------------------------------------------------------

    def arm(self, step: int, due: Sequence[DueRecipe]) -> None:
        self._armed = tuple(due)
        self._captures = {}

    def held_bytes(self) -> int:
        return sum(c.rows.numel() * c.rows.element_size() for c in self._captures.values() if c.rows is not None)

    def release(self) -> None:
        self._captures = {}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook_for(self, layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self._suspended or not guard.running(Part.EXPERTS):  # GUARD-3: not after a failure here
                return
            for armed in self._armed:  # the first call of the layer in the step (CAP-1)
                if armed.recipe in self._captures:
                    continue
                try:
                    slot_layer, expert = self.experts.locate(armed.recipe.index)
                    if slot_layer != layer:
                        continue
                    self._captures[armed.recipe] = self._record(armed, module, expert, args, kwargs)
                except Exception as exc:  # CAP-6: never into the training loop; GUARD-3: a failure of the part
                    self._captures[armed.recipe] = _ExpertCapture(armed.recipe, armed.step, None,
                                                                  ReplayStatus.NOT_READY, f"capture failed: {exc!r}")
                    guard.failed(Part.EXPERTS, exc, "forward hook")
        return hook

    def _record(self, due: DueRecipe, module: nn.Module, expert: int, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> _ExpertCapture:
        values = list(args) + list(kwargs.values())
        if len(values) < 2 or not all(isinstance(v, torch.Tensor) for v in values[:2]):
            return _ExpertCapture(due.recipe, due.step, None, ReplayStatus.NOT_READY,
                                  "the grouped experts were not called as experts(x, num_tokens_per_expert)")
        x, counts_tensor = values[0], values[1]
        counts = validate_counts([int(c) for c in counts_tensor.tolist()], int(x.shape[0]),
                                 local_expert_count(module))
        start, stop = expert_rows(counts, expert)
        if stop == start:
            return _ExpertCapture(due.recipe, due.step, None, ReplayStatus.NOT_READY,
                                  "the packed input is empty: nothing to materialize")
        index = torch.tensor(materialize_rows(stop - start, due.recipe.n_exec), device=x.device) + start
        byte_count = due.recipe.n_exec * x[0].numel() * x.element_size()
        held = self.held_bytes()  # CAP-2: the budget covers every capture of the step (lanes, MOE-10)
        if held + byte_count > self.config.max_capture_bytes:
            return _ExpertCapture(due.recipe, due.step, None, ReplayStatus.CAPTURE_TOO_LARGE,
                                  f"{byte_count} bytes, {held} already held > max_capture_bytes="
                                  f"{self.config.max_capture_bytes}")
        rows = x.detach().index_select(0, index).contiguous()
        return _ExpertCapture(due.recipe, due.step, rows, ReplayStatus.OK)

    # -- the round's executor (REPLAY-9) -------------------------------------------------------

    def _ready(self, due: DueRecipe) -> _ExpertCapture:
        capture = self._captures.get(due.recipe)
        if capture is None or capture.step != due.step:
            return _ExpertCapture(due.recipe, due.step, None, ReplayStatus.NOT_READY,
                                  f"{due.recipe} was armed for step {due.step} but its layer was not called")
        return capture

    def prepare(self, due: DueRecipe) -> tuple[ReplayStatus, tuple[object, ...]]:
        capture = self._ready(due)
        layer, _ = self.experts.locate(due.recipe.index)
        module = self.experts.layers[layer]
        description: tuple[object, ...] = (str(due.recipe), due.step, type(module).__qualname__)
        if capture.rows is None:
            return capture.status, (*description, "not-ready", capture.reason)
        return ReplayStatus.OK, (*description, str(capture.rows.dtype), tuple(capture.rows.shape),
                                 tuple((n, str(p.dtype), tuple(p.shape)) for n, p in module.named_parameters()))

    def local_evidence(self, due: DueRecipe) -> list[Callable[[], dict[EvidenceKind, int]]]:
        layer, expert = self.experts.locate(due.recipe.index)
        module = self.experts.layers[layer]
        return [lambda: {EvidenceKind.PARAMETERS: structured_signature(expert_parameter_slices(module, expert))}]

    def payload(self, due: DueRecipe) -> list[torch.Tensor]:
        rows = self._ready(due).rows
        assert rows is not None  # every peer is ready (READY-2)
        return [rows]

    def replay(self, due: DueRecipe) -> ReplayRun:
        """REPLAY-5 on the expert: copies of the parameters, the one-hot count vector."""
        rows = self._ready(due).rows
        assert rows is not None
        layer, expert = self.experts.locate(due.recipe.index)
        module = self.experts.layers[layer]
        count = local_expert_count(module)
        counts = torch.zeros(count, dtype=torch.int64, device=rows.device)
        counts[expert] = due.recipe.n_exec
        x = rows.detach().clone()
        if x.is_floating_point():
            x.requires_grad_(True)
        parameters = {n: _local(p).detach().clone().requires_grad_(p.requires_grad)
                      for n, p in module.named_parameters()}
        buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
        trainable = [(n, p) for n, p in parameters.items() if p.requires_grad]
        targets = ([x] if x.requires_grad else []) + [p for _, p in trainable]

        def run() -> tuple[torch.Tensor, Sequence[torch.Tensor | None]]:
            self._suspended = True
            try:
                with deterministic_algorithms(self.config.deterministic), torch.enable_grad():
                    output = functional_call(module, {**parameters, **buffers}, (x, counts))
                    cotangent = fixed_cotangent(output, 0, self.config.cotangent_seed)
                    gradients = torch.autograd.grad([output], targets, [cotangent], allow_unused=True)
            finally:
                self._suspended = False
            return output, gradients

        def evidence(first: tuple[torch.Tensor, Sequence[torch.Tensor | None]]) -> dict[EvidenceKind, int]:
            output, gradients = first
            input_gradient = gradients[0] if x.requires_grad else None
            parameter_gradients = gradients[1:] if x.requires_grad else gradients
            # Only this expert's slice of each grouped gradient: the others are zero by construction.
            by_name = {}
            for (name, parameter), gradient in zip(trainable, parameter_gradients, strict=True):
                if gradient is not None and parameter.dim() >= 3 and parameter.shape[0] == count:
                    gradient = gradient[expert]
                by_name[name] = gradient
            return {
                EvidenceKind.INPUT: tensor_signature(rows),
                EvidenceKind.OUTPUT: tensor_signature(output.detach()),
                EvidenceKind.INPUT_GRADIENT: structured_signature(input_gradient),
                EvidenceKind.PARAMETER_GRADIENT: structured_signature(by_name),
            }

        return ReplayRun(rows.device, run, evidence)


#: What one expert check did: the runner's report (an alias kept for the public name).
ExpertStepReport = StepReport


class ExpertReplayer(ReplayRunner):
    """Expert recipes of one rank, replayed among the replicas of its experts (``peers``: the
    expert-data-parallel group, never the default group) by the replay runner, with the dense
    path's timing, seeds, validation and error handling (REPLAY-9). ``expert_keys``: the
    ``(slot, n_exec)`` pairs to replay (a regime catalog's ``expert_keys()``, MOE-5).
    Construction is collective over ``peers`` (the schedule contract, READY-1); call
    :meth:`step` once per training step after ``optimizer.step()`` -- the capture is of the
    step's forward, the check runs on the live parameters at the step's end."""

    def __init__(
        self,
        experts: ExpertLayers,
        peers: PeerGroup,
        expert_keys: Sequence[tuple[int, int]],
        config: ExpertReplayConfig | None = None,
    ) -> None:
        self.config = config or ExpertReplayConfig()
        self.experts = experts
        executor = ExpertExecutor(experts, expert_keys, self.config)
        schedule = Schedule(executor.catalog, Intervals(
            expert_steps=self.config.expert_steps, expert_recipes_per_check=self.config.expert_recipes_per_check))
        # The dense replay's device and communication tests already judge these ranks' devices
        # and links; expert checks do not feed a second pair (the straggler statistics stay).
        super().__init__(executor, peers, schedule, self.config.replay_config().runner_settings(),
                         track_stragglers=False, label="expert replay", part=Part.EXPERTS)


class AllToAllReplay:
    """MOE-8: the all-to-all dispatch/combine replay among the ranks of one EP group. Every
    rank sends the same fixed block to every rank (the balanced traffic matrix), so every rank
    must receive identical bytes; the received bytes' signatures are voted with the one rule
    and a rank whose receive path corrupts data is named. ``all_to_all`` is
    ``torch.distributed.all_to_all(outputs, inputs, group=...)`` bound to the EP group (or a
    stand-in with that signature); ``peers`` carries the vote (the same ranks)."""

    def __init__(self, peers: PeerGroup, all_to_all: Callable[[list[torch.Tensor], list[torch.Tensor]], None], *,
                 rows_per_pair: int = 4, width: int = 64, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", seed: int = 2608) -> None:
        self.peers = peers
        self.traffic = balanced_traffic(peers.size, rows_per_pair)
        self._all_to_all = all_to_all
        generator = torch.Generator().manual_seed(seed)
        self.block = torch.randn(rows_per_pair, width, generator=generator).to(device=device, dtype=dtype)
        #: Opt-in fault hook for tests: called on the received blocks before they are signed.
        self.receive_hook: Callable[[list[torch.Tensor]], None] | None = None

    def check(self, step: int) -> RecipeResult:
        recipe = RecipeId(RecipeClass.DISPATCH)
        sends = [self.block.clone() for _ in self.traffic[self.peers.position]]
        receives = [torch.empty_like(self.block) for _ in sends]
        status = ReplayStatus.OK
        try:
            self._all_to_all(receives, sends)
            if self.receive_hook is not None:
                self.receive_hook(receives)
            signature = structured_signature(receives)
        except Exception as exc:
            logger.warning("scout: all-to-all replay failed: %r", exc)
            status, signature = ReplayStatus.REPLAY_FAILED, 0
        rows = self.peers.all_gather_int64([int(status), signature])
        return combine_evidence(recipe, step, [r[0] for r in rows], {EvidenceKind.OUTPUT: [r[1] for r in rows]})

