"""Same seed and scenario => identical trace; different seeds => different timings."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from scout.scenarios.registry import ScenarioParams, run_scenario, scenario_names
from scout.transport.sim import Freeze, SimCluster
from tests import processes
from tests.sim.helpers import exchange_rounds, run

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]


def test_same_seed_gives_an_identical_trace() -> None:
    faults = [Freeze(rank=2, start_s=0.0005, duration_s=2.0)]
    first = run(exchange_rounds(4), 6, seed=11, faults=faults)
    second = run(exchange_rounds(4), 6, seed=11, faults=faults)
    assert first.trace.records == second.trace.records
    assert first.trace == second.trace
    assert first.trace.digest() == second.trace.digest()
    assert first.values() == second.values()
    assert len(first.trace) > 50


def test_different_seeds_give_different_traces_when_jitter_matters() -> None:
    digests = {run(exchange_rounds(3), 5, seed=seed).trace.digest() for seed in range(5)}
    assert len(digests) == 5


def test_every_scenario_is_deterministic() -> None:
    for name in scenario_names():
        params = ScenarioParams(ranks=12, seed=5, group_size=4)
        first = run_scenario(name, params)
        second = run_scenario(name, params)
        assert first.trace_digest == second.trace_digest, name
        assert first.rows == second.rows, name
        other = run_scenario(name, ScenarioParams(ranks=12, seed=6, group_size=4))
        assert other.trace_digest != first.trace_digest, name


def test_trace_does_not_depend_on_the_process_hash_seed() -> None:
    """The digest is host- and process-independent: string hashing is randomised per process."""
    code = (
        "from scout.scenarios.registry import ScenarioParams, run_scenario\n"
        "print(run_scenario('exchange-partition', ScenarioParams(ranks=9, seed=3)).trace_digest)\n"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(REPO))
        completed = processes.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        digests.add(completed.stdout.strip())
    local = run_scenario("exchange-partition", ScenarioParams(ranks=9, seed=3)).trace_digest
    assert digests == {local}


def test_ties_are_broken_by_scheduling_order() -> None:
    """Zero latency makes every message of a round arrive at the same instant."""
    from scout.transport.sim import LatencyModel

    latency = LatencyModel(base_latency_s=0.0, jitter_s=0.0, collective_step_latency_s=0.0)
    traces = []
    for _ in range(2):
        cluster = SimCluster(5, seed=0, latency=latency, trace_messages=True)
        cluster.spawn(exchange_rounds(2))
        traces.append(cluster.run().trace.records)
    assert traces[0] == traces[1]
    delivered = [r for r in traces[0] if r[3] == "deliver"]
    assert delivered and all(r[0] == 0.0 for r in delivered)


def test_scenario_json_is_plain_data() -> None:
    report = run_scenario("exchange-silent-peer", ScenarioParams(ranks=6, seed=2))
    document = report.to_json()
    assert json.loads(json.dumps(document))["trace_digest"] == report.trace_digest
