"""scout in a Megatron-Core training loop (docs/integrations/megatron.md): one line after the model
and the optimizer are built, no edit inside the loop.

    from scout.integrations.megatron import attach
    job, start = attach(model, optimizer, run_dir="runs/exp1", checkpoint_dir="ckpt", state={"lr": sched})

Megatron-Core has no training loop or checkpoint schedule of its own (Megatron-LM's ``pretrain``
is not part of the ``megatron-core`` package): the loop is the user's, and its checkpoints are
Megatron-Core's ``dist_checkpointing`` folders. So here scout writes them:

- ``attach`` plans the resume (spec/frameworks.md FRAME-10) and, where there is a checkpoint to
  resume from, loads it with ``dist_checkpointing.load`` -- the model through its own
  ``sharded_state_dict()``, the optimizer's state (common state, written by rank 0: data-parallel
  replicas hold the same) and each registered object's state per rank (a ``ShardedObject`` per
  rank, spec/frameworks.md FRAME-3..5) -- and returns the job and the step the loop resumes after;
- ``job.step()`` runs after every optimizer step (a step post-hook on the torch optimizer, or on
  the one inside a ``MegatronOptimizer``, FRAME-1);
- at scout's checkpoint steps (FRAME-11) the integration saves with ``dist_checkpointing.save`` to
  ``checkpoint_dir/iter_NNNNNNN`` (Megatron-LM's naming) as the next optimizer step begins or at
  ``job.close()`` -- after the loop's ``scheduler.step()`` of that step -- and the gate records the
  folder (FRAME-6..8), where it becomes recovery-verified or quarantined and marked (FRAME-9).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import scout
from scout.integrations._optimizer_steps import OptimizerSteps
from scout.job import framework
from scout.job.attach import Job
from scout.job.inputs import checked_state, unwrap_optimizer

__all__ = ["ScoutMegatron", "attach", "checkpoint_name"]

logger = logging.getLogger("scout")
#: The common (rank 0) part of scout's entries in the checkpoint.
COMMON_KEY = "scout_common"
#: The per-rank registered state: one ShardedObject per rank under this key.
STATE_KEY = "scout_state"


def checkpoint_name(step: int) -> str:
    """The folder of the checkpoint of ``step`` (Megatron-LM's ``iter_0000042``)."""
    return f"iter_{step:07d}"


def _core_model(model: Any) -> Any:
    """The module with ``sharded_state_dict`` inside torch's or Megatron-Core's DDP wrapper."""
    inner = model
    for _depth in range(4):
        if hasattr(inner, "sharded_state_dict") and not hasattr(inner, "module"):
            return inner
        if not hasattr(inner, "module"):
            break
        inner = inner.module
    if not hasattr(inner, "sharded_state_dict"):
        raise scout.ConfigError(f"the model is a {type(model).__name__} without sharded_state_dict(): pass a "
                                "Megatron-Core model (GPTModel, MegatronModule), plain or in DDP "
                                "(docs/integrations/megatron.md)")
    return inner


class ScoutMegatron(OptimizerSteps):
    """The glue between a Megatron-Core model, its optimizer and the scout job."""

    def __init__(self, job: Job, model: Any, optimizer: Any, state: dict[str, Any], checkpoint_dir: Path,
                 start: int) -> None:
        self.model, self.optimizer, self.state, self.checkpoint_dir = model, optimizer, state, checkpoint_dir
        super().__init__(job, optimizer, start)

    def _save_if_due(self) -> None:
        due, self.save_due = self.save_due, None
        if due is None:
            return
        path = self.checkpoint_dir / checkpoint_name(due)
        with self.job.checkpoint_io("write", path.name):  # a slow write is a checkpoint stage, not a hang
            save(self.model, self.optimizer, self.state, path, due)
        framework.record_save(self.job, str(path.resolve()), due, "megatron")

    def close(self) -> None:
        self._close_hooks()
        self._close_job()


def _sharded(model: Any, optimizer: Any, state: dict[str, Any], step: int | None) -> dict[str, Any]:
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    rank, world = dist.get_rank(), dist.get_world_size()
    sharded: dict[str, Any] = dict(model.sharded_state_dict(prefix=""))
    sharded[COMMON_KEY] = {"step": step, "optimizer": None if step is None else optimizer.state_dict()}
    for name, value in state.items():
        data = None if step is None else value.state_dict()
        sharded[f"{STATE_KEY}.{name}"] = ShardedObject(f"{STATE_KEY}.{name}", data, (world,), (rank,), replica_id=0)
    return sharded


def save(model: Any, optimizer: Any, state: dict[str, Any], path: Path, step: int) -> None:
    """The checkpoint of ``step`` at ``path`` with ``dist_checkpointing.save`` (collective)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        if path.exists():  # written again by a restarted run (FRAME-9): Megatron-Core saves into an empty folder
            shutil.rmtree(path)
        path.mkdir(parents=True)
    dist.barrier()
    dist_checkpointing.save(_sharded(model, optimizer, state, step), str(path))


def load(model: Any, optimizer: Any, state: dict[str, Any], path: str) -> int:
    """FRAME-10: the checkpoint at ``path`` into the model, the optimizer and the registered state
    (collective); returns its step."""
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load(_sharded(model, optimizer, state, None), path)
    common = loaded.pop(COMMON_KEY)
    for name, value in state.items():
        value.load_state_dict(loaded.pop(f"{STATE_KEY}.{name}"))
    model.load_state_dict(loaded, strict=False)  # Megatron's _extra_state entries are not in every dict
    optimizer.load_state_dict(common["optimizer"])
    return int(common["step"])


def attach(model: Any, optimizer: Any, *, run_dir: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str],
           state: dict[str, Any] | None = None, **settings: Any) -> tuple[Job, int]:
    """scout on a Megatron-Core loop (module docstring); keywords after ``state`` are
    ``scout.attach`` settings. Collective: every rank calls it. ``job.close()`` at the end."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout needs torch.distributed: launch with torchrun and initialize the process group "
                           "(and Megatron-Core's parallel_state) before attach")
    core = _core_model(model)
    inner_optimizer = unwrap_optimizer(optimizer)
    registered = checked_state(state)
    plan = framework.plan_resume(run_dir)
    if plan.path is not None:
        step = load(core, inner_optimizer, registered, plan.path)
        if step != plan.step:
            raise RuntimeError(f"{plan.path} holds step {step}, the gate recorded step {plan.step} for it")
    job = scout.attach(model, optimizer, run_dir=run_dir, **settings)
    try:
        framework.begin(job, plan, plan.step)
        glue = ScoutMegatron(job, core, inner_optimizer, registered, Path(checkpoint_dir), plan.step)
    except BaseException as error:
        job.leave(error)
        job.close()
        raise
    job.close = glue.close  # also saves a checkpoint still due and removes the hooks
    return job, plan.step
