"""The toy model of scout's own jobs: a tiny decoder-only transformer (embedding, pre-norm blocks
with causal attention and an MLP, output head).

One definition for the real-process campaign (:mod:`scout.scenarios.real_campaign`), the
overhead benchmark (``bench/overhead.py``) and the replay tests (``tests/replay/_scenarios.py``),
which used to write it out three times. Each keeps its own size and flavour through the
arguments; the module tree (``embed``, ``layers.<i>.{norm_attention, qkv, projection, norm_mlp,
mlp}``, ``norm``, ``lm_head``) and the order in which parameters are created (so a seeded
initialisation) are the same for every flavour. Needs torch; import it only where torch is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION", "Block", "TinyLM"]

#: ``explicit``: softmax of masked scores, written out (every op visible to replay's capture);
#: ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (a benchmark's fast path).
ATTENTION = ("explicit", "sdpa")


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each residual."""

    def __init__(
        self, width: int, heads: int, *, mlp_ratio: int = 2, dropout: float = 0.0, attention: str = "explicit"
    ) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r} is not one of {ATTENTION}")
        self.width, self.heads, self.attention = width, heads, attention
        self.norm_attention = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)
        self.norm_mlp = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))
        # No module at all without dropout: a model without it has no Dropout in its tree.
        self.dropout = nn.Dropout(dropout) if dropout else None

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.dropout is None else self.dropout(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm_attention(x)).chunk(3, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

        if self.attention == "sdpa":
            mixed = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        else:
            scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(width // self.heads)
            mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            mixed = scores.masked_fill(mask, float("-inf")).softmax(-1) @ split(v)
        x = x + self._drop(self.projection(mixed.transpose(1, 2).reshape(batch, length, width)))
        out: torch.Tensor = x + self._drop(self.mlp(self.norm_mlp(x)))
        return out


class TinyLM(nn.Module):
    """Embedding, ``layers`` blocks, a final norm and the output head; logits by position."""

    def __init__(
        self,
        vocab: int,
        width: int,
        heads: int,
        layers: int,
        *,
        mlp_ratio: int = 2,
        dropout: float = 0.0,
        attention: str = "explicit",
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            Block(width, heads, mlp_ratio=mlp_ratio, dropout=dropout, attention=attention) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.lm_head(self.norm(x))
        return out
