"""The framework jobs' hang: a rank asleep in its training loop, as a stuck host thread is, until
scout has named it -- then it wakes, so that a test does not sleep on after its evidence is in.
Bounded: past ``bound_s`` it wakes anyway (the test then finds no hang report and fails)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from scout import reports
from scout.reports.kinds import ReportKind

POLL_S = 0.25


def asleep_until_named(run_dir: str | Path, rank: int, bound_s: float) -> float:
    """Sleep until ``run_dir``'s reports name ``rank`` in a ``hang`` report, at most ``bound_s``
    seconds; returns the seconds slept."""
    path = Path(run_dir) / reports.REPORTS_FILE
    start = time.monotonic()
    while time.monotonic() - start < bound_s:
        time.sleep(POLL_S)
        if _named(path, rank):
            break
    return time.monotonic() - start


def _named(path: Path, rank: int) -> bool:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line being appended
            continue
        if record.get("kind") == ReportKind.HANG.value and rank in record.get("ranks", ()):
            return True
    return False
