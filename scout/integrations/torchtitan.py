"""scout in TorchTitan (0.3), through its public extension points (docs/integrations.md).

TorchTitan builds a trainer from a ``Trainer.Config`` whose ``model_spec`` carries a
``post_optimizer_build_fn(optimizers, model_parts, parallel_dims)``: TorchTitan calls it once,
after the model is parallelized and the optimizers are built, on every rank. :func:`with_scout`
returns a copy of a ``ModelSpec`` whose hook first runs the original one and then, when
``ScoutSettings.enable`` is set, attaches scout:

- replay peers from TorchTitan's device mesh (:func:`replica_partitions`): the dense recipes
  among the data-parallel replicas of the same shard (``dp_replicate``: DDP, or HSDP's
  replicate dimension), the expert recipes among the replicas of the same experts (the sparse
  mesh ``(pp, dp_replicate, efsdp, ep)`` with ``ep`` kept), never the default group;
- ``scout.attach`` on ``model_parts[0]`` and the optimizers container (a
  ``torch.optim.Optimizer``), with its DCP checkpoints feeding the gate;
- an optimizer step post-hook that calls ``job.step()`` after every ``optimizers.step()`` --
  TorchTitan's training loop itself is unchanged;
- with ``moe_catalog``: expert replay (``scout.replay.moe.ExpertReplayer``) over TorchTitan's
  ``GroupedExperts`` modules at the catalog's compressed keys (spec/moe.md MOE-5, MOE-7).

What it does not do: TorchTitan's own checkpointer keeps writing its checkpoints; the gate
certifies scout's DCP checkpoints (``checkpoint_dir``), not TorchTitan's ``step-N`` folders -- the
hook runs before TorchTitan builds its ``CheckpointManager`` and receives neither it nor the
trainer, and the resume step is the job config's (docs/integrations.md says what doing it takes). TorchTitan 0.3 cannot
train on CPU (its attention backends have no CPU backward), so the trainer path is tested on a
GPU (``tests/gpu/torchtitan_train.py``); the pieces that run on CPU are tested in
``tests/integrations``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from scout.core.guards import whole_number
from scout.replay.mesh import replica_groups

__all__ = ["ScoutSettings", "TitanDegrees", "attach_to_titan", "replica_partitions", "with_scout"]

logger = logging.getLogger("scout")


@attrs.frozen
class ScoutSettings:
    """scout's switches for a TorchTitan job. ``overrides``: ``scout.attach`` keywords."""

    enable: bool = False
    run_dir: str = "./outputs/scout"
    checkpoint_dir: str | None = None
    moe_catalog: str | None = None  # a `scout moe-catalog` JSON: turns expert replay on
    expert_steps: int = 50
    overrides: tuple[tuple[str, Any], ...] = ()


@attrs.frozen
class TitanDegrees:
    """TorchTitan's parallel degrees (``ParallelDims`` fields), in its world-mesh order."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __attrs_post_init__(self) -> None:
        for field in attrs.fields(TitanDegrees):
            value = getattr(self, field.name)
            if not whole_number(value) or value < 1:
                raise ValueError(f"parallel degree {field.name} must be an int >= 1, got {value!r}")
        if (self.dp_shard * self.cp * self.tp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp_shard*cp*tp={self.dp_shard * self.cp * self.tp} "
                             "(TorchTitan's efsdp = dp_shard*cp*tp/ep)")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @classmethod
    def of(cls, parallel_dims: Any) -> TitanDegrees:
        """From a TorchTitan ``ParallelDims`` (an EP degree of 0 or None counts as 1)."""
        return cls(**{f.name: int(getattr(parallel_dims, f.name, 1) or 1) for f in attrs.fields(cls)})


def replica_partitions(degrees: TitanDegrees) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """The dense and the expert replay partitions of the world (PEER-1 on TorchTitan's
    meshes). Dense: the dense mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` with replicate
    ``dp_replicate`` (ranks that hold the same shard of the same stage). Experts: the sparse
    mesh ``(pp, dp_replicate, efsdp, ep)`` -- the same world, unflattened -- with replicate
    ``dp_replicate``: ranks that hold the same experts (same ``ep``) and the same expert shard
    (same ``efsdp``). Pure: no torch."""
    dense = replica_groups((degrees.pp, degrees.dp_replicate, degrees.dp_shard, degrees.cp, degrees.tp),
                           ("pp", "dp_replicate", "dp_shard", "cp", "tp"), "dp_replicate")
    efsdp = degrees.dp_shard * degrees.cp * degrees.tp // degrees.ep
    experts = replica_groups((degrees.pp, degrees.dp_replicate, efsdp, degrees.ep),
                             ("pp", "dp_replicate", "efsdp", "ep"), "dp_replicate")
    return tuple(map(tuple, dense)), tuple(map(tuple, experts))


def attach_to_titan(settings: ScoutSettings, optimizers: Any, model_parts: Sequence[Any], parallel_dims: Any) -> Any:
    """Attach scout to a built TorchTitan trainer's model and optimizers (collective over the
    world). Returns the ``scout.attach`` job; ``job.step()`` runs after every optimizer step."""
    import torch.distributed as dist

    import scout
    from scout.replay.collectives import TorchPeerGroup

    if len(model_parts) != 1:
        raise ValueError(f"scout attaches to one model part; this job has {len(model_parts)} (pipeline "
                         "parallel stages are not supported by the TorchTitan integration yet)")
    degrees = TitanDegrees.of(parallel_dims)
    if degrees.world_size != dist.get_world_size():
        raise ValueError(f"TorchTitan's degrees {degrees} span {degrees.world_size} ranks, the world has "
                         f"{dist.get_world_size()}")
    dense, expert_partition = replica_partitions(degrees)
    overrides = dict(settings.overrides)
    peers = TorchPeerGroup(partition=dense, timeout_s=float(overrides.get("collective_timeout_s", 120.0)))
    if all(len(g) < 2 for g in dense):
        logger.warning("scout: every dense replay group has one member (dp_replicate=1): nothing can be compared; "
                       "use HSDP (dp_replicate >= 3 to attribute) for replay to certify")
    job = scout.attach(model_parts[0], optimizers, run_dir=settings.run_dir, checkpoint_dir=settings.checkpoint_dir,
                       peers=peers, **overrides)
    experts = None
    if settings.moe_catalog is not None:
        from scout.replay.moe import ExpertLayers, ExpertReplayConfig, ExpertReplayer
        from scout.replay.moe_catalog import load_catalog

        layers = ExpertLayers.discover(model_parts[0])
        catalog = load_catalog(Path(settings.moe_catalog), layers)
        expert_peers = TorchPeerGroup(partition=expert_partition, timeout_s=peers.timeout_s)
        experts = ExpertReplayer(layers, expert_peers, catalog.expert_keys(),
                                 ExpertReplayConfig(expert_steps=settings.expert_steps))
    job_step: Callable[[], None] = job.step
    replaying = [experts]

    def after_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        experts = replaying[0]
        if experts is not None and "experts" in job.parts_off:  # spec/guard.md GUARD-4: off on every rank
            experts.close()
            replaying[0] = experts = None
        if experts is not None:
            report = experts.step()
            for result in report.results:
                if result.status.value == "ATTRIBUTED":
                    logger.warning("scout: expert replay %s at step %d attributed positions %s",
                                   result.recipe, result.step, list(result.outliers))
        job_step()

    optimizers.register_step_post_hook(after_step)
    job.expert_replayer = experts
    return job


def with_scout(model_spec: Any, settings: ScoutSettings) -> Any:
    """A copy of a TorchTitan ``ModelSpec`` whose ``post_optimizer_build_fn`` also attaches
    scout when ``settings.enable`` (the switch by config). The original hook runs first."""
    original = model_spec.post_optimizer_build_fn

    def post_optimizer_build(optimizers: Any, model_parts: Any, parallel_dims: Any) -> None:
        if original is not None:
            original(optimizers, model_parts, parallel_dims)
        if settings.enable:
            attach_to_titan(settings, optimizers, model_parts, parallel_dims)

    return dataclasses.replace(model_spec, post_optimizer_build_fn=post_optimizer_build)

