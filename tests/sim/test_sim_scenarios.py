"""The registered scenarios: swarm over seeds and shapes, a large run, and failure reports."""

from __future__ import annotations

import random

import pytest

from scout.scenarios import registry
from scout.scenarios.registry import (
    Check,
    ScenarioOutcome,
    ScenarioParams,
    get_scenario,
    run_scenario,
    scenario,
    scenario_names,
)
from scout.scenarios.testing import ScenarioFailed, assert_scenario

BUILT_IN = {
    "exchange-healthy",
    "exchange-silent-peer",
    "exchange-partition",
    "exchange-straggler",
    "crash-during-allgather",
    "corrupt-evidence",
}


def test_built_in_scenarios_are_registered() -> None:
    assert set(scenario_names()) >= BUILT_IN


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_scenario_swarm(name: str) -> None:
    """TigerBeetle-style swarm: the seed also picks the cluster's shape."""
    spec = get_scenario(name)
    for seed in range(6):
        shape = random.Random(seed)
        ranks = shape.randint(max(2, spec.min_ranks), 40)
        group_size = shape.choice([2, 3, 4, 5, 8])
        assert_scenario(name, ranks=ranks, seed=seed, group_size=group_size)


def test_smallest_sizes() -> None:
    assert_scenario("exchange-healthy", ranks=1, seed=0)
    for name in BUILT_IN - {"exchange-healthy"}:
        assert_scenario(name, ranks=2, seed=1)


def test_1024_ranks() -> None:
    report = assert_scenario("exchange-silent-peer", ranks=1024, seed=3)
    assert report.result.events > 30_000
    assert [row[1] for row in report.rows] == [1024, 1024, 1023, 1023, 1024, 1024]


def test_a_failing_scenario_prints_the_command_that_reproduces_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Registered into a copy of the registry, so the failing scenario lives only in this test.
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @scenario("test-always-fails", summary="a scenario whose check fails (tests only)")
    def always_fails(params: ScenarioParams) -> ScenarioOutcome:
        healthy = get_scenario("exchange-healthy").run(params)
        return ScenarioOutcome(
            columns=healthy.columns,
            rows=healthy.rows,
            checks=[Check("the impossible holds", False, "it does not")],
            faults=[],
            result=healthy.result,
        )

    with pytest.raises(ScenarioFailed) as info:
        assert_scenario("test-always-fails", ranks=6, seed=77, rounds=2)
    message = str(info.value)
    assert "the impossible holds: it does not" in message
    assert (
        "reproduce with: scout simulate test-always-fails --ranks 6 --seed 77 --rounds 2" in message
    )


def test_scenario_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="needs at least 2 ranks"):
        run_scenario("exchange-partition", ScenarioParams(ranks=1, seed=0))
    with pytest.raises(ValueError, match="needs at least 4 rounds"):
        run_scenario("exchange-partition", ScenarioParams(ranks=4, seed=0, rounds=3))
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        ScenarioParams(ranks=4, seed=0, group_size=1)
    with pytest.raises(KeyError, match="known scenarios: .*exchange-healthy"):
        get_scenario("no-such-thing")
    with pytest.raises(ValueError, match="registered twice"):
        scenario("exchange-healthy", summary="again")(lambda params: None)  # type: ignore[arg-type,return-value]


def test_straggler_confirmation_round_confirms_a_2x_straggler_in_confirm_rounds_checks() -> None:
    """bench/evaluate.py's simulated straggler power, bounded: a 2x straggler is confirmed in
    CONFIRM_ROUNDS checks (STRAG-4); the whole table is the slow test below."""
    from scout.scenarios.localization import (
        CONFIRM_ROUNDS,
        STRAGGLER_ROUND,
        straggler_confirmation_round,
    )
    from scout.scenarios.registry import ScenarioParams

    params = ScenarioParams(ranks=8, seed=4, group_size=8, rounds=STRAGGLER_ROUND + CONFIRM_ROUNDS + 1)
    _rank, round_id = straggler_confirmation_round(params, 2.0)
    assert round_id is not None and round_id - STRAGGLER_ROUND + 1 == CONFIRM_ROUNDS


@pytest.mark.slow  # four straggler jobs of 26 steps: about 20 s on a loaded 2-core box
def test_straggler_confirmation_round_counts_the_checks_each_slowdown_needs() -> None:
    """bench/evaluate.py's simulated straggler power: at 1.5x and 2x the sequential test at its
    defaults confirms in CONFIRM_ROUNDS checks (STRAG-4); at 1.2x it needs more, and a factor of 1
    (no straggler) is never confirmed."""
    from scout.scenarios.localization import (
        CONFIRM_ROUNDS,
        STRAGGLER_ROUND,
        straggler_confirmation_round,
    )
    from scout.scenarios.registry import ScenarioParams

    params = ScenarioParams(ranks=8, seed=4, group_size=8, rounds=STRAGGLER_ROUND + 24)
    checks = {}
    for factor in (1.0, 1.2, 1.5, 2.0):
        _rank, round_id = straggler_confirmation_round(params, factor)
        checks[factor] = None if round_id is None else round_id - STRAGGLER_ROUND + 1
    assert checks[1.5] == checks[2.0] == CONFIRM_ROUNDS
    assert checks[1.2] is not None and CONFIRM_ROUNDS < checks[1.2] <= 20
    assert checks[1.0] is None
