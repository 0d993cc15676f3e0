"""One check step of a job as a pipeline (docs/design.md §7.4): checks → one exchange →
aggregate → gate → reports → policy. ``scout.attach``'s ``Job`` drives it on every rank over
torch.distributed; the simulator drives the same functions with simulated checks
(``scout.scenarios.replay_job``), as it runs the observer's driver. No torch here.

Theory of operation. :func:`run_step` is a rank program (``scout.transport.program``): it
yields transport ops and receives their results, so any binding can run it.

1. every :class:`Check` of the rank runs (its own replay collectives inside) and gives a
   :class:`CheckOutput` -- its peer group's results and straggler reports -- or None when
   nothing was due at this step (a function of the step: the same on every rank);
2. :func:`scout.job.aggregate.exchange_outputs` exchanges every check's output once, over the
   whole job (group leaders carry their group's; nothing when every check has one group);
   :func:`scout.job.aggregate.merge` turns what arrived into job-wide :class:`GateFeed` values
   and straggler reports -- alike on every rank;
3. the gate's writer (one rank, :class:`scout.job.gate_driver.GateDriver`) steps the gate with
   each feed and turns every effect into reports; the other reports of the step follow;
4. :func:`decide` applies the fault policy alike on every rank: ``on_sdc = "restart"`` stops
   the job at this step on every rank (:class:`Stop`).

In a job (``pipeline.boundary`` set) each of these is guarded (spec/guard.md): a check, the merge
and the gate's writer that raise are recorded as their part's failure and the step goes on -- a
check that was due gives an empty output, so the exchange keeps the same shape on every rank
(GUARD-3) -- and a part that is off (GUARD-4) is no longer run. Without a boundary (the
simulator) an exception propagates.

At a replay cycle's end the gate closes the cycle, and the job saves a checkpoint when one is
due (:attr:`StepOutcome.checkpoint_due`), then reports the capture with :meth:`Pipeline.captured`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Protocol

import attrs

from scout.core.failure import FailureClass
from scout.core.recipes import RecipeResult
from scout.core.sdc_reports import SdcReportCounter
from scout.core.straggler.tracking import StragglerEvent
from scout.gate.model import Artifact, CheckpointId, Recipe
from scout.job import aggregate
from scout.job.gate_driver import GateDriver, Reporter, RestoreDecision
from scout.reports import guard
from scout.reports.guard import Boundary, Part
from scout.reports.kinds import ReportKind, RestartReason, straggler_record_arguments
from scout.transport.program import Op

__all__ = [
    "Check",
    "CheckOutput",
    "FaultDetected",
    "Finding",
    "GateFeed",
    "Layout",
    "Pipeline",
    "StepOutcome",
    "Stop",
    "decide",
    "replay_output",
    "run_step",
]


@attrs.frozen
class Layout:
    """The peer groups of one check: their names (as the gate knows them) and global ranks,
    and where this rank sits."""

    names: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    index: int  # this rank's group
    position: int  # this rank's position in it

    @classmethod
    def of(cls, groups: Sequence[Sequence[int]], names: Sequence[str], rank: int) -> Layout:
        members = tuple(tuple(int(r) for r in g) for g in groups)
        index = next((i for i, g in enumerate(members) if rank in g), None)
        if index is None or len(names) != len(members):
            raise ValueError(f"rank {rank} is in none of the groups {[list(g) for g in members]}, or the "
                             f"{len(names)} names {list(names)} do not name them")
        return cls(tuple(names), members, index, members[index].index(rank))

    @property
    def leader(self) -> bool:
        """Every member of a group decides alike; its first member speaks for it."""
        return self.position == 0


@attrs.frozen
class Finding:
    """A fault a check found, as the report names it: global ranks, a stable reason code."""

    kind: ReportKind
    reason: str
    ranks: tuple[int, ...]
    step: int
    evidence: Mapping[str, Any]


@attrs.frozen
class GateFeed:
    """One recipe's job-wide result: one RecipeResult per peer group that answered (the gate
    makes the others MISSING) and the findings its attributed groups name."""

    recipe: str
    step: int
    results: Mapping[str, RecipeResult]  # group name -> result
    findings: tuple[Finding, ...] = ()


@attrs.frozen
class CheckOutput:
    """What one check gave on this rank at one step. ``results`` and ``stragglers`` are its
    group's (every member holds the same; the exchange carries the leader's); ``feeds`` are
    job-wide already (the canary decides over the whole job)."""

    check: str
    layout: Layout
    results: tuple[RecipeResult, ...] = ()
    stragglers: tuple[Mapping[str, Any], ...] = ()  # ``scout.reports.make_record`` arguments
    feeds: tuple[GateFeed, ...] = ()
    costs_s: Mapping[str, float] = attrs.Factory(dict)
    timing: tuple[Mapping[str, Any], ...] = ()  # LOOP-6: ``scout.reports.timing.timing_arguments``


class Check(Protocol):
    """One kind of check a job runs at the end of its steps."""

    @property
    def name(self) -> str: ...

    @property
    def layout(self) -> Layout: ...

    def gate_recipes(self) -> Sequence[Recipe]:
        """The recipes it feeds to the gate, with the groups they apply to (GATE config)."""
        ...

    def due(self, step: int) -> bool:
        """Whether ``step`` is one of its check steps: a function of the step alone, the same on
        every rank (GUARD-3: a check that fails at a due step still gives an output)."""
        ...

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        """Check ``step`` (may yield transport ops); None when nothing was due."""
        ...

    def resume_at(self, step: int) -> None: ...

    def step_begins(self) -> None:
        """The training loop's next step begins now (LOOP-1: scout's own work is not loop work)."""
        ...

    # Optional (spec/budget.md BUDGET-14): ``quiet_step(step)``, the check's own step-keeping at a
    # step where it is not due -- what ``run`` does there, without a generator. A check without it
    # makes every step go through ``run_step``.

    def straggler_trackers(self) -> Mapping[str, Any]:
        """Its straggler trackers by kind (``device``, ``communication``, ``loop``), for the
        per-rank stats the ops sidecar exports (docs/metrics.md); empty if it has none."""
        ...

    def close(self) -> None: ...


@attrs.frozen
class Stop:
    """The fault policy stops the job at ``step`` on every rank."""

    kind: ReportKind
    step: int
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    reason: str
    restarts_spent: bool = False  # RECOVERY-5: the launcher has no restart left


class FaultDetected(RuntimeError):
    """Raised by ``job.step()`` on every rank at the same step when a fault's policy is
    ``restart``: let it end the process, and the launcher (``torchrun --max-restarts``)
    restarts the job; ``job.restore()`` then resumes from the checkpoint the recovery table
    picks."""

    def __init__(self, kind: str, step: int, ranks: Sequence[int], hosts: Sequence[str], reason: str,
                 restarts_spent: bool = False) -> None:
        self.kind, self.step, self.ranks, self.hosts, self.reason = kind, step, tuple(ranks), tuple(hosts), reason
        self.restarts_spent = restarts_spent
        where = f" on {', '.join(hosts)}" if hosts else ""
        then = ("the launcher's restarts are spent, so the job stops here (RECOVERY-5)" if restarts_spent else
                "the job stops so that the launcher restarts it from a trusted checkpoint")
        super().__init__(f"scout: {kind} at step {step}: rank(s) {list(ranks)}{where} ({reason}); {then}")

    @classmethod
    def of(cls, stop: Stop) -> FaultDetected:
        return cls(stop.kind.value, stop.step, stop.ranks, stop.hosts, stop.reason, stop.restarts_spent)


class CheckpointSaveFailed(RuntimeError):
    """Raised by ``job.step()`` on every rank when a checkpoint save failed and
    ``on_checkpoint_error = "stop"`` (spec/gate.md GATE-40); the ``checkpoint`` report
    ``save-failed`` in ``run_dir`` names the path and the error."""


@attrs.frozen
class StepOutcome:
    step: int
    stop: Stop | None = None
    checkpoint_due: bool = False


def replay_output(name: str, layout: Layout, results: Sequence[RecipeResult], events: Sequence[StragglerEvent],
                  ratios: Mapping[str, Sequence[float | None]], hosts: Sequence[str],
                  costs_s: Mapping[str, float] | None = None) -> CheckOutput:
    """A replay check's output (dense or experts, on torch or simulated): its group's results
    and a report for every confirmation or recovery of its straggler tests (STRAG-21)."""
    by_rank = dict(enumerate(hosts))
    stragglers = tuple(straggler_record_arguments(event, hosts=by_rank, group_ratios=ratios.get(event.kind.value))
                       for event in events)
    return CheckOutput(name, layout, tuple(results), stragglers, costs_s=dict(costs_s or {}))


def decide(findings: Sequence[Finding], *, on_sdc: str, hosts: Sequence[str]) -> Stop | None:
    """The fault policy, alike on every rank from the same findings: with ``on_sdc =
    "restart"`` an SDC stops the job at the step it was found, naming every rank it found."""
    sdc = [f for f in findings if f.kind is ReportKind.SDC]
    if on_sdc != "restart" or not sdc:
        return None
    ranks = tuple(sorted({rank for finding in sdc for rank in finding.ranks}))
    return Stop(ReportKind.SDC, sdc[0].step, ranks, tuple(sorted({hosts[r] for r in ranks})), sdc[0].reason)


class Pipeline:
    """One rank's checks, exchange, gate (on the writer rank), reports and policy."""

    def __init__(
        self,
        checks: Sequence[Check],
        *,
        rank: int,
        world_size: int,
        hosts: Sequence[str],
        groups: Sequence[Sequence[int]],
        on_sdc: str,
        cycle_steps: int,
        checkpoint_every_cycles: int,
        reporter: Reporter,
        gate: GateDriver | None,
        timeout_s: float,
        clock: Callable[[], float] | None = None,
        boundary: Boundary | None = None,
    ) -> None:
        self.checks = tuple(checks)
        self.rank = rank
        self.world_size = world_size
        self.hosts = tuple(hosts)
        self.groups = tuple(tuple(g) for g in groups)  # the replica groups, for the restart report
        self.on_sdc = on_sdc
        self.cycle_steps = cycle_steps
        self.checkpoint_every_cycles = checkpoint_every_cycles
        self.checkpoint_every_steps = cycle_steps * checkpoint_every_cycles
        self.origin_step = 0  # BUDGET-5: cycles are counted from here
        self.reporter = reporter
        self.gate = gate
        self.timeout_s = timeout_s
        self.clock = clock
        #: Seconds spent per part of the pipeline (``replay_s``, ``gate_and_reports_s``, ...).
        self.costs: dict[str, float] = {}
        #: spec/guard.md: this rank's record of scout's failures (None: exceptions propagate).
        self.boundary = boundary
        #: GUARD-6: the gate still takes cycle boundaries (no part that feeds it is off), and
        #: scout still saves checkpoints.
        self.certifying = True
        self.saving = True
        #: GUARD-6: the gate's writer stopped after a failure; the SDC findings are then written
        #: here, once per rank and recipe as GATE-41 counts them.
        self.gate_stopped = False
        self._sdc_counts = SdcReportCounter()
        #: LAYOUT-3: why the loop straggler check is off for this layout (None: it is on, or no
        #: checks); the restart report carries it, so that ``scout report`` can say it.
        self.loop_check_off: str | None = None
        #: BUDGET-14: every check keeps its steps by itself, so a step may be quiet.
        self._quiet_capable = all(callable(getattr(check, "quiet_step", None)) for check in self.checks)

    def active_checks(self) -> list[Check]:
        """The checks that are not off (GUARD-4), in their order."""
        boundary = self.boundary
        if boundary is None or not boundary.off:
            return list(self.checks)
        return [check for check in self.checks if not boundary.is_off(Part(check.name))]

    def stop_gate(self) -> None:
        """GUARD-3, GUARD-6: the gate's writer takes no more events, at once (it has no collective);
        every rank stops saving checkpoints at the part's off step (``certifying``), and before it
        rank 0 refuses the save in the broadcast that precedes every save."""
        if self.gate is not None:
            self.gate_stopped = True
        self.gate = None

    def report_findings(self, findings: Sequence[Finding]) -> None:
        """GUARD-6: with the gate stopped, its SDC reports (GATE-41's counting) come from here."""
        for finding in findings:
            recipe = str(finding.evidence.get("recipe", ""))
            count = self._sdc_counts.observe(recipe, finding.ranks, finding.step)
            if count.report:
                self.reporter.record(finding.kind, finding.reason, ranks=finding.ranks, step=finding.step,
                                     evidence={**finding.evidence, "counts": list(count.counts),
                                               "first_steps": list(count.first_steps), "gate": "stopped"})

    def _failed(self, part: Part, error: Exception, where: str = "job.step") -> None:
        """GUARD-3: record a failure of ``part``; without a boundary, propagate it."""
        if self.boundary is None:
            raise error
        self.boundary.failed(part, error, where)

    def _failed_check(self, check: Check, error: Exception) -> None:
        if self.boundary is None:
            raise error
        self.boundary.failed(Part(check.name), error, "job.step")

    def set_cycle(self, cycle_steps: int, origin_step: int) -> None:
        """BUDGET-5: cycles of ``cycle_steps`` steps from ``origin_step`` on (a boundary), and a
        checkpoint every ``checkpoint_every_cycles`` of them."""
        self.cycle_steps, self.origin_step = cycle_steps, origin_step
        self.checkpoint_every_steps = cycle_steps * self.checkpoint_every_cycles

    def self_check_before(self, optimizer: Any) -> None:
        """SELF-9: run the live self-check at ``optimizer``'s pre-step hook, for an optimizer that
        steps the model without being given to ``attach`` (DeepSpeed's inner optimizer under ZeRO,
        whose parameter writes no version counter shows); with the optimizer given to ``attach``
        the replay check does this itself (``scout.job.attach.Job.self_check_before``)."""
        for check in self.checks:
            hook = getattr(getattr(check, "runner", None), "self_check_before", None)
            if callable(hook):
                hook(optimizer)

    def cycle_ends(self, step: int) -> bool:
        """BUDGET-5: a replay cycle (the gate's) ends at ``step``, counted from the current cadence's
        origin (the budget's exchange and the gate's boundary are there)."""
        return self.cycle_steps > 0 and (step - self.origin_step) % self.cycle_steps == 0

    def quiet(self, step: int) -> bool:
        """spec/budget.md BUDGET-14: nothing of the pipeline's runs at ``step`` -- no cycle ends there
        and no check that is on is due -- and every check keeps its steps by itself. The same on
        every rank: the cycle, its origin, the checks' schedules and the parts off are."""
        if not self._quiet_capable or self.cycle_ends(step):
            return False
        return not any(check.due(step) for check in self.active_checks())

    def quiet_step(self, step: int) -> None:
        """BUDGET-14: each check's step-keeping at a quiet step, guarded as in :func:`run_step`
        (GUARD-3: a check that raises is recorded as its part's failure, the step goes on)."""
        for check in self.active_checks():
            try:
                check.quiet_step(step)  # type: ignore[attr-defined]  # Pipeline.quiet checked it has one
            except Exception as error:
                self._failed_check(check, error)

    def straggler_trackers(self) -> dict[str, Any]:
        """Every check's straggler trackers by kind (``scout.ops.launch.NodeOps.after_step``)."""
        return {kind: tracker for check in self.checks for kind, tracker in check.straggler_trackers().items()}

    def _cost(self, name: str, seconds: float) -> None:
        self.costs[name] = self.costs.get(name, 0.0) + seconds

    def decide_restore(self, failure: FailureClass | None, *, checkpoints: bool) -> RestoreDecision:
        """Where an attempt starts (the gate's writer decides; ``scout.job.gate_driver``)."""
        if self.gate is None:
            return RestoreDecision(0, None, failure, None, 0)
        return self.gate.decide_restore(failure, checkpoints=checkpoints)

    def begin(self, decision: RestoreDecision, *, lost: Sequence[str] = ()) -> None:
        """The attempt starts at ``decision.step`` on every rank: the checks resume there, the
        gate restarts and opens a cycle, the ``restart`` report says where and why (and which
        chosen checkpoints were found without files on the way, RECOVERY-7)."""
        for check in self.checks:
            check.resume_at(decision.step)
        evidence = {"cycle_steps": self.cycle_steps, "checkpoint_every_steps": self.checkpoint_every_steps,
                    "world_size": self.world_size, "hosts": list(self.hosts), "groups": [list(g) for g in self.groups]}
        if lost:
            evidence["lost"] = list(lost)
        if self.loop_check_off is not None:
            evidence["loop_check_off"] = self.loop_check_off
        if self.gate is not None:
            self.gate.begin(decision, evidence=evidence)
        else:
            self.reporter.record(ReportKind.RESTART, RestartReason.STARTED, step=decision.step,
                                 evidence={"failure": None, "choice": None, **evidence})
        self.step_begins()

    def waited(self, entry_ns: int, exit_ns: int) -> None:
        """Scout waited for its peers between these monotonic times, in a collective the
        instrumentation does not see (the agreement, spec/guard.md GUARD-4): a check that times
        the loop counts it as a wait, not as the rank's own work (LOOP-1)."""
        for check in self.active_checks():
            waited = getattr(check, "waited", None)
            if waited is None:
                continue
            try:
                waited(entry_ns, exit_ns)
            except Exception as error:  # GUARD-1
                self._failed_check(check, error)

    def step_begins(self) -> None:
        for check in self.active_checks():
            try:
                check.step_begins()
            except Exception as error:  # GUARD-1
                self._failed_check(check, error)

    def lost(self, checkpoint: CheckpointId, detail: str) -> None:
        """The chosen checkpoint has no files (every rank; the gate's writer records it, GATE-42)."""
        if self.gate is not None:
            self.gate.lost(checkpoint, detail)

    def captured(self, step: int, artifact: Artifact | None = None) -> None:
        """The checkpoint of ``step`` is complete on stable storage (every rank); ``artifact``:
        the framework wrote it, there (spec/frameworks.md FRAME-6)."""
        if self.gate is not None:
            self.gate.captured(step, artifact)

    def close(self) -> None:
        for check in self.checks:
            check.close()
        if self.gate is not None:
            self.gate.close()


def run_step(pipeline: Pipeline, step: int) -> Generator[Op, Any, StepOutcome]:
    """One step through the pipeline (module docstring); alike on every rank."""
    clock = pipeline.clock
    outputs: list[CheckOutput] = []
    for check in pipeline.active_checks():
        started = clock() if clock else 0.0
        due = check.due(step)
        try:
            output = yield from check.run(step)
        except Exception as error:  # GUARD-3: its collectives were entered before it raised
            pipeline._failed_check(check, error)
            output = None
        if output is None and due:
            output = CheckOutput(check.name, check.layout)  # GUARD-3: nothing from this rank's group
        if output is not None:
            outputs.append(output)
            if clock:
                pipeline._cost(f"{check.name}_s", clock() - started)
                for name, seconds in output.costs_s.items():
                    pipeline._cost(name, seconds)
    started = clock() if clock else 0.0
    stop: Stop | None = None
    if outputs:
        gathered = yield from aggregate.exchange_outputs(outputs, world_size=pipeline.world_size,
                                                         timeout_s=pipeline.timeout_s)
        stop = _after_exchange(pipeline, outputs, gathered)
    counted = step - pipeline.origin_step  # BUDGET-5: cycles from the current cadence's origin
    cycle_end = pipeline.cycle_ends(step)
    if cycle_end and pipeline.gate is not None and pipeline.certifying:
        try:
            if guard.INJECTING:
                guard.inject("gate.boundary")
            pipeline.gate.boundary(step)
        except Exception as error:  # GUARD-3: the writer stops at once
            pipeline._failed(Part.GATE, error)
            pipeline.stop_gate()
    if clock:
        pipeline._cost("gate_and_reports_s", clock() - started)
    due = (cycle_end and pipeline.checkpoint_every_steps > 0 and counted % pipeline.checkpoint_every_steps == 0
           and stop is None and pipeline.certifying and pipeline.saving)
    return StepOutcome(step, stop, due)


def _after_exchange(pipeline: Pipeline, outputs: Sequence[CheckOutput], gathered: Sequence[Any] | None) -> Stop | None:
    """Merge, feed the gate, write the step's reports, apply the policy (every rank; GUARD-3)."""
    try:
        if guard.INJECTING:
            guard.inject("aggregate.merge")
        # The gate's writer, and the reporter rank (the same rank in a job), need every group's part.
        merged = aggregate.merge(outputs, gathered,
                                 for_gate=pipeline.gate is not None or pipeline.reporter.sink is not None)
        findings = [f for feed in merged.feeds for f in feed.findings]
        stop = decide(findings, on_sdc=pipeline.on_sdc, hosts=pipeline.hosts)
    except Exception as error:
        pipeline._failed(Part.AGGREGATE, error)
        return None
    unfed = list(merged.feeds)
    while unfed and pipeline.gate is not None:
        try:
            if guard.INJECTING:
                guard.inject("gate.feed")
            pipeline.gate.feed(unfed[0])
        except Exception as error:  # GUARD-3: the writer stops at once; the findings it missed are written below
            pipeline._failed(Part.GATE, error)
            pipeline.stop_gate()
            break
        unfed.pop(0)
    if pipeline.gate_stopped:
        try:
            pipeline.report_findings([f for feed in unfed for f in feed.findings])
        except Exception as error:
            pipeline._failed(Part.AGGREGATE, error)
    try:
        for arguments in merged.stragglers:
            pipeline.reporter.straggler(arguments)
        for arguments in merged.timing:  # LOOP-6: run_dir/timing.jsonl, not a report
            pipeline.reporter.timing(arguments)
    except Exception as error:
        pipeline._failed(Part.AGGREGATE, error)
    if stop is not None:
        stop = attrs.evolve(stop, restarts_spent=pipeline.reporter.restarts_left == 0)
        try:
            pipeline.reporter.stopped(stop)
        except Exception as error:  # the policy still stops every rank; only its report is lost
            pipeline._failed(Part.AGGREGATE, error)
    return stop
