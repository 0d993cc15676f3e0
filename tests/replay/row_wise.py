"""A linear layer whose rows do not depend on how many rows it is given, on any CPU.

The self-check's cut replay (spec/self_check.md SELF-3) recomputes a few rows of a call and
compares them bit for bit with the same rows of the live output. ``nn.Linear`` is a matrix product
whose kernel the BLAS picks by the number of rows: on this project's AVX-512 machines the 2-row
product of a (6, 6) layer differs in its last bits from the first 2 rows of the 8-row one (on
AVX2 machines it did not), so there the cut replay of a plain linear layer mismatches and
falls back to the exact replay, as SELF-3 says it must. Tests of the cut path itself use this
layer: each row is its own one-row product, the same whatever the batch.
"""

from __future__ import annotations

import torch
from torch import nn


class RowWiseLinear(nn.Linear):
    """``nn.Linear`` computed one row at a time (a leading batch dimension of any size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = [super(RowWiseLinear, self).forward(x[index : index + 1]) for index in range(x.shape[0])]
        return torch.cat(rows) if rows else super().forward(x)
