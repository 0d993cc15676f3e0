"""The training state a plain loop registers with ``attach(..., state={...})`` inside scout's DCP
checkpoints (spec/frameworks.md FRAME-4, FRAME-5).

Each rank saves each registered object's ``state_dict()`` as the bytes of ``torch.save``, in a
uint8 tensor under a key of its own (``scout_state_<name>_rank_<r>``): DCP de-duplicates entries
whose key is the same on every rank, which would keep one rank's data position or scaler and drop
the others', and a state dict of lists and floats is not what DCP's flattening round-trips
reliably. Restoring reads this rank's tensor, ``torch.load(..., weights_only=True)`` (no code runs
from a checkpoint file) and hands it to ``load_state_dict``. torch is imported lazily.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["load_registered", "registered_tensors", "state_key", "templates"]

logger = logging.getLogger("scout.gate")
PREFIX = "scout_state_"


def state_key(name: str, rank: int) -> str:
    return f"{PREFIX}{name}_rank_{rank}"


def registered_tensors(state: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """FRAME-4: this rank's entries of a checkpoint: one uint8 tensor per registered object."""
    import torch

    tensors = {}
    for name, value in state.items():
        buffer = io.BytesIO()
        torch.save(value.state_dict(), buffer)
        tensors[state_key(name, rank)] = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    return tensors


def templates(path: Path, state: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """Tensors to load this rank's registered state into. FRAME-5: a registered name the
    checkpoint lacks is an error (its state would silently start over); a saved name that is no
    longer registered is a warning."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    suffix = f"_rank_{rank}"
    saved = sorted(key[len(PREFIX):-len(suffix)] for key in stored if key.startswith(PREFIX) and key.endswith(suffix))
    missing = [name for name in state if state_key(name, rank) not in stored]
    if missing:
        raise ValueError(f"checkpoint at {path} holds no state {missing} for rank {rank} (it holds {saved or 'none'}): "
                         "it was saved by a run that registered other state= names with scout.attach; register "
                         "the same names, or restart from another run_dir (spec/frameworks.md FRAME-5)")
    unused = [name for name in saved if name not in state]
    if unused:
        logger.warning("scout: checkpoint %s holds state %s that this run does not register with attach(state=...); "
                       "it is not restored (spec/frameworks.md FRAME-5)", path, unused)
    found: dict[str, Any] = {}
    for name in state:
        meta = stored[state_key(name, rank)]
        if not isinstance(meta, TensorStorageMetadata):
            raise ValueError(f"checkpoint at {path}: {state_key(name, rank)} is not a tensor ({type(meta).__name__})")
        found[state_key(name, rank)] = torch.empty(tuple(meta.size), dtype=torch.uint8)
    return found


def load_registered(loaded: Mapping[str, Any], state: Mapping[str, Any], rank: int) -> None:
    """FRAME-5: hand each registered object the state dict this rank saved."""
    import torch

    for name, value in state.items():
        raw = loaded[state_key(name, rank)].numpy().tobytes()
        value.load_state_dict(torch.load(io.BytesIO(raw), weights_only=True))
