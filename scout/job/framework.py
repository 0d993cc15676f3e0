"""The framework's own checkpoints in the gate (spec/frameworks.md FRAME-6..12), for the
integrations in ``scout.integrations``. Three collective steps over the world, the first and the
last rank programs (:func:`run_plan`, :func:`run_record_save`) run on a gloo group of scout's own:

- :func:`plan_resume`, before the framework loads anything (and before ``attach``: a framework
  resumes before it builds what scout attaches to): the recovery decision of the gate, for the
  failure the previous attempt recorded, with RECOVERY-7's fallback -- a chosen checkpoint whose
  files any rank lacks, or whose content digest is not the one recorded, is lost (GATE-42) and
  the decision is made again. The framework is then pointed at the plan's path.
- :func:`begin`, once ``attach`` returned and the framework resumed: the lost checkpoints are
  recorded by the gate's writer, the decision is made again on the real gate and must be the
  plan's, and the framework must stand at the plan's step; the step loop begins there.
- :func:`record_save`, after each save of the framework: every rank's files are written (one
  exchange), rank 0 digests them and the gate records the capture with its artifact.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from scout.core.failure import FailureClass
from scout.gate.artifact import content_digest, remove_mark
from scout.gate.model import Artifact, CheckpointId
from scout.gate.recorder import GateWriter, MemoryRecorder, inspect_gate
from scout.job.gate_driver import GateDriver, Reporter, RestoreDecision
from scout.job.pipeline import CheckpointSaveFailed, Pipeline
from scout.job.run_dir import our_records
from scout.reports.kinds import SAVE_FAILED, ReportKind, attempt_failure
from scout.transport.program import AllGather, Barrier, Broadcast, Op

if TYPE_CHECKING:
    from scout.job.attach import Job

__all__ = ["FORMATS", "ResumePlan", "begin", "plan_resume", "record_save", "run_plan", "run_record_save"]

logger = logging.getLogger("scout")
#: FRAME-6: the framework checkpoint formats the integrations record.
FORMATS: Final = ("huggingface", "lightning", "accelerate", "deepspeed", "torchtitan", "megatron")
#: Bound on the plan's exchanges (the ranks were just rendezvoused by the framework).
PLAN_TIMEOUT_S: Final = 120.0
#: RECOVERY-7: chosen checkpoints found unusable one after another before the plan gives up.
PLAN_ROUNDS_MAX: Final = 10_000


@attrs.frozen
class ResumePlan:
    """Where the framework resumes (FRAME-10): ``path`` (None: from initialization) at ``step``,
    the checkpoint the gate chose, the failure class of the previous attempt, and the
    checkpoints found unusable on the way, with why (to be recorded as LOST by :func:`begin`)."""

    path: str | None
    step: int
    checkpoint: CheckpointId | None
    failure: FailureClass | None
    lost: tuple[tuple[CheckpointId, str], ...] = ()


def _unusable(artifact: Artifact | None, lacking: list[int], digest: Callable[[str], str]) -> str | None:
    """Why the chosen checkpoint cannot be resumed from (FRAME-10), or None."""
    if artifact is None:
        return "no framework checkpoint is recorded for it (a checkpoint of scout's own in a framework's run)"
    if lacking:
        return f"no checkpoint at {artifact.path} on rank(s) {lacking}"
    try:
        found = digest(artifact.path)
    except OSError as error:
        return f"{artifact.path} cannot be read: {error}"
    if found != artifact.digest:
        return (f"{artifact.path} no longer holds the files the gate recorded (digest {found}, recorded "
                f"{artifact.digest}): written again or changed since")
    return None


def plan_resume(run_dir: str | os.PathLike[str]) -> ResumePlan:
    """FRAME-10: which framework checkpoint to resume from. Collective over the world (after
    ``init_process_group``); every rank returns the same plan (:func:`run_plan` on a group of
    scout's own, torn down after)."""
    import torch.distributed as dist

    from scout.job.control import ControlGroup

    control = ControlGroup(PLAN_TIMEOUT_S)  # WAIT-6: a gloo group of scout's own
    try:
        rank = dist.get_rank()
        driver, failure = _plan_gate(Path(run_dir)) if rank == 0 else (None, None)
        plan = control.run(run_plan(driver, failure, rank=rank))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(control.group)
    if rank == 0 and plan.lost:
        logger.warning("scout: resume: checkpoint(s) %s cannot be resumed from (%s); marked lost, never chosen again "
                       "(spec/gate.md GATE-42) -- the framework resumes from %s",
                       ", ".join(str(c) for c, _ in plan.lost), "; ".join(why for _, why in plan.lost),
                       plan.path or "initialization")
    return plan


def _plan_gate(root: Path) -> tuple[GateDriver | None, FailureClass | None]:
    """Rank 0: the gate as the manifest holds it, in memory (the plan records nothing), and the
    failure the previous attempt recorded (RECOVERY-6: the bound jobs' reports)."""
    failure = attempt_failure(our_records(root)) if root.exists() else None
    reading = None
    if (root / "gate").is_dir():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # attach's gate writer says what it found
            reading = inspect_gate(root / "gate")
    if reading is None:
        return None, failure
    return GateDriver(GateWriter(MemoryRecorder(), reading.state),
                      Reporter(None, job_id="plan", generation=0, hosts=(), rank=0)), failure


def run_plan(driver: GateDriver | None, failure: FailureClass | None, *, rank: int,
             exists: Callable[[str], bool] = os.path.exists,
             digest: Callable[[str], str] = content_digest) -> Generator[Op, Any, ResumePlan]:
    """FRAME-10 with RECOVERY-7's fallback, as a rank program: rank 0's gate (``driver``) decides
    and one broadcast gives every rank the choice and its artifact; every rank looks for it
    (``exists``) and one all-gather says who lacks it; rank 0 checks its content (``digest``,
    FRAME-7) and a broadcast says whether it is usable. An unusable checkpoint is lost in memory
    (``begin`` records it) and the decision is made again. Alike on every rank."""
    lost: list[tuple[CheckpointId, str]] = []
    for _round in range(PLAN_ROUNDS_MAX):
        decision: RestoreDecision | None = None
        artifact: Artifact | None = None
        if driver is not None:
            decision = driver.decide_restore(failure, checkpoints=True)
            if decision.checkpoint is not None:
                entry = driver.writer.state.context.entry(decision.checkpoint)
                artifact = None if entry is None else entry.artifact
        chosen = (None if decision is None else decision.to_plain(),
                  None if artifact is None else (artifact.format, artifact.path, artifact.digest))
        plain_decision, plain_artifact = yield Broadcast(chosen, 0, PLAN_TIMEOUT_S)  # plain data: any binding
        decision = None if plain_decision is None else RestoreDecision.from_plain(plain_decision)
        artifact = None if plain_artifact is None else Artifact(*plain_artifact)
        if decision is None or decision.checkpoint is None:
            break
        present = yield AllGather(artifact is not None and exists(artifact.path), PLAN_TIMEOUT_S)
        lacking = [r for r, here in enumerate(present) if not here]
        problem = yield Broadcast(_unusable(artifact, lacking, digest) if rank == 0 else None, 0, PLAN_TIMEOUT_S)
        if problem is None:
            break
        lost.append((decision.checkpoint, problem))
        if driver is not None:
            driver.lost(decision.checkpoint, problem)  # in memory: begin() records it (GATE-42)
    else:
        raise RuntimeError(f"resume: {PLAN_ROUNDS_MAX} chosen checkpoints in a row were unusable; the gate's "
                           "manifest is not what this job saved (spec/recovery.md RECOVERY-7)")
    cause = yield Broadcast(None if failure is None else failure.value, 0, PLAN_TIMEOUT_S)
    failure = None if cause is None else FailureClass(cause)
    if decision is None or decision.checkpoint is None or artifact is None:
        return ResumePlan(None, 0, None, failure, tuple(lost))
    return ResumePlan(artifact.path, decision.step, decision.checkpoint, failure, tuple(lost))


def begin(job: Job, plan: ResumePlan, framework_step: int) -> None:
    """FRAME-10: the framework resumed from ``plan`` and stands at ``framework_step``: record the
    losses, check the gate still decides the plan's checkpoint, begin the step loop there.
    Collective over the world."""
    if framework_step != plan.step:
        raise RuntimeError(f"scout planned to resume at step {plan.step} ({plan.path or 'initialization'}) but the "
                           f"framework stands at step {framework_step}: pass the plan's path to the framework's "
                           "resume (spec/frameworks.md FRAME-10)")
    control = job.parts.control
    if job.rank == 0:
        for checkpoint, why in plan.lost:
            job.pipeline.lost(checkpoint, why)
    decision: RestoreDecision = control.broadcast(job.pipeline.decide_restore(plan.failure, checkpoints=True))
    if decision.checkpoint != plan.checkpoint:
        raise RuntimeError(f"the gate now chooses {decision.checkpoint}, the plan chose {plan.checkpoint}: the "
                           "manifest changed between the plan and attach (another job on this run_dir?)")
    with job.parts.idle_loops.awake():
        job.begin_at(decision, [str(c) for c, _ in plan.lost])


def record_save(job: Job, path: str | os.PathLike[str], step: int, format: str) -> str | None:
    """FRAME-8: the framework saved the checkpoint of ``step`` at ``path`` on every rank (each
    rank calls this after its own part of the save returned). Rank 0 digests it and the gate
    records the capture (FRAME-6, FRAME-7). Returns the digest on rank 0 (None elsewhere, and
    when the save is not recorded: a second save at the same step, FRAME-8)."""
    if format not in FORMATS:
        raise ValueError(f"format {format!r} is not one of {FORMATS}")
    with job.parts.idle_loops.awake():
        return job.parts.control.run(run_record_save(job.pipeline, CheckpointId(job.timeline, step), path, format,
                                                     timeout_s=job.config.collective_timeout_s))


def run_record_save(pipeline: Pipeline, checkpoint: CheckpointId, path: str | os.PathLike[str], format: str, *,
                    timeout_s: float) -> Generator[Op, Any, str | None]:
    """:func:`record_save` as a rank program: a barrier (every rank's files are written before
    rank 0 reads them), rank 0's record, one broadcast of its outcome; a record that failed is a
    ``save-failed`` report, and a failed manifest stops the job on every rank (GATE-40)."""
    yield Barrier(timeout_s)
    digest: str | None = None
    error: str | None = None
    manifest = False
    if pipeline.rank == 0:
        try:
            digest = _record_on_writer(pipeline, Path(path), checkpoint.step, format)
        except _Unreadable as raised:  # not recorded, so never certified; training goes on
            error = str(raised)
        except OSError as raised:  # the manifest could not record it (GATE-40: the job stops)
            error, manifest = f"{type(raised).__name__}: {raised}", True
    error, manifest = yield Broadcast((error, manifest), 0, timeout_s)
    if error is None:
        return digest
    step = checkpoint.step
    pipeline.reporter.record(ReportKind.CHECKPOINT, SAVE_FAILED, ranks=[0], step=step, evidence={
        "checkpoint": str(checkpoint), "path": str(path), "error": error,
        "policy": "manifest" if manifest else "not-recorded"})
    if not manifest:
        logger.warning("scout: the framework's checkpoint of step %d at %s is not recorded: %s", step, path, error)
        return None
    raise CheckpointSaveFailed(f"scout: the framework's checkpoint of step {step} at {path} could not be "
                               f"recorded: {error}; the job stops (GATE-40)")


class _Unreadable(Exception):
    """The framework's checkpoint could not be digested."""


def _record_on_writer(pipeline: Pipeline, path: Path, step: int, format: str) -> str | None:
    gate = pipeline.gate
    if gate is None:  # replay is off: no gate, nothing to certify
        return None
    context = gate.writer.state.context
    if context.last_capture_step == step:
        logger.info("scout: a second checkpoint at step %d (%s) is not recorded: a step has one (FRAME-8)", step, path)
        return None
    if step < context.last_step:
        logger.warning("scout: the framework's checkpoint %s is of step %d, behind step %d the gate has seen; "
                       "not recorded (FRAME-8)", path, step, context.last_step)
        return None
    try:
        remove_mark(path)  # FRAME-9: written again where a quarantined checkpoint was
        digest = content_digest(path)
    except OSError as error:
        raise _Unreadable(f"{type(error).__name__}: {error}") from None
    gate.captured(step, Artifact(format, str(path.resolve()), digest))
    return digest
