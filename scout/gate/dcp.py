"""Checkpoint bytes for the gate through torch.distributed.checkpoint (DCP) (docs/design.md §5).

The gate decides *which* checkpoint to trust and to restore; this module moves the bytes. Every
rank calls :func:`save_checkpoint` at a cycle boundary (a collective); when it returns the bytes
are complete on storage, and only then does the gate's writer feed ``CheckpointCaptured(step)``
to the gate. After a failure, :func:`restore_for_failure` asks the recovery decision
(:mod:`scout.gate.recovery`) which checkpoint to restore and loads it on every rank: model,
optimizer, this rank's RNG states (CPU, and CUDA for every device) and the step.

A checkpoint lives in ``<root>/t<timeline>-s<step>``: the timeline is part of the name because a
restarted job re-runs steps. torch is imported lazily, so importing this module costs nothing.
RNG state is per rank (dropout masks differ by rank), saved under a rank-unique key, so DCP's
de-duplication of replicated entries cannot drop it; restoring needs the same world size.

The CUDA RNG states (``torch.cuda.get_rng_state_all()``, one per visible device) are saved when
the process has initialized CUDA -- a process that never did has drawn nothing from them, and
saving would initialize CUDA on a CPU job -- and restored when the checkpoint holds them and
this process sees the same number of devices; with another number a device's index may name
another GPU, so nothing is restored and a warning names both counts (docs/gate.md, "Checkpoint
bytes"). A checkpoint saved before CUDA states were kept restores the rest as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scout.gate.model import CheckpointId, GateContext
from scout.gate.recovery import EmergencyReplay, FailureClass, RecoveryDecision, recover
from scout.gate.registered_state import load_registered, registered_tensors, templates

if TYPE_CHECKING:
    import torch
    from torch import nn

    from scout.core.machine import MachineState

__all__ = ["checkpoint_path", "load_checkpoint", "restore_for_failure", "save_checkpoint"]

logger = logging.getLogger("scout.gate")


def checkpoint_path(root: str | os.PathLike[str], checkpoint: CheckpointId) -> Path:
    return Path(root) / f"t{checkpoint.timeline}-s{checkpoint.step:012d}"


def _rng_key(rank: int) -> str:
    return f"rng_rank_{rank}"


def _cuda_rng_key(rank: int) -> str:
    return f"cuda_rng_rank_{rank}"


def _cuda_module() -> Any:
    """``torch.cuda``; tests replace it with a fake that has the same RNG calls."""
    import torch

    return torch.cuda


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int,
           namespace: str | None = None) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    suffix = "" if namespace is None else f"@{namespace}"
    return {
        f"model{suffix}": model_state,
        f"optimizer{suffix}": optimizer_state,
        _rng_key(rank): torch.get_rng_state(),
        "step": torch.tensor(step, dtype=torch.int64),
    }


def _saved_cuda_rng(rank: int) -> dict[str, Any]:
    """This process's CUDA RNG states, one row per device, if it has initialized CUDA."""
    import torch

    cuda = _cuda_module()
    if not (cuda.is_available() and cuda.is_initialized()):
        return {}
    states = [torch.as_tensor(s, dtype=torch.uint8).cpu() for s in cuda.get_rng_state_all()]
    return {_cuda_rng_key(rank): torch.stack(states)} if states else {}


def _cuda_rng_template(path: Path, rank: int) -> dict[str, Any]:
    """A tensor to load this rank's CUDA RNG states into, if the checkpoint holds them."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    key = _cuda_rng_key(rank)
    stored = FileSystemReader(str(path)).read_metadata().state_dict_metadata.get(key)
    if stored is None:
        return {}
    if not isinstance(stored, TensorStorageMetadata):
        raise ValueError(f"checkpoint at {path}: {key} is not a tensor ({type(stored).__name__})")
    return {key: torch.empty(tuple(stored.size), dtype=torch.uint8)}


def _restore_cuda_rng(path: Path, rank: int, states: Any) -> None:
    cuda = _cuda_module()
    if not cuda.is_available():
        logger.warning(
            "scout: checkpoint %s holds CUDA RNG states for %d device(s) but CUDA is not available "
            "here; only the CPU RNG state was restored",
            path, len(states),
        )
        return
    devices = cuda.device_count()
    if devices != len(states):
        logger.warning(
            "scout: checkpoint %s holds CUDA RNG states for %d device(s), this process sees %d; "
            "a device index may name another GPU now, so no CUDA RNG state was restored (set "
            "CUDA_VISIBLE_DEVICES as in the saved run to restore it)",
            path, len(states), devices,
        )
        return
    cuda.set_rng_state_all(list(states))


def save_checkpoint(
    root: str | os.PathLike[str],
    checkpoint: CheckpointId,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    process_group: Any = None,
    registered: Mapping[str, Any] | None = None,
    namespace: str | None = None,
) -> Path:
    """Collective: every rank of ``process_group`` calls it with the same checkpoint id. Returns
    once DCP has written every rank's shard and the metadata; a checkpoint directory that exists
    already is refused (a step has one checkpoint per timeline, GATE-16). ``registered``: the
    other training state of ``attach(state=...)``, saved per rank (spec/frameworks.md FRAME-4).
    ``namespace``: the model and optimizer are saved under keys of their own
    (``model@<namespace>``): each pipeline stage's (LAYOUT-5), whose modules name their layers
    alike, and which DCP would otherwise keep one copy of as if they were replicas."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict_saver

    path = checkpoint_path(root, checkpoint)
    if (path / ".metadata").exists():
        raise FileExistsError(f"checkpoint {checkpoint} already exists at {path}; a step is saved once per timeline")
    rank = dist.get_rank(process_group)
    state = _state(model, optimizer, rank, checkpoint.step, namespace) | _saved_cuda_rng(rank)
    state |= registered_tensors(registered or {}, rank)
    state_dict_saver.save(state, checkpoint_id=str(path), process_group=process_group)
    return path


def load_checkpoint(
    root: str | os.PathLike[str],
    checkpoint: CheckpointId,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    process_group: Any = None,
    registered: Mapping[str, Any] | None = None,
    namespace: str | None = None,
) -> int:
    """Collective: load model, optimizer, the registered state (spec/frameworks.md FRAME-5) and
    this rank's RNG states in place; returns the step. ``namespace``: as saved
    (:func:`save_checkpoint`)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = checkpoint_path(root, checkpoint)
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"checkpoint {checkpoint} has no complete DCP checkpoint at {path}")
    rank = dist.get_rank(process_group)
    state = _state(model, optimizer, rank, 0, namespace) | _cuda_rng_template(path, rank)
    state |= templates(path, registered or {}, rank)
    state_dict_loader.load(state, checkpoint_id=str(path), process_group=process_group)
    suffix = "" if namespace is None else f"@{namespace}"
    set_state_dict(model, optimizer, model_state_dict=state[f"model{suffix}"],
                   optim_state_dict=state[f"optimizer{suffix}"])
    # FRAME-5: after the optimizer (an LR scheduler's state refers to its param groups' lr).
    load_registered(state, registered or {}, rank)
    torch.set_rng_state(state[_rng_key(rank)])
    if _cuda_rng_key(rank) in state:
        _restore_cuda_rng(path, rank, state[_cuda_rng_key(rank)])
    step = int(state["step"].item())
    if step != checkpoint.step:
        raise ValueError(f"checkpoint {checkpoint} at {path} holds step {step}; the directory was renamed or reused")
    return step


def restore_for_failure(
    root: str | os.PathLike[str],
    gate_state: MachineState[GateContext],
    failure: FailureClass,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    emergency_replay: EmergencyReplay = EmergencyReplay.NOT_RUN,
    process_group: Any = None,
) -> RecoveryDecision:
    """Collective: decide which checkpoint to restore (spec/recovery.md) and load it. Every rank
    must pass the same gate state (read from the manifest). With decision ``none`` nothing is
    loaded: the caller starts from initialization."""
    decision = recover(gate_state, failure, emergency_replay)
    if decision.checkpoint is not None:
        load_checkpoint(root, decision.checkpoint, model, optimizer, process_group=process_group)
    return decision
