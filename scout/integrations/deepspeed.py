"""scout in a DeepSpeed training loop (docs/integrations/deepspeed.md): one line after
``deepspeed.initialize(...)``, no edit inside the loop.

    from scout.integrations.deepspeed import attach
    job, start, client_state = attach(engine, run_dir="runs/exp1")   # after deepspeed.initialize

``attach`` plans the resume (spec/frameworks.md FRAME-10) and, where there is a checkpoint to
resume from, loads it with ``engine.load_checkpoint(<its save_dir>, tag=<its tag>)``: DeepSpeed
restores the module, the optimizer (ZeRO partitions included), the LR scheduler and its step
counters, and hands back the ``client_state`` the loop saved with it. It returns the scout job,
the step the loop resumes after and that ``client_state`` (``{}`` on a fresh run). Then

- scout is attached to the engine's module and its torch optimizer (``engine.basic_optimizer``);
  under ZeRO (stage >= 1) to the module alone: each rank steps its own slice of the optimizer, so
  the data-parallel ranks are no replicas of the optimizer step and its replay is left out. And
  ``job.step()`` runs after every ``engine.step()`` that is a
  real optimizer step (``engine.global_steps`` advanced: not at the micro-batches of gradient
  accumulation);
- every ``engine.save_checkpoint(save_dir, tag)`` is recorded in the gate as the folder
  ``save_dir/tag`` once every rank's part is written (FRAME-6..8; the method is wrapped on this
  engine);
- where scout's cycle asks for a checkpoint and the loop saved none at that step, the integration
  calls ``engine.save_checkpoint(<run_dir>/checkpoints, tag="global_stepN", save_latest=False)``
  as the next ``engine.step()`` begins or at ``job.close()`` (FRAME-11): the module, the optimizer
  and the schedule are still those of step N, and a save of the loop's own at that step came first
  and is the one recorded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import scout
from scout.job import framework
from scout.job.attach import Job

__all__ = ["Resumed", "ScoutDeepSpeed", "attach"]

logger = logging.getLogger("scout")
#: FRAME-11: scout's own saves go under run_dir in this folder, one tag per step.
OWN_DIR = "checkpoints"


class Resumed(NamedTuple):
    """What :func:`attach` returns: the scout job, the step the loop resumes after, and the
    ``client_state`` saved with the checkpoint it resumed from (``{}`` on a fresh run)."""

    job: Job
    step: int
    client_state: dict[str, Any]


class ScoutDeepSpeed:
    """The glue between one ``DeepSpeedEngine`` and its scout job (module docstring)."""

    def __init__(self, engine: Any, job: Job, own_dir: Path) -> None:
        self.engine, self.job, self.own_dir = engine, job, own_dir
        self._close_job = job.close
        self.recorded: set[int] = set()
        self.save_due: int | None = None
        self._step, self._save = engine.step, engine.save_checkpoint
        engine.step, engine.save_checkpoint = self.step, self.save_checkpoint  # on this engine only

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """``engine.step()``, then ``job.step()`` when it was an optimizer step."""
        self._save_if_due()  # the loop saved nothing at the step before: scout asks (FRAME-11)
        before = self.engine.global_steps
        result = self._step(*args, **kwargs)
        if self.engine.global_steps != before:
            self.job.step()
            if self.job.checkpoint_due:
                self.save_due = self.engine.global_steps
        return result

    def save_checkpoint(self, save_dir: Any, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``engine.save_checkpoint`` (same arguments, same result), then ``save_dir/tag`` recorded
        as the checkpoint of the current step (FRAME-8). Collective, as DeepSpeed's own."""
        step = self.engine.global_steps
        name = str(tag) if tag is not None else f"global_step{step}"  # DeepSpeed's default tag
        with self.job.checkpoint_io("write", name):  # a slow write is a checkpoint stage, not a hang
            result = self._save(save_dir, name, *args, **kwargs)
        framework.record_save(self.job, os.path.abspath(os.path.join(os.fspath(save_dir), name)), step, "deepspeed")
        self.recorded.add(step)
        return result

    def _save_if_due(self) -> None:
        due, self.save_due = self.save_due, None
        if due is not None and due not in self.recorded:
            self.save_checkpoint(str(self.own_dir), f"global_step{due}", save_latest=False)

    def close(self) -> None:
        self._save_if_due()
        del self.engine.step, self.engine.save_checkpoint  # the class's methods again
        self._close_job()


def attach(engine: Any, *, run_dir: str | os.PathLike[str], **settings: Any) -> Resumed:
    """scout on a ``DeepSpeedEngine`` (module docstring); keywords after ``run_dir`` are
    ``scout.attach`` settings. Collective: every rank calls it. ``job.close()`` at the end."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout needs torch.distributed: launch with torchrun or the deepspeed launcher "
                           "(deepspeed.initialize then starts the process group)")
    plan = framework.plan_resume(run_dir)
    client_state: dict[str, Any] = {}
    if plan.path is not None:
        folder = Path(plan.path)
        loaded, state = engine.load_checkpoint(str(folder.parent), tag=folder.name)
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint scout chose, {folder} (its log says why)")
        client_state = dict(state or {})
    optimizer = getattr(engine, "basic_optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = engine.optimizer  # FRAME-1 unwraps or names what it is
    if engine.zero_optimization_stage() > 0:
        # ZeRO partitions the optimizer: each rank steps its own slice, so data-parallel ranks are no
        # replicas of the optimizer step and its replay could never agree. The layers are replayed.
        if dist.get_rank() == 0:
            logger.info("scout: ZeRO stage %d partitions the optimizer: its step is not replayed (the model's "
                        "layers are)", engine.zero_optimization_stage())
        optimizer = None
    job = scout.attach(engine, optimizer, run_dir=run_dir, **settings)
    inner = getattr(engine, "basic_optimizer", None)
    if optimizer is None and isinstance(inner, torch.optim.Optimizer):
        # SELF-9: under ZeRO the engine writes the module's parameters through .data after its
        # inner optimizer steps; the live calls are re-executed before that step.
        job.self_check_before(inner)
    try:
        framework.begin(job, plan, engine.global_steps)
        glue = ScoutDeepSpeed(engine, job, Path(run_dir) / OWN_DIR)
    except BaseException as error:
        job.leave(error)
        job.close()
        raise
    job.close = glue.close  # also gives the engine's methods back
    return Resumed(job, plan.step, client_state)
