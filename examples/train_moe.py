"""A small mixture-of-experts transformer (4 experts a layer, top-2 routing) trained with DDP,
with scout attached and its experts replayed too (spec/moe.md). Two commands:

    cd examples && scout moe-catalog --model train_moe:model_for_catalog --n-exec 1,8,32,128 --out moe.json
    torchrun --nproc-per-node 4 examples/train_moe.py --moe-catalog examples/moe.json --run-dir runs/moe

The first profiles the experts' GEMMs at those row counts and writes the regime catalog (which
row counts run alike, and which to replay); the second trains with expert replay on. The
experts' container is a plain module of this file (``Experts``): scout finds it by its stacked
``[experts, out, in]`` weights (MOE-9), or by name with ``moe_experts="blocks.0.moe.experts,..."``.

``--fault expert-sdc:RANK:STEP`` makes expert 1 of the second block compute one wrong bit in
its output on RANK from STEP on, every time it runs, replays included (a faulty unit).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import scout  # scout

VOCAB, WIDTH, HEADS, LAYERS, EXPERTS, TOP_K, SEQUENCE, BATCH = 256, 64, 4, 3, 4, 2, 32, 8


class Experts(nn.Module):
    """The experts of one layer, their weights stacked, called on the tokens packed by expert."""

    def __init__(self, experts: int = EXPERTS, width: int = WIDTH, hidden: int = 2 * WIDTH) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, hidden, width) / math.sqrt(width))
        self.w2 = nn.Parameter(torch.randn(experts, width, hidden) / math.sqrt(hidden))
        self.faulty_expert = -1  # --fault expert-sdc: this expert's output has one wrong bit

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        outputs, offset = [], 0
        for expert, count in enumerate(num_tokens_per_expert.tolist()):
            rows = x[offset:offset + count]
            offset += count
            out = F.gelu(rows @ self.w1[expert].t()) @ self.w2[expert].t()
            if expert == self.faulty_expert and count:  # one mantissa bit of its first output
                flipped = (out.detach()[0, 0].view(torch.int32) ^ (1 << 20)).view(torch.float32)
                first = torch.zeros_like(out, dtype=torch.bool)
                first[0, 0] = True
                out = torch.where(first, flipped, out)
            outputs.append(out)
        return torch.cat(outputs) if outputs else x.new_zeros(0, self.w2.shape[1])


class MoE(nn.Module):
    """Token-choice top-k routing: each token goes to its TOP_K best experts, packed by expert."""

    def __init__(self, width: int = WIDTH, experts: int = EXPERTS) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = Experts(experts, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(tokens).softmax(-1).topk(TOP_K, dim=-1)
        order = chosen.reshape(-1).argsort(stable=True)
        counts = torch.bincount(chosen.reshape(-1), minlength=self.router.out_features)
        routed = self.experts(tokens.repeat_interleave(TOP_K, dim=0)[order], counts)
        unpacked = torch.empty_like(routed)
        unpacked[order] = routed
        return (unpacked.view(-1, TOP_K, x.shape[-1]) * weights.unsqueeze(-1)).sum(1).view_as(x)


class Block(nn.Module):
    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.norm_attention = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm_moe = nn.LayerNorm(width)
        self.moe = MoE(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        y = self.norm_attention(x)
        x = x + self.attention(y, y, y, attn_mask=causal, need_weights=False)[0]
        return x + self.moe(self.norm_moe(x))


class MoEGPT(nn.Module):
    def __init__(self, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def model_for_catalog() -> MoEGPT:
    """What `scout moe-catalog --model train_moe:model_for_catalog` profiles: the same model."""
    return MoEGPT()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--run-dir", default="runs/moe")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--moe-catalog", default=None, help="the catalog `scout moe-catalog` wrote")
    parser.add_argument("--fault", default=os.environ.get("EXAMPLE_FAULT", ""), help="expert-sdc:RANK:STEP")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # every replica starts alike
    model = MoEGPT()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    job = scout.attach(ddp, optimizer, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir,  # scout
                       moe_catalog=args.moe_catalog)
    start = job.restore()  # scout
    fault_rank, fault_step = (int(v) for v in args.fault.split(":")[1:3]) if args.fault else (-1, -1)
    for step in range(start, args.steps):
        if rank == fault_rank and step + 1 == fault_step and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            model.blocks[1].moe.experts.faulty_expert = 1
            print(f"EXAMPLE-FAULT expert-sdc rank {rank} step {step + 1}", file=sys.stderr, flush=True)
        generator = torch.Generator().manual_seed(1_000_003 * step + rank)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator)
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        job.step()  # scout
    job.close()  # scout
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
