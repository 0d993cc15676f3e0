"""A 4-rank training job for the wall-time straggler tests (tests/job/test_stragglers_torchrun.py),
under ``torchrun`` with ``scout.attach`` at its defaults.

The model is the example GPT's (examples/train_gpt.py) with its device time emulated: each
block's forward waits ``--device-ms`` and its backward twice that, as the host thread of a GPU
job waits for its device. Four CPU-bound ranks on a 2-core host compete for the cores, and
their wall times then measure the scheduler's placement more than their work (spec/replay.md
STRAG-1, measured there); with the device emulated, the ranks mostly wait, as on a GPU host,
and wall time is what a rank costs the job.

Faults (``--fault KIND:RANK:FACTOR:HOW``, HOW ``sleep`` or ``spin``):

- ``slow-forward``: every block's forward on RANK takes FACTOR times as long -- a forward hook
  waits FACTOR - 1 times the block's own forward time after it;
- ``slow-loop``: after its forward, RANK's loop waits FACTOR - 1 times the forward's time,
  outside any module;
- ``slow-layers``: every block on RANK takes FACTOR times as long, forward *and* backward, its
  emulated device time included -- a slow or waiting device: the block waits FACTOR - 1 times
  its own forward time after its forward, and FACTOR - 1 times its own backward time after its
  backward. It is inside the block's computation (not a hook of the block), so a replay of the
  block, which runs the module's forward without its own hooks under FSDP2 (spec/replay.md
  REPLAY-8), is slowed like the live step, as a slow device slows both.

``--mesh ddp`` (the default) wraps the model in DDP; ``--mesh hsdp`` shards every block and the
model with FSDP2 on a ``(4, 1)`` mesh ``("replicate", "shard")`` -- four replicas -- and passes
the replicas to scout (docs/attach.md "FSDP2").
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import scout
from scout.replay.collectives import OwnWallClock

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _DeviceWait(torch.autograd.Function):
    """The device's time for a block: ``seconds`` in forward, twice that in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:  # type: ignore[override]
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        time.sleep(2 * ctx.seconds)
        return gradient, None


class _BackwardMark(torch.autograd.Function):
    """A mark in a block's backward, at no cost in its forward: on the block's output
    (``begins``) it runs first in the block's backward and notes when; on its input it runs
    last and waits for the stretch of what ran between."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slow: _SlowLayer, begins: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.slow, ctx.begins = slow, begins
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        slow = ctx.slow
        if ctx.begins:
            slow.backward_began.append(slow.clock_ns())
        elif slow.backward_began:
            slow.wait(slow.backward_began.pop())
        return gradient, None, None


class _SlowLayer:
    """``slow-layers``: the block's own time, forward and backward, stretched ``factor`` times.
    Times are on the rank's own clock -- the wall clock less the time its host kept it waiting
    for a CPU (as FAULT-6's slow loop) -- so that on a host whose cores the ranks share the rank
    is ``factor`` times as slow in its own time, which the other ranks' contention does not
    stretch or shrink."""

    def __init__(self, factor: float, how: str) -> None:
        self.factor = factor
        self.how = how
        self.clock_ns = OwnWallClock()
        self.backward_began: list[int] = []

    def wait(self, since_ns: int) -> None:
        """Wait ``factor - 1`` times the own time since ``since_ns``, on the same clock."""
        now = self.clock_ns()
        until = now + round((self.factor - 1.0) * (now - since_ns))
        while self.clock_ns() < until:  # ends: the own clock advances while asleep or spinning
            if self.how == "sleep":
                time.sleep(max(1e-4, (until - self.clock_ns()) / 1e9))


class EmulatedBlock(nn.Module):
    """A block of the example GPT whose forward also waits for its (emulated) device."""

    def __init__(self, block: nn.Module, device_s: float) -> None:
        super().__init__()
        self.block = block
        self.device_s = device_s
        self.slow: _SlowLayer | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slow = self.slow
        if slow is None:
            return _DeviceWait.apply(self.block(x), self.device_s)
        # The backward is timed between a mark on the output and one on the input, so only an
        # input that takes a gradient (every block's, live and replayed) slows it.
        timed_backward = x.requires_grad
        if timed_backward:
            x = _BackwardMark.apply(x, slow, False)
        began = slow.clock_ns()
        y = _DeviceWait.apply(self.block(x), self.device_s)
        slow.wait(began)
        return _BackwardMark.apply(y, slow, True) if timed_backward else y


def _wait(seconds: float, how: str) -> None:
    if seconds <= 0:
        return
    if how == "sleep":
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def _log_loop_checks(job: Any, path: str) -> None:
    """Every loop check's times, evidence and scores, for the measurements of spec/replay.md
    LOOP-3 (the job's loop timer, wrapped)."""
    import json

    from scout.job.checks import LoopStragglerCheck

    timer = next(c for c in job.pipeline.checks if isinstance(c, LoopStragglerCheck)).timer
    end_step = timer.end_step

    def logged(step: int) -> Any:
        began = time.perf_counter()
        check = end_step(step)
        if check is not None:
            check_ms = (time.perf_counter() - began) * 1e3  # the check's own cost (LOOP-2)
            with open(path, "a") as out:
                out.write(json.dumps({"step": check.step, "loop_ms": check.loop_ms, "period_ms": check.period_ms,
                                      "evidence": check.evidence, "ratios": check.performance_ratios,
                                      "confirmed": sorted(check.confirmed), "reason": check.reason,
                                      "check_ms": check_ms}) + "\n")
        return check

    timer.end_step = logged


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--mesh", choices=("ddp", "hsdp"), default="ddp")
    parser.add_argument("--device-ms", type=float, default=4.0)
    parser.add_argument("--fault", default="")
    parser.add_argument("--loop-log", default="", help="rank 0 writes every loop check here (JSON lines)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    example = _example()
    torch.manual_seed(0)
    model = example.GPT()
    model.layers = nn.ModuleList(EmulatedBlock(block, args.device_ms / 1e3) for block in model.layers)
    kind, target, factor, how = (args.fault.split(":") + ["", "-1", "1", "sleep"])[:4] if args.fault else (
        "", "-1", "1", "sleep")
    mine = int(target) == rank
    if how not in ("sleep", "spin") or kind not in ("", "slow-forward", "slow-loop", "slow-layers"):
        raise SystemExit(f"--fault {args.fault}: KIND must be slow-forward, slow-loop or slow-layers and HOW "
                         f"sleep or spin")
    if mine and kind == "slow-layers":
        for block in model.layers:
            block.slow = _SlowLayer(float(factor), how)
    if mine and kind == "slow-forward":
        for block in model.layers:
            started: list[float] = []
            block.register_forward_pre_hook(lambda _m, _i, started=started: started.append(time.perf_counter()))
            block.register_forward_hook(lambda _m, _i, _o, started=started: _wait(
                (float(factor) - 1) * (time.perf_counter() - started.pop()), how))
    peers = None
    if args.mesh == "hsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from scout.replay import TorchPeerGroup

        mesh = init_device_mesh("cpu", (4, 1), mesh_dim_names=("replicate", "shard"))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        peers = TorchPeerGroup.from_mesh(mesh, ("replicate",))
        trained: nn.Module = model
    else:
        trained = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    job = scout.attach(trained, optimizer, run_dir=args.run_dir, peers=peers)
    if args.loop_log and rank == 0:
        _log_loop_checks(job, args.loop_log)
    start = job.restore()
    for step in range(start + 1, args.steps + 1):
        tokens = example.batch(step, rank)
        began = time.perf_counter()
        logits = trained(tokens[:, :-1])
        if mine and kind == "slow-loop":
            _wait((float(factor) - 1) * (time.perf_counter() - began), how)
        loss = F.cross_entropy(logits.reshape(-1, example.VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        job.step()
    job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
