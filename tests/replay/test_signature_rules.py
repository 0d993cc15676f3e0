"""The signature's definition and refusals, value by value (spec/replay.md SIG-1..SIG-10).

``tests/replay/test_signature.py`` proves the properties (every bit flip of every element,
every path against the definition, across processes). These tests are the fast, exact half:
the definition's constants pinned against published splitmix64 outputs, the word stream of
every kind of structured value written out, each refusal's message, the torch-ops path's chunk
and tail handling against the definition on small inputs, and the fallback when the native
kernel is absent. They run in one process in about a second, so that the mutation target
``signature`` (tests/mutation/) can run them for every mutant. Nothing here depends on which
device kernel serves CUDA tensors (that is tests/replay/test_signature_gpu.py)."""

from __future__ import annotations

import collections
import enum
import logging
import struct
import warnings
from collections.abc import Iterator

import attrs
import numpy as np
import pytest
import torch

from scout.replay import _native, signature
from scout.replay.signature import (
    MAX_STRUCTURE_DEPTH,
    SignatureBackend,
    content_reference,
    signature_words,
    structured_signature,
    tensor_signature,
)

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
# splitmix64 seeded with 0: its n-th output is the finaliser of n * GOLDEN (published values).
SPLITMIX64_FROM_0 = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]


@pytest.fixture
def torch_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The native kernel disabled (as on a machine without a C compiler), then restored."""
    monkeypatch.setenv("SCOUT_SIGNATURE_BACKEND", "torch")
    _native.reset_for_tests()
    signature._state.clear()
    yield
    monkeypatch.undo()
    _native.reset_for_tests()
    signature._state.clear()


def test_SIG_2_mix_is_the_splitmix64_finaliser() -> None:
    assert [signature.mix64((n * GOLDEN) & MASK64) for n in (1, 2, 3, 4)] == SPLITMIX64_FROM_0
    assert signature.mix64(0) == 0
    assert signature.mix64(MASK64) == signature.mix64(MASK64) & MASK64


def test_SIG_2_content_is_the_sum_of_mixed_keyed_words_with_a_zero_padded_tail() -> None:
    zeros = bytes(8)
    assert content_reference(b"") == 0
    assert content_reference(zeros) == SPLITMIX64_FROM_0[0]  # mix(0 + 1 * K)
    assert content_reference(zeros * 3) == sum(SPLITMIX64_FROM_0[:3]) & MASK64
    assert content_reference(b"\x05") == content_reference(b"\x05" + bytes(7)) == signature.mix64(5 + GOLDEN)
    word = struct.pack("<Q", 0x0102030405060708)
    assert content_reference(zeros + word[:3]) == (
        SPLITMIX64_FROM_0[0] + signature.mix64((0x060708 + 2 * GOLDEN) & MASK64)) & MASK64


def _small_inputs() -> Iterator[bytes]:
    rng = np.random.default_rng(26)
    for length in (1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 40, 41):
        yield rng.integers(0, 256, size=length, dtype=np.uint8).tobytes()
    # Words whose top bits are set: a right shift that copies the sign bit would differ.
    yield b"\xff" * 24 + b"\x80"
    yield struct.pack("<4Q", 1 << 63, MASK64, (1 << 63) | 1, 0x7FFFFFFFFFFFFFFF)


def test_SIG_9_the_torch_ops_path_equals_the_definition_for_every_chunk_and_tail() -> None:
    for data in _small_inputs():
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        want = content_reference(data)
        assert signature._content_torch(flat) == want, len(data)
        for chunk_words in (1, 2, 3, 4):
            assert signature._content_torch(flat, chunk_words) == want, (len(data), chunk_words)
    # A view at any byte offset is read by its bytes (offsets 1..17: not only those below 8).
    raw = torch.arange(40, dtype=torch.uint8)
    for offset in range(1, 18):
        assert signature._content_torch(raw[offset:]) == content_reference(bytes(range(offset, 40))), offset


def test_SIG_9_the_torch_ops_path_refuses_what_is_not_a_flat_byte_tensor() -> None:
    for bad in (torch.zeros(8, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.uint8)):
        with pytest.raises(ValueError) as error:
            signature._content_torch(bad)
        assert str(error.value) == f"expected a 1-D uint8 tensor, got {bad.dtype} of shape {bad.shape}"
    with pytest.raises(ValueError) as error:
        signature._content_torch(torch.zeros(8, dtype=torch.uint8), 0)
    assert str(error.value) == "chunk_words must be >= 1, got 0"


def test_SIG_2_the_signature_of_a_tensor_by_the_definition() -> None:
    """signature = mix(content XOR meta), as a signed 64-bit int; meta digests the domain word,
    the byte count, the rank, the shape and the dtype's name."""
    tensor = torch.arange(6, dtype=torch.int16).view(2, 3)
    data = tensor.numpy().tobytes()
    words = [int.from_bytes(b"scoutT01", "little"), 12, 2, 2, 3, len("torch.int16"),
             int.from_bytes(b"torch.in", "little"), int.from_bytes(b"t16", "little")]
    stream = (content_reference(struct.pack(f"<{len(words)}Q", *words))
              + signature.mix64(len(words) ^ int.from_bytes(b"scoutS01", "little"))) & MASK64
    meta = signature.mix64(stream)
    unsigned = signature.mix64(content_reference(data) ^ meta)
    expected = unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned
    assert tensor_signature(tensor) == expected
    assert signature._tensor_signature_torch_only(tensor) == expected
    for path in signature.native_paths():
        assert signature._tensor_signature_on_path(tensor, path) == expected


def test_SIG_2_signatures_are_signed_64_bit_ints() -> None:
    assert signature._to_signed(0) == 0
    assert signature._to_signed((1 << 63) - 1) == (1 << 63) - 1
    assert signature._to_signed(1 << 63) == -(1 << 63)
    assert signature._to_signed(MASK64) == -1


def test_SIG_1_what_is_refused_is_named() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch deprecates creating quantized tensors
        quantized = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    cases: list[tuple[object, type[Exception], str]] = [
        ([1, 2], TypeError, "tensor_signature needs a torch.Tensor, got list"),
        (torch.eye(3).to_sparse(), TypeError, "tensor_signature supports strided (dense) tensors only, got layout "
                                              "torch.sparse_coo; convert with .to_dense() first"),
        (quantized, TypeError,
         "tensor_signature does not support quantized dtype torch.quint8"),
        (torch.empty(3, 2, device="meta"), ValueError, "a meta tensor has no data to sign (shape (3, 2))"),
    ]
    for value, kind, message in cases:
        with pytest.raises(kind) as error:
            tensor_signature(value)  # type: ignore[arg-type]
        assert str(error.value) == message


def test_SIG_1_views_are_hashed_by_the_values_they_show() -> None:
    values = torch.tensor([1 + 2j, -3 - 4j, 0.5 + 0j], dtype=torch.complex64)
    conjugate = values.conj()
    assert conjugate.is_conj()
    assert tensor_signature(conjugate) == tensor_signature(torch.tensor([1 - 2j, -3 + 4j, complex(0.5, -0.0)], dtype=torch.complex64))
    negative = conjugate.imag
    assert negative.is_neg()
    assert tensor_signature(negative) == tensor_signature(torch.tensor([-2.0, 4.0, -0.0]))
    matrix = torch.arange(6.0).view(2, 3)
    assert tensor_signature(matrix.t()) == tensor_signature(torch.tensor([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]))
    assert tensor_signature(torch.ones(3, requires_grad=True)) == tensor_signature(torch.ones(3))


class DTensor(torch.Tensor):
    """Stands for torch.distributed.tensor.DTensor: what the rule reads is the class name and
    ``to_local`` (a real DTensor needs a process group)."""

    local: torch.Tensor

    def to_local(self) -> torch.Tensor:
        return self.local


class Sharded(torch.Tensor):
    """Another tensor class with a ``to_local``: not a DTensor, hashed as itself."""

    def to_local(self) -> torch.Tensor:
        return torch.arange(4.0)


def test_SIG_1_a_dtensor_is_hashed_by_its_local_shard() -> None:
    sharded = torch.Tensor._make_subclass(DTensor, torch.zeros(8))
    sharded.local = torch.arange(4.0)
    assert tensor_signature(sharded) == tensor_signature(torch.arange(4.0))
    other = torch.Tensor._make_subclass(Sharded, torch.zeros(8))
    assert tensor_signature(other) == tensor_signature(torch.zeros(8))


def test_SIG_9_without_the_native_kernel_the_signature_is_the_same_and_a_forced_path_is_refused(
    torch_only: None, caplog: pytest.LogCaptureFixture
) -> None:
    tensor = torch.arange(5, dtype=torch.int32)
    with caplog.at_level(logging.WARNING, logger="scout.replay"):
        assert signature.signature_backend("cpu") is SignatureBackend.TORCH
        assert signature.native_path() is None and signature.native_paths() == ()
        assert tensor_signature(tensor) == signature._tensor_signature_torch_only(tensor)
    warnings = [r.getMessage() for r in caplog.records if r.name == "scout.replay"]
    assert warnings == [
        "scout: the native signature kernel is unavailable (disabled by SCOUT_SIGNATURE_BACKEND=torch); using torch "
        "ops, which give identical signatures more slowly"
    ]
    with pytest.raises(ValueError) as error:
        signature._tensor_signature_on_path(tensor, "scalar")
    assert str(error.value) == ("native path 'scalar' requested but the native kernel is unavailable: disabled by "
                                "SCOUT_SIGNATURE_BACKEND=torch")
    # An empty tensor needs no kernel on any path.
    empty = torch.zeros(0, dtype=torch.int32)
    assert signature._tensor_signature_on_path(empty, "scalar") == signature._tensor_signature_torch_only(empty)


def test_SIG_9_a_requested_native_path_is_the_one_used() -> None:
    tensor = torch.arange(7, dtype=torch.int16)
    missing = next(p for p in _native.PATH_NAMES if p not in _PATHS_HERE)
    with pytest.raises(ValueError) as error:
        signature._tensor_signature_on_path(tensor, missing)
    assert str(error.value) == f"signature path {missing!r} is not available here; available: {', '.join(_PATHS_HERE)}"


class _RecordingKernel:
    def __init__(self) -> None:
        self.paths: list[str | None] = []

    def content(self, address: int, byte_count: int, path: str | None) -> int:
        self.paths.append(path)
        return content_reference(bytes((i * 131 + 17) & 0xFF for i in range(byte_count)))


def test_SIG_9_the_self_test_runs_the_path_it_tests() -> None:
    kernel = _RecordingKernel()
    assert signature._native_self_test(kernel, "avx2") is None  # type: ignore[arg-type]
    assert kernel.paths and set(kernel.paths) == {"avx2"}


def test_SIG_9_the_backend_of_each_device() -> None:
    assert signature.signature_backend() is SignatureBackend.NATIVE
    assert signature.signature_backend(torch.device("cpu")) is SignatureBackend.NATIVE
    assert signature.signature_backend("meta") is SignatureBackend.TORCH
    assert signature.native_path() in signature.native_paths()


def test_SIG_9_a_path_that_fails_its_self_test_is_dropped_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = signature._native_self_test
    monkeypatch.setattr(signature, "_native_self_test",
                        lambda kernel, path: "planted" if path != "scalar" else real(kernel, path))
    _native.reset_for_tests()
    signature._state.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="scout.replay"):
            assert signature.native_paths() == ("scalar",) and signature.native_path() == "scalar"
        dropped = {p: "planted" for p in _native.PATH_NAMES[1:] if p in _PATHS_HERE}
        messages = [r.getMessage() for r in caplog.records if r.name == "scout.replay"]
        assert messages == ([f"scout: native signature paths failed their self-test: {dropped}"] if dropped else [])
    finally:
        monkeypatch.undo()
        _native.reset_for_tests()
        signature._state.clear()


_PATHS_HERE = signature.native_paths()


class _WrongKernel:
    def __init__(self, wrong_at: int) -> None:
        self.wrong_at = wrong_at

    def content(self, address: int, byte_count: int, path: str) -> int:
        data = bytes((i * 131 + 17) & 0xFF for i in range(byte_count))
        right = content_reference(data)
        return right ^ 1 if byte_count == self.wrong_at else right


def test_SIG_9_the_self_test_names_the_path_the_length_and_both_values() -> None:
    assert signature._native_self_test(_WrongKernel(-1), "avx2") is None  # type: ignore[arg-type]
    for length in (0, 9, 777):
        want = content_reference(bytes((i * 131 + 17) & 0xFF for i in range(length)))
        assert signature._native_self_test(_WrongKernel(length), "avx2") == (  # type: ignore[arg-type]
            f"avx2: content of {length} bytes is {want ^ 1:#x}, the definition gives {want:#x}")


# --------------------------------------------------------------------------------------------
# Structured signatures: the word stream of every kind of value (SIG-10)
# --------------------------------------------------------------------------------------------


def _text(value: str) -> list[int]:
    raw = value.encode()
    padded = raw + bytes(-len(raw) % 8)
    return [len(raw), *(int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8))]


def _float(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


class Color(enum.Enum):
    RED = "r"


class Corner(enum.Enum):
    ORIGIN = (0, 0)


@attrs.frozen
class Point:
    x: int
    y: str


Pair = collections.namedtuple("Pair", ["left", "right"])


def test_SIG_10_the_words_of_every_kind_of_value() -> None:
    tensor = torch.arange(3.0)
    cases = [
        (None, [1]),
        (False, [2, 0]),
        (True, [2, 1]),
        (0, [3, 0, 0]),
        (5, [3, 0, 1, 5]),
        (-5, [3, 1, 1, 5]),
        (2**64 + 7, [3, 0, 2, 7, 1]),
        (-(2**64), [3, 1, 2, 0, 1]),
        (1.5, [4, _float(1.5)]),
        (-0.0, [4, 1 << 63]),
        (1 - 2j, [5, _float(1.0), _float(-2.0)]),
        ("héllo wörld", [6, *_text("héllo wörld")]),
        (b"abcdefghi", [7, 9, int.from_bytes(b"abcdefgh", "little"), ord("i")]),
        (bytearray(b"ab"), [7, 2, int.from_bytes(b"ab", "little")]),
        (tensor, [8, tensor_signature(tensor) & MASK64]),
        (np.arange(3.0, dtype=np.float32), [8, tensor_signature(torch.arange(3.0)) & MASK64]),
        (np.int64(5), [3, 0, 1, 5]),
        (np.float64(1.5), [4, _float(1.5)]),
        (torch.float32, [13, *_text("torch.float32")]),
        (torch.device("cpu"), [14, *_text("cpu")]),
        (torch.Size([2, 3]), [12, 2, 2, 3]),
        (Color.RED, [15, *_text(f"{__name__}.Color"), 6, *_text("r")]),
        (Corner.ORIGIN, [15, *_text(f"{__name__}.Corner"), 9, 2, 3, 0, 0, 3, 0, 0]),
        (np.zeros(1, dtype=[("a", "i4"), ("b", "f8")])[0], [9, 2, 3, 0, 0, 4, 0]),  # a numpy record
        ((1, None), [9, 2, 3, 0, 1, 1, 1]),
        ([None], [10, 1, 1]),
        ({"b": 1, "a": None}, [11, 2, 6, *_text("a"), 1, 6, *_text("b"), 3, 0, 1, 1]),
        ({3, 1}, [17, 2, 3, 0, 1, 1, 3, 0, 1, 3]),
        (frozenset(), [17, 0]),
        (Point(1, "y"), [16, *_text(f"{__name__}.Point"), 2, *_text("x"), 3, 0, 1, 1, *_text("y"), 6, *_text("y")]),
        (Pair(None, True), [16, *_text(f"{__name__}.Pair"), 2, *_text("left"), 1, *_text("right"), 2, 1]),
    ]
    for value, words in cases:
        assert signature_words(value) == words, value
        assert all(type(word) is int for word in signature_words(value))


def test_SIG_10_mapping_entries_are_ordered_by_their_encoded_keys() -> None:
    # "b" (one byte) encodes before "aa" (two): the order is the words', not the keys' own.
    assert signature_words({"aa": 1, "b": 2}) == [11, 2, 6, *_text("b"), 3, 0, 1, 2, 6, *_text("aa"), 3, 0, 1, 1]
    # Keys of different types are ordered too (they cannot be compared with each other).
    assert signature_words({"a": 1, 2: None}) == [11, 2, 3, 0, 1, 2, 1, 6, *_text("a"), 3, 0, 1, 1]
    # Two keys that encode alike (equal tensors, distinct objects) are never compared themselves.
    first, second = torch.ones(3), torch.ones(3)
    words = signature_words({first: 1, second: 1})
    assert words[:2] == [11, 2] and words[2:8] == words[8:14] == [8, tensor_signature(first) & MASK64, 3, 0, 1, 1]


def test_SIG_10_the_structured_signature_digests_the_stream_with_its_length() -> None:
    for value in (None, {"a": [1, 2.5]}, ()):
        words = signature_words(value)
        content = content_reference(struct.pack(f"<{len(words)}Q", *words))
        digest = signature.mix64((content + signature.mix64(len(words) ^ int.from_bytes(b"scoutS01", "little"))) & MASK64)
        assert structured_signature(value) == signature._to_signed(digest)


def _nested(depth: int) -> object:
    value: object = None
    for _ in range(depth):
        value = [value]
    return value


def test_SIG_10_depth_is_bounded_exactly() -> None:
    assert signature_words(_nested(MAX_STRUCTURE_DEPTH)) == [10, 1] * MAX_STRUCTURE_DEPTH + [1]
    with pytest.raises(ValueError) as error:
        signature_words(_nested(MAX_STRUCTURE_DEPTH + 1))
    assert str(error.value) == "value" + "[0]" * (MAX_STRUCTURE_DEPTH + 1) + f": nested deeper than {MAX_STRUCTURE_DEPTH} levels"
    # An enum's value is one level below it, a numpy scalar none.
    with pytest.raises(ValueError, match=r"^value(\[0\]){64}\.value: nested deeper"):
        signature_words(_wrap(Color.RED, MAX_STRUCTURE_DEPTH))
    assert signature_words(_wrap(np.int64(1), MAX_STRUCTURE_DEPTH))[-3:] == [0, 1, 1]


def _wrap(value: object, depth: int) -> object:
    for _ in range(depth):
        value = [value]
    return value


def _tuples(depth: int) -> object:
    value: object = None
    for _ in range(depth):
        value = (value,)
    return value


@pytest.mark.parametrize("kind", ["dict value", "dict key", "set member", "record field", "enum value"])
def test_SIG_10_every_container_counts_one_level(kind: str) -> None:
    """A value one level inside a dict (as a key or a value), a set, a record or an enum: the
    deepest None lies at depth 1 + the nesting below it, and depth 64 is the last accepted."""

    def inside(depth: int) -> object:
        if kind == "dict value":
            return {"k": _tuples(depth)}
        if kind == "dict key":
            return {_tuples(depth): 0}
        if kind == "set member":
            return frozenset({_tuples(depth)})
        if kind == "record field":
            return Point(_tuples(depth), "y")  # type: ignore[arg-type]
        return _wrap(Color.RED, depth)  # the enum at depth n, its value at n + 1

    assert signature_words(inside(MAX_STRUCTURE_DEPTH - 1))
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_STRUCTURE_DEPTH} levels"):
        signature_words(inside(MAX_STRUCTURE_DEPTH))


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


def test_SIG_10_a_value_that_cannot_be_signed_is_named_with_its_path() -> None:
    supported = ("supported: tensors, numpy arrays, None, bool, int, float, complex, str, bytes, torch dtype/device/"
                 "Size, enums, tuples, lists, mappings, sets, attrs classes and named tuples")
    opaque = f"cannot sign a value of type {__name__}.Opaque; {supported}"
    cases = [
        (Opaque(), f"value: {opaque}"),
        ({"k": [1, Opaque()]}, f"value['k'][1]: {opaque}"),
        ({Opaque(): 1}, f"value key Opaque(): {opaque}"),
        ({1: {2: Opaque()}}, f"value[1][2]: {opaque}"),
        ({Opaque()}, f"value member: {opaque}"),
        (Point(1, Opaque()), f"value.y: {opaque}"),  # type: ignore[arg-type]
        (Pair(Opaque(), 1), f"value.left: {opaque}"),
    ]
    stamp = np.datetime64("2020-01-02T03:04")  # its .item() is a datetime, which is not signed
    with pytest.raises(TypeError) as error:
        signature_words({"t": stamp})
    assert str(error.value) == f"value['t']: cannot sign a value of type datetime.datetime; {supported}"
    for value, message in cases:
        with pytest.raises(TypeError) as error:
            signature_words(value)
        assert str(error.value) == message


def test_SIG_10_a_value_that_contains_itself_is_refused_but_a_value_seen_twice_is_not() -> None:
    loop: list[object] = [1]
    loop.append(loop)
    with pytest.raises(ValueError) as error:
        signature_words(loop)
    assert str(error.value) == "value[1]: the value contains itself; a signature needs a finite tree"
    table: dict[str, object] = {}
    table["self"] = table
    with pytest.raises(ValueError, match=r"^value\['self'\]: the value contains itself"):
        signature_words(table)
    shared = [1]
    assert signature_words([shared, shared, {"a": shared}]) == [
        10, 3, 10, 1, 3, 0, 1, 1, 10, 1, 3, 0, 1, 1, 11, 1, 6, *_text("a"), 10, 1, 3, 0, 1, 1]
    members = frozenset({(1,)})
    assert signature_words([members, members]) == [10, 2, 17, 1, 9, 1, 3, 0, 1, 1, 17, 1, 9, 1, 3, 0, 1, 1]
    point = Point(1, "y")
    assert signature_words((point, point))[:2] == [9, 2]


def test_SIG_4_the_collision_bound() -> None:
    assert signature.collision_bound(0) == 1.0
    assert signature.collision_bound(1) == 0.0
    assert signature.collision_bound(2) == signature.collision_bound(1000) == 1.0 / (2.0**64 - 1.0)
    with pytest.raises(ValueError) as error:
        signature.collision_bound(-1)
    assert str(error.value) == "changed_words must be >= 0, got -1"
