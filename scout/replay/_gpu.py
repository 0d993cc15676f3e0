"""The GPU kernel of the tensor signature: SIG-2's content sum as one Triton kernel that reads
each word once, where the tensor lives (SIG-7).

The torch-ops path makes a dozen passes over int64 temporaries (one per shift, xor, multiply);
this kernel makes one pass over the data: each program sums ``mix(w_i + (i+1)·K)`` over
``BLOCK_WORDS × BLOCKS_PER_PROGRAM`` words into one 64-bit partial, and the partials (one per
program, a few thousand for 512 MiB) are added on the device. Only the 8-byte total reaches the
host. Integer addition mod 2^64 is order-free, so the value is bit-identical to the C kernel's
and to the definition (SIG-9); ``tests/replay/test_signature_gpu.py`` checks that under Triton's
CPU interpreter (``TRITON_INTERPRET=1``) here and on the GPU by the GPU script ``tests/gpu/run.py``.

Triton is optional: without it (or without CUDA) ``available()`` is False and CUDA tensors use
the torch-ops path, which gives the same value more slowly. The signature uses the kernel
through :func:`content_or_none` (SIG-13): on each device it first self-tests the kernel against
the torch-ops path, and a compile or launch failure or a mismatch disables the kernel for the
process with one warning -- the torch-ops path takes over with the same values.
:func:`compile_ahead` compiles the kernel for a GPU architecture without a GPU (SIG-14).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch

from scout.core.guards import whole_number

__all__ = [
    "BLOCK_WORDS",
    "BLOCKS_PER_PROGRAM",
    "available",
    "compile_ahead",
    "content",
    "content_or_none",
    "self_test_lengths",
    "unavailable_reason",
]

logger = logging.getLogger("scout.replay")

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
    disabled = _state.get("disabled")
    if disabled is not None:
        return str(disabled)
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


def self_test_lengths() -> tuple[int, ...]:
    """Byte lengths around every boundary of the kernel: one word, the tail word, the end of a
    block and of a program, and a second program."""
    block_bytes = 8 * BLOCK_WORDS
    program_bytes = block_bytes * BLOCKS_PER_PROGRAM
    return (1, 7, 8, 9, block_bytes - 8, block_bytes, block_bytes + 1, program_bytes - 1,
            program_bytes, program_bytes + 9, 2 * program_bytes + 5)


def _self_test(device: torch.device) -> str | None:
    """SIG-13: the kernel against the torch-ops path on ``device``; None if every length agrees."""
    from scout.replay.signature import _content_torch

    for length in self_test_lengths():
        data = (torch.arange(length, dtype=torch.int64) * 131 + 17).remainder_(256).to(torch.uint8)
        on_device = data.to(device)
        got, want = content(on_device, length), _content_torch(on_device)
        if got != want:
            return (
                f"self-test on {device}: the kernel gives {got:#x} for {length} bytes, the "
                f"torch-ops path {want:#x}"
            )
    return None


def _disable(reason: str) -> None:
    _state["disabled"] = reason
    logger.warning(
        "scout: the Triton signature kernel is disabled for this process (%s); CUDA tensors use "
        "torch ops, which give identical signatures more slowly",
        reason,
    )


def content_or_none(tensor: torch.Tensor, byte_count: int) -> int | None:
    """SIG-13: :func:`content` through the Triton kernel if it works on the tensor's device,
    else None (the caller uses the torch-ops path). The first use on a device self-tests the
    kernel there; a compile or launch failure, or a self-test mismatch, disables it for the
    process with one warning."""
    if unavailable_reason(tensor.device) is not None:
        return None
    tested: set[str] = _state.setdefault("self_tested", set())
    try:
        if str(tensor.device) not in tested:
            mismatch = _self_test(tensor.device)
            if mismatch is not None:
                _disable(mismatch)
                return None
            tested.add(str(tensor.device))
        return content(tensor, byte_count)
    except Exception as exc:  # Triton raises its own compile errors; launches raise RuntimeError
        _disable(f"the kernel failed to compile or launch on {tensor.device}: {exc!r}")
        return None


#: The kernel's parameters as Triton types, for :func:`compile_ahead`; follows _content_kernel.
_SIGNATURE = {
    "words_ptr": "*i64",
    "word_count": "i64",
    "partials_ptr": "*i64",
    "key_step": "u64",
    "mix_1": "u64",
    "mix_2": "u64",
    "BLOCK": "constexpr",
    "STEPS": "constexpr",
}


def compile_ahead(
    capability: int,
    *,
    block_words: int = BLOCK_WORDS,
    blocks_per_program: int = BLOCKS_PER_PROGRAM,
    num_warps: int = 4,
) -> Any:
    """SIG-14: the kernel compiled for an NVIDIA GPU of compute ``capability`` (80: A100, 90:
    H100/H200, 100: B200), no GPU needed: Triton's compiler and the ptxas its wheel ships.
    Returns Triton's compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata``)."""
    if not whole_number(capability) or capability < 1:
        raise ValueError(f"compile_ahead: capability must be an int such as 80 or 90, got {capability!r}")
    if _interpreting():
        raise RuntimeError("compile_ahead: TRITON_INTERPRET=1 is set; the interpreter compiles nothing")
    kernel = _load()
    if isinstance(kernel, str):
        raise RuntimeError(f"compile_ahead: the Triton signature kernel is unavailable: {kernel}")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(
        fn=kernel,
        signature=_SIGNATURE,
        constexprs={"BLOCK": block_words, "STEPS": blocks_per_program},
    )
    # The kernel is integer arithmetic only: floating-point fusion changes nothing.
    options = {"num_warps": num_warps, "enable_fp_fusion": False}
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


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
