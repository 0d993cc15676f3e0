"""Property tests of the verdict rule (spec/verdict.md) with Hypothesis.

Each property follows from the spec's clauses; the clause is named in the test.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scout.core import verdict as verdict_module
from scout.core.verdict import (
    MISSING,
    Status,
    TimingConfig,
    classify_exact,
    classify_timing,
)
from tests.model_check.naive_verdict import naive_exact, naive_timing

durations = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
timing_item = st.one_of(
    durations,
    durations,
    durations,
    st.just(MISSING),
    st.just(math.nan),
    st.just(math.inf),
    st.just(-math.inf),
    st.floats(max_value=-1e-9, min_value=-1e6),
    st.integers(min_value=0, max_value=10**6),
)
configs = st.builds(
    TimingConfig,
    kappa=st.floats(min_value=0.01, max_value=20),
    relative_floor=st.floats(min_value=0.0, max_value=1.0),
    absolute_floor_ms=st.floats(min_value=0.0, max_value=100.0),
)
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def summary(v):
    return v.status, v.outliers, v.reason, v.missing, v.invalid


@SETTINGS
@given(st.lists(timing_item, min_size=1, max_size=12), configs)
def test_VERDICT_20_timing_matches_the_naive_reference(values, config) -> None:
    assert summary(classify_timing(values, config)) == naive_timing(values, config)


@SETTINGS
@given(st.lists(timing_item, min_size=1, max_size=40), configs)
def test_timing_vector_path_equals_plain_path(values, config) -> None:
    """The numpy path (large groups) decides exactly like the plain path."""
    plain = classify_timing(values, config)
    assert len(values) < verdict_module._VECTOR_MIN_PEERS
    if len(values) == 1:
        return  # the vector path is only entered for n >= 128, never for singletons
    vector = verdict_module._classify_timing_vector(list(values), config)
    assert summary(vector) == summary(plain)


@SETTINGS
@given(
    st.lists(st.integers(min_value=0, max_value=3), min_size=128, max_size=400),
    st.integers(min_value=0, max_value=2**63),
)
def test_exact_int_fast_path_equals_reference(symbols, big) -> None:
    values = [big + s for s in symbols]
    assert summary(classify_exact(values)) == naive_exact(values)


@SETTINGS
@given(st.lists(timing_item, min_size=1, max_size=12), configs, st.randoms(use_true_random=False))
def test_VERDICT_7_timing_permutation_equivariance(values, config, rnd) -> None:
    order = list(range(len(values)))
    rnd.shuffle(order)
    before = classify_timing(values, config)
    after = classify_timing([values[old] for old in order], config)
    new_of_old = {old: new for new, old in enumerate(order)}
    assert after.status is before.status and after.reason is before.reason
    assert after.outliers == tuple(sorted(new_of_old[p] for p in before.outliers))
    assert after.missing == tuple(sorted(new_of_old[p] for p in before.missing))
    assert after.invalid == tuple(sorted(new_of_old[p] for p in before.invalid))


@SETTINGS
@given(
    st.lists(st.floats(min_value=1e-3, max_value=1e6), min_size=1, max_size=15),
    st.integers(min_value=-20, max_value=20),
    st.floats(min_value=0.01, max_value=20),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_VERDICT_29_scaling_by_a_power_of_two_changes_nothing(values, exponent, kappa, rel) -> None:
    config = TimingConfig(kappa=kappa, relative_floor=rel, absolute_floor_ms=0.0)
    scale = 2.0**exponent
    scaled = [v * scale for v in values]
    assert summary(classify_timing(scaled, config)) == summary(classify_timing(values, config))


@SETTINGS
@given(st.lists(timing_item, min_size=1, max_size=15), configs)
def test_VERDICT_2_outliers_are_never_part_of_the_majority(values, config) -> None:
    v = classify_timing(values, config)
    n = len(values)
    if v.status is Status.ATTRIBUTED:
        healthy = n - len(v.outliers) - len(v.missing) - len(v.invalid)
        assert 2 * healthy > n
        assert not set(v.outliers) & (set(v.missing) | set(v.invalid))
        centre = v.healthy_value
        assert all(float(values[p]) > centre for p in v.outliers)  # one-sided: slow only
    if v.status is Status.AGREE:
        assert not (v.outliers or v.missing or v.invalid)
    else:
        assert (v.status is Status.ATTRIBUTED) == bool(v.outliers)


@SETTINGS
@given(st.lists(timing_item, min_size=1, max_size=15), configs)
def test_VERDICT_21_nan_never_yields_agree(values, config) -> None:
    assume(any(isinstance(x, float) and math.isnan(x) for x in values))
    assert classify_timing(values, config).status is not Status.AGREE


attributed_inputs = st.builds(
    lambda base, offsets, slow, extra: [base * (1 + o) for o in offsets] + [base * slow] + extra,
    st.floats(min_value=1.0, max_value=1e4),
    st.lists(st.floats(min_value=-0.05, max_value=0.05), min_size=3, max_size=12),
    st.floats(min_value=2.0, max_value=100.0),
    st.lists(timing_item, max_size=3),
)


@SETTINGS
@given(attributed_inputs, configs, st.integers(0, 20), st.randoms(use_true_random=False))
def test_VERDICT_21_nan_never_hides_another_peers_outlier(values, config, where, rnd) -> None:
    rnd.shuffle(values)
    before = classify_timing(values, config)
    assume(before.status is Status.ATTRIBUTED)
    n = len(values) + 1
    healthy = len(values) - len(before.outliers) - len(before.missing) - len(before.invalid)
    assume(2 * healthy > n)  # the majority still holds with one more (invalid) peer
    position = where % n
    with_nan = values[:position] + [math.nan] + values[position:]
    after = classify_timing(with_nan, config)
    shifted = tuple(p + (p >= position) for p in before.outliers)
    assert after.status is Status.ATTRIBUTED and after.outliers == shifted
    assert position in after.invalid


@SETTINGS
@given(
    st.floats(min_value=1.0, max_value=1e6),
    st.lists(st.floats(min_value=-0.04, max_value=0.04), min_size=2, max_size=64),
)
def test_VERDICT_28_jitter_within_4_percent_always_agrees(base, offsets) -> None:
    values = [base * (1 + o) for o in offsets]
    assert classify_timing(values).status is Status.AGREE


@SETTINGS
@given(
    # Above 4 ms the 0.5x excess clears the 1 ms absolute floor (VERDICT-24).
    st.floats(min_value=4.0, max_value=1e5),
    st.lists(st.floats(min_value=-0.02, max_value=0.02), min_size=3, max_size=64),
    st.floats(min_value=-0.02, max_value=0.02),
    st.integers(min_value=0, max_value=64),
)
def test_VERDICT_28_a_1_5x_straggler_among_2_percent_jitter_is_named(base, offsets, own, where):
    values = [base * (1 + o) for o in offsets]
    position = where % (len(values) + 1)
    values.insert(position, 1.5 * base * (1 + own))
    v = classify_timing(values)
    assert v.status is Status.ATTRIBUTED and v.outliers == (position,)


SIZES = [3, 4, 5, 7, 8, 16, 64, 127, 128, 129, 256, 1024]


@pytest.mark.parametrize("n", SIZES)
def test_VERDICT_28_gaussian_1_percent_jitter_never_attributed_straggler_always(n: int) -> None:
    """The issue's acceptance rule, on seeded Gaussian draws (both code paths: n < / >= 128)."""
    rng = random.Random(n)
    trials = 60 if n <= 256 else 15
    for _ in range(trials):
        base = rng.uniform(4.0, 1000.0)
        values = [base * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(n)]
        assert classify_timing(values).status is Status.AGREE, values
        straggler = rng.randrange(n)
        values[straggler] = 1.5 * base * (1 + 0.01 * rng.gauss(0, 1))
        v = classify_timing(values)
        assert v.status is Status.ATTRIBUTED and v.outliers == (straggler,), (straggler, values)


def test_VERDICT_28_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"kappa must be finite and > 0, got 0"):
        TimingConfig(kappa=0)
    with pytest.raises(ValueError, match=r"kappa .* got -1"):
        TimingConfig(kappa=-1)
    with pytest.raises(ValueError, match=r"kappa .* got inf"):
        TimingConfig(kappa=math.inf)
    with pytest.raises(ValueError, match=r"relative_floor must be finite and >= 0, got -0.1"):
        TimingConfig(relative_floor=-0.1)
    with pytest.raises(ValueError, match=r"absolute_floor_ms .* got nan"):
        TimingConfig(absolute_floor_ms=math.nan)
    with pytest.raises(TypeError, match=r"kappa must be a real number, got bool"):
        TimingConfig(kappa=True)
    with pytest.raises(TypeError, match=r"got str"):
        TimingConfig(absolute_floor_ms="1")


def test_VERDICT_20_bad_timing_input() -> None:
    with pytest.raises(ValueError, match="empty"):
        classify_timing([])
    with pytest.raises(TypeError, match=r"peer 1 gave str"):
        classify_timing([1.0, "2", 3.0])
    with pytest.raises(TypeError, match=r"peer 0 gave bool"):
        classify_timing([True, 2.0, 3.0])
    with pytest.raises(TypeError, match=r"peer 200 gave str"):
        classify_timing([1.0] * 200 + ["x"] + [1.0] * 10)  # the vector path names it too
    with pytest.raises(TypeError, match="TimingConfig"):
        classify_timing([1.0, 2.0], config={"kappa": 3})  # type: ignore[arg-type]


@SETTINGS
@given(
    st.integers(min_value=128, max_value=3000),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 2**64 - 1)), max_size=40),
)
def test_exact_int_fast_path_with_few_scattered_outliers(n, healthy, corruptions) -> None:
    """The chunked outlier search (<= 16 outliers) and the numpy search (more) are exact."""
    values = [healthy] * n
    for where, value in corruptions:
        values[where % n] = value
    verdict = classify_exact(values)
    expected_outliers = tuple(i for i, v in enumerate(values) if v != healthy)
    if 2 * (n - len(expected_outliers)) > n:
        assert verdict.outliers == expected_outliers
        expected = Status.ATTRIBUTED if expected_outliers else Status.AGREE
        assert verdict.status is expected
