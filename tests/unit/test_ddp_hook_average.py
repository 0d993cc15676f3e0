"""INSTR-15: where scout's DDP hook averages a bucket with one ``ReduceOp.AVG`` all-reduce (NCCL on
a CUDA bucket: it divides inside its reduction) and where it divides the bucket itself, counted, and
sums (anywhere else). In-process: the decision reads the group's backend for the bucket's device;
the real gloo job is tests/job/test_ddp_hook.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scout.job.hooks import _averages_in_reduction  # noqa: E402


class _Backend:
    def __init__(self, name: str | None) -> None:
        self._name = name

    def name(self) -> str:
        if self._name is None:
            raise RuntimeError("no backend for this device")
        return self._name


class _Group:
    def __init__(self, name: str | None) -> None:
        self.backend = _Backend(name)

    def _get_backend(self, device: object) -> _Backend:
        return self.backend


class _Bucket:
    def __init__(self, device: str) -> None:
        self.device = torch.device(device)


@pytest.mark.parametrize(("device", "backend", "native"), [
    ("cuda", "nccl", True), ("cuda", "NCCL", True), ("cuda", "gloo", False), ("cuda", None, False),
    ("cpu", "nccl", False), ("cpu", "gloo", False), ("cpu", "mpi", False)])
def test_INSTR_15_avg_only_where_the_backend_divides_inside_its_reduction(
    device: str, backend: str | None, native: bool
) -> None:
    """NCCL on a CUDA bucket averages inside its reduction; anywhere else (gloo's AVG is a sum and a
    pass after it, MPI has none, a backend that cannot say) the hook divides, counted, and sums."""
    assert _averages_in_reduction(_Group(backend), _Bucket(device)) is native
