"""The job's side of scout's exception boundary (spec/guard.md): the agreement over scout's
control group that switches a failed part off on every rank at one step (GUARD-4), what switching
each part off does (GUARD-2, GUARD-6), its reports (GUARD-5) and the fallback when the control
group itself fails (GUARD-7). ``scout.job.attach.Job`` drives it from ``job.step()``.

Theory of operation. Every guarded call site records its part's failures on the rank's
:class:`scout.reports.guard.Boundary`. At the end of ``job.step()`` of every step before a multiple
of ``agreement_interval_steps`` :meth:`Agreement.launch` turns the parts that failed here since the
last launch into flags -- one int64 per part -- and starts one non-blocking all-reduce (maximum) of
them on the control group. At the start of the next ``job.step()`` :meth:`Agreement.collect` waits
for it (it has long completed in a job whose steps
meet in a collective) and returns the parts flagged by any rank: every rank gets the same list at
the same step, and :meth:`GuardedJob.switch_off` switches them off there. Only then, at such a
step, one all-gather brings the failures' records to rank 0, which reports them.

:meth:`GuardedJob.run_step` is one ``job.step()`` inside the boundary: the agreement first, the
step's work on the control group (its pipeline, a checkpoint save) with GUARD-7 around it, the
step's mark and the ops sidecar's stats (GUARD-1), the next agreement's launch. At a quiet step
(spec/budget.md BUDGET-14, :meth:`GuardedJob.quiet`) ``job.step()`` calls only
:meth:`GuardedJob.step_ended` of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist

from scout.job.control import ControlGroup
from scout.job.pipeline import CheckpointSaveFailed, Pipeline, Stop
from scout.observer import instrument
from scout.reports import guard
from scout.reports.guard import CONSEQUENCES, NEEDS_CONTROL, Boundary, Failure, Part
from scout.reports.kinds import ReportKind
from scout.transport.nccl.work import TimedOut, wait_work

if TYPE_CHECKING:
    from scout.ops.launch import NodeOps

__all__ = ["Agreement", "ControlFailed", "GuardedJob", "agreement_due", "off_step"]

logger = logging.getLogger("scout")

#: Every part, in the order of the agreement's flags.
FLAG_ORDER: Final = tuple(Part)
#: The check parts, by the check's name (``scout.job.pipeline.Check.name``).
CHECK_PARTS: Final = frozenset({Part.LOOP, Part.REPLAY, Part.EXPERTS, Part.CANARY})
#: GUARD-6: the parts whose results the gate needs to close a cycle.
GATE_FEEDERS: Final = frozenset({Part.REPLAY, Part.EXPERTS, Part.CANARY})


class ControlFailed(RuntimeError):
    """GUARD-7: scout's control group could not complete an agreement."""


def agreement_due(step: int, interval_steps: int) -> bool:
    """GUARD-4: whether ``job.step()`` of ``step`` launches an agreement (collected at step+1, a
    multiple of ``interval_steps``)."""
    return (step + 1) % interval_steps == 0


def off_step(failed_step: int, interval_steps: int) -> int:
    """GUARD-4: the step from which a part that failed in ``failed_step`` (its training phase or its
    ``job.step()`` before the launch) is off on every rank: the next multiple of ``interval_steps``."""
    return (failed_step // interval_steps + 1) * interval_steps


class Agreement:
    """GUARD-4: one non-blocking all-reduce of failure flags over the control group, every
    ``interval_steps`` steps."""

    def __init__(self, control: ControlGroup, boundary: Boundary, timeout_s: float, interval_steps: int) -> None:
        self.control = control
        self.boundary = boundary
        self.timeout_s = timeout_s
        self.interval_steps = interval_steps
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._launched: list[Part] = []  # this rank's flags in the pending launch
        self.stopped = False  # GUARD-7: no agreement is possible any more on this rank

    def launch(self, step: int) -> None:
        """At the end of ``job.step()`` of ``step``: start the agreement on the parts that failed
        here since the last launch, where one is due."""
        if self.stopped or not agreement_due(step, self.interval_steps):
            return
        failed = set(self.boundary.take_new())
        flags = torch.tensor([int(part in failed) for part in FLAG_ORDER], dtype=torch.int64)
        # Scout's own collective, not the job's: the wrappers let it through unpublished.
        with instrument.already_published():
            work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.control.group, async_op=True)
        self._pending = (work, flags)
        self._launched = sorted(failed, key=FLAG_ORDER.index)

    @property
    def pending(self) -> bool:
        """A launch is in flight: the next ``job.step()`` collects it."""
        return self._pending is not None

    def collect(self) -> list[Part]:
        """The parts any rank flagged in the last launch (the same list on every rank); [] before
        the first launch. Raises :class:`ControlFailed` when it does not complete in time."""
        if self.stopped or self._pending is None:
            return []
        work, flags = self._pending
        self._pending = None
        # spec/transport.md WAIT-1, WAIT-7: bounded, asleep on the work's future, never an aborting wait.
        outcome = wait_work(work, time.monotonic() + self.timeout_s)
        if isinstance(outcome, TimedOut):
            raise ControlFailed(f"the agreement did not complete within collective_timeout_s={self.timeout_s} "
                                "s: a rank is more than a step behind, or gone")
        if outcome is not None:
            raise ControlFailed(f"the agreement failed: {type(outcome).__name__}: {outcome}") from outcome
        return [part for part, flag in zip(FLAG_ORDER, flags.tolist(), strict=True) if flag]

    def gather(self, parts: Sequence[Part]) -> list[Failure]:
        """At an off step (collective, the same ``parts`` on every rank): every rank's records of
        ``parts``' failures, by rank."""
        mine = [failure.to_plain() for failure in self.boundary.failures(parts)]
        gathered = self.control.all_gather(mine)
        return [Failure.from_plain(plain) for plains in gathered for plain in (plains or ())]

    def close(self, wait_s: float = 1.0) -> None:
        """Let the last launch complete (bounded); a rank that left early never joins it. The
        failures no agreement carried are logged here, on their rank (GUARD-4): those of a launch
        never collected, and those since."""
        unagreed = (self._launched if self._pending is not None else []) + self.boundary.take_new()
        for failure in self.boundary.failures(unagreed):
            logger.warning("scout: %s failed on rank %d at step %d (%s: %s) after the job's last agreement "
                           "(spec/guard.md GUARD-4); it was stopped on this rank and is reported only here",
                           failure.part.value, failure.rank, failure.step, failure.error_type, failure.message)
        pending, self._pending = self._pending, None
        if pending is None:
            return
        wait_work(pending[0], time.monotonic() + wait_s)  # its outcome no longer matters to anyone


class GuardedJob:
    """What switching parts off does on this rank (GUARD-2, GUARD-6), the agreement that decides
    it (GUARD-4), the reports (GUARD-5) and the control group's failure (GUARD-7)."""

    def __init__(self, boundary: Boundary, agreement: Agreement, pipeline: Pipeline, *, rank: int,
                 ops: NodeOps | None) -> None:
        self.boundary = boundary
        self.agreement = agreement
        self.pipeline = pipeline
        self.reporter = pipeline.reporter
        self.rank = rank
        #: The ops sidecar's per-rank stats are written after each step while ``ops_on``.
        self.ops = ops
        self.ops_on = ops is not None
        #: Every failure reported so far (rank 0 keeps them for the ``finished`` report).
        self.reported: list[Failure] = []
        boundary.on_first_failure = self._stop_at_once

    # -- one job.step() ------------------------------------------------------------------------

    def run_step(self, step: int, work: Callable[[], Stop | None]) -> Stop | None:
        """``job.step()`` of ``step`` inside the boundary (module docstring): returns what
        ``work`` -- the step's collectives on the control group -- returned, None if it failed
        (GUARD-7). ``CheckpointSaveFailed`` is a policy the user chose: it propagates."""
        started, entry_ns = time.perf_counter(), time.monotonic_ns()
        self.agree(step)  # GUARD-4: what failed anywhere at the last step is off from here
        agreement_s = time.perf_counter() - started
        self.pipeline.waited(entry_ns, time.monotonic_ns())  # LOOP-1: a wait for the peers, not loop work
        stop = None
        try:
            if guard.INJECTING:
                guard.inject("control.exchange")
            stop = work()
        except CheckpointSaveFailed:  # on_checkpoint_error = "stop"
            raise
        except Exception as error:  # GUARD-7: this rank's sequence of control collectives is broken
            self.control_failed(error, step)
        self.step_ended(step)
        started = time.perf_counter()
        try:
            self.agreement.launch(step)  # GUARD-4: what failed here since the last launch
        except Exception as error:
            self.control_failed(error, step)
        costs = self.pipeline.costs
        costs["agreement_s"] = costs.get("agreement_s", 0.0) + agreement_s + time.perf_counter() - started
        return stop

    def quiet(self, step: int) -> bool:
        """spec/budget.md BUDGET-14: no agreement is collected or launched at ``step`` (GUARD-4):
        none is in flight, and ``step`` does not launch one (or no agreement is possible any more)."""
        agreement = self.agreement
        return not agreement.pending and (agreement.stopped or not agreement_due(step, agreement.interval_steps))

    def step_ended(self, step: int) -> None:
        """What every ``job.step()`` does after its work, quiet (BUDGET-14) or not: the next step's
        mark (and the observer's liveness check) and the ops sidecar's stats (GUARD-1)."""
        try:
            instrument.mark_step(step + 1)
        except Exception as error:  # GUARD-1: the observer's step check, the step's publish
            guard.failed(Part.INSTRUMENTATION, error, "job.step")
        if self.ops is not None and self.ops_on:  # metrics and on_report's per-rank stats (docs/metrics.md)
            try:
                if guard.INJECTING:
                    guard.inject("ops.after_step")
                self.ops.after_step(step, self.pipeline.costs, self.pipeline.straggler_trackers())
            except Exception as error:
                guard.failed(Part.OPS, error, "job.step")

    def _stop_ops(self) -> None:
        self.ops_on = False

    # -- GUARD-3: what stops at once where it failed ----------------------------------------

    def _stop_at_once(self, part: Part) -> None:
        if part is Part.GATE:
            self.pipeline.stop_gate()  # rank 0's writer has no collective: it stops now
        elif part is Part.OPS:
            self._stop_ops()

    # -- GUARD-4 -------------------------------------------------------------------------------

    def agree(self, step: int) -> None:
        """At the start of ``job.step()`` of ``step``: switch off, on every rank, the parts any
        rank flagged at the last step's end, and report them (rank 0)."""
        try:
            parts = self.agreement.collect()
            if not parts:
                return
            failures = self.agreement.gather(parts)
        except Exception as error:  # GUARD-7: ControlFailed, or the gather's own failure
            self.control_failed(error, step)
            return
        self.switch_off(parts, step)
        self.report(failures, step)

    def switch_off(self, parts: Iterable[Part], step: int) -> None:
        """GUARD-2, GUARD-6: ``parts`` are off from ``step`` on this rank (every rank calls it
        with the same parts at the same step, or GUARD-7 on one rank)."""
        parts = list(parts)
        checks = [Part(check.name) for check in self.pipeline.checks]
        # What exists only with checks (replay on): the gate, its checkpoints, the merge.
        with_checks = [Part.AGGREGATE, Part.GATE, Part.CHECKPOINT] if checks else []
        if Part.AGGREGATE in parts:  # nothing of the checks could reach the gate or the policy
            parts += [*checks, Part.GATE]
        if Part.CONTROL in parts:
            parts += [part for part in (*checks, *with_checks) if part in NEEDS_CONTROL]
        for part in self.boundary.switch_off(parts, step):
            try:
                self._switch_off(part)
            except Exception:  # switching off must not raise either (GUARD-1)
                logger.debug("scout: switching %s off failed", part.value, exc_info=True)

    def _switch_off(self, part: Part) -> None:
        pipeline = self.pipeline
        if part in CHECK_PARTS:
            for check in pipeline.checks:
                if check.name == part.value:
                    check.close()  # its hooks go; the pipeline no longer runs it
            if part in GATE_FEEDERS:
                pipeline.certifying = False
        elif part is Part.GATE:
            pipeline.stop_gate()
            pipeline.certifying = False
        elif part is Part.CHECKPOINT:
            pipeline.saving = False
        elif part is Part.OPS:
            self._stop_ops()
        elif part is Part.INSTRUMENTATION:
            instrument.stop_publishing()
        elif part is Part.COMPLETION:
            instrument.stop_completion("switched off after a failure (spec/guard.md GUARD-4)")
        elif part is Part.CONTROL:
            self.agreement.stopped = True
        # DDP_HOOK: the hook asks guard.running() at every bucket; AGGREGATE: its checks and the gate.

    def report(self, failures: Sequence[Failure], step: int) -> None:
        """GUARD-5: one ``internal_error`` report per failure (the reporter writes on rank 0). A
        report that cannot be written is logged with the failure (GUARD-1: never raised)."""
        for failure in failures:
            self.reported.append(failure)
            try:
                self.reporter.record(ReportKind.INTERNAL_ERROR, failure.part.reason, ranks=[failure.rank],
                                     step=failure.step, evidence={
                                         "part": failure.part.value, "where": failure.where,
                                         "error_type": failure.error_type, "message": failure.message,
                                         "frames": list(failure.frames), "count": failure.count, "off_step": step,
                                         "consequence": CONSEQUENCES[failure.part]})
            except Exception:
                logger.exception("scout: the internal_error report of %s on rank %d could not be written",
                                 failure.part.value, failure.rank)

    # -- GUARD-7 -------------------------------------------------------------------------------

    def control_failed(self, error: BaseException, step: int) -> None:
        """This rank can no longer agree: every part that needs the control group is off here,
        now; the failure is reported where this rank can (rank 0's reporter, else stderr)."""
        self.boundary.failed(Part.CONTROL, error, "job.step")
        self.boundary.take_new()  # there is no agreement left to carry it
        self.switch_off([Part.CONTROL], step)
        self.report(self.boundary.failures([Part.CONTROL]), step)

    def parts_off(self) -> dict[str, int]:
        """GUARD-8: part -> its off step, on this rank."""
        return {part.value: off for part, off in self.boundary.off.items()}

    def parts_off_evidence(self) -> dict[str, Any]:
        """GUARD-8: ``{"parts_off": ...}`` for a ``finished`` report's evidence; empty while every
        part runs."""
        off = self.parts_off()
        return {"parts_off": off} if off else {}
