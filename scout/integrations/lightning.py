"""scout in PyTorch Lightning's ``Trainer`` (docs/integrations/lightning.md): one line instead of
``trainer.fit(...)``, no edit of the ``LightningModule`` or the loop.

    from scout.integrations.lightning import fit
    fit(trainer, model, datamodule=dm, run_dir="runs/exp1")     # instead of trainer.fit(...)

``fit`` starts torch.distributed through the Trainer's strategy (as ``trainer.fit`` would), plans
the resume (spec/frameworks.md FRAME-10: the newest checkpoint the gate allows for the previous
attempt's failure, recovery-verified after an SDC), adds a scout ``Callback`` and calls
``trainer.fit(..., ckpt_path=<that .ckpt>)``: Lightning itself restores the model, the optimizer,
the LR schedulers and its loops. The callback

- attaches scout when training starts (to the strategy's DDP-wrapped module and the torch
  optimizer), and runs ``job.step()`` after every optimizer step (not after every micro-batch);
- records every ``.ckpt`` the Trainer writes (its ``ModelCheckpoint``, a manual
  ``trainer.save_checkpoint``) in the gate once the step it belongs to has been through
  ``job.step()`` (FRAME-6..8); one written after a fault was detected is recorded too, so that the
  gate quarantines and marks it (FRAME-9);
- saves one through the Trainer (``scout-step=N.ckpt`` beside the ``ModelCheckpoint``'s) where
  scout's cycle asks for a checkpoint and none was written at that step (FRAME-11);
- keeps the data position (FRAME-12): Lightning 2.6 restores its loop counters mid-epoch but
  restarts a plain ``DataLoader`` at the epoch's first batch (it warns that the loader "is not
  resumable"), so the callback saves the number of batches the epoch has consumed with its own
  state in the checkpoint and, on resume, the training loader's sampler skips those batches'
  indices (no data is loaded for them).

The two places where scout reaches into the Trainer, for the length of ``fit`` only: the Trainer's
``save_checkpoint`` is wrapped (to learn each checkpoint's path once every rank's part is written),
and so is the strategy's ``process_dataloader`` (its documented hook for "wrapping the dataloader",
where the skip is installed before Lightning first iterates the training loader).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import scout
from scout.job import framework
from scout.job.attach import Job
from scout.job.pipeline import FaultDetected

__all__ = ["fit"]

logger = logging.getLogger("scout")
#: FRAME-11: the name of a checkpoint scout asks the Trainer to write at a cycle end.
OWN_NAME = "scout-step={step}.ckpt"


class SkipFirst:
    """FRAME-12: a sampler that skips its first ``skip`` indices once, on the next iteration, then
    is the sampler it wraps (its length, its ``set_epoch``)."""

    def __init__(self, sampler: Any, skip: int) -> None:
        if skip < 0:
            raise ValueError(f"skip must be >= 0, got {skip}")
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        indices: Iterator[Any] = iter(self.sampler)
        for _index in itertools.islice(indices, skip):
            pass
        return indices

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def _skip_batches(loader: Any, batches: int) -> bool:
    """Make ``loader``'s next iteration start ``batches`` batches in. True when it could: a
    DataLoader whose batch sampler is torch's ``BatchSampler`` (a ``batch_size`` was given)."""
    from torch.utils.data import BatchSampler

    batch_sampler = getattr(loader, "batch_sampler", None)
    if type(batch_sampler) is not BatchSampler:
        return False
    sampler = batch_sampler.sampler
    inner = sampler.sampler if isinstance(sampler, SkipFirst) else sampler
    batch_sampler.sampler = SkipFirst(inner, batches * batch_sampler.batch_size)
    return True


class _Hooks:
    """The scout callback's hooks; mixed with the Trainer's own ``Callback`` class (the
    ``pytorch_lightning`` or the ``lightning.pytorch`` one) by :func:`_callback_class`."""

    def __init__(self, run_dir: str | os.PathLike[str], plan: framework.ResumePlan, **settings: Any) -> None:
        self.run_dir, self.plan, self.settings = run_dir, plan, settings
        self.job: Job | None = None
        #: Saves that returned on this rank, not yet recorded: (path, global step).
        self.pending: list[tuple[str, int]] = []
        self.recorded_steps: set[int] = set()
        self.stepped = 0
        #: FRAME-12: (epoch, batches consumed in it), this run's and the one loaded from a checkpoint.
        self.epoch, self.batches = 0, 0
        self.resume_position: tuple[int, int] | None = None

    # -- state in Lightning's checkpoint (FRAME-12) --------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_position = (int(state["epoch"]), int(state["batches"]))

    # -- hooks ---------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        for callback in trainer.checkpoint_callbacks:
            if getattr(callback, "save_weights_only", False):
                raise scout.ConfigError(f"{type(callback).__name__}(save_weights_only=True) saves no optimizer, LR "
                                        "schedule or loop state, so a resume cannot continue the run: scout needs "
                                        "whole checkpoints (docs/integrations/lightning.md)")
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            raise scout.ConfigError(f"scout attaches to one optimizer; this LightningModule configures "
                                    f"{len(optimizers)} (docs/integrations/lightning.md)")
        model = trainer.strategy.model  # DDP when distributed: its gradient buckets are published
        self.job = scout.attach(model, optimizers[0], run_dir=self.run_dir, **self.settings)
        self.stepped = trainer.global_step
        framework.begin(self.job, self.plan, trainer.global_step)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.epoch, self.batches = trainer.current_epoch, 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._record_pending()  # a save after the last batch's hooks (validation, epoch end)
        self.batches += 1  # counted from its start: a checkpoint written during it holds it

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.job is not None, "on_train_start attaches scout"
        step = trainer.global_step
        if step == self.stepped:  # a micro-batch of gradient accumulation: no optimizer step yet
            return
        self.stepped = step
        try:
            self.job.step()
        except FaultDetected:
            self._record_pending()  # written after the fault began: recorded, so quarantined and marked
            raise
        self._record_pending()
        if self.job.checkpoint_due and step not in self.recorded_steps:  # FRAME-11
            trainer.save_checkpoint(str(self._own_dir(trainer) / OWN_NAME.format(step=step)))
            self._record_pending()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.job is not None and trainer.state.fn == "fit":
            self._record_pending()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._record_pending()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.job is not None:
            self._record_pending()
            self.job.close()

    # -- helpers -------------------------------------------------------------------------------
    def saved(self, path: str, step: int) -> None:
        """The Trainer's save of ``step`` at ``path`` returned on this rank (every rank's part is
        written: Lightning's save ends with a barrier)."""
        self.pending.append((path, step))

    def _record_pending(self) -> None:
        if self.job is None:
            return
        pending, self.pending = self.pending, []
        for path, step in pending:
            if step > self.stepped:  # FRAME-8: recorded once its step has been through job.step()
                self.pending.append((path, step))
                continue
            framework.record_save(self.job, path, step, "lightning")
            self.recorded_steps.add(step)

    @staticmethod
    def _own_dir(trainer: Any) -> Path:
        callback = trainer.checkpoint_callback
        directory = getattr(callback, "dirpath", None)
        return Path(directory) if directory else Path(trainer.default_root_dir) / "checkpoints"

    def skip_consumed(self, trainer: Any, loader: Any) -> Any:
        """FRAME-12: the training loader Lightning is about to iterate, after a resume mid-epoch."""
        position, self.resume_position = self.resume_position, None
        if position is None or not trainer.training:
            self.resume_position = position
            return loader
        epoch, batches = position
        self.epoch, self.batches = epoch, batches
        if epoch != trainer.current_epoch or not 0 < batches < len(loader):
            return loader  # the epoch's start, or its end (Lightning goes on with the next epoch)
        if _skip_batches(loader, batches):
            logger.info("scout: the training data resumes at batch %d of epoch %d", batches, epoch)
        else:
            logger.warning("scout: the training loader (%s) has no torch BatchSampler: it restarts epoch %d at its "
                           "first batch, not at batch %d (docs/integrations/lightning.md)", type(loader).__name__,
                           epoch, batches)
        return loader


@functools.cache
def _callback_class(package: str) -> type:
    base = importlib.import_module(package).Callback
    return type("ScoutCallback", (_Hooks, base), {"__doc__": "scout in the Trainer (scout.integrations.lightning)."})


def _package(trainer: Any) -> str:
    root = type(trainer).__module__.split(".", 1)[0]
    return "pytorch_lightning" if root == "pytorch_lightning" else "lightning.pytorch"


def fit(trainer: Any, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
        datamodule: Any = None, *, run_dir: str | os.PathLike[str], **settings: Any) -> Any:
    """``trainer.fit(model, ...)`` with scout (module docstring); keywords after ``run_dir`` are
    ``scout.attach`` settings. Collective: every rank calls it, as every rank calls ``fit``."""
    import torch.distributed as dist

    trainer.strategy.setup_environment()  # starts torch.distributed (fit does it again: a no-op then)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout needs torch.distributed: launch the script with torchrun and a distributed strategy "
                           "(strategy='ddp')")
    plan = framework.plan_resume(run_dir)
    callback: Any = _callback_class(_package(trainer))(run_dir, plan, **settings)
    trainer.callbacks.append(callback)
    save_checkpoint, process_dataloader = trainer.save_checkpoint, trainer.strategy.process_dataloader

    def save_and_note(filepath: Any, *args: Any, **kwargs: Any) -> None:
        job = callback.job
        with job.checkpoint_io("write", os.fspath(filepath)) if job is not None else contextlib.nullcontext():
            save_checkpoint(filepath, *args, **kwargs)  # a slow write is a checkpoint stage, not a hang
        callback.saved(os.path.abspath(os.fspath(filepath)), trainer.global_step)

    def process_and_skip(dataloader: Any) -> Any:
        return callback.skip_consumed(trainer, process_dataloader(dataloader))

    trainer.save_checkpoint, trainer.strategy.process_dataloader = save_and_note, process_and_skip
    try:
        with warnings.catch_warnings():
            # FRAME-12: the loader does resume (skip_consumed); where it cannot, scout warns itself.
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
            return trainer.fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path=plan.path)
    except BaseException as error:
        if callback.job is not None:
            callback.job.leave(error)
        raise
    finally:
        del trainer.save_checkpoint, trainer.strategy.process_dataloader  # the classes' methods again
        trainer.callbacks.remove(callback)
