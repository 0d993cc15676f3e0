"""What differs between the Python versions scout supports (3.10 and later)."""

from __future__ import annotations

import sys
from typing import NoReturn

__all__ = ["assert_never"]

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # pragma: no cover - exercised on Python 3.10 only

    def assert_never(value: NoReturn, /) -> NoReturn:
        """The end of a dispatch over a closed union: reaching it is a bug naming the value."""
        raise AssertionError(f"unhandled value of a closed union: {value!r}")
