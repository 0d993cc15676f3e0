"""A rank of tests/job/test_attach_warnings.py (run by tests.replay._launch, gloo, forked ranks):
``scout.attach`` as a user would call it on a model scout must warn about (spec/replay.md CAP-9,
REC-8; spec/gate.md GATE-1): ``batchnorm`` -- DDP over blocks with BatchNorm; ``singleton`` --
replay groups of one rank each, what a 1-D FSDP mesh gives."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import scout
from scout.replay import TorchPeerGroup
from tests.replay._scenarios import TinyLM


class ConvBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.conv(x)))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ConvBlock() for _ in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean((2, 3)))


def main(rank: int, world: int, *, case: str) -> dict[str, Any]:
    scratch = Path(os.environ["SCOUT_TEST_SCRATCH"])
    torch.manual_seed(0)
    if case == "batchnorm":
        model: nn.Module = DistributedDataParallel(ConvNet())
        peers = None
    elif case == "singleton":
        model, peers = TinyLM(), TorchPeerGroup(partition=[[r] for r in range(world)], timeout_s=60)
    else:
        raise ValueError(f"unknown case {case!r}")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    job = scout.attach(model, optimizer, run_dir=str(scratch / "run"), checkpoint_dir=str(scratch / "ckpt"),
                       observer=False, peers=peers)
    job.close()
    return {"rank": rank}
