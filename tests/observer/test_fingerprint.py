"""Collective fingerprints (spec/observer.md, "Fingerprint", FINGERPRINT-1..4)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scout.core.fingerprint import (
    FINGERPRINT_NONE,
    CollectiveCall,
    TensorMeta,
    canonical_bytes,
    fingerprint,
)
from tests import processes

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]

BASE = CollectiveCall(
    "all_reduce",
    group=(0, 1, 2, 3),
    inputs=(TensorMeta("torch.float32", (4, 8)),),
    reduce_op="SUM",
)
# Pinned so that an accidental change of the encoding (which would make two versions of scout
# disagree inside one job) fails loudly. Change it only together with the domain tag.
BASE_FINGERPRINT = fingerprint(BASE)


def test_FINGERPRINT_1_same_value_in_every_process_whatever_the_hash_seed() -> None:
    script = (
        "from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint\n"
        "print(fingerprint(CollectiveCall('all_reduce', group=(0, 1, 2, 3), "
        "inputs=(TensorMeta('torch.float32', (4, 8)),), reduce_op='SUM')))\n"
    )
    values = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = processes.run(
            [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        values.add(int(result.stdout))
    assert values == {BASE_FINGERPRINT}


def test_FINGERPRINT_1_the_encoding_is_pinned() -> None:
    assert canonical_bytes(BASE).startswith(b"scout.fingerprint.v1\x00")
    assert fingerprint(
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.float32", (4, 8)),), (), "SUM")
    ) == BASE_FINGERPRINT


@pytest.mark.parametrize(
    "changed",
    [
        CollectiveCall("broadcast", (0, 1, 2, 3), (TensorMeta("torch.float32", (4, 8)),), reduce_op="SUM"),
        CollectiveCall("all_reduce", (0, 1, 2), (TensorMeta("torch.float32", (4, 8)),), reduce_op="SUM"),
        CollectiveCall("all_reduce", None, (TensorMeta("torch.float32", (4, 8)),), reduce_op="SUM"),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.bfloat16", (4, 8)),), reduce_op="SUM"),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.float32", (8, 4)),), reduce_op="SUM"),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.float32", None),), reduce_op="SUM"),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (), (TensorMeta("torch.float32", (4, 8)),), reduce_op="SUM"),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.float32", (4, 8)),), reduce_op="MAX"),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.float32", (4, 8)),), reduce_op="SUM", root=0),
        CollectiveCall("all_reduce", (0, 1, 2, 3), (TensorMeta("torch.float32", (4, 8)),), reduce_op="SUM",
                       detail=(("tag", 1),)),
    ],
)
def test_FINGERPRINT_2_every_field_counts(changed: CollectiveCall) -> None:
    assert fingerprint(changed) != BASE_FINGERPRINT


def test_FINGERPRINT_3_values_are_64_bit_and_never_the_no_collective_marker() -> None:
    values = {fingerprint(CollectiveCall("barrier", detail=(("i", i),))) for i in range(2000)}
    assert len(values) == 2000
    assert all(1 <= v < 2**64 for v in values) and FINGERPRINT_NONE not in values


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CollectiveCall(""), "CollectiveCall.op must be a non-empty string"),
        (lambda: CollectiveCall("x", group=()), "group must be a non-empty tuple"),
        (lambda: CollectiveCall("x", group=(0, -1)), r"group must hold ranks >= 0, got \(0, -1\)"),
        (lambda: CollectiveCall("x", root=-2), "root must be a rank >= 0 or None, got -2"),
        (lambda: TensorMeta("torch.float32", (2, -1)), r"shape must hold ints >= 0, got \(2, -1\)"),
        (lambda: TensorMeta("", (2,)), "TensorMeta.dtype must be a non-empty string"),
    ],
)
def test_FINGERPRINT_4_bad_descriptions_are_refused_naming_the_value(build: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build()  # type: ignore[operator]


names = st.text(alphabet="abcdefgh_.0123456789", min_size=1, max_size=6)
metas = st.builds(TensorMeta, names, st.none() | st.tuples(*[st.integers(0, 3)] * 2) | st.tuples(st.integers(0, 3)))
calls = st.builds(
    CollectiveCall,
    names,
    st.none() | st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple),
    st.lists(metas, max_size=2).map(tuple),
    st.lists(metas, max_size=2).map(tuple),
    st.none() | names,
    st.none() | st.integers(0, 5),
    st.lists(st.tuples(names, st.integers(-3, 3)), max_size=2).map(tuple),
)


@given(calls, calls)
def test_FINGERPRINT_2_the_encoding_is_injective(first: CollectiveCall, second: CollectiveCall) -> None:
    assert (canonical_bytes(first) == canonical_bytes(second)) == (first == second)


# --------------------------------------------------------------------------------------------
# Mutation follow-up (tests/mutation/survivors.md, "Observer"): the exact bytes, the 0 remap, and
# every refusal's exact message.
# --------------------------------------------------------------------------------------------


def test_FINGERPRINT_1_the_pinned_value_is_a_literal() -> None:
    # BASE_FINGERPRINT above is computed at import; this one is written down.
    assert fingerprint(BASE) == 13230406281835259423


def test_FINGERPRINT_1_canonical_bytes_are_pinned_for_ints_of_one_and_two_bytes() -> None:
    # 127 fits one signed byte, 300 needs two (little-endian), -1 is one byte 0xff; no group,
    # no reduce_op and no root are each one tag byte.
    call = CollectiveCall("x", detail=(("n", 127), ("m", 300), ("k", -1)))
    assert canonical_bytes(call) == (
        b"scout.fingerprint.v1\x00" b"\x01\x01x" b"N" b"I\x01\x00" b"O\x01\x00" b"N" b"N"
        b"\x01\x03" b"\x01\x01n\x01\x7f" b"\x01\x01m\x02\x2c\x01" b"\x01\x01k\x01\xff"
    )


def test_FINGERPRINT_1_canonical_bytes_are_pinned_with_every_field_present() -> None:
    call = CollectiveCall("all_reduce", group=(0, 1), inputs=(TensorMeta("f", None),),
                          outputs=(TensorMeta("g", (2,)),), reduce_op="SUM", root=0)
    assert canonical_bytes(call) == (
        b"scout.fingerprint.v1\x00" b"\x01\x0aall_reduce" b"T\x01\x02\x01\x00\x01\x01"
        b"I\x01\x01\x01\x01fN" b"O\x01\x01\x01\x01gT\x01\x01\x01\x02" b"R\x01\x03SUM" b"T\x01\x01\x01\x00"
        b"\x01\x00"
    )


class _Digest:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def digest(self) -> bytes:
        return self.raw


@pytest.mark.parametrize(("raw", "expected"), [(bytes(8), 1), (b"\x01" + bytes(7), 1), (b"\xff" * 8, 2**64 - 1)])
def test_FINGERPRINT_3_a_zero_digest_is_remapped_to_1_and_the_ends_of_the_range_are_kept(
    monkeypatch: pytest.MonkeyPatch, raw: bytes, expected: int
) -> None:
    """No BLAKE2b input with a zero digest is known, so the hash is replaced by one that gives it."""
    import types

    import scout.core.fingerprint as module

    fake = types.SimpleNamespace(blake2b=lambda data, digest_size: _Digest(raw))
    monkeypatch.setattr(module, "hashlib", fake)
    monkeypatch.setattr(module, "_KNOWN", {})  # computed afresh, not remembered from another test
    assert fingerprint(BASE) == expected


def test_FINGERPRINT_1_a_remembered_fingerprint_is_the_computed_one_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fingerprint() remembers the calls it has seen (a step repeats the same few collectives):
    what it returns from memory is what it computes, and it holds at most KNOWN_CALLS_MAX calls."""
    import scout.core.fingerprint as module

    monkeypatch.setattr(module, "_KNOWN", {})
    monkeypatch.setattr(module, "KNOWN_CALLS_MAX", 3)
    calls = [CollectiveCall("all_reduce", detail=(("n", n),)) for n in range(7)]
    first = [fingerprint(call) for call in calls]
    assert len(module._KNOWN) <= 3
    module._KNOWN.clear()
    assert [fingerprint(call) for call in calls] == first  # computed again: the same values
    assert [fingerprint(call) for call in reversed(calls)] == first[::-1]  # partly from memory


def _exactly(message: str) -> str:
    import re

    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: CollectiveCall("a\x00b"), ValueError, "CollectiveCall.op must not contain NUL characters, got 'a\\x00b'"),
        (lambda: CollectiveCall("x", reduce_op=""), ValueError,
         "CollectiveCall.reduce_op must be a non-empty string, got ''"),
        (lambda: CollectiveCall("x", root=True), ValueError, "CollectiveCall.root must be a rank >= 0 or None, got True"),
        (lambda: CollectiveCall("x", root=1.0), ValueError, "CollectiveCall.root must be a rank >= 0 or None, got 1.0"),
        (lambda: CollectiveCall("x", group=(0, True)), ValueError,
         "CollectiveCall.group must hold ranks >= 0, got (0, True)"),
        (lambda: CollectiveCall("x", group=(0, 1.0)), ValueError,
         "CollectiveCall.group must hold ranks >= 0, got (0, 1.0)"),
        (lambda: TensorMeta("f", [2]), TypeError, "TensorMeta.shape must be a tuple of ints or None, got [2]"),
        (lambda: TensorMeta("f", (True,)), ValueError, "TensorMeta.shape must hold ints >= 0, got (True,)"),
        (lambda: TensorMeta("f", (2.0,)), ValueError, "TensorMeta.shape must hold ints >= 0, got (2.0,)"),
        (lambda: CollectiveCall("x", inputs=[TensorMeta("f", None)]), TypeError,
         "tensor lists must be tuples of TensorMeta, got [TensorMeta(dtype='f', shape=None)]"),
        (lambda: CollectiveCall("x", outputs=(None,)), TypeError, "tensor lists must be tuples of TensorMeta, got (None,)"),
        (lambda: CollectiveCall("x", detail=[("a", 1)]), TypeError,
         "CollectiveCall.detail must be a tuple of (name, int) pairs, got [('a', 1)]"),
        (lambda: CollectiveCall("x", detail=(["a", 1],)), TypeError,
         "CollectiveCall.detail must be a tuple of (name, int) pairs, got (['a', 1],)"),
        (lambda: CollectiveCall("x", detail=(("a", 1, 2),)), TypeError,
         "CollectiveCall.detail must be a tuple of (name, int) pairs, got (('a', 1, 2),)"),
        (lambda: CollectiveCall("x", detail=((1, 2),)), TypeError,
         "CollectiveCall.detail must be a tuple of (name, int) pairs, got ((1, 2),)"),
        (lambda: CollectiveCall("x", detail=(("a", True),)), TypeError,
         "CollectiveCall.detail must be a tuple of (name, int) pairs, got (('a', True),)"),
        (lambda: CollectiveCall("x", detail=(("a", "1"),)), TypeError,
         "CollectiveCall.detail must be a tuple of (name, int) pairs, got (('a', '1'),)"),
        (lambda: CollectiveCall("x", detail=(("", 1),)), ValueError,
         "CollectiveCall.detail name must be a non-empty string, got ''"),
    ],
)
def test_FINGERPRINT_4_each_refusal_says_exactly_which_field_and_value(
    build: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=_exactly(message)):
        build()  # type: ignore[operator]
