"""Beyond one machine (docs/cluster.md): two torchrun "nodes" on loopback with a c10d
rendezvous, each with its own working directory, TMPDIR and run directory and nothing shared;
and an MPI job started as two halves with different TMPDIRs. The observers meet through the
launcher (its store, or scout's own process group; MPI itself) -- never a shared directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.scenarios.launcher import Rendezvous, torchrun_command, torchrun_env
from tests.job.test_attach_torchrun import EXAMPLE

pytestmark = pytest.mark.torchdist
THRESHOLD_S = 3.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def two_nodes(tmp_path: Path, fault: str, *, share_store: bool, timeout_s: float = 240.0) -> list[dict[str, Any]]:
    """Run the example as 2 nodes x 2 ranks; returns the reports of both nodes' run dirs."""
    port = _free_port()
    nodes = []
    for node in (0, 1):
        home = tmp_path / f"node{node}"
        (home / "tmp").mkdir(parents=True)
        env = torchrun_env({"stall_threshold_s": THRESHOLD_S, "recheck_interval_s": 2},
                           extra={"TMPDIR": str(home / "tmp")}, share_store=share_store)
        command = torchrun_command(EXAMPLE, 2, ["--steps", "24", "--run-dir", home / "run", "--fault", fault],
                                   rendezvous=Rendezvous(f"127.0.0.1:{port}", f"scout-test-{port}", 2))
        nodes.append(subprocess.Popen(command, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    outputs = []
    for process in nodes:
        try:
            outputs.append(process.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            for other in nodes:
                os.killpg(other.pid, 9)
            raise
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    return [r for node in (0, 1) for r in reports.read_records(tmp_path / f"node{node}" / "run" / "reports.jsonl")]


def _hangs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["source"] == "observer"]


@pytest.mark.parametrize(("rank", "share_store", "fault"),
                         [(3, True, "hang-before-backward"),
                          # rank 0 on the other node, own store: test_CLUSTER_rank_0_frozen_with_sigstop
                          pytest.param(1, False, "hang-before-forward", marks=pytest.mark.slow)])
def test_CLUSTER_COMPLETION_3_a_hang_on_either_node_is_named(tmp_path: Path, rank: int, share_store: bool,
                                                             fault: str) -> None:
    """Before backward: the peers wait in the bucket all-reduces. Before the forward: DDP's
    default buffer broadcast (the example's causal mask is a buffer) lets the healthy ranks
    through at different times, and the sleeper never enqueued it (spec/observer.md
    COMPLETION-3) -- named across the two nodes all the same."""
    records = two_nodes(tmp_path, f"{fault}:{rank}:20:{THRESHOLD_S + 5}:until-named", share_store=share_store)
    (hang,) = _hangs(records)
    assert (hang["kind"], hang["ranks"], hang["step"]) == ("hang", [rank], 20), hang
    assert hang["evidence"]["basis"] == "completion"


def test_CLUSTER_rank_0_frozen_with_sigstop_is_named(tmp_path: Path) -> None:
    records = two_nodes(tmp_path, f"freeze:0:20:{THRESHOLD_S + 5}:until-named", share_store=False)
    (hang,) = _hangs(records)
    assert (hang["kind"], hang["ranks"]) == ("hang", [0]) and hang["reporter_rank"] != 0, hang


@pytest.mark.mpi
def test_CLUSTER_mpi_job_in_two_halves_with_their_own_tmpdir_names_the_behind_rank(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="needs mpi4py: pip install mpi4py mpich")
    from tests.transport.test_conformance_mpi import _mpiexec

    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec found: pip install mpich")
    halves = []
    for half in ("a", "b"):
        (tmp_path / half).mkdir()
        halves += ["-n", "2", "-env", "TMPDIR", str(tmp_path / half), "-env", "SCOUT_TEST_REPORT_DIR",
                   str(tmp_path / half), sys.executable, "-m", "tests.observer.mpi_observer_worker", str(tmp_path),
                   "behind"]
        if half == "a":
            halves.append(":")
    run = subprocess.run([mpiexec, *halves], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    found = [json.loads(line) for half in ("a", "b") if (tmp_path / half / "reports.jsonl").exists()
             for line in (tmp_path / half / "reports.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["ranks"]) for r in found] == [("hang", [2])], found
    assert not (tmp_path / "reports.jsonl").exists()
