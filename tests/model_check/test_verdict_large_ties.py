"""VERDICT-13 at the sizes the all-int fast path answers (n >= 128): exact ties and near-ties.

The random-list properties in test_verdict_properties.py draw i.i.d. symbols, which almost never
put exactly half of a large group on one value, and the exhaustive check stops at n <= 9. A
strict majority means ``2 * count > n``; weakening it to ``>=`` changes the answer only at an
exact tie, so these strategies build that case on purpose: ``k`` copies of one value and
``n - k`` of another with ``k`` at, just below and just above ``n / 2``, in every arrangement
the fast path's probe positions (first, middle, last, quarters) can see.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout.core import verdict as verdict_module
from scout.core.verdict import MISSING, Reason, Status, classify_exact
from tests.model_check.naive_verdict import naive_exact

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALLEST_FAST = verdict_module._VECTOR_MIN_PEERS


def summary(verdict):
    return verdict.status, verdict.outliers, verdict.reason, verdict.missing, verdict.invalid


@st.composite
def two_value_groups(draw, offsets=(-1, 0, 1)):
    """``k`` copies of ``a`` and ``n - k`` of ``b``, with ``k - n // 2`` in ``offsets`` (odd n:
    around the half), arranged as blocks either way round, interleaved, or shuffled."""
    n = draw(st.integers(min_value=SMALLEST_FAST, max_value=1200))
    k = n // 2 + draw(st.sampled_from(offsets))
    a = draw(st.integers(min_value=-(2**63), max_value=2**64 - 1))
    b = draw(st.integers(min_value=-(2**63), max_value=2**64 - 1).filter(lambda v: v != a))
    layout = draw(st.sampled_from(("a-first", "b-first", "interleaved", "shuffled")))
    if layout == "a-first":
        values = [a] * k + [b] * (n - k)
    elif layout == "b-first":
        values = [b] * (n - k) + [a] * k
    elif layout == "interleaved":
        pairs = min(k, n - k)
        values = [a, b] * pairs + [a] * (k - pairs) + [b] * (n - k - pairs)
    else:
        values = [a] * k + [b] * (n - k)
        values = draw(st.permutations(values))
    return list(values), a, k


@SETTINGS
@given(two_value_groups())
def test_VERDICT_13_fast_path_ties_and_near_ties_match_the_reference(case) -> None:
    values, _a, _k = case
    assert summary(classify_exact(values)) == naive_exact(values)


@SETTINGS
@given(two_value_groups(offsets=(0,)).filter(lambda case: len(case[0]) % 2 == 0))
def test_VERDICT_13_an_exact_half_at_n_ge_128_is_no_majority(case) -> None:
    """n/2 peers on each of two values: nobody holds a strict majority, nobody is convicted."""
    values, _a, k = case
    assert 2 * k == len(values)
    verdict = classify_exact(values)
    assert verdict.status is Status.INCONCLUSIVE and verdict.reason is Reason.NO_MAJORITY
    assert verdict.outliers == ()


@SETTINGS
@given(two_value_groups(offsets=(1,)))
def test_VERDICT_13_one_more_than_half_at_n_ge_128_convicts_exactly_the_rest(case) -> None:
    values, a, k = case
    assert 2 * k > len(values)
    verdict = classify_exact(values)
    assert verdict.status is Status.ATTRIBUTED and verdict.healthy_value == a
    assert verdict.outliers == tuple(i for i, v in enumerate(values) if v != a)


@pytest.mark.parametrize("n", [128, 129, 130, 256, 1024, 4096])
def test_VERDICT_13_half_and_half_blocks(n: int) -> None:
    """The issue's example and its neighbours: [1]*64 + [2]*64 is Inconclusive, not 64 outliers."""
    half = n // 2
    for values in ([1] * half + [2] * (n - half), [2] * (n - half) + [1] * half):
        verdict = classify_exact(values)
        if 2 * half == n:
            assert verdict.status is Status.INCONCLUSIVE, (n, verdict.outliers[:4])
            assert verdict.reason is Reason.NO_MAJORITY
        else:  # odd n: the larger block (n - half) holds a strict majority
            assert verdict.status is Status.ATTRIBUTED and len(verdict.outliers) == half
        assert summary(verdict) == naive_exact(values)


@pytest.mark.parametrize("n", [128, 200, 1000])
def test_VERDICT_14_a_tie_completed_by_missing_peers_is_missing_evidence(n: int) -> None:
    """Half on one value, the rest split between another value and MISSING: MISSING takes the
    general path (the fast path is all-int only) and the answer names the silent peers."""
    half = n // 2
    values = [7] * half + [8] * (n - half - 3) + [MISSING] * 3
    verdict = classify_exact(values)
    assert summary(verdict) == naive_exact(values)
    assert verdict.status is Status.INCONCLUSIVE and verdict.reason is Reason.MISSING_EVIDENCE
