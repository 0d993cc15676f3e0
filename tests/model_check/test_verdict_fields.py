"""Every field of a Verdict (VERDICT-2), not only its status and outliers.

The other verdict tests compare ``(status, outliers, reason, missing, invalid)``. A mutation run
(tests/mutation/survivors.md) showed what that leaves unguarded: the evidence echoed back, the
timing centre (``healthy_value``) and threshold, the large-group paths for inputs that are not
plain ints, the low bits of 64-bit signatures in the numpy outlier search, and the messages of
bad-input errors. These tests close those gaps.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout.core import verdict as verdict_module
from scout.core.verdict import (
    MISSING,
    Reason,
    Status,
    TimingConfig,
    classify_exact,
    classify_timing,
)
from tests.model_check.naive_verdict import naive_exact
from tests.model_check.test_verdict_properties import configs, timing_item

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def everything(verdict):
    return (
        verdict.status,
        verdict.outliers,
        verdict.evidence,
        verdict.reason,
        verdict.missing,
        verdict.invalid,
        verdict.healthy_value,
        verdict.threshold_ms,
    )


def naive_centre_and_threshold(values, config: TimingConfig) -> tuple[float | None, float | None]:
    """VERDICT-22..24 by hand: the lower median of the valid durations and the threshold."""
    valid = sorted(
        float(v) for v in values if v is not MISSING and not math.isnan(float(v)) and float(v) >= 0
    )
    if not valid:
        return None, None
    centre = valid[(len(valid) - 1) // 2]
    if centre == math.inf:
        return centre, None
    deviations = sorted(abs(v - centre) for v in valid)
    mad = deviations[(len(deviations) - 1) // 2]
    return centre, max(config.kappa * 1.4826 * mad, config.relative_floor * centre, config.absolute_floor_ms)


@SETTINGS
@given(st.lists(timing_item, min_size=2, max_size=40), configs)
def test_VERDICT_2_timing_vector_path_fills_every_field_like_the_plain_path(values, config) -> None:
    plain = classify_timing(values, config)
    vector = verdict_module._classify_timing_vector(list(values), config)
    assert everything(vector) == everything(plain)


@SETTINGS
@given(st.lists(timing_item, min_size=1, max_size=40), configs)
def test_VERDICT_2_timing_evidence_centre_and_threshold(values, config) -> None:
    verdict = classify_timing(values, config)
    assert verdict.evidence == tuple(values)
    if len(values) == 1:
        return  # VERDICT-4: a singleton is not measured
    centre, threshold = naive_centre_and_threshold(values, config)
    assert verdict.healthy_value == centre
    assert verdict.threshold_ms == threshold


@pytest.mark.parametrize("n", [5, 200])
def test_VERDICT_26_an_infinite_centre_is_reported_as_the_centre(n: int) -> None:
    values = [math.inf] * (n - 1) + [1.0]
    verdict = classify_timing(values)
    assert verdict.reason is Reason.GROUP_WIDE_SLOWDOWN
    assert verdict.healthy_value == math.inf and verdict.evidence == tuple(values)


def test_VERDICT_20_large_groups_mixing_ints_and_fractions_keep_the_fractions() -> None:
    base = [100 + (i % 7) for i in range(199)]  # ints first
    values = [*base, 100.75]
    assert everything(classify_timing(values)) == everything(
        verdict_module._classify_timing_vector(values, verdict_module.DEFAULT_TIMING_CONFIG)
    )
    assert classify_timing([*[10] * 150, 10.5, 60.25]).outliers == (151,)


@SETTINGS
@given(st.lists(st.one_of(st.integers(0, 3), st.just(MISSING)), min_size=1, max_size=12))
def test_VERDICT_2_exact_evidence_and_healthy_value(values) -> None:
    verdict = classify_exact(values)
    assert verdict.evidence == tuple(values)
    present = [v for v in values if v is not MISSING]
    if verdict.status in (Status.AGREE, Status.ATTRIBUTED):
        assert 2 * present.count(verdict.healthy_value) > len(values)


SHARED_NAN = math.nan


@pytest.mark.parametrize(
    "values",
    [
        [SHARED_NAN] * 200,  # one NaN object, 200 times: list.count would say they agree
        [1.5] * 150 + [SHARED_NAN] * 50,
        ["a"] * 150 + ["b"] * 50,
        [7] * 150 + [MISSING] * 50,
        [b"x"] * 64 + [b"y"] * 64,
    ],
    ids=["same-nan-object", "floats-and-nan", "strings", "ints-and-missing", "bytes-tie"],
)
def test_VERDICT_12_13_large_groups_that_are_not_all_int_follow_the_rule(values) -> None:
    """n >= 128 but not plain ints: the general path, never the int fast path."""
    verdict = classify_exact(values)
    assert (verdict.status, verdict.outliers, verdict.reason, verdict.missing, verdict.invalid) == naive_exact(values)


def test_VERDICT_13_many_outliers_differing_only_in_the_lowest_bit_of_a_large_signature() -> None:
    """More than 16 outliers (the numpy search) of 64-bit values above 2**53: exact, not float."""
    healthy = 2**60 + 1
    values = [healthy] * 200
    for position in range(0, 60, 3):  # 20 outliers
        values[position] = healthy - 1
    verdict = classify_exact(values)
    assert verdict.status is Status.ATTRIBUTED
    assert verdict.outliers == tuple(range(0, 60, 3))
    unsigned = [2**64 - 1] * 200
    for position in range(1, 61, 3):
        unsigned[position] = 2**64 - 2
    assert classify_exact(unsigned).outliers == tuple(range(1, 61, 3))


def test_VERDICT_10_mixed_types_after_a_missing_peer_are_refused() -> None:
    with pytest.raises(TypeError, match=r"peer 1 gave int, peer 2 gave str"):
        classify_exact([MISSING, 1, "a"])


def test_VERDICT_3_and_bad_config_errors_say_what_was_wrong() -> None:
    empty = r"^peer group is empty: a verdict needs at least one peer \(VERDICT-3\)$"
    with pytest.raises(ValueError, match=empty):
        classify_timing([])
    with pytest.raises(ValueError, match=empty):
        classify_exact([])
    with pytest.raises(TypeError, match=r"^config must be a TimingConfig, got dict$"):
        classify_timing([1.0, 2.0], config={"kappa": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^TimingConfig\.relative_floor must be a real number, got str$"):
        TimingConfig(relative_floor="0.1")
    with pytest.raises(TypeError, match=r"^TimingConfig\.absolute_floor_ms must be a real number, got NoneType$"):
        TimingConfig(absolute_floor_ms=None)


def test_MISSING_reads_as_MISSING() -> None:
    assert repr(MISSING) == "MISSING"
    assert repr([1, MISSING]) == "[1, MISSING]"


@pytest.mark.parametrize("n", [128, 1000])
def test_VERDICT_2_large_int_groups_echo_the_evidence_and_name_the_healthy_value(n: int) -> None:
    """The all-int fast path fills the same fields as the general path."""
    healthy = 2**63 + 12345
    agree = [healthy] * n
    verdict = classify_exact(agree)
    assert (verdict.status, verdict.evidence, verdict.healthy_value) == (Status.AGREE, tuple(agree), healthy)
    attributed = [*agree[:-3], 7, 8, 9]
    verdict = classify_exact(attributed)
    assert (verdict.status, verdict.evidence, verdict.healthy_value) == (Status.ATTRIBUTED, tuple(attributed), healthy)
    assert verdict.outliers == (n - 3, n - 2, n - 1)
