"""CUDA RNG state (every device) in the DCP checkpoint (scout/gate/dcp.py, docs/gate.md "CUDA
RNG"): on a CPU-only machine against a fake ``torch.cuda`` (tests/fake_cuda.py) through real DCP
saves and loads on a one-rank gloo world; on a GPU, a restored run's dropout mask equals the
uninterrupted run's."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from scout.gate import dcp  # noqa: E402
from scout.gate.model import CheckpointId  # noqa: E402
from tests.fake_cuda import FakeCuda  # noqa: E402

pytestmark = pytest.mark.torchdist


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _job() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _saved_keys(path: Path) -> set[str]:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def test_cuda_rng_states_of_every_device_are_saved_and_restored(
    world_of_one: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCuda(device_count=2)
    monkeypatch.setattr(dcp, "_cuda_module", lambda: fake)
    model, optimizer = _job()
    saved = [s.clone() for s in fake.rng_states]
    path = dcp.save_checkpoint(tmp_path / "ckpt", CheckpointId(0, 5), model, optimizer)
    assert "cuda_rng_rank_0" in _saved_keys(path)
    fake.rng_states = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]  # drew on
    assert dcp.load_checkpoint(tmp_path / "ckpt", CheckpointId(0, 5), model, optimizer) == 5
    assert [s.tolist() for s in fake.rng_states] == [s.tolist() for s in saved]


def test_a_process_that_never_initialized_cuda_saves_no_cuda_state_and_loads_as_before(
    world_of_one: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCuda(device_count=1)
    fake.initialized = False
    monkeypatch.setattr(dcp, "_cuda_module", lambda: fake)
    model, optimizer = _job()
    path = dcp.save_checkpoint(tmp_path / "ckpt", CheckpointId(0, 1), model, optimizer)
    assert not any(key.startswith("cuda_rng") for key in _saved_keys(path))
    fake.initialized = True  # the restoring process uses CUDA: nothing to restore, no error
    before = [s.clone() for s in fake.rng_states]
    assert dcp.load_checkpoint(tmp_path / "ckpt", CheckpointId(0, 1), model, optimizer) == 1
    assert [s.tolist() for s in fake.rng_states] == [s.tolist() for s in before]


def test_another_device_count_restores_no_cuda_state_and_says_so(
    world_of_one: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model, optimizer = _job()
    monkeypatch.setattr(dcp, "_cuda_module", lambda: FakeCuda(device_count=2))
    dcp.save_checkpoint(tmp_path / "ckpt", CheckpointId(0, 2), model, optimizer)
    one = FakeCuda(device_count=1)
    before = one.rng_states[0].clone()
    monkeypatch.setattr(dcp, "_cuda_module", lambda: one)
    with caplog.at_level(logging.WARNING, logger="scout.gate"):
        assert dcp.load_checkpoint(tmp_path / "ckpt", CheckpointId(0, 2), model, optimizer) == 2
    assert "CUDA RNG states for 2 device(s), this process sees 1" in caplog.text
    assert one.rng_states[0].tolist() == before.tolist()


def test_a_cpu_only_restore_of_a_gpu_checkpoint_restores_the_rest(
    world_of_one: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model, optimizer = _job()
    monkeypatch.setattr(dcp, "_cuda_module", lambda: FakeCuda(device_count=1))
    dcp.save_checkpoint(tmp_path / "ckpt", CheckpointId(0, 3), model, optimizer)
    absent = FakeCuda(device_count=1)
    absent.is_available = lambda: False  # type: ignore[method-assign]
    monkeypatch.setattr(dcp, "_cuda_module", lambda: absent)
    with caplog.at_level(logging.WARNING, logger="scout.gate"):
        assert dcp.load_checkpoint(tmp_path / "ckpt", CheckpointId(0, 3), model, optimizer) == 3
    assert "CUDA is not available here" in caplog.text


def test_a_restored_gpu_run_draws_the_same_dropout_mask(world_of_one: None, tmp_path: Path) -> None:
    """On a GPU (skipped elsewhere): the mask drawn after a restore equals the one drawn right
    after the save, and differs from the next draw without a restore (so the check can fail)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the fake-torch.cuda tests above cover the code path on CPU")
    device = torch.device("cuda", torch.cuda.current_device())
    model, optimizer = _job()
    torch.cuda.manual_seed_all(2608)
    torch.nn.functional.dropout(torch.ones(64, device=device), 0.5)  # the run draws before saving
    dcp.save_checkpoint(tmp_path / "ckpt", CheckpointId(0, 7), model, optimizer)
    after_save = torch.nn.functional.dropout(torch.ones(4096, device=device), 0.5).cpu()
    without_restore = torch.nn.functional.dropout(torch.ones(4096, device=device), 0.5).cpu()
    dcp.load_checkpoint(tmp_path / "ckpt", CheckpointId(0, 7), model, optimizer)
    after_restore = torch.nn.functional.dropout(torch.ones(4096, device=device), 0.5).cpu()
    assert torch.equal(after_restore, after_save)
    assert not torch.equal(without_restore, after_save)
