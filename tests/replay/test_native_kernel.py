"""Loading the native signature kernel (scout/replay/_native.py; spec/replay.md SIG-9, SIG-12).

How the C kernel is found, built, cached, self-tested and chosen: every reason it is not used
is recorded word for word, a failing path is dropped alone, a forced path is honoured or refused
naming the choices, the library's name is the digest of what built it, and a build goes to the
fallback directory when the cache directory is unusable. Builds run the real compiler into
temporary directories; the path mask of a CPU this machine is not is given by a library object
with the kernel's two entry points (``_Library``). Mutation target ``native`` (tests/mutation/).
"""

from __future__ import annotations

import ctypes
import hashlib
import platform
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scout.replay import _native, signature
from scout.replay._native import KERNEL_SOURCE, PATH_NAMES, NativeKernel

pytestmark = pytest.mark.spawns

FLAGS = ("-O3", "-shared", "-fPIC")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache and a temporary directory shared by this module's tests: the kernel is compiled
    into each once (about a second each), not once per test."""
    root = tmp_path_factory.mktemp("native")
    (root / "tmp").mkdir()
    return root


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, shared: Path) -> Iterator[None]:
    """Each test starts with no kernel loaded, the shared cache and temporary directories and no
    forcing variables; afterwards the process's kernel is loaded again from the usual cache."""
    for name in ("SCOUT_SIGNATURE_PATH", "SCOUT_SIGNATURE_BACKEND", "CC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCOUT_CACHE_DIR", str(shared / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(shared / "tmp"))
    _native.reset_for_tests()
    yield
    monkeypatch.undo()
    _native.reset_for_tests()
    signature._state.clear()


class _Function:
    def __init__(self, result: object) -> None:
        self.result = result
        self.calls: list[tuple[object, ...]] = []
        self.restype: object = None
        self.argtypes: object = None

    def __call__(self, *args: object) -> object:
        self.calls.append(args)
        return self.result


class _Library:
    """The kernel's two entry points, for a CPU whose path mask is ``mask``."""

    def __init__(self, mask: int, content: int = 7) -> None:
        self.scout_signature_paths = _Function(mask)
        self.scout_signature_content_path = _Function(content)


def _kernel(mask: int) -> NativeKernel:
    return NativeKernel(_Library(mask), Path("/x.so"))  # type: ignore[arg-type]


def test_SIG_12_paths_are_read_from_the_mask_and_the_fastest_is_preferred() -> None:
    assert _kernel(0b0001).paths == ("scalar",) and _kernel(0b0001).path == "scalar"
    assert _kernel(0b0011).paths == ("scalar", "avx2") and _kernel(0b0011).path == "avx2"
    assert _kernel(0b0111).paths == ("scalar", "avx2", "avx512") and _kernel(0b0111).path == "avx512"
    assert _kernel(0b1001).paths == ("scalar", "neon") and _kernel(0b1001).path == "neon"
    kernel = _kernel(0b0101)
    assert (kernel.paths, kernel.path, kernel.dropped, kernel.library_path) == (("scalar", "avx512"), "avx512", {},
                                                                                 Path("/x.so"))


def test_SIG_9_content_calls_the_kernel_with_the_address_the_length_and_the_path_number() -> None:
    library = _Library(0b0111, content=2**64 - 1)
    kernel = NativeKernel(library, Path("/x.so"))  # type: ignore[arg-type]
    assert library.scout_signature_content_path.restype is ctypes.c_uint64
    assert library.scout_signature_content_path.argtypes == [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
    assert library.scout_signature_paths.restype is ctypes.c_int and library.scout_signature_paths.argtypes == []
    assert kernel.content(1000, 24) == 2**64 - 1
    assert kernel.content(1000, 24, "scalar") == 2**64 - 1
    assert kernel.content(8, 3, "avx2") == 2**64 - 1
    assert library.scout_signature_content_path.calls == [(1000, 24, 2), (1000, 24, 0), (8, 3, 1)]
    with pytest.raises(ValueError) as error:
        kernel.content(8, 3, "neon")
    assert str(error.value) == "signature path 'neon' is not available here; available: scalar, avx2, avx512"


def test_SIG_9_a_forced_path_is_used_or_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOUT_SIGNATURE_PATH", " Scalar ")
    assert _kernel(0b0111).path == "scalar"
    monkeypatch.setenv("SCOUT_SIGNATURE_PATH", "neon")
    with pytest.raises(ValueError) as error:
        _kernel(0b0011)
    assert str(error.value) == ("SCOUT_SIGNATURE_PATH='neon' is not available on this machine; available: scalar, "
                                "avx2 (unset it to choose automatically)")
    monkeypatch.setenv("SCOUT_SIGNATURE_PATH", "   ")
    assert _kernel(0b0011).path == "avx2"


def test_SIG_9_dropping_a_path_keeps_the_reason_and_chooses_again_only_if_it_was_in_use() -> None:
    kernel = _kernel(0b0111)
    kernel.drop("avx2", "wrong at 9 bytes")
    assert (kernel.paths, kernel.path, kernel.dropped) == (("scalar", "avx512"), "avx512", {"avx2": "wrong at 9 bytes"})
    kernel.drop("avx512", "wrong at 0 bytes")
    assert (kernel.paths, kernel.path) == (("scalar",), "scalar")
    assert kernel.dropped == {"avx2": "wrong at 9 bytes", "avx512": "wrong at 0 bytes"}


def test_SIG_9_the_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shared: Path) -> None:
    assert _native._cache_root() == shared / "cache"
    monkeypatch.delenv("SCOUT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _native._cache_root() == tmp_path / "xdg" / "scout"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _native._cache_root() == tmp_path / "home" / ".cache" / "scout"


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_SIG_9_the_compiler_is_CC_else_the_first_of_cc_gcc_clang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert _native._compiler() is None
    clang = _script(bin_dir / "clang", "exit 0")
    assert _native._compiler() == str(clang)
    gcc = _script(bin_dir / "gcc", "exit 0")
    assert _native._compiler() == str(gcc)
    cc = _script(bin_dir / "cc", "exit 0")
    assert _native._compiler() == str(cc)
    mine = _script(tmp_path / "my-cc", "exit 0")
    monkeypatch.setenv("CC", str(mine))
    assert _native._compiler() == str(mine)
    monkeypatch.setenv("CC", str(tmp_path / "missing-cc"))
    assert _native._compiler() == str(cc)


def _library_name(compiler: str) -> str:
    key = "\0".join([KERNEL_SOURCE, compiler, *FLAGS, platform.machine()])
    return f"scout_signature_{hashlib.sha256(key.encode()).hexdigest()[:20]}.so"


def test_SIG_9_the_library_is_named_by_what_built_it_and_reused(tmp_path: Path) -> None:
    compiler = _native._compiler()
    assert compiler is not None
    built = _native._build(compiler, tmp_path / "native", FLAGS)
    assert built == tmp_path / "native" / _library_name(compiler)
    assert sorted(p.name for p in built.parent.iterdir()) == [built.name]  # no scratch left behind
    assert NativeKernel(ctypes.CDLL(str(built)), built).paths[0] == "scalar"
    # An existing library of that name is used as it is, without compiling.
    other = tmp_path / "other"
    other.mkdir()
    (other / _library_name("/no/such/cc")).write_bytes(b"not compiled")
    assert _native._build("/no/such/cc", other, FLAGS) == other / _library_name("/no/such/cc")
    # Another compiler or other flags give another library.
    assert _library_name(compiler) != _library_name(compiler + "x")


def test_SIG_9_a_failed_compile_says_which_compiler_flags_exit_code_and_error(tmp_path: Path) -> None:
    failing = _script(tmp_path / "failing-cc", "echo 'kernel.c:1: error: planted' >&2; exit 3")
    with pytest.raises(RuntimeError) as error:
        _native._build(str(failing), tmp_path / "native", FLAGS)
    assert str(error.value) == f"{failing} -O3 -shared -fPIC failed with exit code 3: kernel.c:1: error: planted"
    assert list((tmp_path / "native").iterdir()) == []


def test_SIG_9_the_build_happens_inside_the_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The scratch directory is a hidden one next to the library (the final rename stays on one
    file system), not the system's temporary directory."""
    compiler = _native._compiler()
    assert compiler is not None
    recording = _script(tmp_path / "recording-cc", f'echo "$@" > {tmp_path / "args"}; exec {compiler} "$@"')
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    built = _native._build(str(recording), tmp_path / "native", FLAGS)
    assert built.exists()
    source = Path((tmp_path / "args").read_text().split()[len(FLAGS)])
    assert source.name == "scout_signature.c" and source.parent.parent == tmp_path / "native"
    assert source.parent.name.startswith(".build-")


def test_SIG_9_a_compile_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slow = _script(tmp_path / "slow-cc", "exec sleep 20")
    monkeypatch.setattr(_native, "_COMPILE_TIMEOUT_S", 0.5)
    with pytest.raises(subprocess.TimeoutExpired):
        _native._build(str(slow), tmp_path / "native", FLAGS)


def test_SIG_9_a_compile_error_is_quoted_up_to_500_characters(tmp_path: Path) -> None:
    noisy = _script(tmp_path / "noisy-cc", "printf 'e%.0s' $(seq 600) >&2; exit 1")
    with pytest.raises(RuntimeError) as error:
        _native._build(str(noisy), tmp_path / "native", FLAGS)
    assert str(error.value) == f"{noisy} -O3 -shared -fPIC failed with exit code 1: " + "e" * 500


def _right(kernel: NativeKernel, path: str) -> str | None:
    return signature._native_self_test(kernel, path)


def test_SIG_9_the_kernel_is_built_self_tested_and_cached(shared: Path) -> None:
    calls: list[str] = []

    def counting(kernel: NativeKernel, path: str) -> str | None:
        calls.append(path)
        return _right(kernel, path)

    assert _native.native_unavailable_reason() is None  # not tried yet
    kernel = _native.load_native_kernel(counting)
    assert kernel is not None and kernel.paths[0] == "scalar" and kernel.dropped == {}
    assert calls == list(kernel.paths)
    assert kernel.library_path.parent == shared / "cache" / "native"
    assert _native.load_native_kernel(counting) is kernel and len(calls) == len(kernel.paths)
    assert _native.native_unavailable_reason() is None
    _native.reset_for_tests()
    again = _native.load_native_kernel(counting)
    assert again is not None and again is not kernel and again.library_path == kernel.library_path


def test_SIG_9_a_path_failing_its_self_test_is_dropped_and_a_failing_scalar_path_fails_the_library() -> None:
    available = _native.load_native_kernel(_right)
    assert available is not None
    paths_here = available.paths
    _native.reset_for_tests()
    kernel = _native.load_native_kernel(lambda k, path: None if path == "scalar" else f"{path} planted")
    assert kernel is not None and kernel.paths == ("scalar",) and kernel.path == "scalar"
    assert kernel.dropped == {p: f"{p} planted" for p in paths_here if p != "scalar"}
    _native.reset_for_tests()
    assert _native.load_native_kernel(lambda k, path: "wrong" if path == "scalar" else None) is None
    reason = _native.native_unavailable_reason()
    assert reason is not None
    parts = reason.split("; ")
    assert len(parts) == 2  # the cache directory's library, then the fallback directory's
    for part in parts:
        library, _, why = part.partition(": ")
        assert library.endswith(".so") and why == "self-test of the scalar path failed: wrong"


def test_SIG_9_an_unusable_cache_directory_falls_back_to_the_temporary_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shared: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("SCOUT_CACHE_DIR", str(blocked))
    kernel = _native.load_native_kernel(_right)
    assert kernel is not None
    assert kernel.library_path.parent == shared / "tmp" / "scout-native"


def test_SIG_9_every_reason_the_kernel_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shared: Path) -> None:
    def reason() -> str | None:
        _native.reset_for_tests()
        assert _native.load_native_kernel(_right) is None
        return _native.native_unavailable_reason()

    monkeypatch.setenv("SCOUT_SIGNATURE_BACKEND", "Torch")
    assert reason() == "disabled by SCOUT_SIGNATURE_BACKEND=torch"
    monkeypatch.setenv("SCOUT_SIGNATURE_BACKEND", "native")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert reason() == "no C compiler found (set CC, or install gcc or clang)"
    failing = _script(tmp_path / "failing-cc", "echo broken >&2; exit 1")
    monkeypatch.setenv("CC", str(failing))
    cache, fallback = shared / "cache" / "native", shared / "tmp" / "scout-native"
    assert reason() == (f"{cache} -O3 -shared -fPIC: {failing} -O3 -shared -fPIC failed with exit code 1: broken; "
                        f"{fallback} -O3 -shared -fPIC: {failing} -O3 -shared -fPIC failed with exit code 1: broken")
    monkeypatch.setattr(sys, "byteorder", "big")
    assert reason() == "the native kernel reads little-endian words; this machine is big-endian"


def test_SIG_9_a_forced_path_that_is_missing_fails_the_load_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOUT_SIGNATURE_PATH", "sparc")
    with pytest.raises(ValueError, match=r"^SCOUT_SIGNATURE_PATH='sparc' is not available on this machine"):
        _native.load_native_kernel(_right)


def test_SIG_12_the_names_of_the_paths() -> None:
    assert PATH_NAMES == ("scalar", "avx2", "avx512", "neon")
