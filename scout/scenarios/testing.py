"""Helpers for tests that run the simulator: a failure always says how to replay it.

    from scout.scenarios.testing import assert_scenario
    assert_scenario("exchange-silent-peer", ranks=64, seed=seed)

fails with the scenario's failed checks and ``reproduce with: scout simulate
exchange-silent-peer --ranks 64 --seed S``. Errors raised by the run itself (a bound hit, a
program that raised) already carry that line.
"""

from __future__ import annotations

from scout.scenarios.registry import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_ROUNDS,
    ScenarioParams,
    ScenarioReport,
    run_scenario,
)

__all__ = ["ScenarioFailed", "assert_scenario"]


class ScenarioFailed(AssertionError):
    """A scenario's checks failed. ``report`` has the table, the checks and the trace."""

    def __init__(self, report: ScenarioReport) -> None:
        self.report = report
        failed = [check for check in report.checks if not check.ok]
        lines = [f"scenario {report.scenario} failed {len(failed)} of {len(report.checks)} checks:"]
        lines += [f"  {check.name}: {check.detail}" for check in failed]
        lines.append(report.reproduce)
        super().__init__("\n".join(lines))


def assert_scenario(
    name: str,
    *,
    ranks: int,
    seed: int,
    group_size: int = DEFAULT_GROUP_SIZE,
    rounds: int = DEFAULT_ROUNDS,
) -> ScenarioReport:
    """Run scenario ``name``; raise :class:`ScenarioFailed` (with the replay command) if a check
    fails, else return the report."""
    params = ScenarioParams(ranks=ranks, seed=seed, group_size=group_size, rounds=rounds)
    report = run_scenario(name, params)
    if not report.ok:
        raise ScenarioFailed(report)
    return report
