"""The observer (OBS-*) under ``mpiexec -n 4`` with the MPI transport: each rank bootstraps its observer over
MpiTransport (scout/observer/mpi_observer.py) and the observers watch over the UDP channel while
the ranks block in a real MPI all-reduce. Rank programs: tests/observer/mpi_observer_worker.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.observer import flat

pytest.importorskip("mpi4py", reason="needs mpi4py: pip install mpi4py mpich")

from tests.transport.process_runs import run_ranks  # noqa: E402
from tests.transport.test_conformance_mpi import _mpiexec  # noqa: E402

pytestmark = pytest.mark.mpi
RUN_TIMEOUT_S = 90.0
THRESHOLD_S = 1.0


def mpi_job(tmp_path: Path, scenario: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec found: pip install mpich")
    command = [mpiexec, "-n", "4", sys.executable, "-m", "tests.observer.mpi_observer_worker", str(tmp_path), scenario]
    run = run_ranks(command, tmp_path, 4, "mpi", RUN_TIMEOUT_S)
    path = tmp_path / "reports.jsonl"
    reports = [flat(json.loads(line)) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return run.results, reports


def test_OBS_mpi_rank_2_sleeping_before_an_mpi_all_reduce_is_attributed_as_behind(tmp_path: Path) -> None:
    results, reports = mpi_job(tmp_path, "behind")
    assert len(reports) == 1, reports
    (report,) = reports
    assert (report["kind"], report["scope"], report["outcome"], report["attributed_ranks"]) == ("hang", "rank", "behind", [2])
    assert report["reporter_rank"] == 0
    assert THRESHOLD_S <= report["evidence"]["idle_s"] < THRESHOLD_S + 1.0
    assert all(r["observer_exit"] == 0 for r in results), results


@pytest.mark.slow  # OBS-1 on a healthy run: the gloo suite's in CI (the channel is the same UDP)
def test_OBS_1_mpi_healthy_run_reports_nothing_and_sends_no_observer_message(tmp_path: Path) -> None:
    results, reports = mpi_job(tmp_path, "healthy")
    assert reports == []
    assert [r["stats"]["messages_sent"] for r in results] == [0, 0, 0, 0]
    assert all(r["observer_exit"] == 0 for r in results), results
