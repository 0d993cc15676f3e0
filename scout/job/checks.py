"""The checks a job runs at the end of its steps (``scout.job.pipeline.Check``), on torch:
dense replay and expert replay (one replay runner each, spec/replay.md REPLAY-9), loop
stragglers (LOOP-1..LOOP-4) and the golden canary (spec/canary.md). Each gives its peer group's
results and straggler reports as a ``CheckOutput``; the pipeline exchanges them once.

A new kind of check (a failed checkpoint save) is one more class with ``run(step)`` returning a
``CheckOutput``, added to the list :func:`build_checks` returns. The live path's self-check
(spec/replay.md SELF-1..9) is not a check of its own: it is one more evidence group of the dense
replay, taken when a call is captured and exchanged in the rows replay already exchanges.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from scout.core.budget import CALIBRATION, Cadence
from scout.core.canary import CanaryOutcome
from scout.core.recipes import Intervals, RecipeClass, RecipeId, Schedule
from scout.core.verdict import Status
from scout.gate.model import Recipe
from scout.job import bench_switches
from scout.job.config import Config
from scout.job.pipeline import CheckOutput, Finding, GateFeed, Layout, replay_output
from scout.replay.arrival import LoopConfig, LoopTimer, untimed
from scout.replay.canary import CANARY_RECIPE, Canary, CanaryMonitor
from scout.replay.collectives import TorchPeerGroup
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer
from scout.replay.runner import ReplayRunner, StepReport
from scout.replay.stragglers import StragglerKind
from scout.reports import guard
from scout.reports.guard import Part
from scout.reports.hook_time import HOOK_TIME, now_ns
from scout.reports.kinds import ReportKind, SdcReason
from scout.reports.timing import timing_arguments

__all__ = ["CanaryCheck", "Cycle", "LoopStragglerCheck", "ReplayCheck", "build_checks", "dense_intervals",
           "expert_cadence", "group_names", "running_statistics"]

logger = logging.getLogger("scout")


def group_names(prefix: str, count: int) -> tuple[str, ...]:
    """The gate's names of a check's peer groups: ``dp`` for the one group of a plain
    data-parallel job, ``dp0``, ``dp1``, ... (``ep0``, ... for experts) otherwise."""
    return (prefix,) if count == 1 and prefix == "dp" else tuple(f"{prefix}{i}" for i in range(count))


class _NoOps:
    """These checks run their collectives themselves (blocking torch calls): ``run`` is a
    generator that yields no op, so the pipeline treats them like any rank program."""

    def resume_at(self, step: int) -> None:
        pass

    def step_begins(self) -> None:
        pass

    def straggler_trackers(self) -> Mapping[str, Any]:
        return {}

    def close(self) -> None:
        pass


class ReplayCheck(_NoOps):
    """One replay runner (dense or experts) as a check."""

    def __init__(self, name: str, runner: ReplayRunner, layout: Layout, hosts: Sequence[str],
                 notes: Sequence[str] = ()) -> None:
        self.name = name
        self.runner = runner
        self.layout = layout
        self.hosts = tuple(hosts)
        self.notes = tuple(notes)
        #: LAYOUT-2: the deepest stage's hidden layer count (the job's cycle is built on it), when
        #: the stages' counts were exchanged; 0: this rank's own is the job's.
        self.job_hidden_layers = 0
        #: LAYOUT-2: each group's catalog (recipe ids), when the groups' catalogs were exchanged
        #: (a pipeline stage may hold no embedding or no head); None: every group has this rank's.
        self.group_catalogs: tuple[tuple[str, ...], ...] | None = None

    def gate_recipes(self) -> list[Recipe]:
        """Every recipe of the job's groups, each applying to the groups whose catalog holds it."""
        if self.group_catalogs is None:
            return [Recipe(str(recipe), self.layout.names) for recipe in self.runner.catalog.recipes()]
        holders: dict[str, list[str]] = {}
        for name, catalog in zip(self.layout.names, self.group_catalogs, strict=True):
            for recipe in catalog:
                holders.setdefault(recipe, []).append(name)
        ordered = sorted(holders, key=RecipeId.parse)
        return [Recipe(recipe, tuple(holders[recipe])) for recipe in ordered]

    def due(self, step: int) -> bool:
        return bool(self.runner.schedule.due(step))

    def _at(self, step: int) -> None:
        if self.runner.step_count + 1 != step:
            raise RuntimeError(f"{self.name} is at step {self.runner.step_count + 1}, the job at step {step}: "
                               "call resume_at with the step the job restored")

    def quiet_step(self, step: int) -> None:
        """spec/budget.md BUDGET-14: the runner's step at a step where nothing is due (REPLAY-10)."""
        self._at(step)
        self.runner.keep_step()

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        self._at(step)
        due = bool(self.runner.schedule.due(step))
        report = self.runner.step()
        if not due:
            return None
        costs = {f"{self.name}_compute_s": sum(report.compute_ms.values()) / 1e3,
                 f"{self.name}_collectives_s": report.collective_ms / 1e3}
        output = replay_output(self.name, self.layout, report.results, report.straggler_events,
                               report.performance_ratios, self.hosts, costs)
        return attrs.evolve(output, timing=self._timing(report))
        yield  # a rank program

    def _timing(self, report: StepReport) -> tuple[dict[str, Any], ...]:
        """LOOP-6: this check's device and communication comparisons, each one timing record;
        nothing for a comparison that did not run."""
        stragglers = self.runner.stragglers
        if stragglers is None:
            return ()
        ranks = self.layout.groups[self.layout.index]
        common: dict[str, Any] = {"step": report.step, "group": self.layout.names[self.layout.index], "ranks": ranks}
        records = []
        device = report.evidence.get(StragglerKind.DEVICE.value)
        if report.timing and device is not None:
            verdicts = list(report.timing.values())
            decided = [v for v in verdicts if v.status is not Status.INCONCLUSIVE]
            status = (Status.ATTRIBUTED if any(v.status is Status.ATTRIBUTED for v in decided) else
                      Status.AGREE if decided else Status.INCONCLUSIVE)
            reason = None if decided else next((v.reason.value for v in verdicts if v.reason is not None), None)
            records.append(timing_arguments(
                "device", **common, times_ms=_summed_ms(report.peer_compute_ms, len(ranks)), evidence=device,
                confirmed=[ranks[p] for p in sorted(report.confirmed_stragglers)], status=status.value,
                reason=reason, slow_ratio=stragglers.device.config.slow_ratio))
        communication = report.evidence.get(StragglerKind.COMMUNICATION.value)
        if report.communication is not None and communication is not None:
            verdict = report.communication
            records.append(timing_arguments(
                "communication", **common, times_ms=report.communication_ms, evidence=communication,
                confirmed=[ranks[p] for p in sorted(report.confirmed_communication_stragglers)],
                status=verdict.status.value, reason=None if verdict.reason is None else verdict.reason.value,
                slow_ratio=stragglers.communication.config.slow_ratio))
        return tuple(records)

    def resume_at(self, step: int) -> None:
        self.runner.resume_at(step)

    def straggler_trackers(self) -> Mapping[str, Any]:
        stragglers = self.runner.stragglers
        if stragglers is None or self.name != "replay":  # the dense replay's (experts feed none)
            return {}
        return {"device": stragglers.device, "communication": stragglers.communication}

    def close(self) -> None:
        self.runner.close()


def _summed_ms(per_recipe_ms: Mapping[str, Sequence[Any]], size: int) -> list[float | None]:
    """Each peer's replay compute time over the check's recipes (ms), None where one is missing
    or not a finite number >= 0."""
    sums: list[float | None] = [0.0] * size
    for values in per_recipe_ms.values():
        for position, value in enumerate(values):
            total = sums[position]
            valid = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                     and value >= 0)
            sums[position] = None if total is None or not valid else total + float(value)
    return sums


class LoopStragglerCheck(_NoOps):
    """LOOP-1..LOOP-4: the rank its peers wait for at the step's collectives. Its check comes
    first in a step: the loop body of the step ends when ``job.step()`` begins."""

    name = "loop"

    def __init__(self, timer: LoopTimer, layout: Layout, hosts: Sequence[str], hidden: Sequence[Any] = ()) -> None:
        self.timer = timer
        self.layout = layout
        self.hosts = tuple(hosts)
        # LOOP-7: the forward window, from the first hidden layer's pre-hook to the last one's
        # forward hook -- registered now, after the hooks the layers already have.
        self._handles = [] if not hidden else [
            hidden[0].register_forward_pre_hook(
                lambda _module, _inputs: _loop_hook(timer.forward_started) if timer.measuring else None),
            hidden[-1].register_forward_hook(
                lambda _module, _inputs, _output: _loop_hook(timer.forward_ended) if timer.measuring else None)]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def gate_recipes(self) -> list[Recipe]:
        return []

    def due(self, step: int) -> bool:
        return step % self.timer.config.check_every_steps == 0

    def waited(self, entry_ns: int, exit_ns: int) -> None:
        """LOOP-1: scout's own wait for its peers at the start of ``job.step()`` (the agreement,
        spec/guard.md GUARD-4) is a wait of this step's loop body, not work of the rank's."""
        self.timer.collective(entry_ns, exit_ns)

    def step_begins(self) -> None:
        self.timer.begin_step()

    def straggler_trackers(self) -> Mapping[str, Any]:
        return {"loop": self.timer.tracker, "forward": self.timer.forward_tracker}

    def quiet_step(self, step: int) -> None:
        """spec/budget.md BUDGET-14: the loop body of ``step`` ended (not a check step: no exchange)."""
        self.timer.end_step(step)

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        check = self.timer.end_step(step)
        if check is None:
            return None
        if guard.INJECTING:  # after the check's exchange: its peers are not left waiting
            guard.inject("loop.check")
        forward = check.forward
        ratios = {"loop": check.performance_ratios}
        if forward is not None:
            ratios["forward"] = forward.performance_ratios
        output = replay_output(self.name, self.layout, (), check.events, ratios, self.hosts)
        if check.verdict is None:  # LOOP-6: nothing was compared (a group of one, disabled, steps differ)
            return output
        timing = [self._timing("loop", check.step, check.loop_ms, check.evidence, check.confirmed,
                               check.verdict.status.value, check.reason)]
        if forward is not None and forward.verdict is not None:  # LOOP-7
            timing.append(self._timing("forward", check.step, forward.forward_ms, forward.evidence, forward.confirmed,
                                       forward.verdict.status.value, forward.reason))
        return attrs.evolve(output, timing=tuple(timing))
        yield  # a rank program

    def _timing(self, kind: str, step: int, times_ms: Sequence[float | None], evidence: Sequence[float | None],
                confirmed: frozenset[int], status: str, reason: str | None) -> dict[str, Any]:
        ranks = self.layout.groups[self.layout.index]
        return timing_arguments(
            kind, step=step, group=self.layout.names[self.layout.index], ranks=ranks, times_ms=times_ms,
            evidence=evidence, confirmed=[ranks[p] for p in sorted(confirmed)], status=status, reason=reason,
            slow_ratio=self.timer.config.straggler.slow_ratio)


class CanaryCheck(_NoOps):
    """CANARY-3..CANARY-8 at every cycle end, before the boundary (CANARY-7): the decision is
    job-wide already (every rank's readings are exchanged), so its feed needs no exchange."""

    name = "canary"

    def __init__(self, monitor: CanaryMonitor, layout: Layout, cycle_steps: int) -> None:
        self.monitor = monitor
        self.layout = layout
        self.cycle_steps = cycle_steps
        self.origin_step = 0  # BUDGET-5: cycles are counted from here

    def gate_recipes(self) -> list[Recipe]:
        return [Recipe(str(CANARY_RECIPE), self.layout.names)]

    def due(self, step: int) -> bool:
        # The cycle's end counted from its origin (BUDGET-5), as run() finds it: GUARD-3's empty
        # output at a due step that failed keeps the exchange's shape only where the two agree.
        return bool(self.cycle_steps) and (step - self.origin_step) % self.cycle_steps == 0

    def quiet_step(self, step: int) -> None:
        """spec/budget.md BUDGET-14: the canary has nothing to keep between cycle ends."""

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        if not self.due(step):
            return None
        decision = self.monitor.check(step)
        if guard.INJECTING:  # after the canary's exchange: the other ranks are not left waiting
            guard.inject("canary.check")
        results = CanaryMonitor.gate_results(decision, step, self.layout.groups)
        findings: tuple[Finding, ...] = ()
        if decision.ranks:
            reason = (SdcReason.CANARY_COMMON_MODE if decision.outcome is CanaryOutcome.COMMON_MODE
                      else SdcReason.CANARY_CHANGED)
            findings = (Finding(ReportKind.SDC, reason, tuple(decision.ranks), step, {
                "recipe": str(CANARY_RECIPE), "outcome": decision.outcome.value, "classes": list(decision.classes),
                "detail": decision.reason}),)
        feed = GateFeed(str(CANARY_RECIPE), step, dict(zip(self.layout.names, results, strict=True)), findings)
        return CheckOutput(self.name, self.layout, feeds=(feed,))
        yield  # a rank program


def _loop_hook(action: Callable[[], None]) -> None:
    """LOOP-7's forward-window hooks on the training thread (spec/guard.md GUARD-3): after a
    failure of the loop part on this rank they do nothing, and a failure never reaches the forward."""
    if not guard.running(Part.LOOP):
        return
    started = now_ns()
    try:
        if guard.INJECTING:
            guard.inject("loop.forward_hook")
        action()
    except Exception as error:
        guard.failed(Part.LOOP, error, "forward hook")
    HOOK_TIME.spent_ns += now_ns() - started  # spec/budget.md BUDGET-10


def loop_listener(listener: Callable[..., Callable[[], None]]) -> Callable[..., Callable[[], None] | None]:
    """A loop timer's collective listener (LOOP-5) under the loop part's boundary (GUARD-3): silent
    after a failure here, and what it returns at the collective's completion is guarded too."""

    def guarded_finish(finish: Callable[[], None]) -> Callable[[], None]:
        def finished() -> None:
            try:
                finish()
            except Exception as error:
                guard.failed(Part.LOOP, error, "collective listener")

        return finished

    def listen(*args: Any, **kwargs: Any) -> Callable[[], None] | None:
        if not guard.running(Part.LOOP):
            return None
        try:
            finish = listener(*args, **kwargs)
        except Exception as error:
            guard.failed(Part.LOOP, error, "collective listener")
            return None
        return None if finish is untimed else guarded_finish(finish)  # LOOP-8: nothing to call

    return listen


def running_statistics(hidden: Sequence[nn.Module]) -> list[str]:
    """spec/replay.md CAP-9: ``hidden.<layer>.<name>`` of every module of a hidden layer that
    tracks running statistics (BatchNorm-style), SyncBatchNorm excepted."""
    return [f"hidden.{layer}.{name or type(module).__name__}" for layer, block in enumerate(hidden)
            for name, module in block.named_modules()
            if getattr(module, "track_running_stats", False) and getattr(module, "running_mean", None) is not None
            and not isinstance(module, nn.SyncBatchNorm)]


@attrs.frozen
class Cycle:
    """The replay cycle's length in steps and what sets it (spec/replay.md REC-4, REC-8)."""

    steps: int
    set_by: str
    note: str = ""  # why it is longer than it could be (MOE-10)

    @classmethod
    def of(cls, schedule: Schedule) -> Cycle:
        def length(c: RecipeClass) -> tuple[int, int]:  # a tie goes to the class with more recipes
            return schedule.class_cycle_steps(c), schedule.catalog.class_size(c)

        longest = max(schedule.active_classes(), default=None, key=length)
        if longest is None:
            return cls(0, "no recipe class is active")
        size, interval = schedule.catalog.class_size(longest), schedule.intervals.for_class(longest)
        per_check = min(size, schedule.intervals.per_check(longest))
        each = "one" if per_check == 1 else str(per_check)
        return cls(schedule.cycle_length_steps(),
                   f"{size} {longest.value} recipe(s), {each} every {interval} step(s)")

    def longest(self, other: Cycle) -> Cycle:
        return other if other.steps > self.steps else self


def dense_intervals(cadence: Cadence, layers: int) -> Intervals:
    """REC-2, BUDGET-2: a hidden check every ``interval`` steps replaying ``lanes`` layers; the
    embedding, the head and the optimizer slice once per cycle (``interval x ceil(layers /
    lanes)`` steps; never, without hidden layers)."""
    cycle = cadence.interval_steps * -(-layers // cadence.lanes)
    return Intervals(embedding_steps=cycle, hidden_steps=cadence.interval_steps, output_steps=cycle,
                     optimizer_steps=cycle, hidden_recipes_per_check=cadence.lanes)


def expert_cadence(dense_cycle_steps: int, expert_recipes: int, max_per_step: int) -> tuple[int, int]:
    """spec/moe.md MOE-10: ``(interval, recipes per check)`` that fit the expert recipes into the
    dense cycle ``C``: one recipe every ``C // n_e`` steps when ``n_e <= C``, else a check every
    step replaying ``ceil(n_e / C)`` recipes, at most ``max_per_step``."""
    if max_per_step < 1:
        raise ValueError(f"max_expert_replays_per_step must be >= 1, got {max_per_step!r}")
    dense, count = max(1, dense_cycle_steps), max(1, expert_recipes)
    if count <= dense:
        return dense // count, 1
    return 1, min(-(-count // dense), max_per_step)


def build_checks(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    peers: TorchPeerGroup,
    config: Config,
    *,
    rank: int,
    hosts: Sequence[str],
    exchange: Callable[[Any], list[Any]],
    run_dir: str,
    add_collective_listener: Callable[[Callable[..., Callable[[], None] | None]], None],
    names: Sequence[str] | None = None,
    loop_check: bool = True,
) -> tuple[list[Any], Cycle]:
    """Every check the configuration asks for, in the order they run at a step, and the
    replay cycle (the longest schedule's over the whole job, REC-4, with what sets it: REC-8).
    ``names``: the gate's names of the peers' groups (LAYOUT-2; default ``dp``, ``dp0``, ...);
    ``loop_check`` False: no loop straggler check (LAYOUT-3: waits on neighbours unpublished).
    Collective over the world."""
    modules = RecipeModules.discover(model)
    if rank == 0 and (stats := running_statistics(modules.hidden)):
        logger.warning("scout: hidden layer module(s) %s keep running statistics that each replica updates from its "
                       "own batch, so their replays can differ and stay Inconclusive, and then no checkpoint is "
                       "verified (spec/replay.md CAP-9): convert them with "
                       "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping it, or use a norm "
                       "without running statistics (LayerNorm, GroupNorm)", ", ".join(stats))
    # LAYOUT-2: pipeline stages may hold different numbers of layers; every stage's schedule is
    # built on the deepest stage's, so the job has one cycle (REC-4).
    layers = max(int(count) for count in exchange(len(modules.hidden)))
    # BUDGET-8: an explicit interval; else the calibration cadence until the budget decides (BUDGET-5).
    explicit = config.replay_interval_steps
    intervals = dense_intervals(Cadence(explicit) if explicit is not None else CALIBRATION, layers)
    # STRAG-1: with straggler_repetitions = 0 the run that gives the SDC evidence is also the
    # one timed (no extra replay); n > 0 times n repetitions after it.
    repetitions = config.straggler_repetitions
    warmup_runs, timed_runs = (1 if repetitions else 0), max(1, repetitions)
    replayer = Replayer(model, optimizer, peers, ReplayConfig(
        intervals=intervals, max_capture_bytes=config.max_capture_bytes, replay_rows=config.replay_rows,
        timing_warmup_runs=warmup_runs, timing_repetitions=timed_runs, self_check=config.self_check), modules)
    dense_names = tuple(names) if names is not None else group_names("dp", len(peers.partition))
    dense = Layout.of(peers.partition, dense_names, rank)
    cycle = Cycle.of(replayer.schedule)
    # Loop stragglers: arrival at the step's collectives, timed by the instrumentation and DDP's
    # bucket hook, checked every loop_check_steps.
    checks: list[Any] = [ReplayCheck("replay", replayer, dense, hosts)]
    checks[0].job_hidden_layers = layers
    if loop_check and "loop_timer" not in bench_switches.parts_off():  # a benchmark's private switch
        # LOOP-8: each check compares the loop_check_steps steps before it, however far apart.
        loop = LoopTimer(peers, LoopConfig(check_every_steps=config.loop_check_steps,
                                           measured_steps=config.loop_check_steps))
        add_collective_listener(loop_listener(loop.collective_started))  # LOOP-5: from enqueue to completion
        checks.insert(0, LoopStragglerCheck(loop, dense, hosts, modules.hidden))
    if config.moe_catalog is not None:  # spec/moe.md: experts replicated like the dense layers (EP = 1)
        from scout.replay.moe import ExpertLayers, ExpertReplayConfig, ExpertReplayer
        from scout.replay.moe_catalog import load_catalog

        layers_of_experts = ExpertLayers.discover(model, config.expert_names())
        catalog = load_catalog(config.moe_catalog, layers_of_experts)
        expert_peers = TorchPeerGroup(partition=peers.partition, timeout_s=config.collective_timeout_s)
        keys = catalog.expert_keys()
        interval, per_check = expert_cadence(cycle.steps, len(keys), config.max_expert_replays_per_step)
        experts = ExpertReplayer(layers_of_experts, expert_peers, keys,
                                 ExpertReplayConfig(expert_steps=interval, expert_recipes_per_check=per_check,
                                                    timing_warmup_runs=warmup_runs, timing_repetitions=timed_runs))
        expert_cycle = Cycle.of(experts.schedule)
        if expert_cycle.steps > cycle.steps:  # MOE-10: the bound cut the expert recipes per step
            expert_cycle = attrs.evolve(expert_cycle, note=(
                f"the dense recipes' cycle is {cycle.steps} steps and at most max_expert_replays_per_step="
                f"{config.max_expert_replays_per_step} expert recipes are replayed per step; a larger "
                "max_expert_replays_per_step, fewer --n-exec values in the MoE catalog or a larger "
                "replay_interval_steps bring it closer"))
        cycle = cycle.longest(expert_cycle)
        checks.append(ReplayCheck("experts", experts, Layout.of(peers.partition, group_names(
            "ep", len(peers.partition)), rank), hosts, _coverage_notes(catalog)))
    cycle = _job_wide(checks, cycle, exchange)
    if config.canary:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        monitor = CanaryMonitor(Canary(device=device), exchange, rank=rank, golden_path=f"{run_dir}/gate/canary.json")
        checks.append(CanaryCheck(monitor, dense, cycle.steps))
    return checks, cycle


def _job_wide(checks: Sequence[Any], cycle: Cycle, exchange: Callable[[Any], list[Any]]) -> Cycle:
    """LAYOUT-2, REC-4: every replay check learns each group's catalog (its first rank's: a
    group's members agree on theirs, READY-1), and the job's cycle is the longest of any rank's.
    One exchange over the world."""
    replays = [check for check in checks if isinstance(check, ReplayCheck)]
    mine = ((cycle.steps, cycle.set_by, cycle.note),
            tuple(tuple(str(r) for r in check.runner.catalog.recipes()) for check in replays))
    gathered = exchange(mine)
    for index, check in enumerate(replays):
        check.group_catalogs = tuple(tuple(gathered[group[0]][1][index]) for group in check.layout.groups)
    steps, set_by, note = max((tuple(row[0]) for row in gathered), key=lambda c: int(c[0]))
    return cycle if int(steps) == cycle.steps else Cycle(int(steps), str(set_by), str(note))


def _coverage_notes(catalog: Any) -> tuple[str, ...]:
    """MOE-6: what heterogeneous routing the expert recipes cover, for certificates."""
    qualified = catalog.qualified_templates()
    if not qualified:
        return ("heterogeneous MoE routing: no template qualified; only the replayed per-expert regimes are covered",)
    return (f"heterogeneous MoE routing: covered only for the qualified templates {', '.join(qualified)}",)
