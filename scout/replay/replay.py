"""In-situ replay: the per-step driver (spec/replay.md READY-*, REPLAY-*, EVID-*).

Theory of operation. ``Replayer.after_optimizer_step()`` is called once per training step on
every peer. The schedule (``scout.core.recipes.Schedule``) says, from the step number alone,
which recipes are due; the capture hooks were armed for exactly those before the step's
forward. At a due step every peer, ready or not:

1. builds a compact description of what it is about to replay (step, recipe, module class,
   capture step, shapes, dtypes, requires-grad mask, autocast, RNG-state layout; READY-1),
2. exchanges its digest, readiness and status in one fixed-size all-gather (one slot per
   recipe class, so the size never depends on local state; READY-3),
3. decides per recipe with ``decide_readiness`` -- the decision is a function of the gathered
   rows only, so every peer takes the same branch and nobody enters a collective that another
   skips (READY-2);
4. for each recipe that proceeds: signs its own live inputs (PARAMETERS), receives the source
   peer's captured inputs and RNG state by broadcast, signs them (INPUT, RNG), and replays on
   isolated copies under deterministic algorithms (REPLAY-3..5); local failures become a status
   code, never a skipped broadcast;
5. exchanges every evidence signature, status and replay compute time -- and its own time
   inside this check's earlier collectives, apart from compute (COMM-1) -- in a second
   fixed-size all-gather, and decides each recipe with ``combine_evidence`` (EVID-*), each
   replay time with ``classify_timing`` (STRAG-1) and the communication times likewise
   (COMM-2). Both kinds of timing verdict feed a confirmation machine (spec/straggler.toml).

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
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar

import attrs
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.hooks import RemovableHandle

from scout.core.recipes import (
    CLASS_ORDER,
    Catalog,
    Coverage,
    DueRecipe,
    EvidenceKind,
    Intervals,
    RecipeClass,
    RecipeId,
    RecipeResult,
    ReplayStatus,
    Schedule,
    combine_evidence,
    coverage,
    decide_readiness,
)
from scout.core.straggler import (
    DEFAULT_SEQUENTIAL_CONFIG,
    Confirmed,
    Recovered,
    SequentialConfig,
    check_evidence,
)
from scout.core.verdict import (
    DEFAULT_TIMING_CONFIG,
    MISSING,
    Status,
    TimingConfig,
    Verdict,
    classify_exact,
    classify_timing,
)
from scout.replay.capture import Capture, CaptureFailure, ModuleCapture, is_sharded
from scout.replay.collectives import PeerGroup
from scout.replay.optimizer import OptimizerCapture, OptimizerSnapshot
from scout.replay.rng import installed_rng_state
from scout.replay.signature import structured_signature
from scout.replay.stragglers import StragglerEvent, StragglerKind, StragglerTracker
from scout.replay.tree import map_tensors, tensor_leaves
from scout.transport.base import DeadlineExceeded, TransportError
from scout.transport.nccl.timing import Mark, Timer, WallTimer, timer_for, wait_elapsed_s

__all__ = ["RecipeModules", "ReplayConfig", "Replayer", "StepReport", "deterministic_algorithms"]

logger = logging.getLogger("scout.replay")
_Result = TypeVar("_Result")

#: STRAG-1's CPU clock: the replaying thread's CPU time, with the wall timer's arithmetic.
_THREAD_CPU_TIMER: Final = WallTimer(clock_ns=time.thread_time_ns)

MODULE_EVIDENCE: tuple[EvidenceKind, ...] = (
    EvidenceKind.PARAMETERS,
    EvidenceKind.INPUT,
    EvidenceKind.RNG,
    EvidenceKind.OUTPUT,
    EvidenceKind.INPUT_GRADIENT,
    EvidenceKind.PARAMETER_GRADIENT,
)
OPTIMIZER_EVIDENCE: tuple[EvidenceKind, ...] = (
    EvidenceKind.PARAMETERS,
    EvidenceKind.INPUT,
    EvidenceKind.UPDATED,
    EvidenceKind.LIVE_UPDATED,
)
_EVIDENCE_ORDER = tuple(EvidenceKind)
# Fixed-size rows (READY-3, EVID-1): one slot per recipe class, whatever is due locally.
_READINESS_SLOT = 3  # due flag, status, description digest
_EVIDENCE_SLOT = 2 + len(_EVIDENCE_ORDER)  # status, compute microseconds, evidence...
# COMM-1: entry and wait microseconds of each of the check's collectives so far (a check makes
# at most one readiness exchange and one broadcast per recipe class); -1 pads absent calls.
_COMMUNICATION_CALLS = 1 + len(CLASS_ORDER)
_COMMUNICATION_SLOT = 2 * _COMMUNICATION_CALLS
READINESS_ROW_LENGTH = 1 + _READINESS_SLOT * len(CLASS_ORDER)
EVIDENCE_ROW_LENGTH = _EVIDENCE_SLOT * len(CLASS_ORDER) + _COMMUNICATION_SLOT
#: COMM-2: a peer's own time inside collectives is small; scheduler noise on a shared host is
#: of the order of a millisecond, so communication rounds use a higher absolute floor.
DEFAULT_COMMUNICATION_TIMING: Final = TimingConfig(absolute_floor_ms=5.0)
TIMING_CLOCKS: Final = ("auto", "cpu", "wall")


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
    # the clock ``timing_clock`` picks: "auto" (CPU time on a CPU, device-synchronised wall
    # time on an accelerator), "cpu" or "wall".
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


@attrs.frozen
class StepReport:
    """What one call of ``after_optimizer_step`` did."""

    step: int
    results: tuple[RecipeResult, ...]
    timing: dict[str, Verdict]  # recipe id -> timing verdict over replay compute ms
    compute_ms: dict[str, float]  # this peer's replay compute time per recipe
    collective_ms: float  # this peer's time inside replay collectives this step (entry + wait)
    capture_bytes: int  # bytes held by captures when the check began
    errors: tuple[str, ...] = ()
    # STRAG-4: the device (replay compute) sequential test's reports of this step, as the
    # machine's effects, and the peer positions confirmed now.
    stragglers: tuple[Confirmed | Recovered, ...] = ()
    confirmed_stragglers: frozenset[int] = frozenset()
    # COMM-1..COMM-3: every peer's own communication time (ms, by position) in the collectives
    # before the evidence exchange, its timing verdict, and the communication test's reports.
    communication_ms: tuple[float, ...] = ()
    communication: Verdict | None = None
    communication_stragglers: tuple[Confirmed | Recovered, ...] = ()
    confirmed_communication_stragglers: frozenset[int] = frozenset()
    # STRAG-1: every peer's compute time per recipe (ms, by position, from the evidence rows;
    # MISSING where its replay did not complete) and this peer's timed repetitions (ms).
    peer_compute_ms: dict[str, tuple[Any, ...]] = attrs.Factory(dict)
    repetitions_ms: dict[str, tuple[float, ...]] = attrs.Factory(dict)
    # STRAG-2: each peer's log time ratio to the centre this check, by kind ("device",
    # "communication"); None where the check said nothing about it.
    evidence: dict[str, tuple[float | None, ...]] = attrs.Factory(dict)
    # STRAG-21: confirmations and recoveries of this step with what their reports need, and
    # every peer's performance ratio (median over its trail) by kind.
    straggler_events: tuple[StragglerEvent, ...] = ()
    performance_ratios: dict[str, tuple[float | None, ...]] = attrs.Factory(dict)


class NondeterministicReplay(RuntimeError):
    """A kernel without a deterministic implementation was called inside replay."""


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True) -> Iterator[None]:
    """REPLAY-4: deterministic kernels for the block only; the previous settings come back."""
    if not enabled:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled()
    previous_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    previous_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    except RuntimeError as exc:
        if "deterministic" in str(exc):
            raise NondeterministicReplay(str(exc)) from exc
        raise
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous_cudnn


@attrs.define
class _Local:
    """One due recipe on this peer: its capture and, once replayed, its evidence."""

    due: DueRecipe
    record: Capture | OptimizerSnapshot | CaptureFailure
    status: ReplayStatus
    digest: int
    evidence: dict[EvidenceKind, int] = attrs.Factory(dict)
    compute_s: float = 0.0  # STRAG-1: median of the timed repetitions
    repetitions_s: tuple[float, ...] = ()  # every timed repetition


@attrs.frozen
class _Exchanged:
    """What one check's exchanges and replays produced (recipe ids as strings)."""

    results: tuple[RecipeResult, ...]
    timing: dict[str, Verdict]  # timing verdict over the peers' compute times, per recipe
    compute_ms: dict[str, float]  # this peer's compute time per recipe
    communication_ms: tuple[float, ...]  # COMM-2: every peer's own communication time
    peer_compute_ms: dict[str, tuple[Any, ...]]  # every peer's compute time per recipe (or MISSING)
    repetitions_ms: dict[str, tuple[float, ...]]  # this peer's timed repetitions per recipe


def _effects(
    events: Sequence[StragglerEvent], kind: StragglerKind
) -> tuple[Confirmed | Recovered, ...]:
    return tuple(event.effect for event in events if event.kind is kind)


class Replayer:
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
            raise ValueError(
                f"source_position {self.config.source_position} is outside the peer group of "
                f"{peers.size}"
            )
        self.peers = peers
        self.modules = modules if modules is not None else RecipeModules.discover(model)
        self.catalog = Catalog(
            hidden_layer_count=len(self.modules.hidden),
            has_embedding=self.modules.embedding is not None,
            has_output=self.modules.output is not None,
            optimizer_slice_count=self.config.optimizer_slices_per_cycle if optimizer else 0,
        )
        self.schedule = Schedule(self.catalog, self.config.intervals)
        by_recipe = self.modules.by_recipe()
        # REPLAY-8: modules with sharded (FSDP2) parameters replay on the gathered parameters
        # their own forward used, captured with the inputs (CAP-7).
        self.sharded_recipes = frozenset(
            recipe
            for recipe, module in by_recipe.items()
            if any(is_sharded(p) for p in module.parameters())
        )
        self._capture = ModuleCapture(
            by_recipe,
            self.config.max_capture_bytes,
            with_parameters=self.sharded_recipes,
            rows=self.config.replay_rows,
        )
        self._optimizer = (
            OptimizerCapture(
                optimizer, self.config.optimizer_slice_numel, self.config.max_capture_bytes
            )
            if optimizer is not None
            else None
        )
        self.step_count = 0
        self._closed = False
        self._compute_hooks: OrderedDict[int, Callable[[float], None]] = OrderedDict()
        self.results: deque[RecipeResult] = deque(maxlen=self.config.history_limit)
        self.disabled_reason: str | None = None
        self._schedule_digest = structured_signature(self.schedule.describe())
        # STRAG-4, COMM-2: one sequential test per kind of evidence over this group.
        self.stragglers = StragglerTracker(
            StragglerKind.DEVICE,
            peers.ranks,
            self.config.straggler,
            self.config.straggler_trail_checks,
        )
        self.communication_stragglers = StragglerTracker(
            StragglerKind.COMMUNICATION,
            peers.ranks,
            self.config.straggler,
            self.config.straggler_trail_checks,
        )
        if (
            self.config.deterministic
            and not os.environ.get("CUBLAS_WORKSPACE_CONFIG")
            and any(p.is_cuda for p in model.parameters())
        ):
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
        self._check_schedule_contract()
        self._arm(1)

    # ----------------------------------------------------------------------------------------
    # Public surface
    # ----------------------------------------------------------------------------------------

    @property
    def capture_bytes(self) -> int:
        """CAP-5: bytes currently held by captures."""
        optimizer_bytes = self._optimizer.held_bytes if self._optimizer else 0
        return self._capture.held_bytes + optimizer_bytes

    def coverage(self, since_step: int = 0) -> Coverage:
        return coverage(self.catalog, list(self.results), since_step)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove every hook; the model and optimizer are as they were before."""
        self._closed = True
        self._capture.close()
        if self._optimizer is not None:
            self._optimizer.close()

    def resume_at(self, step: int) -> None:
        """The job restarted from a checkpoint taken after step ``step``: the next
        :meth:`after_optimizer_step` is step ``step + 1`` (the schedule is a function of the
        step, so every peer resumes it alike)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"resume_at needs a step >= 0, got {step!r}")
        self.step_count = step
        self._arm(step + 1)

    def after_optimizer_step(self) -> StepReport:
        """Finish step ``step_count + 1``: run its due checks, arm the next step."""
        if self._closed:
            raise RuntimeError("this Replayer was closed; attach a new one to keep checking")
        step = self.step_count + 1
        self.step_count = step
        try:
            return self._check(step)
        except Exception as exc:  # diagnostics never crash the trainer
            logger.exception("scout: replay check at step %d failed", step)
            self.disabled_reason = f"internal error at step {step}: {exc!r}"
            results = self._inconclusive_all(self.schedule.due(step), self.disabled_reason)
            return StepReport(step, results, {}, {}, 0.0, 0, (repr(exc),))
        finally:
            self._capture.release()
            if self._optimizer is not None:
                self._optimizer.release()
            self._arm(step + 1)

    step = after_optimizer_step

    # ----------------------------------------------------------------------------------------
    # Protocol
    # ----------------------------------------------------------------------------------------

    def _check_schedule_contract(self) -> None:
        if self.peers.size == 1:
            return
        try:
            rows = self.peers.all_gather_int64([self._schedule_digest])
        except Exception as exc:
            self.disabled_reason = f"schedule contract exchange failed: {exc}"
            logger.warning("scout: replay disabled: %s", self.disabled_reason)
            return
        verdict = classify_exact([row[0] for row in rows])
        if verdict.status is not Status.AGREE:
            self.disabled_reason = (
                f"peers disagree on the replay schedule ({verdict.status.value}, outliers "
                f"{list(verdict.outliers)}): every peer must use the same intervals, catalog "
                "and optimizer slicing"
            )
            logger.warning("scout: replay disabled: %s", self.disabled_reason)

    def _arm(self, step: int) -> None:
        due = self.schedule.due(step)
        self._capture.arm(
            step, [d.recipe for d in due if d.recipe.recipe_class is not RecipeClass.OPTIMIZER]
        )
        if self._optimizer is not None:
            optimizer_due = [d for d in due if d.recipe.recipe_class is RecipeClass.OPTIMIZER]
            if optimizer_due:
                self._optimizer.arm(optimizer_due[0].recipe, step, optimizer_due[0].check_index)
            else:
                self._optimizer.arm(None, step, 0)

    def _inconclusive_all(self, due: Sequence[DueRecipe], reason: str) -> tuple[RecipeResult, ...]:
        results = tuple(
            RecipeResult(d.recipe, d.step, Status.INCONCLUSIVE, reason=reason) for d in due
        )
        self.results.extend(results)
        return results

    def _check(self, step: int) -> StepReport:
        due = self.schedule.due(step)
        capture_bytes = self.capture_bytes
        if not due:
            return StepReport(step, (), {}, {}, 0.0, capture_bytes)
        if self.disabled_reason is not None:
            reason = f"replay-disabled: {self.disabled_reason}"
            return StepReport(step, self._inconclusive_all(due, reason), {}, {}, 0.0, capture_bytes)
        timer = getattr(self.peers, "timer", None)
        if timer is not None:
            timer.take()
        locals_ = [self._prepare(d) for d in due]
        try:
            exchanged = self._exchange_and_replay(step, locals_)
            results, timing, compute_ms = exchanged.results, exchanged.timing, exchanged.compute_ms
            communication_ms = exchanged.communication_ms
        except TransportError as exc:  # a deadline, or a group the binding marked unusable
            kind = "deadline" if isinstance(exc, DeadlineExceeded) else "transport failure"
            self.disabled_reason = f"{kind} at step {step}: {exc}"
            logger.warning("scout: replay disabled: %s", self.disabled_reason)
            results = self._inconclusive_all(due, f"{kind}: {exc}")
            return StepReport(step, results, {}, {}, 0.0, capture_bytes, (str(exc),))
        collective_ms = timer.take().total_s * 1e3 if timer is not None else 0.0
        self.results.extend(results)
        # STRAG-2..STRAG-4: one check of evidence per kind; each single comparison is the
        # timing verdict already taken (per recipe; over the communication times).
        device_evidence = check_evidence(
            exchanged.peer_compute_ms,
            timing,
            self.config.device_floor_ms,
            self.peers.size,
        )
        events = list(self.stragglers.observe(step, device_evidence))
        evidence = {StragglerKind.DEVICE.value: device_evidence}
        communication: Verdict | None = None
        if communication_ms:  # COMM-2: one check per step that exchanged evidence
            communication = classify_timing(communication_ms, self.config.communication_timing)
            communication_evidence = check_evidence(
                {"communication": communication_ms},
                {"communication": communication},
                self.config.communication_timing.absolute_floor_ms,
                self.peers.size,
            )
            evidence[StragglerKind.COMMUNICATION.value] = communication_evidence
            events += self.communication_stragglers.observe(step, communication_evidence)
        return StepReport(
            step,
            results,
            timing,
            compute_ms,
            collective_ms,
            capture_bytes,
            stragglers=_effects(events, StragglerKind.DEVICE),
            confirmed_stragglers=self.stragglers.confirmed,
            communication_ms=communication_ms,
            communication=communication,
            communication_stragglers=_effects(events, StragglerKind.COMMUNICATION),
            confirmed_communication_stragglers=self.communication_stragglers.confirmed,
            peer_compute_ms=exchanged.peer_compute_ms,
            repetitions_ms=exchanged.repetitions_ms,
            evidence=evidence,
            straggler_events=tuple(events),
            performance_ratios={
                StragglerKind.DEVICE.value: self.stragglers.performance_ratios(),
                StragglerKind.COMMUNICATION.value: self.communication_stragglers.performance_ratios(),
            },
        )

    def _prepare(self, due: DueRecipe) -> _Local:
        recipe = due.recipe
        record: Capture | OptimizerSnapshot | CaptureFailure
        if recipe.recipe_class is RecipeClass.OPTIMIZER:
            assert self._optimizer is not None
            record = self._optimizer.get(recipe, due.step)
        else:
            record = self._capture.get(recipe, due.step)
        if isinstance(record, CaptureFailure):
            description: tuple[object, ...] = ("not-ready", str(recipe), due.step, record.reason)
            status = record.status
        else:
            description = record.describe()
            if isinstance(record, Capture):
                module = self._capture.module(recipe)
                description += (
                    tuple((n, str(p.dtype), tuple(p.shape)) for n, p in module.named_parameters()),
                    tuple((n, str(b.dtype), tuple(b.shape)) for n, b in module.named_buffers()),
                )
            status = ReplayStatus.OK
        digest = structured_signature(("scout-replay-readiness", 1, due.step, description))
        return _Local(due, record, status, digest)

    def _exchange_and_replay(self, step: int, locals_: list[_Local]) -> _Exchanged:
        by_class = {local.due.recipe.recipe_class: local for local in locals_}
        if self.peers.size == 1:
            rows = [self._readiness_row(by_class)]
        else:
            rows = self.peers.all_gather_int64(self._readiness_row(by_class))
        results: dict[RecipeClass, RecipeResult] = {}
        proceeding: list[_Local] = []
        for local in locals_:
            slot = 1 + _READINESS_SLOT * CLASS_ORDER.index(local.due.recipe.recipe_class)
            digests = [row[slot + 2] if row[slot] == 1 else MISSING for row in rows]
            statuses = [row[slot + 1] if row[slot] == 1 else MISSING for row in rows]
            schedule_verdict = classify_exact([row[0] for row in rows])
            decision = decide_readiness(digests, statuses)
            if schedule_verdict.status is not Status.AGREE and self.peers.size > 1:
                reason = "readiness: schedule digests differ"
            elif not decision.proceed:
                reason = decision.reason or "readiness"
            else:
                proceeding.append(local)
                continue
            if self.peers.size == 1:
                reason = "singleton"
            results[local.due.recipe.recipe_class] = RecipeResult(
                local.due.recipe, step, Status.INCONCLUSIVE, reason=reason
            )
        for local in proceeding:
            self._replay(local)
        timing: dict[str, Verdict] = {}
        compute_ms = {str(local.due.recipe): local.compute_s * 1e3 for local in proceeding}
        repetitions_ms = {
            str(local.due.recipe): tuple(t * 1e3 for t in local.repetitions_s)
            for local in proceeding
        }
        peer_compute_ms: dict[str, tuple[Any, ...]] = {}
        communication_ms: tuple[float, ...] = ()
        if proceeding:
            mine = self._evidence_row(proceeding)
            evidence_rows = [mine] if self.peers.size == 1 else self.peers.all_gather_int64(mine)
            if self.peers.size > 1 and getattr(self.peers, "timer", None) is not None:
                communication_ms = own_communication_ms(
                    [row[-_COMMUNICATION_SLOT:] for row in evidence_rows]
                )
            for local in proceeding:
                recipe_class = local.due.recipe.recipe_class
                slot = _EVIDENCE_SLOT * CLASS_ORDER.index(recipe_class)
                statuses = [row[slot] for row in evidence_rows]
                kinds = (
                    OPTIMIZER_EVIDENCE if recipe_class is RecipeClass.OPTIMIZER else MODULE_EVIDENCE
                )
                evidence = {
                    kind: [row[slot + 2 + _EVIDENCE_ORDER.index(kind)] for row in evidence_rows]
                    for kind in kinds
                }
                results[recipe_class] = combine_evidence(local.due.recipe, step, statuses, evidence)
                # STRAG-3: a peer whose replay did not complete has no compute time.
                times_ms = tuple(
                    row[slot + 1] / 1e3 if row[slot] == int(ReplayStatus.OK) else MISSING
                    for row in evidence_rows
                )
                peer_compute_ms[str(local.due.recipe)] = times_ms
                timing[str(local.due.recipe)] = classify_timing(times_ms, self.config.timing)
        ordered = tuple(results[c] for c in CLASS_ORDER if c in results)
        return _Exchanged(
            ordered, timing, compute_ms, communication_ms, peer_compute_ms, repetitions_ms
        )

    def _readiness_row(self, by_class: dict[RecipeClass, _Local]) -> list[int]:
        row = [self._schedule_digest]
        for recipe_class in CLASS_ORDER:
            local = by_class.get(recipe_class)
            row += [0, 0, 0] if local is None else [1, int(local.status), local.digest]
        return row

    def _evidence_row(self, proceeding: list[_Local]) -> list[int]:
        row = [0] * EVIDENCE_ROW_LENGTH
        for local in proceeding:
            slot = _EVIDENCE_SLOT * CLASS_ORDER.index(local.due.recipe.recipe_class)
            row[slot] = int(local.status)
            row[slot + 1] = round(local.compute_s * 1e6)
            for kind, value in local.evidence.items():
                row[slot + 2 + _EVIDENCE_ORDER.index(kind)] = value
        timer = getattr(self.peers, "timer", None)
        if timer is not None:  # COMM-1: the readiness exchange and broadcasts of this check
            calls = [-1] * _COMMUNICATION_SLOT
            for index, (entry_s, wait_s) in enumerate(timer.peek().calls[:_COMMUNICATION_CALLS]):
                calls[2 * index : 2 * index + 2] = [round(entry_s * 1e6), round(wait_s * 1e6)]
            row[-_COMMUNICATION_SLOT:] = calls
        return row

    # ----------------------------------------------------------------------------------------
    # Replay of one recipe
    # ----------------------------------------------------------------------------------------

    def _replay(self, local: _Local) -> None:
        """Sign local inputs, broadcast the source's, replay. Broadcasts always happen (a
        local failure must not make this peer skip a collective its peers enter)."""
        record = local.record
        source = self.config.source_position
        if isinstance(record, OptimizerSnapshot):
            assert self._optimizer is not None
            optimizer = self._optimizer
            self._guarded(local, lambda: {EvidenceKind.PARAMETERS: record.local_evidence()})
            self._guarded(
                local, lambda: {EvidenceKind.LIVE_UPDATED: optimizer.live_evidence(record)}
            )
            if self.peers.size > 1:
                self.peers.broadcast_(record.tensors(), source)

            def run_optimizer() -> dict[EvidenceKind, int]:
                inputs = record.local_evidence()

                def run() -> int:
                    with deterministic_algorithms(self.config.deterministic):
                        return optimizer.replay(record)

                device = (
                    record.segments[0].parameter.device if record.segments else torch.device("cpu")
                )
                updated, local.compute_s, local.repetitions_s = self._timed(device, run)
                return {EvidenceKind.INPUT: inputs, EvidenceKind.UPDATED: updated}

            self._guarded(local, run_optimizer)
            return
        assert isinstance(record, Capture)
        module = self._capture.module(local.due.recipe)
        self._guarded(local, lambda: {EvidenceKind.PARAMETERS: _module_state_signature(module)})
        if self.peers.size > 1:
            self.peers.broadcast_(record.tensors() + record.rng.tensors(), source)
        self._guarded(local, lambda: self._replay_module(local, module, record))

    def add_compute_hook(self, hook: Callable[[float], None]) -> RemovableHandle:
        """Call ``hook(elapsed_s)`` at the end of every timed replay repetition, inside its
        timed span, with the time measured so far on the replay clock (STRAG-1; opt-in, for
        faults: FAULT-3's ``slow_compute``)."""
        handle = RemovableHandle(self._compute_hooks)
        self._compute_hooks[handle.id] = hook
        return handle

    def _timed(
        self, device: torch.device, run: Callable[[], _Result]
    ) -> tuple[_Result, float, tuple[float, ...]]:
        """STRAG-1: ``timing_warmup_runs`` untimed runs, then ``timing_repetitions`` timed ones,
        each between two marks of the replay timer (TIMING-1: on CUDA events on the current
        stream, never a device-wide drain); returns the first run's result (the evidence), the
        median of the timed runs (the check's compute time, s) and every timed run (s).

        The first run is a warm-up (caches, allocator, lazy initialisation) whose time says
        more about the host than about the device; the median of the repetitions ignores one
        run in three that a descheduled thread or a page fault lengthened."""
        warmup, repetitions = self.config.timing_warmup_runs, self.config.timing_repetitions
        timer = self._timer(device)
        first: _Result | None = None
        spans: list[tuple[Mark, Mark]] = []
        for index in range(warmup + repetitions):
            start = timer.record()
            result = run()
            if index >= warmup:
                spans.append((start, self._measured(timer, start)))
            if index == 0:
                first = result
        assert first is not None  # repetitions >= 1 (ReplayConfig)
        # The repetitions are queued back to back; only now wait, for their marks alone.
        times = [self._elapsed_s(timer, start, end) for start, end in spans]
        return first, statistics.median(times), tuple(times)

    def _timer(self, device: torch.device) -> Timer:
        """STRAG-1: the timer of replay compute times. ``auto``: on a CPU the replaying
        thread's CPU time -- the CPU is the device, a replay's timed span holds no wait, and
        time the host gave its core to another process is host contention, not device speed;
        on a CUDA device events on the current stream (TIMING-2). ``wall``: events on CUDA,
        the wall clock elsewhere; ``cpu``: the thread's CPU time."""
        mode = self.config.timing_clock
        if mode == "cpu" or (mode == "auto" and device.type == "cpu"):
            return _THREAD_CPU_TIMER
        return timer_for(device) if device.type == "cuda" else WallTimer()

    def _measured(self, timer: Timer, start: Mark) -> Mark:
        """STRAG-1: the end mark of a timed replay, compute hooks included: they run inside the
        timed span and are told the time so far on the same timer (on CUDA this waits for the
        span's own marks -- only when a hook is installed, FAULT-3)."""
        if self._compute_hooks:
            elapsed = self._elapsed_s(timer, start, timer.record())
            for hook in tuple(self._compute_hooks.values()):
                hook(elapsed)
        return timer.record()

    def _elapsed_s(self, timer: Timer, start: Mark, end: Mark) -> float:
        """TIMING-6: the span's duration once its marks completed, bounded by
        ``timing_resolve_timeout_s``; a device that has not got there by then fails the
        replay (REPLAY_FAILED), it does not hang it."""
        elapsed = wait_elapsed_s(timer, start, end, timeout_s=self.config.timing_resolve_timeout_s)
        if elapsed is None:
            raise RuntimeError(
                f"replay timing: the device did not finish the timed replay within "
                f"timing_resolve_timeout_s={self.config.timing_resolve_timeout_s} s"
            )
        return elapsed

    def _guarded(self, local: _Local, work: Any) -> None:
        if local.status is not ReplayStatus.OK:
            return
        try:
            local.evidence.update(work())
        except NondeterministicReplay as exc:
            logger.warning(
                "scout: %s replay refused a nondeterministic kernel: %s", local.due.recipe, exc
            )
            local.status = ReplayStatus.NONDETERMINISTIC
        except Exception as exc:
            logger.warning("scout: %s replay failed: %r", local.due.recipe, exc)
            local.status = ReplayStatus.REPLAY_FAILED

    def _replay_module(
        self, local: _Local, module: nn.Module, capture: Capture
    ) -> dict[EvidenceKind, int]:
        evidence = {
            EvidenceKind.INPUT: structured_signature((capture.args, capture.kwargs)),
            EvidenceKind.RNG: structured_signature(capture.rng.as_structure()),
        }
        flags = {
            id(t): flag for t, flag in zip(capture.tensors(), capture.requires_grad, strict=True)
        }

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
            target: nn.Module = _WithoutOwnHooks(module)
            prefix = _WithoutOwnHooks.PREFIX
        else:
            own_parameters = dict(module.named_parameters())
            own_buffers = dict(module.named_buffers())
            target, prefix = module, ""
        parameters = {
            name: p.detach().clone().requires_grad_(p.requires_grad)
            for name, p in own_parameters.items()
        }
        buffers = {name: b.detach().clone() for name, b in own_buffers.items()}
        trainable = [(n, p) for n, p in parameters.items() if p.requires_grad]
        device = next(iter(parameters.values())).device if parameters else torch.device("cpu")
        substitutes = {prefix + name: t for name, t in {**parameters, **buffers}.items()}
        targets = grad_inputs + [p for _, p in trainable]

        def run() -> tuple[Any, Sequence[torch.Tensor | None]]:
            # One forward and backward on the isolated copies; every run installs the captured
            # RNG state, so the warm-up and the repetitions draw the same dropout masks.
            with (
                self._capture.suspended(),
                installed_rng_state(capture.rng),
                deterministic_algorithms(self.config.deterministic),
                capture.autocast.context(),
                torch.enable_grad(),
            ):
                output = functional_call(
                    target, substitutes, tuple(args), kwargs, strict=bool(prefix)
                )
                outputs = [o for o in tensor_leaves(output) if o.requires_grad]
                gradients: Sequence[torch.Tensor | None] = ()
                if outputs and targets:
                    cotangents = [self._cotangent(o, index) for index, o in enumerate(outputs)]
                    gradients = torch.autograd.grad(
                        outputs, targets, cotangents, allow_unused=True, materialize_grads=False
                    )
            return output, gradients

        (output, gradients), local.compute_s, local.repetitions_s = self._timed(device, run)
        gradients = list(gradients) or [None] * len(targets)
        evidence[EvidenceKind.OUTPUT] = structured_signature(
            map_tensors(lambda t: t.detach(), output)
        )
        evidence[EvidenceKind.INPUT_GRADIENT] = structured_signature(
            list(gradients[: len(grad_inputs)])
        )
        evidence[EvidenceKind.PARAMETER_GRADIENT] = structured_signature(
            {name: g for (name, _), g in zip(trainable, gradients[len(grad_inputs) :], strict=True)}
        )
        return evidence

    def _cotangent(self, output: torch.Tensor, index: int) -> torch.Tensor:
        """A fixed pseudo-random output gradient, identical on every peer (REPLAY-5)."""
        if not (output.is_floating_point() or output.is_complex()):
            return torch.zeros_like(output)
        generator = torch.Generator(device=output.device)
        generator.manual_seed(self.config.cotangent_seed + index)
        return torch.randn(
            output.shape, generator=generator, device=output.device, dtype=output.dtype
        )


class _WithoutOwnHooks(nn.Module):
    """Calls ``inner.forward`` directly: the inner module's own hooks do not run, its
    submodules' do. Holding ``inner`` as a child changes nothing in it."""

    PREFIX: Final = "inner."

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.forward(*args, **kwargs)


def _module_state_signature(module: nn.Module) -> int:
    """PARAMETERS: the live parameters and buffers of a module (REPLAY-3)."""
    return structured_signature(
        {
            "parameters": dict(module.named_parameters()),
            "buffers": dict(module.named_buffers()),
        }
    )


def own_communication_ms(calls_us: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """COMM-2: each peer's own communication time in ms for one check.

    ``calls_us[p]`` is peer ``p``'s ``entry_us, wait_us`` of each collective of the check, in
    call order, flattened (``-1`` pads absent calls). The peers of one collective return at
    about the same moment, so a peer's wait beyond the shortest wait in the group is time
    spent waiting for a later peer, not communicating: per call, own = entry + min(wait). A
    peer whose side of the path is slow has a long entry and the shortest wait; the peers
    waiting for it have a long wait, not a long entry. A peer's value for the check is its
    smallest own time over the calls every peer made: a slow side of the path slows every
    call, a descheduled thread one of them.
    """
    if not calls_us:
        return ()
    pairs = [list(zip(row[0::2], row[1::2], strict=True)) for row in calls_us]
    common = min(
        next((i for i, (entry, _) in enumerate(row) if entry < 0), len(row)) for row in pairs
    )
    if common == 0:
        return ()
    own = []
    for row in pairs:
        per_call = []
        for index in range(common):
            shared_us = min(peer[index][1] for peer in pairs)
            per_call.append((row[index][0] + shared_us) / 1e3)
        own.append(min(per_call))
    return tuple(own)
