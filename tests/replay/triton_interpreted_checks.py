"""Checks of the Triton signature kernel, run in a fresh process under Triton's CPU interpreter.

Triton must see ``TRITON_INTERPRET=1`` before it is first imported (its library functions such
as ``tl.sum`` are then interpreted too), so tests/replay/test_signature_gpu.py runs this module
with ``python -m tests.replay.triton_interpreted_checks CHECK``. Exit status 0 means the check
held; otherwise the message says what differed.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from scout.replay import _gpu  # noqa: E402
from scout.replay.signature import content_reference  # noqa: E402


def _boundary_lengths() -> list[int]:
    per_program = _gpu.BLOCK_WORDS * _gpu.BLOCKS_PER_PROGRAM
    lengths = {0, 1, 7}
    for count in (1, _gpu.BLOCK_WORDS, per_program, 2 * per_program):
        lengths.update({8 * count - 1, 8 * count, 8 * count + 1, 8 * count + 9})
    return sorted(lengths)


def check_definition() -> None:
    for length in _boundary_lengths():
        raw = np.random.default_rng(length).integers(0, 256, size=length, dtype=np.uint8)
        got = _gpu.content(torch.from_numpy(raw), length) if length else 0
        want = content_reference(raw.tobytes())
        assert got == want, f"{length} bytes: kernel {got:#x}, definition {want:#x}"


def check_unaligned() -> None:
    raw = torch.randint(0, 256, (8 * 70 + 13,), dtype=torch.uint8)
    for offset in (1, 3, 7):
        view = raw[offset:]
        got, want = _gpu.content(view, view.numel()), content_reference(view.numpy().tobytes())
        assert got == want, f"offset {offset}: kernel {got:#x}, definition {want:#x}"


def check_every_flip() -> None:
    # Every bit of the words on both sides of the first block's end, and of the padded tail word.
    length = 8 * (_gpu.BLOCK_WORDS + 1) + 5
    raw = np.random.default_rng(3).integers(0, 256, size=length, dtype=np.uint8)
    tensor = torch.from_numpy(raw)
    before = _gpu.content(tensor, length)
    block_end = 8 * _gpu.BLOCK_WORDS
    positions = [*range(block_end - 8, block_end + 8), *range(length - 5, length)]
    seen = set()
    for byte in positions:
        for bit in range(8):
            raw[byte] ^= 1 << bit
            after = _gpu.content(tensor, length)
            raw[byte] ^= 1 << bit
            assert after != before, f"flip of byte {byte} bit {bit} unseen"
            seen.add(after)
    assert len(seen) == 8 * len(positions), "two different flips gave the same signature"


CHECKS = {"definition": check_definition, "unaligned": check_unaligned, "flips": check_every_flip}

if __name__ == "__main__":
    reason = _gpu.unavailable_reason()
    if reason is not None:
        print(f"SKIP: {reason}")
        sys.exit(3)
    for name in sys.argv[1:] or list(CHECKS):
        CHECKS[name]()
    print("ok")
