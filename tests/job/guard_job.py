"""A rank of tests/job/test_guard.py (run by tests.replay._launch: gloo, forked ranks): a DDP
training loop with scout attached as a user attaches it, while ``SCOUT_TEST_INJECT`` (inherited
from the launcher) makes parts of scout raise on one rank (spec/guard.md GUARD-9). Each rank
returns what the test checks: the last step it trained, its slowest step, the parts off on it
and since which step, and what the user's own failing calls raised."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import scout
from scout.replay import TorchPeerGroup
from scout.scenarios.toy import TinyLM as ToyLM
from tests.replay._scenarios import HEADS, LAYERS, VOCAB, WIDTH, TinyLM, _batch


class HeadlessStage(ToyLM):
    """A first pipeline stage as the issue's job had it: the same blocks, but its projection is
    not called ``lm_head`` (and a real stage 0 has none), so scout finds no output head here."""

    def __init__(self) -> None:
        super().__init__(VOCAB, WIDTH, HEADS, LAYERS, dropout=0.1)
        self.projection = self.lm_head
        del self.lm_head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.projection(self.norm(x))


def main(rank: int, world: int, *, steps: int, directory: str, settings: dict[str, Any] | None = None,
         stages: bool = False) -> dict[str, Any]:
    """Train ``steps`` steps with scout's run and checkpoint directories under ``directory``.
    ``stages``: two groups of replicas ({0, 1}, {2, 3}), the first without an output head -- the
    layout in which the gate's writer of issue 36 met a recipe it did not know."""
    torch.manual_seed(0)
    peers = None
    if stages:
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        model: nn.Module = DistributedDataParallel(HeadlessStage() if rank < 2 else TinyLM(),
                                                   process_group=groups[rank // 2])
        peers = TorchPeerGroup(partition=[[0, 1], [2, 3]], timeout_s=30.0)
    else:
        model = DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = scout.attach(model, optimizer, run_dir=f"{directory}/run", checkpoint_dir=f"{directory}/ckpt", peers=peers,
                       **{"observer": False, "replay_interval_steps": 1, "checkpoint_every_cycles": 1,
                          "loop_check_steps": 2, "collective_timeout_s": 30.0, "agreement_interval_steps": 1,
                          **(settings or {})})
    start = job.restore()
    # GUARD-1: the user's own failing call, made through scout's collective wrapper, reaches the
    # user unchanged (every rank alike: it is refused before any byte moves).
    try:
        dist.all_reduce(torch.zeros(2), op="not-an-op")  # type: ignore[arg-type]
        user_error = None
    except Exception as error:  # noqa: BLE001 - the test looks at what arrived
        user_error = f"{type(error).__name__}: {str(error)[:60]}"
    slowest_s, last = 0.0, start
    for step in range(start + 1, steps + 1):
        started = time.monotonic()
        tokens = _batch(rank, step)
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        job.step()
        slowest_s, last = max(slowest_s, time.monotonic() - started), step
    parts_off = job.parts_off
    job.close()
    # DDP keeps every replica's parameters equal only if every bucket was averaged: the hook's
    # future must carry the average whatever happened to scout's work in it (GUARD-3).
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {"rank": rank, "last_step": last, "slowest_step_s": slowest_s, "parts_off": parts_off,
            "user_error": user_error, "parameters": digest}
