"""Upper confidence bounds on a rate observed as ``events`` in ``trials`` (false attributions
per healthy round, docs/evaluation.md): what an operator may rely on before letting scout act
on its own.

The bound is the exact one-sided Clopper-Pearson bound: the largest rate ``p`` at which seeing
``events`` or fewer in ``trials`` still has probability ``1 - confidence``. With no event it is
``1 - (1 - confidence) ** (1 / trials)``; the *rule of three*, ``3 / trials`` at 95 %, is its
familiar, slightly larger approximation (-ln 0.05 = 2.996). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from typing import Final

from scout.core.guards import whole_number

__all__ = ["binomial_cdf", "rule_of_three", "upper_bound"]

#: Bisection steps: the bound is found to within 2**-60 of the interval [0, 1].
_BISECTION_STEPS: Final = 60


def _check(events: int, trials: int) -> None:
    for name, value in (("events", events), ("trials", trials)):
        if not whole_number(value) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if trials == 0:
        raise ValueError("trials must be >= 1: a rate observed in no trial has no bound")
    if events > trials:
        raise ValueError(f"events ({events}) cannot exceed trials ({trials})")


def binomial_cdf(events: int, trials: int, rate: float) -> float:
    """P(X <= events) for X ~ Binomial(trials, rate), summed in log space (no overflow)."""
    _check(events, trials)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate!r}")
    if rate == 0.0:
        return 1.0
    if rate == 1.0:
        return 1.0 if events >= trials else 0.0
    log_p, log_q = math.log(rate), math.log1p(-rate)
    terms = [math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p
             + (trials - k) * log_q for k in range(events + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def upper_bound(events: int, trials: int, confidence: float = 0.95) -> float:
    """The exact one-sided upper ``confidence`` bound on the rate (Clopper-Pearson)."""
    _check(events, trials)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    alpha = 1.0 - confidence
    if events == trials:
        return 1.0
    if events == 0:
        return -math.expm1(math.log(alpha) / trials)
    low, high = events / trials, 1.0
    for _ in range(_BISECTION_STEPS):  # binomial_cdf falls as the rate rises
        middle = (low + high) / 2
        if binomial_cdf(events, trials, middle) > alpha:
            low = middle
        else:
            high = middle
    return high


def rule_of_three(trials: int) -> float:
    """3 / trials: the 95 % upper bound on a rate never observed in ``trials``, as people quote it."""
    _check(0, trials)
    return 3.0 / trials
