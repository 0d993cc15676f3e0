"""Held faults that end once scout has named their rank.

A scenario holds a fault (a rank asleep, a stream stalled, a launch withheld) long enough for the
observers to find it, and then releases it. Held for a fixed time, every fault costs its whole
hold although the report is usually in long before; :func:`wait_until_named` ends the hold once
the run directory's ``reports.jsonl`` names the rank -- by a report of one of ``kinds`` at the
fault's step, where the step is given -- and at ``bound_s`` whatever it holds (the scenario's
judge then finds no report and says so). Only the rank's own report ends it: a report naming
another rank does not, so a wrong name is still seen by the judge.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from scout import reports
from scout.reports.kinds import ReportKind

__all__ = ["named", "release_when_named", "wait_until_named"]

POLL_S = 0.1


def named(run_dir: str | Path, rank: int, kinds: Collection[ReportKind], step: int | None = None) -> bool:
    """Whether a report of one of ``kinds`` in ``run_dir`` names ``rank`` (at ``step``, if given).
    Read by :func:`scout.reports.read_records`, which skips a line being appended."""
    wanted = {kind.value for kind in kinds}
    return any(record["kind"] in wanted and rank in record["ranks"] and (step is None or record.get("step") == step)
               for record in reports.read_records(Path(run_dir) / reports.REPORTS_FILE))


def wait_until_named(run_dir: str | Path, rank: int, bound_s: float, *, kinds: Collection[ReportKind],
                     step: int | None = None) -> float:
    """Sleep until :func:`named`, at most ``bound_s`` seconds; returns the seconds slept."""
    if not bound_s > 0:
        raise ValueError(f"bound_s must be > 0: a held fault ends; got {bound_s!r}")
    start = time.monotonic()
    while time.monotonic() - start < bound_s:
        time.sleep(min(POLL_S, max(0.0, bound_s - (time.monotonic() - start))))
        if named(run_dir, rank, kinds, step):
            break
    return time.monotonic() - start


def release_when_named(release: Callable[[], None], run_dir: str | Path, rank: int, bound_s: float, *,
                       kinds: Collection[ReportKind], step: int | None = None) -> threading.Thread:
    """Call ``release`` from a daemon thread once :func:`wait_until_named` returns (a fault that
    holds a stream, released from outside it)."""
    def watch() -> None:
        wait_until_named(run_dir, rank, bound_s, kinds=kinds, step=step)
        release()

    thread = threading.Thread(target=watch, name=f"scout-release-rank-{rank}", daemon=True)
    thread.start()
    return thread
