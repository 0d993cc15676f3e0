"""What one ``job.step()`` runs (``scout.job.attach.Job.step``): the quiet path or the full one.

At a *quiet* step (spec/budget.md BUDGET-14) -- no cycle ends, no check that is on is due, no
agreement is collected or launched, which every rank finds alike -- :func:`quiet_step` runs only
the step's bookkeeping: the checks' step-keeping (``Pipeline.quiet_step``), the step's mark and the
ops sidecar's stats (``GuardedJob.step_ended``) and the budget's measurement (BUDGET-3). Every other
step takes :func:`full_step`: inside scout's exception boundary (``GuardedJob.run_step``: the
agreement, GUARD-7), the pipeline's rank program on scout's control group (checks, one exchange,
the gate, reports, the policy), the save program where a checkpoint is due, and the measurement.
Why two paths: most steps of a budgeted cadence are quiet, and there ``job.step()`` costs the code
it runs about ten times over, its lines evicted from the caches by the training step before it.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from scout.gate.model import CheckpointId
from scout.job.pipeline import FaultDetected, Stop, run_step
from scout.job.save import run_save
from scout.reports import guard
from scout.reports.hook_time import HOOK_TIME

if TYPE_CHECKING:
    from scout.job.attach import Job

__all__ = ["full_step", "quiet_step", "step"]

logger = logging.getLogger("scout")


def step(job: Job) -> None:
    """One ``job.step()`` past the job's own checks (closed, leaving): BUDGET-14's quiet path, or
    the full one with scout's event loops awake for its collectives (spec/transport.md WAIT-5). A
    process with fault injection on (spec/guard.md GUARD-9) always takes the full path, whose parts
    the injections target; at a quiet step the full path runs no collective either, so such a rank
    keeps in step with the others."""
    at = job._step + 1
    try:
        quiet = job._started and not guard.INJECTING and job.pipeline.quiet(at) and job.guarded.quiet(at)
    except Exception:  # GUARD-1: never into training; the full path asks the checks again inside
        logger.debug("scout: deciding whether step %d is quiet failed; it takes the full path", at, exc_info=True)
        quiet = False  # scout's boundary (GUARD-7), which reports what they raise
    if quiet:
        quiet_step(job, at)
    else:
        with job.parts.idle_loops.awake():
            full_step(job)


def quiet_step(job: Job, at: int) -> None:
    """BUDGET-14: ``job.step()`` of the quiet step ``at``, in the full path's order and clock."""
    began = time.perf_counter()
    hooks_s = HOOK_TIME.take_s()  # BUDGET-10: the training phase's hooks
    job._step = job.boundary.step = at
    job.checkpoint_due = False
    job.pipeline.quiet_step(at)  # each check under GUARD-3
    if job.parts.calibration is not None:  # BUDGET-3 (not a cycle end: no exchange)
        try:
            job.parts.calibration.step_ended(at, time.perf_counter() - began + hooks_s)
        except Exception as error:  # GUARD-7, as when it fails inside the full path's control work
            job.guarded.control_failed(error, at)
    job.guarded.step_ended(at)
    HOOK_TIME.take_s()  # BUDGET-10: what passed through the hooks inside job.step() is in its time
    job.boundary.step = at + 1  # the next step's training phase begins
    job.pipeline.step_begins()


def full_step(job: Job) -> None:
    """``job.step()`` through the pipeline; raises :class:`FaultDetected` where the policy stops."""
    if not job._started:  # no restore(): a fresh start at step 0, whatever the manifest holds
        job._begin(None, checkpoints=False)
    began = time.perf_counter()
    job._step += 1
    at = job.boundary.step = job._step
    stop = job.guarded.run_step(at, partial(control_work, job, at, began, HOOK_TIME.take_s()))
    HOOK_TIME.take_s()  # BUDGET-10: the hooks' time inside job.step() (the budget's exchange too) is not a hook's
    job.boundary.step = at + 1  # the next step's training phase begins
    job.pipeline.step_begins()
    if stop is not None:
        raise FaultDetected.of(stop)


def control_work(job: Job, at: int, began: float, hooks_s: float) -> Stop | None:
    """The step's pipeline, then the save where one is due (GUARD-7); ``hooks_s``: BUDGET-10."""
    outcome = job.parts.control.run(run_step(job.pipeline, at))
    job.checkpoint_due, checkpoint_s = outcome.checkpoint_due, 0.0
    if outcome.checkpoint_due and job.files is not None:  # its time is also costs["cycle_end_s"]
        started = time.perf_counter()
        job.parts.control.run(run_save(job.pipeline, CheckpointId(job.timeline, at), job.files[1],
                                       on_checkpoint_error=job.config.on_checkpoint_error,
                                       timeout_s=job.config.collective_timeout_s))
        checkpoint_s = time.perf_counter() - started
    if job.parts.calibration is not None:  # spec/budget.md BUDGET-3: what scout cost this step
        job.parts.calibration.step_ended(at, time.perf_counter() - began - checkpoint_s + hooks_s, checkpoint_s)
    return outcome.stop
