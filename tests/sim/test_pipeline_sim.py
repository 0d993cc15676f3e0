"""One pipeline from replay to report (docs/design.md §7.4): the simulator runs the functions
``scout.attach``'s Job runs -- the replay round, the straggler tests, the step's one exchange,
the merge, the gate's driver, the reports and the fault policy -- with simulated executors
giving the evidence, as DRIVER-1 proves for the observer's driver."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from scout.core import replay_round as core_round
from scout.core.straggler import tracking
from scout.job import aggregate, gate_driver, pipeline
from scout.reports.kinds import ReportKind
from scout.scenarios import replay_job
from scout.scenarios.registry import ScenarioParams, run_scenario
from scout.scenarios.replay_job import Faults, run_replay_job


def test_PIPELINE_the_simulator_runs_the_products_check_aggregate_gate_report_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same function objects, not copies: the job's step and the simulator's are one
    ``run_step``; both replay checks run the one ``replay_round`` and the one straggler test;
    every call of exchange, merge, gate feed, report and policy below is the product's."""
    from scout.job import checks, stepping
    from scout.replay import runner

    assert stepping.run_step is pipeline.run_step and replay_job.run_step is pipeline.run_step
    assert runner.replay_round is core_round.replay_round and replay_job.replay_round is core_round.replay_round
    assert runner.ReplayStragglers is tracking.ReplayStragglers is replay_job.ReplayStragglers
    assert checks.replay_output is pipeline.replay_output is replay_job.replay_output
    calls: Counter[str] = Counter()

    def counting(owner: Any, name: str) -> None:
        production = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return production(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    counting(replay_job, "replay_round")
    counting(aggregate, "exchange_outputs")
    counting(aggregate, "merge")
    counting(gate_driver.GateDriver, "feed")
    counting(gate_driver.Reporter, "record")
    counting(pipeline, "decide")
    run = run_replay_job(ranks=12, group_size=4, seed=5, steps=4, faults=Faults(sdc_rank=6, sdc_step=3, sdc_bit=9),
                         scenario="pipeline-test")
    assert calls["replay_round"] == 12 * 3  # every rank, every step until the stop at step 3
    assert calls["exchange_outputs"] == calls["merge"] == calls["decide"] == 12 * 3
    assert calls["feed"] == 3  # the gate's writer: one recipe a step
    assert calls["record"] >= 3  # restart (started), sdc, restart (sdc)
    (sdc,) = [r for r in run.records if r["kind"] == ReportKind.SDC]
    assert (sdc["ranks"], sdc["step"], sdc["source"], sdc["evidence"]["group"]) == ([6], 3, "replay", "dp1")
    assert {outcome.stop.step for outcome in run.outcomes if outcome is not None and outcome.stop} == {3}


# The campaign runs both scenarios through the product path at 8-256 ranks in CI
# (tests/unit/test_campaign.py); these run them at 1,024.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdc-in-evidence", "straggler-timing", "straggler-healthy"])
def test_PIPELINE_sdc_and_straggler_scenarios_at_1024_ranks(name: str) -> None:
    report = run_scenario(name, ScenarioParams(ranks=1024, seed=7, group_size=4, rounds=6))
    assert report.ok, [(c.name, c.detail) for c in report.checks if not c.ok]
