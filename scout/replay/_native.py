"""The CPU kernel of the tensor signature: a few lines of C, compiled once with the system
compiler and loaded with ctypes.

Why not ``torch.utils.cpp_extension.load_inline``: it includes the torch headers (a minute of
compilation on a small machine), needs ninja, and ties the cache to one torch ABI. The kernel
needs none of torch -- it reads raw bytes at an address -- so a plain C file compiles in a
fraction of a second and works with any torch build.

The cache key is a digest of the source, the compiler flags and the machine architecture, so a
changed kernel never loads a stale library. The library is written to a temporary name and
renamed into place, so processes that start together (a 4-rank job) never load a half-written
file. A self-test against the pure-Python definition (``signature.content_reference``) runs
before first use; any failure -- no compiler, a compile error, an unwritable cache, a wrong
answer -- leaves the native kernel disabled with the reason recorded, and the signature falls
back to the torch-ops implementation, which gives identical values (SIG-9).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "KERNEL_SOURCE",
    "NativeKernel",
    "load_native_kernel",
    "native_unavailable_reason",
    "reset_for_tests",
]

# The constants and the mixing function are the definition in spec/replay.md (SIG-2); the
# Python reference in signature.py spells out the same arithmetic.
KERNEL_SOURCE = r"""
#include <stdint.h>
#include <string.h>

#define SCOUT_KEY_STEP 0x9E3779B97F4A7C15ULL
#define SCOUT_MIX_1 0xBF58476D1CE4E5B9ULL
#define SCOUT_MIX_2 0x94D049BB133111EBULL

/* A bijection of 64-bit words (the splitmix64 finaliser): xor-shift and multiplication by an
   odd constant are each invertible modulo 2^64. */
static inline uint64_t scout_mix(uint64_t x) {
    x ^= x >> 30;
    x *= SCOUT_MIX_1;
    x ^= x >> 27;
    x *= SCOUT_MIX_2;
    x ^= x >> 31;
    return x;
}

/* Sum over words i = first_word .. first_word + word_count - 1 of
   mix(w_i + (i + 1) * KEY_STEP), modulo 2^64. Words are little-endian; unaligned input is
   allowed (memcpy loads). The sum is order-free, so any split of the range gives the same
   total. */
#if defined(SCOUT_TARGET_CLONES)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
uint64_t scout_signature_words(const unsigned char *data, uint64_t word_count,
                               uint64_t first_word) {
    uint64_t total = 0;
    uint64_t key_first = (first_word + 1) * SCOUT_KEY_STEP;
    for (uint64_t i = 0; i < word_count; ++i) {
        uint64_t word;
        memcpy(&word, data + 8 * i, 8);
        total += scout_mix(word + key_first + i * SCOUT_KEY_STEP);
    }
    return total;
}

/* The content sum of byte_count bytes: whole words, then the tail (1..7 bytes) zero-padded
   to one more word. */
#if defined(SCOUT_TARGET_CLONES)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
uint64_t scout_signature_content(const unsigned char *data, uint64_t byte_count) {
    uint64_t whole = byte_count / 8;
    uint64_t total = scout_signature_words(data, whole, 0);
    uint64_t rest = byte_count - 8 * whole;
    if (rest != 0) {
        unsigned char padded[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(padded, data + 8 * whole, rest);
        total += scout_signature_words(padded, 1, whole);
    }
    return total;
}
"""

_FLAG_SETS: tuple[tuple[str, ...], ...] = (
    # ISA-specific clones are exact integer arithmetic: every clone returns the same value.
    ("-O3", "-shared", "-fPIC", "-DSCOUT_TARGET_CLONES"),
    ("-O3", "-shared", "-fPIC"),
)
_COMPILE_TIMEOUT_S = 120.0

ContentFunction = Callable[[int, int], int]


class NativeKernel:
    """A loaded kernel: ``content(address, byte_count) -> int`` in [0, 2**64)."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        function = library.scout_signature_content
        function.restype = ctypes.c_uint64
        function.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        self._function = function
        self.path = path

    def content(self, address: int, byte_count: int) -> int:
        # ctypes.CDLL releases the GIL for the duration of the call.
        return int(self._function(address, byte_count))


_lock = threading.Lock()
_state: dict[str, object] = {}


def _cache_root() -> Path:
    configured = os.environ.get("SCOUT_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "scout"


def _compiler() -> str | None:
    configured = os.environ.get("CC")
    candidates = [configured] if configured else []
    candidates += ["cc", "gcc", "clang"]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _build(compiler: str, directory: Path, flags: tuple[str, ...]) -> Path:
    digest = hashlib.sha256(
        "\0".join([KERNEL_SOURCE, compiler, *flags, platform.machine()]).encode()
    ).hexdigest()[:20]
    target = directory / f"scout_signature_{digest}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as scratch:
        source = Path(scratch) / "scout_signature.c"
        source.write_text(KERNEL_SOURCE)
        output = Path(scratch) / target.name
        completed = subprocess.run(
            [compiler, *flags, str(source), "-o", str(output)],
            capture_output=True,
            text=True,
            timeout=_COMPILE_TIMEOUT_S,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"{compiler} {' '.join(flags)} failed with exit code {completed.returncode}: "
                f"{completed.stderr.strip()[:500]}"
            )
        os.replace(output, target)  # atomic: concurrent builders all install a whole file
    return target


def _try_load(self_test: Callable[[NativeKernel], str | None]) -> NativeKernel | str:
    if sys.byteorder != "little":
        return "the native kernel reads little-endian words; this machine is big-endian"
    if os.environ.get("SCOUT_SIGNATURE_BACKEND", "").lower() == "torch":
        return "disabled by SCOUT_SIGNATURE_BACKEND=torch"
    compiler = _compiler()
    if compiler is None:
        return "no C compiler found (set CC, or install gcc or clang)"
    problems: list[str] = []
    for directory in (_cache_root() / "native", Path(tempfile.gettempdir()) / "scout-native"):
        for flags in _FLAG_SETS:
            try:
                path = _build(compiler, directory, flags)
                kernel = NativeKernel(ctypes.CDLL(str(path)), path)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                problems.append(f"{directory} {' '.join(flags)}: {exc}")
                continue
            wrong = self_test(kernel)
            if wrong is None:
                return kernel
            problems.append(f"{path}: self-test failed: {wrong}")
    return "; ".join(problems)


def load_native_kernel(self_test: Callable[[NativeKernel], str | None]) -> NativeKernel | None:
    """The kernel, built on first call and cached; None if it cannot be had (see reason)."""
    with _lock:
        if "result" not in _state:
            _state["result"] = _try_load(self_test)
        result = _state["result"]
    return result if isinstance(result, NativeKernel) else None


def native_unavailable_reason() -> str | None:
    """Why the native kernel is not in use, or None if it is (or has not been tried yet)."""
    result = _state.get("result")
    return result if isinstance(result, str) else None


def reset_for_tests() -> None:
    """Forget the loaded kernel so that the next call loads (or refuses) again."""
    with _lock:
        _state.clear()
