"""A deliberately naive reference of spec/verdict.md, written clause by clause.

No fast paths, no numpy, no cleverness: sort everything, count everything, test every clause
in the order the spec states it. It exists only to be compared with scout.core.verdict.
"""

from __future__ import annotations

import math
from typing import Any

from scout.core.verdict import MISSING, Reason, Status, TimingConfig


def naive_exact(values: list[Any]) -> tuple[Status, tuple[int, ...], Reason | None, tuple[int, ...], tuple[int, ...]]:
    n = len(values)
    assert n > 0  # VERDICT-3 is tested separately
    missing = tuple(i for i in range(n) if values[i] is MISSING)
    invalid = tuple(
        i for i in range(n) if isinstance(values[i], float) and math.isnan(values[i])
    )
    # VERDICT-4
    if n == 1:
        return Status.INCONCLUSIVE, (), Reason.SINGLETON, missing, invalid
    valid = [i for i in range(n) if i not in missing and i not in invalid]
    # VERDICT-6
    if not valid:
        return Status.INCONCLUSIVE, (), Reason.NO_EVIDENCE, missing, invalid
    # VERDICT-13: for every valid value, count the peers that hold it.
    best_count = 0
    best_value = None
    for i in valid:
        count = sum(1 for j in valid if values[j] == values[i])
        if count > best_count:
            best_count, best_value = count, values[i]
    if 2 * best_count > n:
        outliers = tuple(
            i for i in range(n) if i not in missing and (i in invalid or values[i] != best_value)
        )
        if outliers:
            return Status.ATTRIBUTED, outliers, None, missing, invalid
        if missing:
            return Status.INCONCLUSIVE, (), Reason.MISSING_EVIDENCE, missing, invalid
        return Status.AGREE, (), None, (), ()
    # VERDICT-14
    if 2 * (best_count + len(missing) + len(invalid)) > n:
        reason = Reason.MISSING_EVIDENCE if missing else Reason.INVALID_EVIDENCE
    else:
        reason = Reason.NO_MAJORITY
    return Status.INCONCLUSIVE, (), reason, missing, invalid


def naive_timing(
    values: list[Any], config: TimingConfig
) -> tuple[Status, tuple[int, ...], Reason | None, tuple[int, ...], tuple[int, ...]]:
    n = len(values)
    assert n > 0
    missing = tuple(i for i in range(n) if values[i] is MISSING)
    # VERDICT-21
    invalid = tuple(
        i
        for i in range(n)
        if values[i] is not MISSING and (math.isnan(values[i]) or values[i] < 0)
    )
    if n == 1:
        return Status.INCONCLUSIVE, (), Reason.SINGLETON, missing, invalid
    valid = [i for i in range(n) if i not in missing and i not in invalid]
    if not valid:
        return Status.INCONCLUSIVE, (), Reason.NO_EVIDENCE, missing, invalid
    # VERDICT-22
    ordered = sorted(float(values[i]) for i in valid)
    centre = ordered[(len(ordered) - 1) // 2]
    # VERDICT-26, first half
    if centre == math.inf:
        return Status.INCONCLUSIVE, (), Reason.GROUP_WIDE_SLOWDOWN, missing, invalid
    # VERDICT-23
    deviations = sorted(abs(float(values[i]) - centre) for i in valid)
    mad = deviations[(len(deviations) - 1) // 2]
    sigma = 1.4826 * mad
    # VERDICT-24
    threshold = max(config.kappa * sigma, config.relative_floor * centre, config.absolute_floor_ms)
    slow = tuple(i for i in valid if float(values[i]) - centre > threshold)
    fast = tuple(i for i in valid if centre - float(values[i]) > threshold)
    # VERDICT-25
    if slow:
        healthy = [i for i in valid if i not in slow]
        if 2 * len(healthy) > n:
            return Status.ATTRIBUTED, slow, None, missing, invalid
        if 2 * len(slow) == n:
            return Status.INCONCLUSIVE, (), Reason.NO_MAJORITY, missing, invalid
        if invalid:
            return Status.INCONCLUSIVE, (), Reason.INVALID_EVIDENCE, missing, invalid
        return Status.INCONCLUSIVE, (), Reason.MISSING_EVIDENCE, missing, invalid
    # VERDICT-26, second half
    if fast:
        return Status.INCONCLUSIVE, (), Reason.GROUP_WIDE_SLOWDOWN, missing, invalid
    # VERDICT-27
    if invalid:
        return Status.INCONCLUSIVE, (), Reason.INVALID_EVIDENCE, missing, invalid
    if missing:
        return Status.INCONCLUSIVE, (), Reason.MISSING_EVIDENCE, missing, invalid
    return Status.AGREE, (), None, (), ()
