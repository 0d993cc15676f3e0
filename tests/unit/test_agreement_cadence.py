"""GUARD-4's cadence (spec/guard.md): the agreement that switches a failed part off on every rank
runs every ``agreement_interval_steps``; a part is off from the step after the first launch at or
after the step it failed in, and a failure no agreement carried is logged at ``close()`` on its
rank. The same rules on real ranks: tests/job/test_guard.py."""

from __future__ import annotations

import logging

import pytest

from scout.job.boundary import Agreement, agreement_due, off_step
from scout.job.config import Config, ConfigError
from scout.reports.guard import Boundary, Part


def test_GUARD_4_a_part_is_off_from_the_step_after_the_first_launch_at_or_after_its_failure() -> None:
    """Exhaustive over intervals 1..12 and failing steps 0..60: ``off_step`` is what the launches
    that ``agreement_due`` allows give (the launch at step u is collected at u+1)."""
    for interval in range(1, 13):
        launches = [u for u in range(0, 80) if agreement_due(u, interval)]
        assert launches == [u for u in range(0, 80) if (u + 1) % interval == 0]
        for failed in range(0, 61):
            first_launch = min(u for u in launches if u >= failed)
            assert off_step(failed, interval) == first_launch + 1, (interval, failed)
            assert off_step(failed, interval) % interval == 0 and failed < off_step(failed, interval) <= failed + interval
    assert [off_step(s, 1) for s in range(5)] == [1, 2, 3, 4, 5], "every step: off from the next"


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "10"])
def test_GUARD_4_agreement_interval_steps_is_a_count_of_steps(value: object) -> None:
    with pytest.raises(ConfigError, match="agreement_interval_steps"):
        Config(agreement_interval_steps=value)  # type: ignore[arg-type]


def test_GUARD_4_the_default_agrees_every_10_steps() -> None:
    assert Config().agreement_interval_steps == 10


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), 3601.0, True, "5"])
def test_BUDGET_13_agreement_interval_s_is_seconds_or_zero(value: object) -> None:
    with pytest.raises(ConfigError, match="agreement_interval_s"):
        Config(agreement_interval_s=value)  # type: ignore[arg-type]


def test_BUDGET_13_the_default_aims_at_an_agreement_every_5_s_and_0_keeps_the_steps() -> None:
    assert Config().agreement_interval_s == 5.0 and Config(agreement_interval_s=0).agreement_interval_s == 0


def test_GUARD_4_a_failure_after_the_last_agreement_is_logged_on_its_rank_at_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    boundary = Boundary(rank=3)
    boundary.step = 17
    boundary.failed(Part.REPLAY, RuntimeError("a capture could not be copied"), "forward hook")
    agreement = Agreement(control=None, boundary=boundary, timeout_s=1.0, interval_steps=10)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="scout"):
        agreement.close()
    (line,) = [r.getMessage() for r in caplog.records if "after the job's last agreement" in r.getMessage()]
    assert line.startswith("scout: replay failed on rank 3 at step 17 (RuntimeError: a capture could not be copied)")
    assert "GUARD-4" in line
    caplog.clear()
    agreement.close()  # nothing left to say
    assert not caplog.records
