"""The simulator's memory limits (docs/simulator.md, "Memory"): every scenario states its memory
per rank, and a run that would need more than the budget is refused before anything is built,
with the figures. The stated figures themselves are checked against peak memory measured at
65,536 ranks by bench/sim.py."""

from __future__ import annotations

import pytest

from scout.scenarios import registry
from scout.scenarios.registry import ScenarioParams, run_scenario, scenario_names


def test_every_scenario_states_its_memory_per_rank() -> None:
    unstated = [name for name in scenario_names() if name not in registry.BYTES_PER_RANK]
    assert not unstated, f"scenarios without a stated memory per rank: {unstated}"


def test_estimate_grows_with_ranks_and_group_size() -> None:
    small = registry.memory_estimate_bytes("observer-behind", ScenarioParams(ranks=1000, seed=1))
    large = registry.memory_estimate_bytes("observer-behind", ScenarioParams(ranks=2000, seed=1))
    wide = registry.memory_estimate_bytes(
        "observer-behind", ScenarioParams(ranks=1000, seed=1, group_size=32)
    )
    assert registry.BASE_MEMORY_BYTES < small < large and small < wide


def test_65536_ranks_of_every_observer_scenario_fit_the_stated_budget() -> None:
    for name in scenario_names():
        if name.startswith("observer-"):
            estimate = registry.memory_estimate_bytes(name, ScenarioParams(ranks=65_536, seed=1))
            assert estimate <= 2.5 * 2**30, (name, estimate)


def test_a_run_beyond_the_budget_is_refused_up_front_with_the_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(registry.MEMORY_BUDGET_ENV, "100")
    called = []
    monkeypatch.setattr(
        registry, "get_scenario", lambda name: registry.Scenario(name, "", called.append)
    )
    with pytest.raises(ValueError) as caught:
        run_scenario("exchange-healthy", ScenarioParams(ranks=1_000_000, seed=1))
    message = str(caught.value)
    assert "1000000 ranks needs about" in message and "MiB" in message
    assert "more than the 100 MiB available" in message and "at most 3,072 ranks fit" in message
    assert called == [], "nothing may run before the refusal"


def test_a_million_ranks_of_the_heaviest_scenario_do_not_fit_24_gib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(registry.MEMORY_BUDGET_ENV, str(24 * 1024))  # this class of machine
    with pytest.raises(ValueError, match="at most .* ranks fit"):
        registry.check_memory("observer-healthy", ScenarioParams(ranks=1_000_000, seed=1))


def test_a_bad_budget_setting_names_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.MEMORY_BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match="SCOUT_SIM_MEMORY_MIB='lots' is not a number"):
        registry.memory_budget_bytes()
    monkeypatch.setenv(registry.MEMORY_BUDGET_ENV, "-5")
    with pytest.raises(ValueError, match="must be a positive number"):
        registry.memory_budget_bytes()
