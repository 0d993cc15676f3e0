"""The glue the Accelerate and Megatron-Core integrations share (docs/integrations.md, FRAME-11):
their loops call ``optimizer.step()`` and nothing of scout's, so the optimizer's post-step hook
counts the step and runs ``job.step()``; when the job says a checkpoint is due, the next
pre-step hook (or ``close()``) saves it -- the loop saved nothing at the step before, so scout
asks. Each integration says how it saves (:meth:`OptimizerSteps._save_if_due`)."""

from __future__ import annotations

from typing import Any

from scout.job.attach import Job

__all__ = ["OptimizerSteps"]


class OptimizerSteps:
    """Steps counted and scout stepped from the optimizer's hooks; saves asked one step late."""

    def __init__(self, job: Job, optimizer: Any, start: int) -> None:
        self.job, self.step = job, start
        self._close_job = job.close
        self.save_due: int | None = None
        self._handles = [optimizer.register_step_pre_hook(self._before_optimizer_step),
                         optimizer.register_step_post_hook(self._after_optimizer_step)]

    def _before_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self._save_if_due()  # the loop saved nothing at the step before: scout asks (FRAME-11)

    def _after_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.step += 1
        self.job.step()
        if self.job.checkpoint_due:
            self.save_due = self.step

    def _save_if_due(self) -> None:
        raise NotImplementedError

    def _close_hooks(self) -> None:
        """A save still due is written; the hooks are removed (the job is closed by the caller)."""
        self._save_if_due()
        for handle in self._handles:
            handle.remove()
