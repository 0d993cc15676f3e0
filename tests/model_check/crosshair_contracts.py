"""Pre/postconditions of the verdict functions, checked by CrossHair (PEP 316 docstrings).

``test_verdict_crosshair.py`` runs ``crosshair check`` on this module with an explicit
iteration budget, and on a mutant of the verdict module to show the check can fail.
The ``VERDICT_IMPL`` indirection lets the mutant reuse these exact contracts.
"""

from __future__ import annotations

from scout.core import verdict as VERDICT_IMPL

# Status is used inside the docstring contracts, which linters cannot see.
from scout.core.verdict import Status, Verdict  # noqa: F401


def exact_verdict(values: list[int]) -> Verdict:
    """
    pre: 1 <= len(values) <= 6
    post: (__return__.status == Status.ATTRIBUTED) == bool(__return__.outliers)
    post: __return__.status != Status.ATTRIBUTED or 2 * values.count(__return__.healthy_value) > len(values)
    post: all(values[p] != __return__.healthy_value for p in __return__.outliers)
    post: __return__.status != Status.AGREE or len(set(values)) == 1
    post: __return__.status != Status.AGREE or len(values) > 1
    post: (__return__.status == Status.INCONCLUSIVE) == (__return__.reason is not None)
    """
    return VERDICT_IMPL.classify_exact(values)


def timing_verdict(values: list[float]) -> Verdict:
    """
    pre: 1 <= len(values) <= 5
    pre: all(0.0 <= v <= 1e9 for v in values)
    post: (__return__.status == Status.ATTRIBUTED) == bool(__return__.outliers)
    post: all(values[p] > __return__.healthy_value for p in __return__.outliers)
    post: __return__.status != Status.ATTRIBUTED or 2 * (len(values) - len(__return__.outliers)) > len(values)
    post: __return__.status != Status.AGREE or len(values) > 1
    post: __return__.status != Status.AGREE or max(values) - min(values) <= 2 * __return__.threshold_ms
    """
    return VERDICT_IMPL.classify_timing(values)
