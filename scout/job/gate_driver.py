"""The gate's writer rank: it steps the checkpoint gate with the job's results and turns every
effect the gate returns into reports (spec/gate.md GATE-9, GATE-36, GATE-37). No torch.

:class:`GateDriver` is the one place where gate events are made and effects acted on: replay
results (:meth:`GateDriver.feed`), cycle boundaries, captures, and the start of an attempt (a
restart with its typed cause, then the first boundary). Its dispatch is over the closed union
``GateEffect`` and ends in ``assert_never``: ``Persist`` is already committed when
``GateWriter.apply`` returns, a ``TrustChange`` is a ``checkpoint`` report, a ``GateReport`` an
``unchecked`` report or the ``sdc`` reports of the feed whose recipe it names -- a repetition of
a persistent fault only when its count doubles or it names a new rank (GATE-41).

:class:`Reporter` builds every record a job writes (``scout.reports.make_record``, the kind's
source from :class:`~scout.reports.kinds.ReportKind`) and hands it to a :class:`ReportSink`:
``run_dir/reports.jsonl`` in a job, a list in the simulator.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from scout import reports
from scout.core.compat import assert_never
from scout.core.failure import FailureClass
from scout.core.sdc_reports import SdcReportCounter
from scout.gate.model import (
    Artifact,
    CheckpointCaptured,
    CheckpointId,
    CheckpointLost,
    CycleBoundary,
    GateEffect,
    GateEvent,
    GateReport,
    GateReportKind,
    Persist,
    Restart,
    Trust,
    TrustChange,
)
from scout.gate.recorder import GateWriter
from scout.gate.recovery import Choice, recover
from scout.gate.results import recipe_verdicts
from scout.job.framework_marks import mark_framework_checkpoint
from scout.reports.kinds import (
    EXHAUSTED,
    ReportKind,
    RestartReason,
    SdcReason,
    UncheckedReason,
    at_fault_in_every_attempt,
    trust_reason,
)
from scout.reports.timing import make_timing_record

if TYPE_CHECKING:
    from scout.job.pipeline import GateFeed, Stop

__all__ = ["GateDriver", "ReportSink", "Reporter", "RestoreDecision", "restarts_left"]

logger = logging.getLogger("scout")


def restarts_left(environ: Mapping[str, str] = os.environ) -> int | None:
    """RECOVERY-5: how many restarts the launcher has left after this attempt; None when it does
    not say (torchrun does: ``TORCHELASTIC_MAX_RESTARTS`` and ``TORCHELASTIC_RESTART_COUNT``)."""
    try:
        budget = int(environ["TORCHELASTIC_MAX_RESTARTS"])
        used = int(environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    except (KeyError, ValueError):
        return None
    return max(0, budget - used)


class ReportSink(Protocol):
    """Where a job's reports go."""

    def write(self, record: Mapping[str, Any]) -> None: ...

    def exclude_hosts(self, hosts: Sequence[str]) -> None: ...

    def timing(self, record: Mapping[str, Any]) -> None:
        """LOOP-6: one ``scout.timing/1`` record (``run_dir/timing.jsonl``), not a report."""
        ...


class Reporter:
    """The reports of one rank. Only the reporting rank (the gate's writer) has a sink; on the
    others every call does nothing, so every rank can run the same code."""

    def __init__(self, sink: ReportSink | None, *, job_id: str, generation: int, hosts: Sequence[str],
                 rank: int, restarts_left: int | None = None,
                 earlier_records: Callable[[], Sequence[Mapping[str, Any]]] | None = None) -> None:
        self.sink = sink
        #: RECOVERY-5: the launcher's restarts left after this attempt (None: it does not say),
        #: and the run's reports so far (to name who was at fault in every attempt).
        self.restarts_left = restarts_left
        self.earlier_records = earlier_records
        self.job_id = job_id
        self.generation = generation
        self.hosts = tuple(hosts)
        self.rank = rank

    def record(self, kind: ReportKind, reason: str, *, ranks: Sequence[int] = (), step: int | None = None,
               evidence: Mapping[str, Any] | None = None) -> None:
        if self.sink is None:
            return
        self.sink.write(reports.make_record(kind, reason=reason, job_id=self.job_id, generation=self.generation,
                                            ranks=ranks, hosts=[self.hosts[r] for r in ranks], step=step,
                                            evidence=evidence, reporter_rank=self.rank))

    def straggler(self, arguments: Mapping[str, Any]) -> None:
        """STRAG-21: a straggler record from ``straggler_record_arguments``."""
        if self.sink is not None:
            self.sink.write(reports.make_record(**arguments, job_id=self.job_id, generation=self.generation,
                                                reporter_rank=self.rank))

    def timing(self, arguments: Mapping[str, Any]) -> None:
        """LOOP-6: a timing record from ``scout.reports.timing.timing_arguments``."""
        if self.sink is not None:
            self.sink.timing(make_timing_record(arguments, job_id=self.job_id, generation=self.generation,
                                                reporter_rank=self.rank))

    def stopped(self, stop: Stop) -> None:
        """The fault policy stopped the job: name the hosts at fault for the scheduler, then say why."""
        if self.sink is None:
            return
        self.sink.exclude_hosts(stop.hosts)
        policy = f"on_{stop.kind.value}=restart"
        if not stop.restarts_spent:
            self.record(ReportKind.RESTART, stop.kind.value, ranks=stop.ranks, step=stop.step,
                        evidence={"policy": policy})
            return
        # RECOVERY-5: no restart left; say so, naming who was at fault in every attempt.
        ranks, hosts = at_fault_in_every_attempt(self.earlier_records() if self.earlier_records else (),
                                                 self.generation, stop.ranks, stop.hosts)
        self.sink.write(reports.make_record(
            ReportKind.RESTART, reason=EXHAUSTED, job_id=self.job_id, generation=self.generation, ranks=ranks,
            hosts=list(hosts), step=stop.step, reporter_rank=self.rank,
            evidence={"policy": policy, "fault": stop.kind.value, "fault_ranks": list(stop.ranks),
                      "fault_hosts": list(stop.hosts), "attempts": self.generation + 1}))
        every = f"rank(s) {list(ranks)} on {', '.join(hosts) or 'no one host'}" if ranks else "no one rank"
        logger.error("scout: restarts are spent: the job stops at step %d after %d attempt(s) (%s at step %d on "
                     "rank(s) %s); at fault in every attempt: %s", stop.step, self.generation + 1, stop.kind.value,
                     stop.step, list(stop.ranks), every)


@attrs.frozen
class RestoreDecision:
    """What an attempt starts from (spec/recovery.md): the step, the checkpoint to load (None:
    initialization), the failure class of the previous attempt and the recovery choice (None
    on a fresh run), and the gate's timeline every later checkpoint of the attempt belongs to."""

    step: int
    checkpoint: CheckpointId | None
    failure: FailureClass | None
    choice: Choice | None
    timeline: int

    def to_plain(self) -> tuple[Any, ...]:
        """As plain data, the payload of a rank program's broadcast (any binding can send it;
        ``scout.transport.codec``): :meth:`from_plain` reads back an equal decision."""
        checkpoint = None if self.checkpoint is None else (self.checkpoint.timeline, self.checkpoint.step)
        return (self.step, checkpoint, None if self.failure is None else self.failure.value,
                None if self.choice is None else self.choice.value, self.timeline)

    @classmethod
    def from_plain(cls, plain: Sequence[Any]) -> RestoreDecision:
        step, checkpoint, failure, choice, timeline = plain
        return cls(step, None if checkpoint is None else CheckpointId(*checkpoint),
                   None if failure is None else FailureClass(failure), None if choice is None else Choice(choice),
                   timeline)


def _restarted(writer: GateWriter) -> bool:
    """The manifest holds an earlier attempt: this one begins with a restart."""
    context = writer.state.context
    return bool(context.checkpoints or context.cycle_start_step is not None or context.timeline)


class GateDriver:
    """The gate on its writer rank (module docstring)."""

    def __init__(self, writer: GateWriter, reporter: Reporter, *, two_replica_groups: Sequence[str] = ()) -> None:
        self.writer = writer
        self.reporter = reporter
        self.sdc_counts = SdcReportCounter()  # GATE-41, for this attempt
        #: LAYOUT-4: the groups of two replicas, where a disagreement is seen and cannot be named.
        self.two_replica_groups = frozenset(two_replica_groups)

    def decide_restore(self, failure: FailureClass | None, *, checkpoints: bool) -> RestoreDecision:
        """The recovery decision for an attempt whose predecessor ended with ``failure`` (None:
        no report says an attempt ran before). ``checkpoints``: the job saves and loads
        checkpoints at all."""
        state = self.writer.state
        restarted = _restarted(self.writer)
        timeline = state.context.timeline + int(restarted)
        cause = (failure or FailureClass.UNCERTAIN) if restarted or failure is not None else None
        if not checkpoints or (failure is None and not state.context.checkpoints):
            return RestoreDecision(0, None, cause, None, timeline)
        decision = recover(state, failure or FailureClass.UNCERTAIN)
        checkpoint = decision.checkpoint
        return RestoreDecision(0 if checkpoint is None else checkpoint.step, checkpoint,
                               failure or FailureClass.UNCERTAIN, decision.choice, timeline)

    def begin(self, decision: RestoreDecision, *, evidence: Mapping[str, Any]) -> None:
        """An attempt starts at ``decision.step``: after any earlier attempt the gate restarts
        with the typed cause (GATE-36), then a cycle opens; the ``restart`` report says so,
        with the cause the manifest now holds."""
        restarted = _restarted(self.writer)
        if restarted:
            self._apply(Restart(decision.step if decision.checkpoint is not None else None,
                                decision.failure or FailureClass.UNCERTAIN))
        self._apply(CycleBoundary(decision.step))
        cause = self.writer.state.context.restart_cause if restarted else None
        details: dict[str, Any] = {
            "failure": None if cause is None else cause.value,
            "choice": None if decision.choice is None else decision.choice.value,
            **evidence,
        }
        if self.writer.recorder.fail_closed is not None:
            # GATE-31/32: the manifest lost its newest generation; only verified checkpoints
            # were restorable, and the report says why.
            details["fail_closed"] = self.writer.recorder.fail_closed
        self.reporter.record(ReportKind.RESTART,
                             RestartReason.RESTORED if decision.checkpoint is not None else RestartReason.STARTED,
                             step=decision.step, evidence=details)

    def feed(self, feed: GateFeed) -> None:
        """One recipe's job-wide result (GATE-4, GATE-5): the gate event, then its reports."""
        context = self.writer.state.context
        self._apply(recipe_verdicts(context.config, feed.recipe, context.cycle, feed.step, feed.results), feed)

    def boundary(self, step: int) -> None:
        self._apply(CycleBoundary(step))

    def captured(self, step: int, artifact: Artifact | None = None) -> None:
        self._apply(CheckpointCaptured(step, artifact))

    def lost(self, checkpoint: CheckpointId, detail: str) -> None:
        """GATE-42: ``checkpoint``'s files are gone; it becomes LOST (committed first, GATE-9) and
        its ``checkpoint`` report (reason ``lost``) says where."""
        self._apply(CheckpointLost(checkpoint, detail))

    def close(self) -> None:
        self.writer.close()

    def _apply(self, event: GateEvent, feed: GateFeed | None = None) -> None:
        """Step the gate (durably: GATE-9) and report what it decided."""
        for effect in self.writer.apply(event):
            self._act(effect, feed)

    def _act(self, effect: GateEffect, feed: GateFeed | None) -> None:
        if isinstance(effect, Persist):
            pass  # committed by the writer before apply() returned (GATE-9)
        elif isinstance(effect, TrustChange):
            entry = self.writer.state.context.entry(effect.checkpoint)
            artifact = None if entry is None else entry.artifact
            self.reporter.record(ReportKind.CHECKPOINT, trust_reason(effect.after),
                                 step=effect.checkpoint.step, evidence={
                                     "checkpoint": str(effect.checkpoint),
                                     "before": None if effect.before is None else effect.before.value,
                                     "after": effect.after.value, "detail": effect.reason,
                                     **({} if artifact is None else {"path": artifact.path, "format": artifact.format})})
            if artifact is not None and effect.after is Trust.QUARANTINED:
                mark_framework_checkpoint(artifact, effect, self.reporter.job_id)
        elif isinstance(effect, GateReport):
            self._report(effect, feed)
        else:
            assert_never(effect)

    def _detect_only(self, report: GateReport, feed: GateFeed | None) -> bool:
        """LAYOUT-4: every group that could not check the recipe holds two replicas that
        disagreed (a layout that detects and cannot name), not a replay that failed."""
        if feed is None or not report.groups:
            return False
        results = [feed.results.get(group) for group in report.groups]
        return all(group in self.two_replica_groups and result is not None and "no-majority" in (result.reason or "")
                   for group, result in zip(report.groups, results, strict=True))

    def _report(self, report: GateReport, feed: GateFeed | None) -> None:
        if report.kind is GateReportKind.UNCHECKED:
            reason = (UncheckedReason.REPLAY_DETECT_ONLY if self._detect_only(report, feed)
                      else UncheckedReason.REPLAY_INCONCLUSIVE)
            self.reporter.record(ReportKind.UNCHECKED, reason, step=report.step, evidence={
                "cycle": report.cycle, "recipes": list(report.recipes), "groups": list(report.groups),
                "detail": report.detail})
        elif report.kind is GateReportKind.SDC:
            # GATE-41: every finding is counted per (rank, recipe); a repetition is written only
            # when it names a new rank or a rank's count doubled since its last report.
            findings = feed.findings if feed is not None else ()
            for finding in findings:  # the ranks the replay named, for the groups the gate names
                recipe = str(finding.evidence.get("recipe") or ",".join(report.recipes))
                count = self.sdc_counts.observe(recipe, finding.ranks, finding.step)
                if count.report:
                    self.reporter.record(finding.kind, finding.reason, ranks=finding.ranks, step=finding.step,
                                         evidence={**finding.evidence, "cycle": report.cycle,
                                                   "counts": list(count.counts), "first_steps": list(count.first_steps)})
            # The gate saw SDC that no check named ranks for: still reported.
            if not findings and self.sdc_counts.observe(",".join(report.recipes), (), report.step).report:
                self.reporter.record(ReportKind.SDC, SdcReason.GATE_SDC, step=report.step, evidence={
                    "cycle": report.cycle, "recipes": list(report.recipes), "groups": list(report.groups),
                    "detail": report.detail})
        else:
            assert_never(report.kind)
