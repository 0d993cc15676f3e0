"""The live path's self-check decision (spec/replay.md SELF-4, SELF-5): exhaustively for every
group of up to 6 peers over every code (MATCH, DIFFER, UNCHECKED, an unknown code, MISSING)
against a clause-by-clause reference that counts by hand, and by property for larger groups.
The decision must take its majority from ``classify_exact`` (one rule, VERDICT): a test reads
the module to make sure no second count of a majority appears in it."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scout.core import self_check
from scout.core.self_check import LiveCheck, SelfCheckOutcome, SelfCheckVerdict, decide_self_check
from scout.core.verdict import MISSING

UNKNOWN = 7  # a code this version does not know: takes no part (SELF-4)
CODES: tuple[Any, ...] = (MISSING, int(LiveCheck.UNCHECKED), int(LiveCheck.MATCH), int(LiveCheck.DIFFER), UNKNOWN)


def naive(codes: list[Any]) -> tuple[SelfCheckOutcome, tuple[int, ...], str | None]:
    """SELF-4 read literally, counting by hand (the reference, not the product)."""
    n = len(codes)
    match = [i for i, c in enumerate(codes) if c == LiveCheck.MATCH]
    differ = [i for i, c in enumerate(codes) if c == LiveCheck.DIFFER]
    silent = n - len(match) - len(differ)  # UNCHECKED, unknown and MISSING take no part
    if not match and not differ:
        return SelfCheckOutcome.NOT_CHECKED, (), None
    if n == 1:
        return SelfCheckOutcome.INCONCLUSIVE, (), "singleton"
    if 2 * len(match) > n:
        if differ:
            return SelfCheckOutcome.ATTRIBUTED, tuple(differ), None
        if silent:
            return SelfCheckOutcome.INCONCLUSIVE, (), "missing-evidence"
        return SelfCheckOutcome.AGREE, (), None
    if 2 * len(differ) > n:
        return SelfCheckOutcome.INCONCLUSIVE, (), "not-reproducible"
    if 2 * (max(len(match), len(differ)) + silent) > n:
        return SelfCheckOutcome.INCONCLUSIVE, (), "missing-evidence"
    return SelfCheckOutcome.INCONCLUSIVE, (), "no-majority"


def summary(verdict: SelfCheckVerdict) -> tuple[SelfCheckOutcome, tuple[int, ...], str | None]:
    return verdict.outcome, verdict.outliers, verdict.reason


def test_SELF_4_SELF_5_every_group_of_up_to_6_peers_decides_as_the_reference() -> None:
    checked = 0
    for n in range(1, 7):
        for codes in itertools.product(CODES, repeat=n):
            decided = decide_self_check(list(codes))
            assert summary(decided) == naive(list(codes)), codes
            # SELF-5: only a DIFFER peer is ever named, and only under a strict MATCH majority.
            assert all(codes[p] == LiveCheck.DIFFER for p in decided.outliers), codes
            assert (decided.outcome is SelfCheckOutcome.ATTRIBUTED) == bool(decided.outliers)
            checked += 1
    assert checked == sum(len(CODES) ** n for n in range(1, 7))


def test_SELF_4_one_rule_the_majority_comes_from_classify_exact() -> None:
    source = inspect.getsource(self_check)
    assert "classify_exact(" in source
    assert "2 *" not in source and "most_common" not in source and "Counter" not in source
    healthy = decide_self_check([1, 1, 1, 2])
    assert healthy.verdict is not None and healthy.verdict.healthy_value == LiveCheck.MATCH


def test_SELF_4_worked_cases() -> None:
    assert decide_self_check([1, 1, 1, 1]).outcome is SelfCheckOutcome.AGREE
    assert summary(decide_self_check([1, 2, 1, 1])) == (SelfCheckOutcome.ATTRIBUTED, (1,), None)
    # The majority does not reproduce its own live output: nondeterminism, never a fault.
    assert summary(decide_self_check([2, 2, 2, 1])) == (SelfCheckOutcome.INCONCLUSIVE, (), "not-reproducible")
    # Two replicas see the disagreement, and name nobody.
    assert summary(decide_self_check([1, 2])) == (SelfCheckOutcome.INCONCLUSIVE, (), "no-majority")
    # A rank that could not check takes no part; its silence may hide a majority either way.
    assert summary(decide_self_check([1, 1, 0, 2])) == (SelfCheckOutcome.INCONCLUSIVE, (), "missing-evidence")
    assert decide_self_check([0, 0, 0]).outcome is SelfCheckOutcome.NOT_CHECKED
    assert decide_self_check([MISSING, 0, UNKNOWN]).outcome is SelfCheckOutcome.NOT_CHECKED


def test_SELF_4_bad_input_is_an_error_naming_the_value() -> None:
    import pytest

    with pytest.raises(ValueError, match="at least one"):
        decide_self_check([])
    with pytest.raises(TypeError, match=r"peer 1: .* got str 'match'"):
        decide_self_check([1, "match"])
    with pytest.raises(TypeError, match="got bool"):
        decide_self_check([1, True])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CODES), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_SELF_4_SELF_5_properties_for_larger_groups(codes: list[Any], random: Any) -> None:
    decided = decide_self_check(codes)
    assert summary(decided) == naive(codes)
    # VERDICT-7: permuting the peers permutes the outliers and changes nothing else.
    order = list(range(len(codes)))
    random.shuffle(order)
    permuted = decide_self_check([codes[i] for i in order])
    assert permuted.outcome is decided.outcome and permuted.reason == decided.reason
    assert sorted(order[p] for p in permuted.outliers) == list(decided.outliers)
    # More MATCH peers never turn an attribution into silence, and a MATCH peer is never named.
    assert not any(codes[p] != LiveCheck.DIFFER for p in decided.outliers)
