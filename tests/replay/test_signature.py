"""Tensor signatures (spec/replay.md SIG-1..SIG-12).

The central property (SIG-3) is tested exhaustively: every bit of every element, for sizes
straddling every internal boundary of every implementation (vector widths and unrolling of the
C kernel, chunk sizes of the torch-ops path, the zero-padded tail word), for every dtype the
issue names. The tests drive the public ``tensor_signature``.
"""

from __future__ import annotations

import itertools
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scout.replay import _native, signature
from scout.replay.signature import (
    SignatureBackend,
    content_reference,
    signature_words,
    structured_signature,
    tensor_signature,
)
from tests import processes

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]
# Internal boundaries in 64-bit words: the C kernel's vector widths and unrolling (8, 16, 32
# words), the tail word, and the chunk sizes the torch-ops tests below use (3, 8).
BOUNDARY_WORDS = (1, 3, 8, 16, 32, 64)


def _element_counts(dtype: torch.dtype) -> list[int]:
    """Element counts whose byte length is a boundary, one element less, one more."""
    size = torch.empty((), dtype=dtype).element_size()
    counts = set()
    for words in BOUNDARY_WORDS:
        exact = words * 8 // size
        counts.update({exact - 1, exact, exact + 1})
    return sorted(c for c in counts if c > 0)


def _random_bytes(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=count, dtype=np.uint8)


def _tensor_over(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``dtype`` sharing memory with ``raw`` (so flipping raw flips the tensor)."""
    if dtype == torch.bool:
        raw[:] &= 1  # bool bytes must be 0 or 1 to be valid bools; bit flips then use uint8
    return torch.from_numpy(raw).view(dtype)


def _flip_every_bit(raw: np.ndarray, sign) -> tuple[int, list[int]]:
    """Signature before, and after each single-bit flip (each flip undone before the next)."""
    before = sign()
    after = []
    for byte in range(raw.size):
        for bit in range(8):
            raw[byte] ^= 1 << bit
            after.append(sign())
            raw[byte] ^= 1 << bit
    assert sign() == before
    return before, after


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_SIG_3_every_bit_flip_of_every_element_changes_signature(dtype: torch.dtype) -> None:
    for count in _element_counts(dtype):
        size = torch.empty((), dtype=dtype).element_size()
        raw = _random_bytes(count * size, seed=count)
        tensor = _tensor_over(raw, dtype if dtype != torch.bool else torch.uint8)
        if dtype == torch.bool:
            tensor = tensor.view(torch.bool)
        before, after = _flip_every_bit(raw, lambda t=tensor: tensor_signature(t))
        unchanged = [i for i, s in enumerate(after) if s == before]
        assert not unchanged, (
            f"{dtype} x {count}: flips {[(i // 8, i % 8) for i in unchanged[:5]]} unseen"
        )
        # Stronger than required, and expected of a good mix: all flips look different.
        assert len(set(after)) == len(after), f"{dtype} x {count}: two flips collide"


@pytest.mark.parametrize("chunk_words", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.uint8])
def test_SIG_3_SIG_9_torch_ops_path_sees_every_flip_across_chunk_boundaries(
    dtype: torch.dtype, chunk_words: int
) -> None:
    size = torch.empty((), dtype=dtype).element_size()
    for words in (chunk_words - 1, chunk_words, chunk_words + 1, 2 * chunk_words + 1):
        count = max(1, words * 8 // size + 1)  # +1 element: a padded tail word too
        raw = _random_bytes(count * size, seed=words)
        tensor = _tensor_over(raw, dtype)

        def sign(t: torch.Tensor = tensor) -> int:
            return signature._tensor_signature_torch_only(t, chunk_words)

        before, after = _flip_every_bit(raw, sign)
        assert before == tensor_signature(tensor)
        assert all(s != before for s in after)


def test_SIG_3_flips_next_to_the_default_torch_chunk_boundary() -> None:
    chunk = signature._TORCH_CHUNK_WORDS_CPU
    raw = _random_bytes(8 * (chunk + 2) + 3, seed=7)
    tensor = torch.from_numpy(raw)
    before = signature._tensor_signature_torch_only(tensor)
    assert before == tensor_signature(tensor)
    # The chunk arithmetic is covered exhaustively with small chunks above; at the default
    # size a few bits per word around the boundary keep this test short.
    for word in (chunk - 1, chunk, chunk + 1, chunk + 2):
        for bit in (0, 7, 31, 32, 62, 63):
            byte = 8 * word + bit // 8
            if byte >= raw.size:
                continue
            raw[byte] ^= 1 << (bit % 8)
            assert signature._tensor_signature_torch_only(tensor) != before, (word, bit)
            assert tensor_signature(tensor) != before, (word, bit)
            raw[byte] ^= 1 << (bit % 8)


def test_SIG_3_any_change_within_one_word_is_seen() -> None:
    """The theorem covers every change confined to one word, not only single flips."""
    raw = _random_bytes(8 * 40, seed=3)
    tensor = torch.from_numpy(raw)
    before = tensor_signature(tensor)
    rng = np.random.default_rng(11)
    for _ in range(3000):
        word = int(rng.integers(0, 40))
        delta = rng.integers(0, 256, size=8, dtype=np.uint8)
        if not delta.any():
            continue
        raw[8 * word : 8 * word + 8] ^= delta
        assert tensor_signature(tensor) != before
        raw[8 * word : 8 * word + 8] ^= delta


def test_SIG_4_pairs_of_sign_flips_in_different_words_are_seen() -> None:
    """A linear weighting (sum of word x odd multiplier) misses every pair of bit-63 flips;
    the mix does not. Exhaustive over all pairs of top-element sign bits of 96 words."""
    values = torch.randn(192, generator=torch.Generator().manual_seed(1))
    raw = values.numpy().view(np.uint8)
    before = tensor_signature(values)
    seen = set()
    for first, second in itertools.combinations(range(96), 2):
        for word in (first, second):
            raw[8 * word + 7] ^= 0x80  # bit 63 of the word: sign of the odd-indexed element
        signed = tensor_signature(values)
        assert signed != before, (first, second)
        seen.add(signed)
        for word in (first, second):
            raw[8 * word + 7] ^= 0x80
    assert len(seen) == 96 * 95 // 2
    assert signature.collision_bound(1) == 0.0 and 0 < signature.collision_bound(2) < 2**-63


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(2, 600),
    dtype=st.sampled_from(
        [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32]
    ),
    data=st.data(),
)
def test_SIG_5_swapped_elements_change_signature(count: int, dtype: torch.dtype, data) -> None:
    generator = torch.Generator().manual_seed(count)
    tensor = (torch.randn(count, generator=generator) * 100).to(dtype)
    first = data.draw(st.integers(0, count - 1))
    second = data.draw(st.integers(0, count - 1))
    if torch.equal(tensor[first : first + 1], tensor[second : second + 1]) or first == second:
        return
    swapped = tensor.clone()
    swapped[first], swapped[second] = tensor[second], tensor[first]
    assert tensor_signature(swapped) != tensor_signature(tensor)


def test_SIG_5_every_adjacent_swap_is_seen() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int8):
        tensor = (torch.randn(257, generator=torch.Generator().manual_seed(5)) * 50).to(dtype)
        before = tensor_signature(tensor)
        for index in range(tensor.numel() - 1):
            if tensor[index] == tensor[index + 1]:
                continue
            swapped = tensor.clone()
            swapped[index], swapped[index + 1] = tensor[index + 1], tensor[index]
            assert tensor_signature(swapped) != before, (dtype, index)


def test_SIG_6_dtype_shape_and_length_are_part_of_the_signature() -> None:
    base = torch.arange(24, dtype=torch.float32)
    signatures = {
        tensor_signature(base),
        tensor_signature(base.view(4, 6)),
        tensor_signature(base.view(6, 4)),
        tensor_signature(base.view(2, 3, 4)),
        tensor_signature(base.view(torch.int32)),
        tensor_signature(base.view(torch.uint8)),
        tensor_signature(base.view(torch.bfloat16)),
        tensor_signature(base.view(torch.float64)),
        tensor_signature(base[:23]),
        tensor_signature(torch.cat([base, torch.zeros(1)])),  # a real trailing zero
    }
    assert len(signatures) == 10
    assert tensor_signature(torch.tensor(3.0)) != tensor_signature(torch.tensor([3.0]))
    assert tensor_signature(torch.zeros(0)) != tensor_signature(torch.zeros(0, 3))
    assert tensor_signature(torch.zeros(0)) != tensor_signature(torch.zeros(0, dtype=torch.int32))
    # Zero bytes at the end are not padding: 7 zero bytes differ from 8.
    assert tensor_signature(torch.zeros(7, dtype=torch.uint8)) != tensor_signature(
        torch.zeros(8, dtype=torch.uint8)
    )


def test_SIG_1_layout_device_and_autograd_state_are_not_part_of_it() -> None:
    base = torch.randn(6, 5, generator=torch.Generator().manual_seed(2))
    transposed_copy = base.t().contiguous()
    assert tensor_signature(base.t()) == tensor_signature(transposed_copy)
    assert tensor_signature(base.requires_grad_()) == tensor_signature(base.detach())
    complex_values = torch.randn(4, dtype=torch.complex64)
    assert tensor_signature(complex_values.conj()) == tensor_signature(
        complex_values.conj().resolve_conj()
    )
    assert tensor_signature(complex_values.conj()) != tensor_signature(complex_values)


def test_SIG_1_unaligned_views_hash_by_their_bytes() -> None:
    raw = torch.from_numpy(_random_bytes(203, seed=9))
    for start in range(1, 9):
        view = raw[start : start + 150]
        assert view.storage_offset() % 8 == start % 8
        want = content_reference(view.numpy().tobytes())
        assert signature._content_torch(view) == want
        assert tensor_signature(view) == tensor_signature(view.clone())
        assert tensor_signature(view) == signature._tensor_signature_torch_only(view)


# Known answers: the definition pinned. A change here changes every signature ever compared
# across versions; it must come with a version bump of the domain words (SIG-8).
KNOWN_ANSWERS = {
    "float32 arange(10)": lambda: torch.arange(10, dtype=torch.float32),
    "uint8 bytes 0..12": lambda: torch.arange(13, dtype=torch.uint8),
    "bfloat16 2x3 ones": lambda: torch.ones(2, 3, dtype=torch.bfloat16),
    "int64 empty": lambda: torch.zeros(0, dtype=torch.int64),
}
KNOWN_VALUES_FILE = Path(__file__).with_name("signature_known_answers.txt")


def _known_answer_lines() -> list[str]:
    return [f"{name} = {tensor_signature(make())}" for name, make in KNOWN_ANSWERS.items()] + [
        f"structure = {structured_signature({'a': [1, 2.5, None], 'b': ('x', b'y', True)})}"
    ]


def test_SIG_8_known_answers_are_pinned() -> None:
    lines = _known_answer_lines()
    pinned = KNOWN_VALUES_FILE.read_text().split("\n")
    pinned = [line for line in pinned if line and not line.startswith("#")]
    assert lines == pinned


def test_SIG_8_deterministic_across_processes_and_backends(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests.replay.test_signature import _known_answer_lines
        print("\\n".join(_known_answer_lines()))
        """
    )
    outputs = []
    for backend in ("", "torch"):
        environment = dict(os.environ, SCOUT_SIGNATURE_BACKEND=backend, PYTHONHASHSEED="random")
        completed = processes.run(
            [sys.executable, "-c", script, str(REPO)],
            capture_output=True,
            text=True,
            env=environment,
            cwd=tmp_path,
            timeout=120,
        )
        assert completed.returncode == 0, completed.stderr
        outputs.append(completed.stdout.strip().split("\n"))
    assert outputs[0] == outputs[1] == _known_answer_lines()


@pytest.mark.parametrize("dtype", DTYPES + [torch.complex64, torch.float8_e4m3fn], ids=str)
def test_SIG_2_SIG_9_native_torch_ops_and_reference_agree(dtype: torch.dtype) -> None:
    assert signature.signature_backend("cpu") is SignatureBackend.NATIVE, (
        _native.native_unavailable_reason()
    )
    for count in (0, 1, 2, 5, 31, 33, 255, 1000, 4099):
        raw = _random_bytes(count * torch.empty((), dtype=dtype).element_size(), seed=count)
        if dtype == torch.bool:
            raw &= 1
        tensor = torch.from_numpy(raw).view(dtype) if count else torch.zeros(0, dtype=dtype)
        native = tensor_signature(tensor)
        assert native == signature._tensor_signature_torch_only(tensor)
        assert native == signature._tensor_signature_torch_only(tensor, 7)
        content = content_reference(raw.tobytes())
        meta = signature._meta_digest(dtype, (count,), raw.size)
        assert native == signature._to_signed(signature.mix64(content ^ meta))


_PATHS_HERE = signature.native_paths()


@pytest.mark.parametrize("path", _native.PATH_NAMES)
def test_SIG_3_SIG_9_every_native_path_sees_every_bit_flip(path: str) -> None:
    """CI runs the every-bit test on each path the machine can run (SIG-12: scalar, AVX2,
    AVX-512 or NEON); the others skip with the reason."""
    if path not in _PATHS_HERE:
        pytest.skip(f"this CPU does not run the {path} path (runs: {', '.join(_PATHS_HERE)})")
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        for count in _element_counts(dtype):
            size = torch.empty((), dtype=dtype).element_size()
            raw = _random_bytes(count * size, seed=count + 7)
            tensor = _tensor_over(raw, dtype)

            def sign(t: torch.Tensor = tensor) -> int:
                return signature._tensor_signature_on_path(t, path)

            before, after = _flip_every_bit(raw, sign)
            assert before == signature._tensor_signature_torch_only(tensor)
            unchanged = [i for i, s in enumerate(after) if s == before]
            assert not unchanged, f"{path} {dtype} x {count}: flips {unchanged[:5]} unseen"


@pytest.mark.parametrize("path", _native.PATH_NAMES)
def test_SIG_9_every_native_path_equals_the_definition(path: str) -> None:
    if path not in _PATHS_HERE:
        pytest.skip(f"this CPU does not run the {path} path (runs: {', '.join(_PATHS_HERE)})")
    kernel = _native.load_native_kernel(signature._native_self_test)
    assert kernel is not None
    for length in [*range(0, 300), 1021, 4099, 8 * 1000 + 3]:
        raw = _random_bytes(length + 1, seed=length)
        assert kernel.content(raw.ctypes.data, length, path) == content_reference(
            raw[:length].tobytes()
        ), (path, length)
    # Unaligned start addresses: the loops use unaligned loads.
    raw = _random_bytes(8 * 300 + 16, seed=99)
    for offset in range(1, 8):
        view = raw[offset:]
        assert kernel.content(view.ctypes.data, view.size, path) == content_reference(view.tobytes())


def test_SIG_9_a_forced_path_that_is_missing_is_an_error_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCOUT_SIGNATURE_PATH", "sparc")
    _native.reset_for_tests()
    try:
        with pytest.raises(ValueError, match="SCOUT_SIGNATURE_PATH='sparc'.*available: scalar"):
            tensor_signature(torch.arange(3.0))
        monkeypatch.setenv("SCOUT_SIGNATURE_PATH", "scalar")
        _native.reset_for_tests()
        assert signature.native_path() == "scalar"
        assert tensor_signature(torch.arange(3.0)) == signature._tensor_signature_torch_only(
            torch.arange(3.0)
        )
    finally:
        monkeypatch.undo()
        _native.reset_for_tests()


def test_SIG_9_a_path_failing_its_self_test_is_dropped_with_the_reason() -> None:
    _native.reset_for_tests()

    def self_test(kernel: _native.NativeKernel, path: str) -> str | None:
        return "planted failure" if path != "scalar" else None

    try:
        kernel = _native.load_native_kernel(self_test)
        assert kernel is not None and kernel.paths == ("scalar",) and kernel.path == "scalar"
        assert set(kernel.dropped) == set(_PATHS_HERE) - {"scalar"}
        with pytest.raises(ValueError, match="not available here"):
            kernel.content(0, 0, "avx512")
    finally:
        _native.reset_for_tests()


def test_SIG_9_large_tensor_native_equals_torch_ops() -> None:
    tensor = torch.randn(3 * 2**20 + 5, generator=torch.Generator().manual_seed(4))
    assert tensor_signature(tensor) == signature._tensor_signature_torch_only(tensor)


def test_SIG_9_fallback_when_the_native_kernel_cannot_be_built(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tensor = torch.randn(1001)
    expected = tensor_signature(tensor)
    monkeypatch.setenv("CC", "/nonexistent/compiler")
    monkeypatch.setenv("PATH", "/nonexistent")
    _native.reset_for_tests()
    signature._state.clear()
    try:
        assert signature.signature_backend("cpu") is SignatureBackend.TORCH
        assert tensor_signature(tensor) == expected
        assert "no C compiler" in (_native.native_unavailable_reason() or "")
        assert "native signature kernel is unavailable" in caplog.text
    finally:
        monkeypatch.undo()
        _native.reset_for_tests()
        signature._state.clear()
    assert signature.signature_backend("cpu") is SignatureBackend.NATIVE


def test_SIG_9_kernel_builds_in_a_fresh_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCOUT_CACHE_DIR", str(tmp_path))
    _native.reset_for_tests()
    try:
        assert signature.signature_backend("cpu") is SignatureBackend.NATIVE
        built = list((tmp_path / "native").glob("scout_signature_*.so"))
        assert len(built) == 1
        assert tensor_signature(torch.arange(5.0)) == signature._tensor_signature_torch_only(
            torch.arange(5.0)
        )
    finally:
        monkeypatch.undo()
        _native.reset_for_tests()


def test_SIG_1_bad_input_names_the_value() -> None:
    with pytest.raises(TypeError, match="got list"):
        tensor_signature([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="layout"):
        tensor_signature(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="meta tensor"):
        tensor_signature(torch.empty(3, device="meta"))


# --------------------------------------------------------------------------------------------
# Structured signatures
# --------------------------------------------------------------------------------------------


def test_SIG_10_structured_signature_distinguishes_kinds_and_orders() -> None:
    values = [
        None,
        True,
        1,
        1.0,
        -0.0,
        0.0,
        "1",
        b"1",
        (1,),
        [1],
        {"a": 1},
        {1: "a"},
        torch.Size([1]),
        torch.float32,
        torch.tensor([1]),
        (1, 2),
        (2, 1),
        ((1,), 2),
        (1, (2,)),
        "",
        (),
        [],
        {},
        2**64,
        -(2**64),
        [None, None],
        [None],
    ]
    digests = [structured_signature(v) for v in values]
    assert len(set(digests)) == len(values)


def test_SIG_10_mappings_are_order_free_and_tensors_by_content() -> None:
    a = {"x": torch.ones(3), "y": [1, 2]}
    b = {"y": [1, 2], "x": torch.ones(3)}
    assert structured_signature(a) == structured_signature(b)
    c = {"y": [1, 2], "x": torch.ones(3).clone()}
    c["x"][1] = torch.tensor(1.0).nextafter(torch.tensor(2.0))
    assert structured_signature(c) != structured_signature(a)


def test_SIG_10_unsupported_values_name_the_path() -> None:
    with pytest.raises(TypeError, match=r"value\['k'\]\[1\].*object"):
        structured_signature({"k": [1, object()]})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        structured_signature(loop)


def test_SIG_10_stream_is_inspectable() -> None:
    assert signature_words(None) == [1]
    assert signature_words(True) == [2, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (SIG-7 on GPU)")
def test_SIG_7_SIG_9_cuda_signature_equals_cpu_and_sees_every_flip() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8):
        cpu = (torch.randn(4099, generator=torch.Generator().manual_seed(8)) * 30).to(dtype)
        assert tensor_signature(cpu.cuda()) == tensor_signature(cpu)
    raw = torch.randint(0, 256, (8 * 33 + 5,), dtype=torch.uint8, device="cuda")
    before = tensor_signature(raw)
    for byte in range(raw.numel()):
        for bit in range(8):
            raw[byte] ^= 1 << bit
            assert tensor_signature(raw) != before
            raw[byte] ^= 1 << bit


def test_SIG_12_benchmark_runs_and_reports_every_row(tmp_path: Path) -> None:
    """The throughput figure itself is measured by bench/signature.py (512 MiB); this keeps the
    script working on a small size."""
    import json

    output = tmp_path / "signature.json"
    completed = processes.run(
        [
            sys.executable,
            str(REPO / "bench" / "signature.py"),
            "--size-mib",
            "8",
            "--fallback-size-mib",
            "1",
            "--repeats",
            "2",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(output.read_text())
    assert result["backend"] == "native" and result["threads"] == 1
    paths = signature.native_paths()
    assert result["paths"] == list(paths) and result["dispatched_path"] == signature.native_path()
    expected = {"copy_into_preallocated", "xxh3_64", "tensor_signature_fp32", "torch_ops_fallback"}
    expected |= {f"signature_{path}_{dtype}" for path in paths for dtype in ("fp32", "bf16")}
    assert set(result["rows"]) == expected
    assert all(row["gb_per_s_median"] > 0 for row in result["rows"].values())
    # One goal per comparison, each judged from medians (bench/_goals.py).
    names = {goal["name"] for goal in result["goals"]}
    assert f"signature CPU {signature.native_path()} fp32 vs xxh3" in names
    assert all(isinstance(goal["met"], bool) and goal["ratio"] > 0 for goal in result["goals"])
