"""In-situ replay on PyTorch (spec/replay.md, docs/replay.md): tensor signatures, capture
through public module hooks, deterministic replay of captured layers and optimizer slices on
every peer, and the readiness contract that keeps peers' collectives symmetric.

This package imports torch; the pure schedule and catalog live in :mod:`scout.core.recipes`,
the straggler sequential test and localization in :mod:`scout.core.straggler`; stragglers'
tracking and reports in :mod:`scout.replay.stragglers`, loop stragglers in
:mod:`scout.replay.arrival`.
"""

from scout.replay.api import attach_replay
from scout.replay.arrival import LoopCheck, LoopConfig, LoopTimer
from scout.replay.collectives import TorchPeerGroup, TransportPeerGroup
from scout.replay.mesh import peer_ranks, replica_groups
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer, StepReport
from scout.replay.signature import structured_signature, tensor_signature
from scout.replay.stragglers import (
    StragglerEvent,
    StragglerKind,
    group_timings,
    straggler_record_arguments,
)

__all__ = [
    "LoopCheck",
    "LoopConfig",
    "LoopTimer",
    "RecipeModules",
    "ReplayConfig",
    "Replayer",
    "StepReport",
    "StragglerEvent",
    "StragglerKind",
    "TorchPeerGroup",
    "TransportPeerGroup",
    "attach_replay",
    "group_timings",
    "peer_ranks",
    "replica_groups",
    "straggler_record_arguments",
    "structured_signature",
    "tensor_signature",
]
