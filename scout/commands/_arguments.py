"""Argument types shared by the ``scout`` commands."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["integer"]


def integer(name: str) -> Callable[[str], int]:
    """An argparse type: a base-10 integer, refused with one line naming the option and the value
    (ranges are checked by each command, so that they exit 2 with its own ``error:`` line)."""

    def parse(text: str) -> int:
        try:
            return int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None

    return parse
