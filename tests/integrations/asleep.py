"""The framework jobs' hang: a rank asleep in its training loop, as a stuck host thread is, until
scout has named it -- then it wakes, so that a test does not sleep on after its evidence is in.
Bounded: past ``bound_s`` it wakes anyway (the test then finds no hang report and fails)."""

from __future__ import annotations

from pathlib import Path

from scout.reports.kinds import ReportKind
from scout.scenarios.wake import wait_until_named


def asleep_until_named(run_dir: str | Path, rank: int, bound_s: float) -> float:
    """Sleep until ``run_dir``'s reports name ``rank`` in a ``hang`` report, at most ``bound_s``
    seconds; returns the seconds slept."""
    return wait_until_named(run_dir, rank, bound_s, kinds=(ReportKind.HANG,))
