"""``attach_replay``: scout replay alone on an existing training loop in one call (spec/replay.md API-1).

    handle = scout.replay.attach_replay(model, optimizer)          # after init_process_group
    for batch in loader:
        loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
        report = handle.step()                              # the one added line

``attach_replay`` is collective over the world when it builds the default peer group (the whole world
as one group of DDP replicas) -- every rank must call it.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from scout.replay.collectives import PeerGroup, TorchPeerGroup
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer

__all__ = ["attach_replay"]

_attached: weakref.WeakKeyDictionary[nn.Module, Replayer] = weakref.WeakKeyDictionary()


def attach_replay(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    peers: PeerGroup | None = None,
    config: ReplayConfig | None = None,
    modules: RecipeModules | None = None,
    timeout_s: float = 60.0,
) -> Replayer:
    """Attach replay to ``model`` (and ``optimizer``); returns the handle whose ``step()`` is
    called once per training step after ``optimizer.step()``.

    Raises RuntimeError if a handle is already attached to this model and not closed.
    """
    existing = _attached.get(model)
    if existing is not None and not existing.closed:
        raise RuntimeError(
            f"scout replay is already attached to this {type(model).__qualname__}; call "
            "close() on the existing handle before attaching again"
        )
    if peers is None:
        peers = TorchPeerGroup(timeout_s=timeout_s)
    handle = Replayer(model, optimizer, peers, config, modules)
    _attached[model] = handle
    return handle
