"""One named test per VERDICT clause that the spec audit (docs/spec-audit.md) found proved only
inside the clause-by-clause reference (naive_verdict.py) or the worked examples, never under its
own id. Each test is the clause's own example or its boundary case."""

from __future__ import annotations

import math

from scout.core.verdict import (
    MISSING,
    Reason,
    Status,
    TimingConfig,
    classify_exact,
    classify_timing,
)


def test_VERDICT_1_a_silent_peer_counts_in_n() -> None:
    # Two of three agree, but n counts the silent peer: 2 of 3 is a strict majority ...
    assert classify_exact([5, 5, MISSING]).healthy_value == 5
    # ... and 2 of 4 (one silent) is not: silence never shrinks the group.
    verdict = classify_exact([5, 5, 6, MISSING])
    assert verdict.status is Status.INCONCLUSIVE and verdict.missing == (3,)


def test_VERDICT_5_exactly_the_inconclusive_verdicts_carry_a_reason() -> None:
    for values in ([1, 1, 1], [1, 1, 2], [1, 2], [1], [MISSING, MISSING], [1, 1, MISSING]):
        verdict = classify_exact(values)
        assert (verdict.reason is not None) == (verdict.status is Status.INCONCLUSIVE), values
    for values_ms in ([10.0, 10.0, 10.0], [10.0, 10.0, 100.0], [10.0, 30.0, 30.1], [10.0]):
        verdict = classify_timing(values_ms)
        assert (verdict.reason is not None) == (verdict.status is Status.INCONCLUSIVE), values_ms


def test_VERDICT_6_no_valid_evidence_is_no_evidence() -> None:
    assert classify_exact([MISSING, math.nan, MISSING]).reason is Reason.NO_EVIDENCE
    assert classify_timing([MISSING, -1.0, math.nan]).reason is Reason.NO_EVIDENCE


def test_VERDICT_11_equal_values_of_different_types_are_refused_not_merged() -> None:
    # 1 == 1.0 == True in Python; as evidence they are different types (VERDICT-10 refuses them).
    for values in ([1, 1.0, 1], [1, True, 1]):
        try:
            classify_exact(values)
        except TypeError:
            continue
        raise AssertionError(f"{values} were merged as equal evidence")


def test_VERDICT_15_a_tie_is_never_broken() -> None:
    for values in ([1, 1, 2, 2], [1, 2, 2, 1, 3, 3], [7] * 64 + [8] * 64):
        verdict = classify_exact(values)
        assert verdict.status is Status.INCONCLUSIVE and verdict.reason is Reason.NO_MAJORITY, values[:8]


def test_VERDICT_16_two_peers_that_disagree_are_detected_never_attributed() -> None:
    verdict = classify_exact([0xA1, 0xB7])
    assert (verdict.status, verdict.reason, verdict.outliers) == (Status.INCONCLUSIVE, Reason.NO_MAJORITY, ())


def test_VERDICT_17_every_minority_is_attributed() -> None:
    verdict = classify_exact(["a", "a", "a", "a", "a", "b", "c"])
    assert verdict.status is Status.ATTRIBUTED and verdict.outliers == (5, 6)


def test_VERDICT_18_a_majority_corrupted_identically_convicts_the_healthy_minority() -> None:
    # The documented limit of consensus: the rule cannot tell, so the lone healthy value loses.
    healthy, corrupted = 0x1111, 0x2222
    verdict = classify_exact([corrupted, corrupted, healthy])
    assert verdict.status is Status.ATTRIBUTED and verdict.outliers == (2,)
    assert verdict.healthy_value == corrupted


def test_VERDICT_22_the_centre_is_the_lower_median() -> None:
    assert classify_timing([100.0, 500.0]).healthy_value == 100.0  # an even split: the fast side
    assert classify_timing([3.0, 1.0, 2.0, 9.0]).healthy_value == 2.0
    assert classify_timing([5.0, MISSING, 7.0, math.nan]).healthy_value == 5.0  # valid ones only


def test_VERDICT_23_VERDICT_24_the_threshold_from_the_spread_and_the_floors() -> None:
    config = TimingConfig(kappa=2.0, relative_floor=0.0, absolute_floor_ms=0.0)
    # centre 10, deviations [0, 0, 1, 1, 4] -> MAD 1 -> threshold 2 * 1.4826 * 1
    verdict = classify_timing([10.0, 10.0, 11.0, 9.0, 14.0], config)
    assert verdict.threshold_ms == 2.0 * 1.4826
    assert verdict.status is Status.ATTRIBUTED and verdict.outliers == (4,)
    # A tight group (MAD 0): the relative floor decides.
    assert classify_timing([10.0, 10.0, 10.0, 10.9], TimingConfig(relative_floor=0.1)).status is Status.AGREE
    assert classify_timing([10.0, 10.0, 10.0, 11.1], TimingConfig(relative_floor=0.1)).outliers == (3,)
    # ... or the absolute floor, whichever is larger.
    verdict = classify_timing([1.0, 1.0, 1.0, 1.9], TimingConfig(relative_floor=0.1, absolute_floor_ms=1.0))
    assert verdict.threshold_ms == 1.0 and verdict.status is Status.AGREE


def test_VERDICT_25_attribution_needs_a_healthy_strict_majority() -> None:
    assert classify_timing([10.0, 10.0, 10.0, 100.0]).outliers == (3,)
    even = classify_timing([10.0, 10.0, 100.0, 100.0])
    assert (even.status, even.reason) == (Status.INCONCLUSIVE, Reason.NO_MAJORITY)
    short = classify_timing([10.0, 10.0, 100.0, MISSING, MISSING])
    assert (short.status, short.reason) == (Status.INCONCLUSIVE, Reason.MISSING_EVIDENCE)
    bad = classify_timing([10.0, 10.0, 100.0, math.nan, math.nan])
    assert (bad.status, bad.reason) == (Status.INCONCLUSIVE, Reason.INVALID_EVIDENCE)


def test_VERDICT_27_agreement_needs_every_peer_valid_and_present() -> None:
    assert classify_timing([10.0, 10.1, 9.9]).status is Status.AGREE
    assert classify_timing([10.0, 10.1, math.nan]).reason is Reason.INVALID_EVIDENCE
    assert classify_timing([10.0, 10.1, MISSING]).reason is Reason.MISSING_EVIDENCE
    assert classify_timing([10.0, math.nan, MISSING]).reason is Reason.INVALID_EVIDENCE  # invalid first
