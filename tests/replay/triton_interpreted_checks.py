"""Checks of the Triton signature kernel, run in a fresh process under Triton's CPU interpreter
(spec/replay.md SIG-3, SIG-9, SIG-14).

Triton must see ``TRITON_INTERPRET=1`` before it is first imported (its library functions such
as ``tl.sum`` are then interpreted too), so tests/replay/test_signature_gpu.py runs this module
once, ``python -m tests.replay.triton_interpreted_checks OUT_JSON [CHECK ...]``: every check
runs in this one process (torch and triton are imported once) and its outcome -- "ok", or what
differed -- is written to OUT_JSON. Exit status 3 means the kernel is unavailable (the reason
is printed); otherwise 0.

"Bit-exact against the CPU signature": the kernel's signature of a tensor
(``_tensor_signature_triton``) must equal ``tensor_signature`` of the same CPU tensor, which
takes the native path, for every dtype from int8 to float64 and both float8 formats, at sizes
around the kernel's block and program boundaries, for strided and offset views, and for every
single-bit flip around the first block's end and in the padded tail word.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from scout.replay import _gpu  # noqa: E402
from scout.replay.signature import (  # noqa: E402
    _tensor_signature_triton,
    content_reference,
    tensor_signature,
)

DTYPES = (
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.int16,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.float32,
    torch.int64,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
BLOCK_BYTES = 8 * _gpu.BLOCK_WORDS
PROGRAM_BYTES = BLOCK_BYTES * _gpu.BLOCKS_PER_PROGRAM


def _random(dtype: torch.dtype, count: int, seed: int) -> torch.Tensor:
    """``count`` elements of ``dtype`` from random bytes: every bit pattern (NaN payloads,
    subnormals, -0.0) is fair game, since the signature is of bytes."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=generator).to(torch.bool)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (count * size,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype)


def _same(tensor: torch.Tensor, what: str) -> None:
    got, want = _tensor_signature_triton(tensor), tensor_signature(tensor)
    assert got == want, f"{what}: kernel signature {got:#x}, CPU signature {want:#x}"


def check_definition() -> None:
    """SIG-9: the kernel's content equals the pure-Python definition at every boundary."""
    lengths = {0, 1, 7}
    for count in (1, _gpu.BLOCK_WORDS, _gpu.BLOCK_WORDS * _gpu.BLOCKS_PER_PROGRAM):
        lengths.update({8 * count - 1, 8 * count, 8 * count + 1, 8 * count + 9})
    lengths.add(2 * PROGRAM_BYTES + 9)
    for length in sorted(lengths):
        raw = np.random.default_rng(length).integers(0, 256, size=length, dtype=np.uint8)
        got = _gpu.content(torch.from_numpy(raw), length) if length else 0
        want = content_reference(raw.tobytes())
        assert got == want, f"{length} bytes: kernel {got:#x}, definition {want:#x}"


def check_dtypes() -> None:
    """SIG-14: every dtype, one element below, at and above the block and program ends."""
    for dtype in DTYPES:
        size = torch.empty((), dtype=dtype).element_size()
        block, program = BLOCK_BYTES // size, PROGRAM_BYTES // size
        for count in (1, block - 1, block, block + 1, program - 1, program + 1):
            _same(_random(dtype, count, seed=count), f"{dtype} x {count}")


def check_views() -> None:
    """SIG-14: strided views, transposes, and contiguous views at a storage offset (the kernel
    reads from an offset pointer, or from a copy when the offset is not a whole word)."""
    for dtype in (torch.uint8, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn):
        base = _random(dtype, 2 * BLOCK_BYTES + 24, seed=7)
        matrix = base[: 64 * 65].view(64, 65)
        views = {
            "every other element": base[::2],
            "every third from the fifth": base[5::3],
            "transposed": matrix.t(),
            "a column slice": matrix[:, 3:40],
        }
        for offset in (1, 3, 7, 8, 9):
            views[f"offset {offset}"] = base[offset:]
        for name, view in views.items():
            _same(view, f"{dtype} {name}")


def check_every_flip() -> None:
    """SIG-3 on the kernel: every bit of the words on both sides of the first block's end and of
    the padded tail word; each flip changes the signature, all differently, and each equals the
    CPU signature."""
    length = BLOCK_BYTES + 8 + 5
    raw = np.random.default_rng(3).integers(0, 256, size=length, dtype=np.uint8)
    tensor = torch.from_numpy(raw)
    before = _tensor_signature_triton(tensor)
    positions = [*range(BLOCK_BYTES - 8, BLOCK_BYTES + 8), *range(length - 5, length)]
    seen = set()
    for byte in positions:
        for bit in range(8):
            raw[byte] ^= 1 << bit
            try:
                after = _tensor_signature_triton(tensor)
                assert after == tensor_signature(tensor), f"flip of byte {byte} bit {bit}: not the CPU signature"
            finally:
                raw[byte] ^= 1 << bit
            assert after != before, f"flip of byte {byte} bit {bit} unseen"
            seen.add(after)
    assert len(seen) == 8 * len(positions), "two different flips gave the same signature"


CHECKS: dict[str, Callable[[], None]] = {
    "definition": check_definition,
    "dtypes": check_dtypes,
    "views": check_views,
    "flips": check_every_flip,
}


def main(argv: list[str]) -> int:
    out_path, names = argv[0], argv[1:] or list(CHECKS)
    reason = _gpu.unavailable_reason()
    if reason is not None:
        print(f"SKIP: {reason}")
        return 3
    results: dict[str, dict[str, object]] = {}
    for name in names:
        began_s = time.monotonic()
        try:
            CHECKS[name]()
            outcome = "ok"
        except AssertionError as exc:
            outcome = f"failed: {exc}"
        except Exception:
            outcome = f"error: {traceback.format_exc()}"
        results[name] = {"outcome": outcome, "seconds": round(time.monotonic() - began_s, 2)}
        print(name, results[name], flush=True)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
