"""Checks of the shared conformance scenarios (tests/transport/scenarios.py) on a real binding:
each scenario's own ``check_scenario`` on the per-rank results a worker wrote."""

from __future__ import annotations

from typing import Any

from tests.transport import scenarios


def check_scenario_run(name: str, per_rank: list[dict[str, Any]], size: int) -> None:
    """Fail with the traceback if a rank raised; else assert the scenario's own check."""
    errors = [f"rank {rank}:\n{r['error']}" for rank, r in enumerate(per_rank) if "error" in r]
    assert not errors, f"{name} raised on some ranks:\n" + "\n".join(errors)
    scenarios.check_scenario(name, [r["result"] for r in per_rank], size)
