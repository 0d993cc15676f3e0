"""A toy top-k routed MoE for the expert tests (no dependency beyond torch).

``GroupedExperts`` is called as ``experts(x, num_tokens_per_expert)`` on the packed rows, like
TorchTitan's. Like a real GEMM library it picks its path by size: under ``SMALL_ROWS`` rows an
expert runs a batched matrix-vector product (``bmm``), otherwise one matrix product -- so the
regime catalog sees two kinds of execution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SMALL_ROWS = 8
DIM = 24
HIDDEN = 40


class GroupedExperts(nn.Module):
    def __init__(self, experts: int, dim: int = DIM, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.num_experts = experts
        self.w1 = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, dim, hidden) / hidden**0.5)

    @staticmethod
    def _product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows < SMALL_ROWS:  # a GEMV path for few rows
            return torch.bmm(x.unsqueeze(1), weight.t().unsqueeze(0).expand(rows, -1, -1)).squeeze(1)
        return x @ weight.t()

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        outputs = []
        offset = 0
        for expert, count in enumerate(num_tokens_per_expert.tolist()):
            if count == 0:
                continue
            rows = x[offset : offset + count]
            offset += count
            hidden = F.gelu(self._product(rows, self.w1[expert]))
            outputs.append(self._product(hidden, self.w2[expert]))
        if not outputs:
            return x.new_zeros(0, self.w2.shape[1])
        return torch.cat(outputs)


class MoE(nn.Module):
    """Top-k token-choice routing over local experts; tokens packed by expert."""

    def __init__(self, experts: int, top_k: int = 2, dim: int = DIM) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = GroupedExperts(experts, dim)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        scores, chosen = self.router(tokens).softmax(-1).topk(self.top_k, dim=-1)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.experts.num_experts)
        packed = tokens.repeat_interleave(self.top_k, dim=0)[order]
        routed = self.experts(packed, counts)
        combined = torch.zeros_like(tokens.repeat_interleave(self.top_k, dim=0))
        combined[order] = routed
        weighted = (combined.view(-1, self.top_k, tokens.shape[-1]) * scores.unsqueeze(-1)).sum(1)
        return weighted.view_as(x)


class ToyMoEModel(nn.Module):
    def __init__(self, experts: int, layers: int = 1, dim: int = DIM) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(MoE(experts, dim=dim) for _ in range(layers))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.out(h)
