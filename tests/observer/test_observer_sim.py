"""The observer on the simulator: the production observer driver (scout.observer.driver) as the
``observer`` program of every simulated rank, beside a simulated trainer that publishes progress
into ``ctx.shared``. Scenarios: scout/scenarios/observer.py. At 1024 ranks
the peer group of each observer is its replica group of 8 (``--group-size``), not the world.
A failure prints the seed and the command that replays it (``assert_scenario``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scout.scenarios.registry import (
    ScenarioParams,
    ScenarioReport,
    run_scenario,
    scenario_names,
)
from scout.scenarios.testing import ScenarioFailed, assert_scenario
from scout.transport.sim import ProgramState

OBSERVER_SCENARIOS = [
    "observer-behind",
    "observer-desync",
    "observer-frozen",
    "observer-group-stall",
    "observer-healthy",
    "observer-process-frozen",
    "observer-trainer-dead",
]


def hanging(report: ScenarioReport) -> list[object]:
    """Programs that neither returned nor were crashed by the scenario's fault: none may be left."""
    return [o for o in report.result.unfinished() if o.state is not ProgramState.CRASHED]


def test_observer_scenarios_are_registered() -> None:
    assert set(OBSERVER_SCENARIOS) <= set(scenario_names())


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", OBSERVER_SCENARIOS)
def test_OBS_sim_4_ranks(name: str, seed: int) -> None:
    report = assert_scenario(name, ranks=4, seed=seed)
    assert hanging(report) == []


@pytest.mark.parametrize("name", OBSERVER_SCENARIOS)
def test_OBS_sim_1024_ranks_in_replica_groups_of_8(name: str) -> None:
    started = time.perf_counter()
    report = assert_scenario(name, ranks=1024, seed=5, group_size=8)
    assert time.perf_counter() - started < 20.0
    assert hanging(report) == []


def test_OBS_1_sim_healthy_sends_no_observer_message_and_reports_nothing() -> None:
    report = assert_scenario("observer-healthy", ranks=16, seed=9)
    assert report.rows == [] and report.result.messages_sent == 0


def test_OBS_7_sim_reporter_is_a_surviving_peer_not_rank_0_when_rank_0_is_at_fault() -> None:
    # Find a seed whose faulty rank is position 0 of its group: the report must come from another.
    for seed in range(40):
        report = assert_scenario("observer-behind", ranks=4, seed=seed)
        (row,) = report.rows
        if row[4] == (0,):
            assert row[7] == 1
            return
    pytest.fail("no seed in 0..39 made rank 0 the faulty one")


def test_sim_observer_scenarios_are_deterministic() -> None:
    params = ScenarioParams(ranks=32, seed=4)
    first = run_scenario("observer-desync", params)
    second = run_scenario("observer-desync", params)
    assert first.trace_digest == second.trace_digest and first.rows == second.rows


def test_sim_failure_message_names_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.scenarios import observer as observer_sim

    # A threshold the checks do not expect: detection is then "late" and the check fails.
    monkeypatch.setitem(observer_sim.OBSERVER_CONFIG, "stall_threshold_s", 2.0)
    monkeypatch.setattr(observer_sim, "_threshold_s", lambda: 0.5)
    with pytest.raises(ScenarioFailed, match="reproduce with: scout simulate observer-behind --ranks 4 --seed 3"):
        assert_scenario("observer-behind", ranks=4, seed=3)


def test_the_simulator_runs_the_production_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """DRIVER-1: one driver per machine: the simulated observers run the function object the
    observer process runs, not a copy."""
    from scout.observer import driver, process
    from scout.scenarios import observer as observer_sim

    assert process.driver.drive is driver.drive and observer_sim.driver.drive is driver.drive
    calls: list[int] = []
    production = driver.drive

    def counting(config, world, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(config.position)
        return production(config, world, **kwargs)

    monkeypatch.setattr(driver, "drive", counting)
    assert_scenario("observer-behind", ranks=4, seed=1)
    assert sorted(calls) == [0, 1, 2, 3]


def test_packaged_tables_are_the_spec_tables() -> None:
    """An installed package loads the same table as the checkout's spec/ (``scout spec`` writes
    the copies; ``scout spec --check`` fails when they differ)."""
    from scout.core.machine.loader import PACKAGED_TABLES, packaged_table_text

    repo = Path(__file__).resolve().parents[2]
    for name in PACKAGED_TABLES:
        assert packaged_table_text(name) == (repo / "spec" / f"{name}.toml").read_text(encoding="utf-8"), name
