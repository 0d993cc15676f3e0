"""Rank programs for tests/layouts/test_tensor_parallel.py, run by ``tests.replay._launch``
(``tests.layouts._scenarios:NAME``): real gloo processes, a real DTensor tensor-parallel block."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class _Block(nn.Module):
    """A tensor-parallel MLP block: a column-wise linear, then a row-wise one (two all-reduces:
    the row-wise output in forward, the column-wise input gradient in backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _replay(block: nn.Module, x: torch.Tensor) -> tuple[int, dict[str, int]]:
    """One replay as scout runs it (TP-1): the block's own forward and backward on copies of its
    parameters, under the local stand-ins; the signature of output and gradients."""
    from torch.func import functional_call

    from scout.replay.signature import structured_signature
    from scout.replay.tensor_parallel import LocalCollectives

    parameters = {n: p.detach().clone().requires_grad_(True) for n, p in block.named_parameters()}
    inputs = x.clone().requires_grad_(True)
    mode = LocalCollectives()
    with mode:
        output = functional_call(block, parameters, (inputs,))
        gradients = torch.autograd.grad([output], [inputs, *parameters.values()], [torch.ones_like(output)])
    return structured_signature((output.detach(), list(gradients))), dict(mode.replaced)


def tensor_parallel_replay(rank: int, world: int) -> dict[str, Any]:
    """TP-2, TP-3, TP-4 on a ("dp", "tp") = (2, 2) mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from scout.replay.signature import structured_signature

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    block = _Block()
    parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(7))  # the source's broadcast input
    live = block(x)  # the live forward, with its real all-reduce (the job's collectives work)
    # TP-4: the last rank replays alone while the others wait in a barrier of the job's group:
    # a replay that entered a collective of the TP group would never return.
    alone = None
    if rank == world - 1:
        alone = _replay(block, x)
    dist.barrier()
    signature, replaced = _replay(block, x)
    again, _ = _replay(block, x)
    # TP-3: a corrupt shard on rank 2 (replica 1, shard 0).
    if rank == 2:
        with torch.no_grad():
            block.up.weight.to_local().view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)
    corrupt, _ = _replay(block, x)
    return {"signature": signature, "again": again, "alone": None if alone is None else alone[0],
            "replaced": replaced, "corrupt": corrupt, "live": structured_signature(live.detach()),
            "tp": mesh.get_local_rank("tp")}


class _Stage(nn.Module):
    """Every stage names its layer ``layers.0``, as a pipeline stage's module does."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4)])
        with torch.no_grad():
            self.layers[0].weight.fill_(value)


def stage_checkpoints(rank: int, world: int) -> dict[str, Any]:
    """LAYOUT-6: ranks 0, 2, ... are replicas of stage 0, ranks 1, 3, ... of stage 1, whose
    modules name their layer alike; saved and loaded with the stage's namespace, then without."""
    from scout.gate import dcp
    from scout.gate.model import CheckpointId

    root = Path(os.environ["SCOUT_TEST_SCRATCH"]) / "checkpoints"
    stage_index = rank % 2
    loaded = {}
    for step, namespace in ((1, f"pp{stage_index}"), (2, None)):
        stage = _Stage(float(stage_index + 1))
        dcp.save_checkpoint(root, CheckpointId(0, step), stage, torch.optim.SGD(stage.parameters(), lr=0.1),
                            namespace=namespace)
        fresh = _Stage(0.0)
        assert dcp.load_checkpoint(root, CheckpointId(0, step), fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                                   namespace=namespace) == step
        loaded["namespaced" if namespace else "plain"] = float(fresh.layers[0].weight[0, 0])
    return loaded


def layouts(rank: int, world: int) -> dict[str, Any]:
    """Both programs in one launch (one torch import, one process group)."""
    return {"replay": tensor_parallel_replay(rank, world), "checkpoints": stage_checkpoints(rank, world)}
