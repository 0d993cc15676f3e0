"""In-situ replay on PyTorch (spec/replay.md, docs/replay.md): tensor signatures, capture
through public module hooks, deterministic replay of captured layers and optimizer slices on
every peer, and the readiness contract that keeps peers' collectives symmetric.

This package imports torch; the pure schedule and catalog live in :mod:`scout.core.recipes`,
straggler confirmation and localization in :mod:`scout.core.straggler`.
"""

from scout.replay.api import attach_replay
from scout.replay.collectives import TorchPeerGroup, TransportPeerGroup
from scout.replay.mesh import peer_ranks, replica_groups
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer, StepReport
from scout.replay.signature import structured_signature, tensor_signature

__all__ = [
    "RecipeModules",
    "ReplayConfig",
    "Replayer",
    "StepReport",
    "TorchPeerGroup",
    "TransportPeerGroup",
    "attach_replay",
    "peer_ranks",
    "replica_groups",
    "structured_signature",
    "tensor_signature",
]
