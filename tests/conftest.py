"""Shared pytest configuration."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite-examples",
        action="store_true",
        default=False,
        help="rewrite the '->' lines of spec/examples/*.txt with the current answers",
    )
