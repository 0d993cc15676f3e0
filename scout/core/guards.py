"""Type guards every module shares. Pure.

``isinstance(value, int)`` is true of ``True`` and ``False`` (``bool`` subclasses ``int``), so a
count, a rank or a step checked that way accepts a flag by mistake; :func:`whole_number` is the
one spelling of "an int, not a bool".
"""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["whole_number"]


def whole_number(value: object) -> TypeGuard[int]:
    """True if ``value`` is an ``int`` (of any sign) and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)
