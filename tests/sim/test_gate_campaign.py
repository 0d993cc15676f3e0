"""The gate across the job on the simulator (scout/observer/gate_campaign.py): 1024 ranks, SDC,
Inconclusive and missing results at random recipes and cycles, every gate invariant checked on
every step, the oracle's promotions, and the quarantine known on every rank. A failure prints the
command that replays it."""

from __future__ import annotations

import pytest

import scout.scenarios.gate_campaign  # noqa: F401  (registers the scenario)
from scout.scenarios.registry import ScenarioParams, run_scenario
from scout.scenarios.testing import assert_scenario


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_GATE_campaign_1024_ranks_keeps_every_invariant(seed: int) -> None:
    report = assert_scenario("gate-campaign", ranks=1024, seed=seed)
    assert report.result.virtual_time_s < 30 + 1


def test_GATE_11_campaign_promotes_clean_cycles_and_recovery_finds_them_after_the_sdc() -> None:
    report = assert_scenario("gate-campaign", ranks=64, seed=3)
    checks = {check.name: check.detail for check in report.checks}
    assert "promoted the checkpoints ending cycles [1, 2]" in checks[
        "promotions happen exactly after two consecutive clean cycles before the SDC (oracle)"
    ]
    assert "verified (sdc-restore-verified) t0/s85" in checks[
        "recovery after the SDC picks the verified checkpoint when there is one, else none"
    ]


def test_campaign_is_deterministic() -> None:
    first = run_scenario("gate-campaign", ScenarioParams(ranks=64, seed=11))
    second = run_scenario("gate-campaign", ScenarioParams(ranks=64, seed=11))
    assert first.trace_digest == second.trace_digest and first.rows == second.rows


def test_campaign_refuses_too_few_groups() -> None:
    with pytest.raises(ValueError, match="needs at least 3 peer groups of at least 3 ranks"):
        run_scenario("gate-campaign", ScenarioParams(ranks=16, seed=1, group_size=8))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_GATE_campaign_many_seeds_longer_runs(seed: int) -> None:
    assert_scenario("gate-campaign", ranks=1024, seed=1000 + seed, rounds=10)
