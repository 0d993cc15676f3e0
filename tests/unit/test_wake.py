"""scout/scenarios/wake.py: a held fault ends once its rank is named at its step, and only then
(a report naming another rank, another step or another kind does not end it), bounded."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from scout import reports
from scout.reports.kinds import ReportKind
from scout.scenarios import wake


def _write(run_dir: Path, *records: tuple[str, list[int], int]) -> None:
    """Reports (kind, ranks, step) as scout writes them."""
    with (run_dir / reports.REPORTS_FILE).open("a", encoding="utf-8") as file:
        for kind, ranks, step in records:
            file.write(json.dumps(reports.make_record(kind, reason="test", job_id="wake", generation=0, ranks=ranks,
                                                      step=step)) + "\n")


def test_named_matches_the_rank_the_kind_and_the_step(tmp_path: Path) -> None:
    assert not wake.named(tmp_path, 1, (ReportKind.HANG,))  # no file yet
    _write(tmp_path, ("hang", [2], 8), ("straggler", [1], 8))
    (tmp_path / reports.REPORTS_FILE).open("a").write('{"kind": "hang", "ranks": [1')  # a line being appended
    assert not wake.named(tmp_path, 1, (ReportKind.HANG, ReportKind.DESYNC), step=8)
    assert wake.named(tmp_path, 2, (ReportKind.HANG,), step=8) and not wake.named(tmp_path, 2, (ReportKind.HANG,), step=9)
    assert wake.named(tmp_path, 2, (ReportKind.HANG,)) and not wake.named(tmp_path, 2, (ReportKind.DESYNC,))


def test_a_hold_ends_when_its_rank_is_named_and_at_its_bound_otherwise(tmp_path: Path) -> None:
    _write(tmp_path, ("hang", [0], 5))
    assert wake.wait_until_named(tmp_path, 0, 5.0, kinds=(ReportKind.HANG,), step=5) < 1.0
    slept = wake.wait_until_named(tmp_path, 1, 0.3, kinds=(ReportKind.HANG,), step=5)  # never named
    assert 0.3 <= slept < 1.0
    with pytest.raises(ValueError, match="bound_s"):
        wake.wait_until_named(tmp_path, 1, 0.0, kinds=(ReportKind.HANG,))


def test_release_when_named_releases_from_its_own_thread_once_named(tmp_path: Path) -> None:
    released = threading.Event()
    thread = wake.release_when_named(released.set, tmp_path, 3, 10.0, kinds=(ReportKind.DESYNC,), step=40)
    time.sleep(0.3)
    assert not released.is_set()  # nothing names rank 3 yet
    _write(tmp_path, ("desync", [3], 40))
    assert released.wait(5.0)
    thread.join(5.0)
    assert not thread.is_alive()
