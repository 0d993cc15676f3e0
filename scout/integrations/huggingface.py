"""scout in Hugging Face's ``Trainer`` (docs/integrations/huggingface.md): one line instead of
``trainer.train()``, no edit of the training loop.

    from scout.integrations.huggingface import train
    train(trainer, run_dir="runs/exp1")          # instead of trainer.train()

``train`` plans the resume (spec/frameworks.md FRAME-10: the newest checkpoint the gate allows for
the previous attempt's failure, recovery-verified after an SDC), adds a :class:`ScoutCallback`
and calls ``trainer.train(resume_from_checkpoint=...)`` with the plan's ``checkpoint-N``: the
Trainer itself restores the model, the optimizer, the LR schedule, the RNG states and the data
position. The callback attaches scout when training begins (to the DDP-wrapped model and the
optimizer inside Accelerate's wrapper), runs ``job.step()`` after every optimizer step, asks the
Trainer to save at scout's checkpoint steps (cycle ends, FRAME-11), and records every
``checkpoint-N`` the Trainer writes in the gate (FRAME-6..8), where it becomes recovery-verified
or quarantined -- a quarantined one gets a ``SCOUT_QUARANTINED`` file (FRAME-9).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import scout
from scout.job import framework
from scout.job.attach import Job

__all__ = ["ScoutCallback", "train"]

#: The Trainer names its checkpoints ``checkpoint-<global step>`` under ``output_dir``.
CHECKPOINT_PREFIX = "checkpoint-"


class ScoutCallback(TrainerCallback):
    """scout attached to one ``Trainer`` (module docstring). ``plan`` is the resume plan the
    Trainer was started with (:func:`scout.job.framework.plan_resume`); ``settings`` are
    ``scout.attach`` keywords (docs/attach.md)."""

    def __init__(self, trainer: Trainer, run_dir: str | os.PathLike[str], plan: framework.ResumePlan,
                 **settings: Any) -> None:
        self.trainer, self.run_dir, self.plan, self.settings = trainer, run_dir, plan, settings
        self.job: Job | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if args.save_only_model:
            raise scout.ConfigError("TrainingArguments(save_only_model=True) saves no optimizer, LR schedule or RNG "
                                    "state, so a resume cannot continue the run: scout needs whole checkpoints")
        model = self.trainer.model_wrapped  # DDP when distributed: its gradient buckets are published
        self.job = scout.attach(model, kwargs.get("optimizer"), run_dir=self.run_dir, **self.settings)
        framework.begin(self.job, self.plan, state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        assert self.job is not None, "on_train_begin attaches scout"
        self.job.step()
        if self.job.checkpoint_due:  # FRAME-11: the Trainer saves at scout's checkpoint steps
            control.should_save = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        assert self.job is not None, "on_train_begin attaches scout"
        path = Path(args.output_dir or ".") / f"{CHECKPOINT_PREFIX}{state.global_step}"
        framework.record_save(self.job, path, state.global_step, "huggingface")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self.job is not None:
            self.job.close()


def train(trainer: Trainer, *, run_dir: str | os.PathLike[str], **settings: Any) -> Any:
    """``trainer.train()`` with scout (module docstring); returns what it returns. Collective:
    every rank calls it, as every rank calls ``trainer.train()``."""
    import torch.distributed as dist

    trainer.args._setup_devices  # the Trainer starts torch.distributed here under torchrun  # noqa: B018
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout needs torch.distributed: launch the script with torchrun (TrainingArguments "
                           "then starts the process group)")
    plan = framework.plan_resume(run_dir)
    callback = ScoutCallback(trainer, run_dir, plan, **settings)
    trainer.add_callback(callback)
    try:
        return trainer.train(resume_from_checkpoint=plan.path)
    except BaseException as error:
        if callback.job is not None:
            callback.job.leave(error)
        raise
