"""The GPU signature kernel (scout/replay/_gpu.py; spec/replay.md SIG-3, SIG-7, SIG-9).

Without a GPU the Triton kernel runs under Triton's CPU interpreter (``TRITON_INTERPRET=1``),
which executes the kernel's own source with numpy's wrapping uint64 arithmetic: the kernel
must equal the pure-Python definition bit for bit and see every single-bit flip across its
block boundaries. On a CUDA host the same checks run on the device (and tests/gpu runs the
benchmark). Each test skips with the reason when its requirement is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scout.replay import _gpu
from scout.replay.signature import tensor_signature

try:
    import triton  # noqa: F401

    _TRITON = True
except ImportError:
    _TRITON = False

needs_triton = pytest.mark.skipif(not _TRITON, reason="triton is not installed")


REPO = Path(__file__).resolve().parents[2]


def _run_interpreted(check: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.replay.triton_interpreted_checks", check],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )
    if completed.returncode == 3:
        pytest.skip(completed.stdout.strip())
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]


@needs_triton
def test_SIG_9_triton_kernel_equals_the_definition() -> None:
    _run_interpreted("definition")


@needs_triton
def test_SIG_9_triton_kernel_reads_unaligned_views() -> None:
    _run_interpreted("unaligned")


@needs_triton
def test_SIG_3_triton_kernel_sees_every_single_bit_flip() -> None:
    _run_interpreted("flips")


def test_SIG_7_unavailable_kernel_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu, "_state", {"kernel": "triton is not installed (test)"})
    assert _gpu.unavailable_reason() == "triton is not installed (test)"
    assert not _gpu.available()
    with pytest.raises(RuntimeError, match="triton is not installed"):
        _gpu.content_words(torch.zeros(4, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not _TRITON, reason="triton is not installed")
def test_SIG_7_SIG_9_cuda_kernel_equals_cpu_for_every_dtype() -> None:
    assert _gpu.available(), _gpu.unavailable_reason()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8):
        for count in (1, 4099, 3 * _gpu.BLOCK_WORDS * _gpu.BLOCKS_PER_PROGRAM + 5):
            cpu = (torch.randn(count, generator=torch.Generator().manual_seed(count)) * 30).to(dtype)
            assert tensor_signature(cpu.cuda()) == tensor_signature(cpu), (dtype, count)
