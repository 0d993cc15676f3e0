"""One test for "a finite real number" at scout's input boundaries.

``math.isfinite`` raises OverflowError on an int too large for a float (``10**400``) instead of
answering; every validator that takes seconds, ratios or milliseconds asks this instead, so such
a value gets the error that names it."""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ["finite_number"]


def finite_number(value: object) -> TypeGuard[int | float]:
    """An int or float (bool excluded) that a float holds finitely."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
