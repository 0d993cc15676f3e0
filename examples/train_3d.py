"""A small GPT trained with pipeline (PP), tensor (TP) and data parallel (DP) together, with scout
attached: the lines marked ``# scout`` are all it takes (docs/layouts.md).

    torchrun --nproc-per-node 6 examples/train_3d.py --pp 2 --run-dir runs/3d --checkpoint-dir ckpt/3d
    torchrun --nproc-per-node 6 examples/train_3d.py --tp 2 --run-dir runs/tp
    torchrun --nproc-per-node 8 examples/train_3d.py --pp 2 --tp 2 --schedule 1f1b

The world is a device mesh ``("pp", "dp", "tp")`` of shape ``(pp, world / (pp * tp), tp)``, rank
order row-major as ``init_device_mesh`` lays it out. Pipeline parallel: ``torch.distributed.pipelining``
(``PipelineStage`` with ``ScheduleGPipe`` or ``Schedule1F1B``), the layers split evenly; the first
stage holds the embedding, the last the final norm and the head. Tensor parallel:
``parallelize_module`` with ``ColwiseParallel`` (queries, keys, values, the MLP's first linear) and
``RowwiseParallel`` (the attention's projection, the MLP's second linear), each rank computing its
heads. Data parallel: each replica reads its own batches and averages its gradients over the
``dp`` dimension in one all-reduce per step. ``scout.attach(stage, optimizer, layout=mesh)`` reads
the mesh: replicas are the ranks of one stage and one tensor shard.

Faults (``--fault``, or EXAMPLE_FAULT): those of ``examples/train_gpt.py`` (``sdc:RANK:STEP``,
``hang-before-forward:RANK:STEP:SECONDS``, ``hang-before-backward:RANK:STEP:SECONDS``,
``slow:RANK:FACTOR``, ``freeze:...``, ``raise:...``), applied to the rank's own stage: ``sdc`` flips
a bit of the output of the stage's second block (its first when it holds one). Under pipeline
parallel the forward and the backward both run inside the schedule's step, so "before backward"
is before the step too, after "before forward".
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import scout  # scout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_gpt import FaultSet  # noqa: E402  (the same faults as the DDP example)

VOCAB, WIDTH, HEADS, LAYERS, SEQUENCE, BATCH = 256, 64, 4, 4, 32, 8


class Block(nn.Module):
    """A pre-norm transformer block whose attention computes whatever heads its projections
    give it: all of them, or this rank's share under tensor parallel."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.head_width = width // heads
        self.norm_attention = nn.LayerNorm(width)
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.projection = nn.Linear(width, width)
        self.norm_mlp = nn.LayerNorm(width)
        self.mlp_in, self.mlp_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        h = self.norm_attention(x)

        def heads(t: torch.Tensor) -> torch.Tensor:  # (batch, local heads, length, head width)
            return t.view(batch, length, -1, self.head_width).transpose(1, 2)

        q, k, v = heads(self.query(h)), heads(self.key(h)), heads(self.value(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_width)
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        mixed = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(batch, length, -1)
        x = x + self.projection(mixed)
        return x + self.mlp_out(F.gelu(self.mlp_in(self.norm_mlp(x))))


class Stage(nn.Module):
    """One pipeline stage of the GPT: layers ``first`` to ``last - 1``, the embedding on the first
    stage, the final norm and the head on the last (None elsewhere)."""

    def __init__(self, first: int, last: int, *, embed: bool, head: bool) -> None:
        super().__init__()
        torch.manual_seed(0)  # every rank builds the whole model alike, then keeps its stage's part
        blocks = [Block() for _ in range(LAYERS)]
        embedding, norm, lm_head = nn.Embedding(VOCAB, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)
        self.embed = embedding if embed else None
        self.layers = nn.ModuleList(blocks[first:last])
        self.norm = norm if head else None
        self.lm_head = lm_head if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.lm_head is not None:
            assert self.norm is not None
            x = self.lm_head(self.norm(x))
        return x


def batch(step: int, replica: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1_000_003 * step + replica)
    return torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def tensor_parallel(stage: Stage, mesh: object) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in stage.layers:
        parallelize_module(block, mesh, {"query": ColwiseParallel(), "key": ColwiseParallel(),  # type: ignore[arg-type]
                                         "value": ColwiseParallel(), "projection": RowwiseParallel(),
                                         "mlp_in": ColwiseParallel(), "mlp_out": RowwiseParallel()})


def average_gradients(stage: nn.Module, group: object, replicas: int) -> None:
    """The data-parallel gradient average: one all-reduce of every gradient laid end to end (a
    tensor-parallel parameter's gradient is its local shard's)."""
    if replicas == 1:
        return
    gradients = [p.grad for p in stage.parameters() if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in gradients]
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=group)  # type: ignore[arg-type]
    flat /= replicas
    offset = 0
    for g in local:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per stage")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--run-dir", default="runs/3d")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--fault", default=os.environ.get("EXAMPLE_FAULT", ""))
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if LAYERS % args.pp or HEADS % args.tp or world % (args.pp * args.tp):
        raise SystemExit(f"--pp {args.pp} must divide the {LAYERS} layers, --tp {args.tp} the {HEADS} heads, and "
                         f"pp x tp the world of {world} ranks")
    replicas = world // (args.pp * args.tp)
    mesh = init_device_mesh("cpu", (args.pp, replicas, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    stage_index, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    per_stage = LAYERS // args.pp
    stage = Stage(stage_index * per_stage, (stage_index + 1) * per_stage, embed=stage_index == 0,
                  head=stage_index == args.pp - 1)
    if args.tp > 1:
        tensor_parallel(stage, mesh["tp"])
    optimizer = torch.optim.AdamW(stage.parameters(), lr=3e-3)
    faults = FaultSet(args.fault, dist.get_rank(), SimpleNamespace(layers=list(stage.layers)), optimizer,  # type: ignore[arg-type]
                      run_dir=args.run_dir)
    schedule = None
    if args.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        pipeline_stage = PipelineStage(stage, stage_index, args.pp, torch.device("cpu"), group=mesh.get_group("pp"))
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        schedule = kind(pipeline_stage, n_microbatches=args.microbatches, loss_fn=loss_of)
    job = scout.attach(stage, optimizer, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir,  # scout
                       layout=mesh)  # scout
    start = job.restore()  # scout
    dp_group = mesh.get_group("dp")
    for step in range(start + 1, args.steps + 1):
        began = time.perf_counter()
        tokens = batch(step, replica)
        faults.before_forward(step)
        losses: list[torch.Tensor] = []
        if schedule is None:
            forward_began = time.perf_counter()
            loss = loss_of(stage(tokens[:, :-1]), tokens[:, 1:])
            faults.after_forward(time.perf_counter() - forward_began)
            faults.before_backward(step)
            loss.backward()
            losses.append(loss.detach())
        else:
            faults.before_backward(step)
            if stage_index == 0:
                schedule.step(tokens[:, :-1])
            elif stage_index == args.pp - 1:
                schedule.step(target=tokens[:, 1:], losses=losses)
            else:
                schedule.step()
        average_gradients(stage, dp_group, replicas)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        faults.loop(time.perf_counter() - began)
        job.step()  # scout
        if losses and mesh.get_local_rank("dp") == 0 and mesh.get_local_rank("tp") == 0 and step % 10 == 0:
            print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
    job.close()  # scout
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
