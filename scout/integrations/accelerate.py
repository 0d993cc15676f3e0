"""scout in a bare Hugging Face Accelerate loop (docs/integrations/accelerate.md): one line after
``accelerator.prepare(...)``, no edit inside the loop.

    from scout.integrations.accelerate import attach
    job, start = attach(accelerator, model, optimizer, run_dir="runs/exp1")   # after prepare()

``attach`` plans the resume (spec/frameworks.md FRAME-10: the newest checkpoint the gate allows
for the previous attempt's failure, recovery-verified after an SDC) and, where there is one, loads
it with ``accelerator.load_state`` -- Accelerate restores the model, the optimizer, the prepared
LR schedulers, the RNG states and every object registered with ``register_for_checkpointing``.
It returns the scout job and the step the loop resumes after (0 on a fresh run): the loop's own
resume code starts there (``accelerator.skip_first_batches(loader, batches)`` for the data, the
Accelerate idiom; docs/integrations/accelerate.md). Then

- scout is attached to the prepared (DDP) model and the torch optimizer inside Accelerate's
  ``AcceleratedOptimizer`` (spec/frameworks.md FRAME-1), and ``job.step()`` runs after every real
  optimizer step (a step post-hook on the torch optimizer: micro-batches of gradient accumulation,
  whose ``optimizer.step()`` Accelerate skips, are not steps);
- every ``accelerator.save_state(...)`` folder is recorded in the gate once every rank's part is
  written (FRAME-6..8; ``save_state`` is wrapped on this accelerator);
- where scout's cycle asks for a checkpoint and the loop saved none at that step, the integration
  calls ``accelerator.save_state`` itself (FRAME-11), as the next optimizer step begins (or at
  ``job.close()``): the model, the optimizer and the LR schedule are still those of the step
  asked for, and the loop's own save of that step, if it makes one, came first and is the one
  recorded. The RNG states Accelerate saves then are those after the next step's forward and
  backward (dropout draws there), not those at the end of the step.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import scout
from scout.integrations._optimizer_steps import OptimizerSteps
from scout.job import framework
from scout.job.attach import Job

__all__ = ["ScoutAccelerate", "attach"]

logger = logging.getLogger("scout")
#: FRAME-11: where scout's own saves go without automatic checkpoint naming (under project_dir).
OWN_DIR = "scout-checkpoints"


class ScoutAccelerate(OptimizerSteps):
    """The glue between one ``Accelerator`` and its scout job (module docstring)."""

    def __init__(self, accelerator: Any, job: Job, start: int) -> None:
        self.accelerator = accelerator
        self.recorded: set[int] = set()
        self._save_state = accelerator.save_state
        accelerator.save_state = self.save_state
        optimizer = job.optimizer
        assert optimizer is not None, "attach() requires the optimizer"
        super().__init__(job, optimizer, start)

    def _save_if_due(self) -> None:
        due, self.save_due = self.save_due, None
        if due is None or due in self.recorded:
            return
        if self.accelerator.project_configuration.automatic_checkpoint_naming:
            self.save_state()
        else:
            self.save_state(str(Path(self.accelerator.project_dir or ".") / OWN_DIR / f"step_{due}"))

    def save_state(self, output_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
        """``accelerator.save_state`` (same arguments, same result), then the folder recorded in
        the gate as the checkpoint of the current step (FRAME-8). Collective, as ``save_state``."""
        with self.job.checkpoint_io("write", f"step {self.step}"):  # a slow write is a checkpoint stage
            location = self._save_state(output_dir, *args, **kwargs)
        written = location if location is not None else output_dir
        if written is None:
            logger.warning("scout: accelerator.save_state returned no folder: the checkpoint of step %d is not "
                           "recorded", self.step)
            return location
        framework.record_save(self.job, os.path.abspath(os.fspath(written)), self.step, "accelerate")
        self.recorded.add(self.step)
        return location

    def close(self) -> None:
        self._close_hooks()
        self.accelerator.save_state = self._save_state
        self._close_job()


def attach(accelerator: Any, model: Any, optimizer: Any, *, run_dir: str | os.PathLike[str],
           **settings: Any) -> tuple[Job, int]:
    """scout on an ``Accelerator`` whose model and optimizer were prepared (module docstring);
    keywords after ``run_dir`` are ``scout.attach`` settings. Returns the job and the step the loop
    resumes after. Collective: every rank calls it. ``job.close()`` at the end of training."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout needs torch.distributed: launch the script with torchrun or accelerate launch on "
                           "several processes (Accelerator() then starts the process group)")
    plan = framework.plan_resume(run_dir)
    if plan.path is not None:
        accelerator.load_state(plan.path)
    job = scout.attach(model, optimizer, run_dir=run_dir, **settings)
    try:
        framework.begin(job, plan, plan.step)
        glue = ScoutAccelerate(accelerator, job, plan.step)
    except BaseException as error:
        job.leave(error)
        job.close()
        raise
    job.close = glue.close  # also gives save_state back and removes the hooks
    return job, plan.step
