"""The CPU kernel of the tensor signature: a small C file with one loop per instruction set,
compiled once with the system compiler and loaded with ctypes.

Why not ``torch.utils.cpp_extension.load_inline``: it includes the torch headers (a minute of
compilation on a small machine), needs ninja, and ties the cache to one torch ABI. The kernel
needs none of torch -- it reads raw bytes at an address -- so a plain C file compiles in a
fraction of a second and works with any torch build.

Paths (SIG-9, SIG-12). The same sum is computed by a scalar loop (four independent sums), an
AVX2 loop (no 64-bit vector multiply: one 32x32->64 and one 32-bit lane multiply each), an
AVX-512 loop (``vpmullq``) and a NEON loop on aarch64. The sum is order-free, so every path
returns the same value; the x86 paths are compiled with per-function target attributes and
chosen at run time by what the CPU reports, so one library serves every x86-64 machine.
``SCOUT_SIGNATURE_PATH`` forces one path (tests and benchmarks run each; an unavailable name
is an error naming the available ones).

The cache key is a digest of the source, the compiler flags and the machine architecture, so a
changed kernel never loads a stale library. The library is written to a temporary name and
renamed into place, so processes that start together (a 4-rank job) never load a half-written
file. A self-test of every available path against the pure-Python definition
(``signature.content_reference``) runs before first use; any failure -- no compiler, a compile
error, an unwritable cache, a wrong answer -- leaves the native kernel disabled with the reason
recorded (a path that fails alone is dropped, with its reason), and the signature falls back to
the torch-ops implementation, which gives identical values (SIG-9).
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
    "PATH_NAMES",
    "NativeKernel",
    "load_native_kernel",
    "native_unavailable_reason",
    "reset_for_tests",
]

# Index = the path number in the C source (SCOUT_PATH_*); fastest first where several exist.
PATH_NAMES: tuple[str, ...] = ("scalar", "avx2", "avx512", "neon")
_PREFERENCE: tuple[str, ...] = ("avx512", "avx2", "neon", "scalar")

# The constants and the mixing function are the definition in spec/replay.md (SIG-2); the
# Python reference in signature.py spells out the same arithmetic.
KERNEL_SOURCE = r"""
#include <stdint.h>
#include <string.h>

#define SCOUT_KEY_STEP 0x9E3779B97F4A7C15ULL
#define SCOUT_MIX_1 0xBF58476D1CE4E5B9ULL
#define SCOUT_MIX_2 0x94D049BB133111EBULL

/* Paths, in the order of the bit mask scout_signature_paths() returns. */
#define SCOUT_PATH_SCALAR 0
#define SCOUT_PATH_AVX2 1
#define SCOUT_PATH_AVX512 2
#define SCOUT_PATH_NEON 3

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SCOUT_HAVE_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define SCOUT_HAVE_NEON 1
#include <arm_neon.h>
#endif

static inline uint64_t scout_mix(uint64_t x) {
    x ^= x >> 30;
    x *= SCOUT_MIX_1;
    x ^= x >> 27;
    x *= SCOUT_MIX_2;
    x ^= x >> 31;
    return x;
}

static inline uint64_t scout_load(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* Sum over i = 0 .. n-1 of mix(w_i + (first + i + 1) * KEY_STEP). Four independent sums hide
   the multiply latency; the sum is order-free, so the grouping does not change the value. */
static uint64_t words_scalar(const unsigned char *d, uint64_t n, uint64_t first) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    uint64_t key = (first + 1) * SCOUT_KEY_STEP;
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += scout_mix(scout_load(d + 8 * i) + key);
        a1 += scout_mix(scout_load(d + 8 * i + 8) + key + SCOUT_KEY_STEP);
        a2 += scout_mix(scout_load(d + 8 * i + 16) + key + 2 * SCOUT_KEY_STEP);
        a3 += scout_mix(scout_load(d + 8 * i + 24) + key + 3 * SCOUT_KEY_STEP);
        key += 4 * SCOUT_KEY_STEP;
    }
    for (; i < n; ++i) {
        a0 += scout_mix(scout_load(d + 8 * i) + key);
        key += SCOUT_KEY_STEP;
    }
    return a0 + a1 + a2 + a3;
}

#if defined(SCOUT_HAVE_X86)
/* AVX2 has no 64-bit multiply: x * C mod 2^64 = xl*Cl + ((xl*Ch + xh*Cl) << 32). One vpmulld
   gives both cross products' low halves at once (c_swapped holds Ch in the low and Cl in the
   high half of each lane); vpmuludq gives xl*Cl in full. */
__attribute__((target("avx2"))) static inline __m256i avx2_mul(__m256i x, __m256i c,
                                                               __m256i c_swapped) {
    const __m256i high = _mm256_set1_epi64x((long long)0xFFFFFFFF00000000ULL);
    __m256i cross = _mm256_mullo_epi32(x, c_swapped); /* lo32(xl*Ch) | lo32(xh*Cl) << 32 */
    __m256i low = _mm256_mul_epu32(x, c);
    return _mm256_add_epi64(_mm256_add_epi64(low, _mm256_slli_epi64(cross, 32)),
                            _mm256_and_si256(cross, high));
}

__attribute__((target("avx2"))) static inline __m256i avx2_mix(__m256i x, __m256i m1_lo,
                                                               __m256i m1_hi, __m256i m2_lo,
                                                               __m256i m2_hi) {
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
    x = avx2_mul(x, m1_lo, m1_hi);
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
    x = avx2_mul(x, m2_lo, m2_hi);
    return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

__attribute__((target("avx2"))) static uint64_t words_avx2(const unsigned char *d, uint64_t n,
                                                           uint64_t first) {
    const __m256i m1_lo = _mm256_set1_epi64x((long long)SCOUT_MIX_1);
    const __m256i m1_hi = _mm256_set1_epi64x((long long)((SCOUT_MIX_1 >> 32) | (SCOUT_MIX_1 << 32)));
    const __m256i m2_lo = _mm256_set1_epi64x((long long)SCOUT_MIX_2);
    const __m256i m2_hi = _mm256_set1_epi64x((long long)((SCOUT_MIX_2 >> 32) | (SCOUT_MIX_2 << 32)));
    const __m256i step = _mm256_set1_epi64x((long long)(16 * SCOUT_KEY_STEP));
    uint64_t k = (first + 1) * SCOUT_KEY_STEP;
    __m256i key[4], acc[4];
    for (int j = 0; j < 4; ++j) {
        uint64_t b = k + (uint64_t)(4 * j) * SCOUT_KEY_STEP;
        key[j] = _mm256_set_epi64x((long long)(b + 3 * SCOUT_KEY_STEP),
                                   (long long)(b + 2 * SCOUT_KEY_STEP),
                                   (long long)(b + SCOUT_KEY_STEP), (long long)b);
        acc[j] = _mm256_setzero_si256();
    }
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < 4; ++j) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(d + 8 * i + 32 * j));
            __m256i x = avx2_mix(_mm256_add_epi64(w, key[j]), m1_lo, m1_hi, m2_lo, m2_hi);
            acc[j] = _mm256_add_epi64(acc[j], x);
            key[j] = _mm256_add_epi64(key[j], step);
        }
    }
    __m256i sum = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]),
                                   _mm256_add_epi64(acc[2], acc[3]));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, sum);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + words_scalar(d + 8 * i, n - i, first + i);
}

__attribute__((target("avx512f,avx512dq"))) static uint64_t words_avx512(const unsigned char *d,
                                                                         uint64_t n,
                                                                         uint64_t first) {
    const __m512i m1 = _mm512_set1_epi64((long long)SCOUT_MIX_1);
    const __m512i m2 = _mm512_set1_epi64((long long)SCOUT_MIX_2);
    const __m512i step = _mm512_set1_epi64((long long)(32 * SCOUT_KEY_STEP));
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    uint64_t k = (first + 1) * SCOUT_KEY_STEP;
    __m512i key[4], acc[4];
    for (int j = 0; j < 4; ++j) {
        __m512i base = _mm512_set1_epi64((long long)(k + (uint64_t)(8 * j) * SCOUT_KEY_STEP));
        key[j] = _mm512_add_epi64(base, _mm512_mullo_epi64(lane, _mm512_set1_epi64((long long)SCOUT_KEY_STEP)));
        acc[j] = _mm512_setzero_si512();
    }
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; ++j) {
            __m512i x = _mm512_add_epi64(_mm512_loadu_si512((const void *)(d + 8 * i + 64 * j)), key[j]);
            x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
            x = _mm512_mullo_epi64(x, m1);
            x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
            x = _mm512_mullo_epi64(x, m2);
            x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
            acc[j] = _mm512_add_epi64(acc[j], x);
            key[j] = _mm512_add_epi64(key[j], step);
        }
    }
    __m512i sum = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
    return (uint64_t)_mm512_reduce_add_epi64(sum) + words_scalar(d + 8 * i, n - i, first + i);
}
#endif

#if defined(SCOUT_HAVE_NEON)
static inline uint64x2_t neon_mul(uint64x2_t x, uint32x2_t c_lo, uint32x2_t c_hi) {
    uint32x2_t x_lo = vmovn_u64(x);
    uint32x2_t x_hi = vshrn_n_u64(x, 32);
    uint64x2_t cross = vmull_u32(x_hi, c_lo);
    cross = vmlal_u32(cross, x_lo, c_hi);
    return vmlal_u32(vshlq_n_u64(cross, 32), x_lo, c_lo);
}

static inline uint64x2_t neon_mix(uint64x2_t x, uint32x2_t m1_lo, uint32x2_t m1_hi,
                                  uint32x2_t m2_lo, uint32x2_t m2_hi) {
    x = veorq_u64(x, vshrq_n_u64(x, 30));
    x = neon_mul(x, m1_lo, m1_hi);
    x = veorq_u64(x, vshrq_n_u64(x, 27));
    x = neon_mul(x, m2_lo, m2_hi);
    return veorq_u64(x, vshrq_n_u64(x, 31));
}

static uint64_t words_neon(const unsigned char *d, uint64_t n, uint64_t first) {
    const uint32x2_t m1_lo = vdup_n_u32((uint32_t)SCOUT_MIX_1);
    const uint32x2_t m1_hi = vdup_n_u32((uint32_t)(SCOUT_MIX_1 >> 32));
    const uint32x2_t m2_lo = vdup_n_u32((uint32_t)SCOUT_MIX_2);
    const uint32x2_t m2_hi = vdup_n_u32((uint32_t)(SCOUT_MIX_2 >> 32));
    const uint64x2_t step = vdupq_n_u64(8 * SCOUT_KEY_STEP);
    uint64_t k = (first + 1) * SCOUT_KEY_STEP;
    uint64x2_t key[4], acc[4];
    for (int j = 0; j < 4; ++j) {
        uint64_t b = k + (uint64_t)(2 * j) * SCOUT_KEY_STEP;
        uint64_t pair[2] = {b, b + SCOUT_KEY_STEP};
        key[j] = vld1q_u64(pair);
        acc[j] = vdupq_n_u64(0);
    }
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 4; ++j) {
            uint64x2_t w = vreinterpretq_u64_u8(vld1q_u8(d + 8 * i + 16 * j));
            acc[j] = vaddq_u64(acc[j], neon_mix(vaddq_u64(w, key[j]), m1_lo, m1_hi, m2_lo, m2_hi));
            key[j] = vaddq_u64(key[j], step);
        }
    }
    uint64x2_t sum = vaddq_u64(vaddq_u64(acc[0], acc[1]), vaddq_u64(acc[2], acc[3]));
    return vgetq_lane_u64(sum, 0) + vgetq_lane_u64(sum, 1) +
           words_scalar(d + 8 * i, n - i, first + i);
}
#endif

/* Bit p set: path p is compiled in and this CPU can run it. */
int scout_signature_paths(void) {
    int paths = 1 << SCOUT_PATH_SCALAR;
#if defined(SCOUT_HAVE_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) paths |= 1 << SCOUT_PATH_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
        paths |= 1 << SCOUT_PATH_AVX512;
#endif
#if defined(SCOUT_HAVE_NEON)
    paths |= 1 << SCOUT_PATH_NEON;
#endif
    return paths;
}

static uint64_t words_path(const unsigned char *d, uint64_t n, uint64_t first, int path) {
    switch (path) {
#if defined(SCOUT_HAVE_X86)
    case SCOUT_PATH_AVX2: return words_avx2(d, n, first);
    case SCOUT_PATH_AVX512: return words_avx512(d, n, first);
#endif
#if defined(SCOUT_HAVE_NEON)
    case SCOUT_PATH_NEON: return words_neon(d, n, first);
#endif
    default: return words_scalar(d, n, first);
    }
}

/* The content sum of byte_count bytes on one path (the caller checks the path is available):
   whole words, then the tail (1..7 bytes) zero-padded to one more word. */
uint64_t scout_signature_content_path(const unsigned char *data, uint64_t byte_count, int path) {
    uint64_t whole = byte_count / 8;
    uint64_t total = words_path(data, whole, 0, path);
    uint64_t rest = byte_count - 8 * whole;
    if (rest != 0) {
        unsigned char padded[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(padded, data + 8 * whole, rest);
        total += scout_mix(scout_load(padded) + (whole + 1) * SCOUT_KEY_STEP);
    }
    return total;
}
"""

_FLAG_SETS: tuple[tuple[str, ...], ...] = (("-O3", "-shared", "-fPIC"),)
_COMPILE_TIMEOUT_S = 120.0


class NativeKernel:
    """A loaded kernel: ``content(address, byte_count) -> int`` in [0, 2**64).

    ``paths`` are the instruction-set paths this CPU runs (names from ``PATH_NAMES``) and
    ``path`` the one ``content`` uses unless told otherwise.
    """

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        function = library.scout_signature_content_path
        function.restype = ctypes.c_uint64
        function.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
        mask_function = library.scout_signature_paths
        mask_function.restype = ctypes.c_int
        mask_function.argtypes = []
        mask = int(mask_function())
        self._function = function
        self.library_path = path
        self.paths: tuple[str, ...] = tuple(
            name for index, name in enumerate(PATH_NAMES) if mask >> index & 1
        )
        self.dropped: dict[str, str] = {}  # path -> why it failed its self-test
        self.path = self._preferred()

    def _preferred(self) -> str:
        forced = os.environ.get("SCOUT_SIGNATURE_PATH", "").strip().lower()
        if forced:
            if forced not in self.paths:
                raise ValueError(
                    f"SCOUT_SIGNATURE_PATH={forced!r} is not available on this machine; "
                    f"available: {', '.join(self.paths)} (unset it to choose automatically)"
                )
            return forced
        return next(name for name in _PREFERENCE if name in self.paths)

    def drop(self, name: str, reason: str) -> None:
        """Stop using a path that failed its self-test (the scalar path is never dropped alone)."""
        self.paths = tuple(p for p in self.paths if p != name)
        self.dropped[name] = reason
        if self.path == name:
            self.path = self._preferred()

    def content(self, address: int, byte_count: int, path: str | None = None) -> int:
        name = self.path if path is None else path
        if name not in self.paths:
            raise ValueError(
                f"signature path {name!r} is not available here; available: {', '.join(self.paths)}"
            )
        # ctypes.CDLL releases the GIL for the duration of the call.
        return int(self._function(address, byte_count, PATH_NAMES.index(name)))


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


SelfTest = Callable[[NativeKernel, str], "str | None"]


def _try_load(self_test: SelfTest) -> NativeKernel | str:
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
            for name in kernel.paths:
                wrong = self_test(kernel, name)
                if wrong is not None:
                    if name == "scalar":
                        problems.append(f"{path}: self-test of the scalar path failed: {wrong}")
                        break
                    kernel.drop(name, wrong)
            else:
                return kernel
    return "; ".join(problems)


def load_native_kernel(self_test: SelfTest) -> NativeKernel | None:
    """The kernel, built on first call and cached; None if it cannot be had (see reason).

    ``self_test(kernel, path)`` returns None if ``path`` computes the definition, else why not.
    """
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
