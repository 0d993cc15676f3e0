"""scout.core.rates: the 95 % upper bound on a false-attribution rate (docs/evaluation.md)."""

from __future__ import annotations

import math

import pytest

from scout.core.rates import binomial_cdf, rule_of_three, upper_bound


def test_no_event_is_the_exact_bound_and_the_rule_of_three_is_close_above_it() -> None:
    for trials in (1, 10, 300, 10_000):
        exact = upper_bound(0, trials)
        assert math.isclose(exact, 1 - 0.05 ** (1 / trials), rel_tol=1e-12)
        assert exact < rule_of_three(trials) or trials < 3
    assert math.isclose(rule_of_three(1000), 0.003)
    assert 0.00299 < upper_bound(0, 1000) < 0.003


@pytest.mark.parametrize(("events", "trials", "expected"), [(1, 100, 0.04655981), (5, 50, 0.19883300),
                                                            (10, 10, 1.0)])
def test_clopper_pearson_known_values(events: int, trials: int, expected: float) -> None:
    # Reference values: the one-sided 95 % Clopper-Pearson bound (R: binom.test(x, n, alternative="less")).
    assert math.isclose(upper_bound(events, trials), expected, rel_tol=1e-6)


def test_the_bound_is_where_the_binomial_tail_is_five_percent() -> None:
    for events, trials in ((1, 20), (3, 1000), (7, 9)):
        bound = upper_bound(events, trials)
        assert math.isclose(binomial_cdf(events, trials, bound), 0.05, rel_tol=1e-9)
        assert upper_bound(events, trials, confidence=0.99) > bound


@pytest.mark.parametrize(("events", "trials", "message"), [(0, 0, "trials must be >= 1"), (3, 2, "cannot exceed"),
                                                           (-1, 5, "events must be an int"),
                                                           (True, 5, "events must be an int")])
def test_bad_counts_are_refused_with_the_value(events: int, trials: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        upper_bound(events, trials)
