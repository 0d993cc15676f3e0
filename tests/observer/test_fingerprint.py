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
