"""The GPU kernel of the tensor signature: SIG-2's content sum as one Triton kernel that reads
each word once, where the tensor lives (SIG-7).

The torch-ops path makes a dozen passes over int64 temporaries (one per shift, xor, multiply);
this kernel makes one pass over the data: each program sums ``mix(w_i + (i+1)·K)`` over
``BLOCK_WORDS × BLOCKS_PER_PROGRAM`` words into one 64-bit partial, and the partials (one per
program, a few thousand for 512 MiB) are added on the device. Only the 8-byte total reaches the
host. Integer addition mod 2^64 is order-free, so the value is bit-identical to the C kernel's
and to the definition (SIG-9); ``tests/replay/test_signature_gpu.py`` checks that under Triton's
CPU interpreter (``TRITON_INTERPRET=1``) here and on the GPU in ``tests/gpu/run_gpu_tests.sh``.

Triton is optional: without it (or without CUDA) ``available()`` is False and CUDA tensors use
the torch-ops path, which gives the same value more slowly.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

__all__ = ["BLOCK_WORDS", "BLOCKS_PER_PROGRAM", "available", "content", "unavailable_reason"]

BLOCK_WORDS = 1024  # words per program per step (8 KiB)
BLOCKS_PER_PROGRAM = 4  # steps per program: 32 KiB per program, fewer partials to add

_KEY_STEP = 0x9E3779B97F4A7C15
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB

_state: dict[str, Any] = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _load() -> Any:
    """The compiled-on-first-launch kernel, or a string saying why there is none."""
    if "kernel" in _state:
        return _state["kernel"]
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        _state["kernel"] = f"triton is not installed ({exc})"
        return _state["kernel"]

    @triton.jit  # type: ignore[untyped-decorator]
    def _content_kernel(  # type: ignore[no-untyped-def]
        words_ptr,
        word_count,
        partials_ptr,
        key_step,
        mix_1,
        mix_2,
        BLOCK: tl.constexpr,
        STEPS: tl.constexpr,
    ):
        program = tl.program_id(0)
        total = tl.zeros([BLOCK], dtype=tl.uint64)
        first = program.to(tl.int64) * (BLOCK * STEPS)
        for step in tl.static_range(STEPS):
            index = first + step * BLOCK + tl.arange(0, BLOCK)
            inside = index < word_count
            word = tl.load(words_ptr + index, mask=inside, other=0).to(tl.uint64, bitcast=True)
            x = word + (index + 1).to(tl.uint64) * key_step
            x ^= x >> 30
            x *= mix_1
            x ^= x >> 27
            x *= mix_2
            x ^= x >> 31
            total += tl.where(inside, x, 0)
        tl.store(partials_ptr + program, tl.sum(total, axis=0).to(tl.int64, bitcast=True))

    _state["kernel"] = _content_kernel
    return _content_kernel


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """Why CUDA tensors cannot use the Triton kernel, or None if they can."""
    kernel = _load()
    if isinstance(kernel, str):
        return kernel
    if _interpreting():
        return None
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def available() -> bool:
    return unavailable_reason() is None


def content_words(
    words: torch.Tensor,
    block_words: int = BLOCK_WORDS,
    blocks_per_program: int = BLOCKS_PER_PROGRAM,
    num_warps: int = 4,
) -> torch.Tensor:
    """Σ mix(w_i + (i+1)·K) over a 1-D int64 tensor, as a 0-d int64 tensor on its device.

    The launch shape (``block_words`` a power of two) changes the speed, never the value:
    bench/signature_gpu.py times several.
    """
    kernel = _load()
    if isinstance(kernel, str):
        raise RuntimeError(f"the Triton signature kernel is unavailable: {kernel}")
    if words.dtype != torch.int64 or words.dim() != 1 or not words.is_contiguous():
        raise ValueError(f"expected a contiguous 1-D int64 tensor, got {words.dtype} {words.shape}")
    word_count = words.numel()
    if block_words < 1 or block_words & (block_words - 1) or blocks_per_program < 1:
        raise ValueError(
            f"block_words must be a power of two and blocks_per_program >= 1, got "
            f"{block_words} and {blocks_per_program}"
        )
    per_program = block_words * blocks_per_program
    programs = max(1, -(-word_count // per_program))
    partials = torch.empty(programs, dtype=torch.int64, device=words.device)
    # Launch on the tensor's own GPU, whichever device is current.
    on_device = torch.cuda.device(words.device) if words.is_cuda else contextlib.nullcontext()
    with on_device:
        kernel[(programs,)](
            words,
            word_count,
            partials,
            _KEY_STEP,  # above 2**63: Triton passes these as uint64
            _MIX_1,
            _MIX_2,
            BLOCK=block_words,
            STEPS=blocks_per_program,
            num_warps=num_warps,
        )
    return partials.sum()  # int64 addition wraps: the sum mod 2**64, on the device


def content(tensor: torch.Tensor, byte_count: int) -> int:
    """SIG-2 ``content`` of a contiguous tensor's bytes, computed on its device."""
    from scout.replay.signature import KEY_STEP, MASK64, _mix_torch_, _to_signed

    flat = tensor.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    whole = byte_count // 8
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    if whole:
        body = flat[: 8 * whole]
        if body.storage_offset() % 8 != 0:
            body = body.clone()  # a view at an odd byte offset cannot be read as int64 in place
        total += content_words(body.view(torch.int64))
    rest = byte_count - 8 * whole
    if rest:  # the zero-padded tail word (SIG-2), with torch ops on the device
        padded = torch.zeros(8, dtype=torch.uint8, device=flat.device)
        padded[:rest] = flat[8 * whole :]
        last = padded.view(torch.int64) + _to_signed(((whole + 1) * KEY_STEP) & MASK64)
        total += _mix_torch_(last).sum()
    return int(total.item()) & MASK64
