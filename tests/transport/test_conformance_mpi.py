"""The MPI binding on real ranks: ``mpiexec -n {4,3,5}`` running tests/transport/mpi_worker.py.

One mpiexec run per size (a module fixture) executes every case on every rank; each test below
checks one case on the per-rank results. The guarantees checked are those of
scout/transport/base.py; the MPI-specific cases are in mpi_worker.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.transport import binding_cases as cases
from tests.transport.mpi_cases import MPI_CASES
from tests.transport.process_runs import REPO, RankRun, run_ranks, worker_env
from tests.transport.scenario_checks import check_scenario_run
from tests.transport.scenarios import SCENARIOS

pytestmark = [pytest.mark.mpi, pytest.mark.light]

#: 4 ranks in every suite; the odd sizes (a strict majority without a tie) in the slow tier, to
#: keep CI's pytest time (issue 40) -- the simulated and torch bindings run every case at 3 and 5.
SIZES = (4, pytest.param(3, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow))
RUN_TIMEOUT_S = 120.0


def _mpiexec() -> str | None:
    beside_python = Path(sys.executable).parent / "mpiexec"
    return str(beside_python) if beside_python.exists() else shutil.which("mpiexec")


@pytest.fixture(scope="module", params=SIZES, ids=["n4", "n3", "n5"])
def mpi_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RankRun:
    pytest.importorskip("mpi4py", reason="the MPI binding needs mpi4py: pip install mpi4py mpich")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec found: pip install mpich (or load your cluster's MPI)")
    size: int = request.param
    out_dir = tmp_path_factory.mktemp(f"mpi_n{size}")
    command = [
        mpiexec,
        "-n",
        str(size),
        sys.executable,
        "-m",
        "tests.transport.mpi_worker",
        str(out_dir),
    ]
    return run_ranks(command, out_dir, size, "mpi", RUN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(cases.CASES))
def test_binding_case(mpi_run: RankRun, name: str) -> None:
    mpi_run.check(name, cases.CASES)


@pytest.mark.parametrize("name", list(MPI_CASES))
def test_mpi_case(mpi_run: RankRun, name: str) -> None:
    mpi_run.check(name, MPI_CASES)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_shared_scenario(mpi_run: RankRun, name: str) -> None:
    check_scenario_run(name, [r["scenarios"][name] for r in mpi_run.results], mpi_run.size)


def test_missing_mpi4py_says_how_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['mpi4py'] = None\n"
        "try:\n"
        "    import scout.transport.mpi\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    completed = processes.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "pip install mpi4py mpich" in completed.stdout, completed.stdout + completed.stderr
    assert "scout-localize[mpi]" in completed.stdout
