"""The GPU signature kernel (scout/replay/_gpu.py; spec/replay.md SIG-3, SIG-7, SIG-9, SIG-13,
SIG-14).

Without a GPU the Triton kernel runs under Triton's CPU interpreter (``TRITON_INTERPRET=1``),
which executes the kernel's own source with numpy's wrapping uint64 arithmetic: the kernel's
signature must equal the CPU signature bit for bit (every dtype, boundary sizes, views, every
single-bit flip: tests/replay/triton_interpreted_checks.py, one process for all of them), and
the kernel must compile ahead of time for sm_80, sm_90 and sm_100 with the ptxas that ships with
Triton. The fallback (SIG-13) is tested in-process with the kernel launch replaced. On a CUDA
host the same checks also run on the device. Each test skips with the reason when its
requirement is missing.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from scout.replay import _gpu
from scout.replay.signature import (
    _content_torch,
    _tensor_signature_torch_only,
    _to_signed,
    tensor_signature,
)

pytestmark = pytest.mark.spawns

try:
    import triton  # noqa: F401

    _TRITON = True
except ImportError:
    _TRITON = False

needs_triton = pytest.mark.skipif(not _TRITON, reason="triton is not installed")

REPO = Path(__file__).resolve().parents[2]
INTERPRETED_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("triton_interpreted") / "checks.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tests.replay.triton_interpreted_checks", str(out)],
        capture_output=True,
        text=True,
        timeout=INTERPRETED_TIMEOUT_S,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )
    if completed.returncode == 3:
        pytest.skip(completed.stdout.strip())
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return results


def _check(interpreted: dict[str, Any], name: str) -> None:
    outcome = interpreted[name]["outcome"]
    assert outcome == "ok", outcome


@needs_triton
def test_SIG_9_triton_kernel_equals_the_definition(interpreted: dict[str, Any]) -> None:
    _check(interpreted, "definition")


@needs_triton
def test_SIG_14_triton_kernel_equals_the_cpu_signature_for_every_dtype_at_every_boundary(
    interpreted: dict[str, Any],
) -> None:
    _check(interpreted, "dtypes")


@needs_triton
def test_SIG_14_triton_kernel_equals_the_cpu_signature_for_strided_and_offset_views(
    interpreted: dict[str, Any],
) -> None:
    _check(interpreted, "views")


@needs_triton
def test_SIG_3_SIG_14_triton_kernel_sees_every_single_bit_flip(interpreted: dict[str, Any]) -> None:
    _check(interpreted, "flips")


EM_CUDA = 190  # the ELF machine number of a cubin


def _ptxas(capability: int) -> Path | None:
    """The ptxas the triton wheel ships for ``capability`` (triton >= 3.4 names it in its knobs;
    older wheels keep it in backends/nvidia/bin), or None."""
    import triton

    nvidia = getattr(getattr(triton, "knobs", None), "nvidia", None)
    names = ("ptxas_blackwell", "ptxas") if capability >= 100 else ("ptxas",)
    for name in names:
        tool = getattr(nvidia, name, None)
        path = getattr(tool, "path", None)
        if path and Path(path).is_file():
            return Path(path)
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return bundled if bundled.is_file() else None


@needs_triton
@pytest.mark.parametrize("capability", [80, 90, 100])
def test_SIG_14_triton_kernel_compiles_ahead_of_time(
    capability: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _ptxas(capability) is None:
        pytest.skip(f"the triton wheel ships no ptxas for sm_{capability}")
    if _gpu._interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set in this process: the interpreter compiles nothing")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a fresh compile, never a cache hit
    compiled = _gpu.compile_ahead(capability)
    ptx = compiled.asm["ptx"]
    assert f".target sm_{capability}" in ptx
    assert ".entry _content_kernel" in ptx
    cubin = compiled.asm["cubin"]
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == EM_CUDA
    # The SM number sits in e_flags: its low byte in the older cubin ABI, the next byte in the
    # newer one (sm_100).
    flags = struct.unpack_from("<I", cubin, 48)[0]
    assert capability in {flags & 0xFF, (flags >> 8) & 0xFF}, hex(flags)
    assert compiled.metadata.num_warps == 4


def test_SIG_14_compile_ahead_refuses_a_bad_capability() -> None:
    with pytest.raises(ValueError, match="capability must be an int such as 80 or 90, got '90'"):
        _gpu.compile_ahead("90")  # type: ignore[arg-type]


def test_SIG_7_unavailable_kernel_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu, "_state", {"kernel": "triton is not installed (test)"})
    assert _gpu.unavailable_reason() == "triton is not installed (test)"
    assert not _gpu.available()
    with pytest.raises(RuntimeError, match="triton is not installed"):
        _gpu.content_words(torch.zeros(4, dtype=torch.int64))


# -- fallback and self-test, with the kernel launch replaced ------------------------------------


def _right_words(words: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """What the kernel computes (Σ mix(w_i + (i+1)·K)), by the torch-ops path."""
    return torch.tensor(_to_signed(_content_torch(words.view(torch.uint8))), dtype=torch.int64)


class Launches:
    def __init__(self, behaviour: Any) -> None:
        self.behaviour = behaviour
        self.count = 0

    def __call__(self, words: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.count += 1
        result: torch.Tensor = self.behaviour(words)
        return result


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that "is available" on this CPU (the interpreter flag), with fresh state."""
    monkeypatch.setattr(_gpu, "_state", {"kernel": object()})
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _data(count: int = 3 * 8 * _gpu.BLOCK_WORDS + 5) -> torch.Tensor:
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))


def test_SIG_13_a_kernel_that_passes_its_self_test_is_used(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    launches = Launches(_right_words)
    monkeypatch.setattr(_gpu, "content_words", launches)
    data = _data()
    assert _gpu.content_or_none(data, data.numel()) == _content_torch(data)
    self_test = sum(1 for length in _gpu.self_test_lengths() if length >= 8)  # a launch each
    assert launches.count == self_test + 1
    assert _gpu.content_or_none(data, data.numel()) == _content_torch(data)
    assert launches.count == self_test + 2  # tested once per device, then one launch per call


def test_SIG_13_a_launch_failure_falls_back_with_one_warning(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def raising(words: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    launches = Launches(raising)
    monkeypatch.setattr(_gpu, "content_words", launches)
    data = _data()
    with caplog.at_level(logging.WARNING, logger="scout.replay"):
        assert _gpu.content_or_none(data, data.numel()) is None
        assert _gpu.content_or_none(data, data.numel()) is None
    assert launches.count == 1  # disabled after the first failure
    warnings = [r for r in caplog.records if "Triton signature kernel is disabled" in r.message]
    assert len(warnings) == 1 and "no kernel image" in warnings[0].message
    assert "no kernel image" in (_gpu.unavailable_reason() or "")


def test_SIG_13_a_kernel_that_computes_wrong_values_is_disabled_by_its_self_test(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    launches = Launches(lambda words: _right_words(words) + 1)
    monkeypatch.setattr(_gpu, "content_words", launches)
    data = _data()
    with caplog.at_level(logging.WARNING, logger="scout.replay"):
        assert _gpu.content_or_none(data, data.numel()) is None
        assert _gpu.content_or_none(data, data.numel()) is None
    assert launches.count == 1  # the first self-test length already differed; never again
    assert "self-test on cpu: the kernel gives" in (_gpu.unavailable_reason() or "")
    assert sum("Triton signature kernel is disabled" in r.message for r in caplog.records) == 1


def test_SIG_13_a_kernel_wrong_only_past_one_program_is_caught(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The self-test's lengths reach past a program: a kernel that drops the second program's
    partial sum is caught before any tensor is signed with it."""
    per_program = _gpu.BLOCK_WORDS * _gpu.BLOCKS_PER_PROGRAM
    launches = Launches(lambda words: _right_words(words[:per_program]))
    monkeypatch.setattr(_gpu, "content_words", launches)
    data = _data()
    assert _gpu.content_or_none(data, data.numel()) is None
    assert "self-test" in (_gpu.unavailable_reason() or "")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not _TRITON, reason="triton is not installed")
def test_SIG_7_SIG_9_cuda_kernel_equals_cpu_for_every_dtype() -> None:
    assert _gpu.available(), _gpu.unavailable_reason()
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8,
              torch.float8_e4m3fn, torch.float8_e5m2)
    for dtype in dtypes:
        for count in (1, 4099, 3 * _gpu.BLOCK_WORDS * _gpu.BLOCKS_PER_PROGRAM + 5):
            cpu = (torch.randn(count, generator=torch.Generator().manual_seed(count)) * 30).to(dtype)
            assert tensor_signature(cpu.cuda()) == tensor_signature(cpu), (dtype, count)
    assert _gpu.available(), f"the kernel disabled itself on the device: {_gpu.unavailable_reason()}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not _TRITON, reason="triton is not installed")
def test_SIG_13_a_failing_launch_on_the_device_falls_back_to_the_same_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def raising(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("injected launch failure")

    monkeypatch.setattr(_gpu, "_state", {})
    monkeypatch.setattr(_gpu, "content_words", raising)
    cpu = torch.randn(70_000, generator=torch.Generator().manual_seed(1))
    assert tensor_signature(cpu.cuda()) == tensor_signature(cpu) == _tensor_signature_torch_only(cpu)
    assert "injected launch failure" in (_gpu.unavailable_reason() or "")
