"""FRAME-12 in the Lightning integration without processes: the training loader's batch sampler
skips the batches an epoch consumed, once, and keeps the epoch's order (set_epoch) and length."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from scout.integrations.lightning import SkipFirst, _skip_batches


def batches(loader: DataLoader[torch.Tensor]) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_FRAME_12_the_loader_resumes_at_the_batch_after_the_consumed_ones_once() -> None:
    data = torch.arange(24)
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)  # as Lightning injects it
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    sampler.set_epoch(1)
    whole = batches(loader)
    assert _skip_batches(loader, 2)
    assert len(loader) == len(whole) == 6
    loader.batch_sampler.sampler.set_epoch(1)  # type: ignore[union-attr]  # reaches the DistributedSampler
    assert batches(loader) == whole[2:], "the epoch goes on at its third batch, in the same order"
    assert batches(loader) == whole, "once: the next epoch is whole"
    assert _skip_batches(loader, 1) and isinstance(loader.batch_sampler.sampler, SkipFirst)  # type: ignore[union-attr]
    assert not isinstance(loader.batch_sampler.sampler.sampler, SkipFirst)  # type: ignore[union-attr]
    assert batches(loader) == whole[1:]


def test_FRAME_12_a_loader_without_torchs_batch_sampler_is_not_skipped() -> None:
    loader = DataLoader(torch.arange(8), batch_size=None)
    assert not _skip_batches(loader, 2)
    with pytest.raises(ValueError, match="skip must be >= 0"):
        SkipFirst(range(3), -1)
