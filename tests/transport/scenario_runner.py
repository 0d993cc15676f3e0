"""Runs the shared conformance scenarios (tests/transport/scenarios.py) on a real binding.

Used by the worker processes (pytest-free). Each scenario is a rank program run with
``run_blocking`` on a fresh transport, so that no round ids or collective numbers carry over
from one scenario to the next; they run in the module's order (the collective deadline last).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from scout.transport.program import run_blocking
from tests.transport.scenarios import SCENARIOS


def run_shared_scenarios(make_transport: Callable[[], Any]) -> dict[str, Any]:
    """Per scenario name: this rank's result under "result", or its traceback under "error"."""
    results: dict[str, Any] = {}
    for name, program in SCENARIOS.items():
        transport = make_transport()
        try:
            results[name] = {"result": run_blocking(program, transport)}
        except Exception:
            results[name] = {"error": traceback.format_exc()}
        finally:
            transport.close()
    return results
