"""The shared conformance scenarios (scenarios.py) on the simulator, at sizes 3, 4 and 5.

Results make the same JSON round trip as on the real bindings, so the same checks judge them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scout.transport.sim import SimCluster
from tests.transport import scenarios

SIZES = (3, 4, 5)
SEEDS = (0, 1)


def run_on_simulator(name: str, size: int, seed: int) -> list[dict[str, Any]]:
    cluster = SimCluster(size, seed=seed)
    cluster.spawn(scenarios.SCENARIOS[name])
    result = cluster.run()
    return json.loads(json.dumps(result.values()))


@pytest.mark.parametrize("seed", SEEDS, ids=lambda seed: f"seed{seed}")
@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"n{size}")
@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_scenario_on_simulator(name: str, size: int, seed: int) -> None:
    results = run_on_simulator(name, size, seed)
    try:
        scenarios.check_scenario(name, results, size)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nreproduce with: pytest tests/transport/test_conformance_sim.py "
            f"-k '{name} and n{size} and seed{seed}' (SimCluster({size}, seed={seed}))"
        ) from None


def test_every_scenario_has_a_check() -> None:
    assert list(scenarios.SCENARIOS) == list(scenarios.CHECKS)
    assert list(scenarios.SCENARIOS)[-1] == "scenario_collective_deadline"


def test_silent_peer_returns_exactly_at_the_virtual_deadline() -> None:
    results = run_on_simulator("scenario_exchange_silent_peer", 4, seed=3)
    for rank in range(3):
        assert results[rank]["waited_s"] == pytest.approx(scenarios.SILENT_TIMEOUT_S, abs=1e-9)


def test_late_member_completes_the_collective_in_flight() -> None:
    results = run_on_simulator("scenario_collective_deadline", 3, seed=0)
    assert results[2]["outcome"] == "result"  # the simulator's choice; bindings may differ


def test_a_broken_binding_fails_the_checks() -> None:
    """The checks are not vacuous: doctored results fail them."""
    results = run_on_simulator("scenario_exchange_silent_peer", 3, seed=0)
    results[0]["missing"] = []
    with pytest.raises(AssertionError, match="missing"):
        scenarios.check_scenario("scenario_exchange_silent_peer", results, 3)
    results = run_on_simulator("scenario_all_gather_order", 3, seed=0)
    results[1]["reversed"] = results[1]["world"]
    with pytest.raises(AssertionError, match="reversed"):
        scenarios.check_scenario("scenario_all_gather_order", results, 3)
