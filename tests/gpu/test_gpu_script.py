"""The GPU script (tests/gpu/run.py): its plan for 1, 2, 4 and 8 GPUs, its CPU plumbing mode
(gloo ranks on CPU, the cases that need no GPU) as CI runs it, a case killed at its timeout,
and -- on a host with a CUDA GPU -- the whole script once, one test per case, so that a failing
case fails its own test and no other."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import processes
from tests.gpu import run as gpu_run

REPO = Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT_S = 240.0  # the CPU mode needs ~40 s on 2 idle cores; this only bounds a broken run


@pytest.mark.parametrize(
    ("gpus", "verdict_ranks", "verdict_backend", "nccl_ranks"),
    [(1, 3, "gloo", 1), (2, 3, "gloo", 2), (4, 4, "nccl", 4), (8, 8, "nccl", 8)],
)
def test_the_plan_adapts_to_the_gpus(gpus: int, verdict_ranks: int, verdict_backend: str, nccl_ranks: int) -> None:
    """A verdict job has at least three replicas (sharing GPUs over gloo where they are fewer);
    an NCCL case has one rank per GPU, never two ranks on one GPU."""
    plan = gpu_run.Plan(device="cuda", gpus=gpus, python=sys.executable, work=Path("/nonexistent"))
    assert (plan.verdict_ranks, plan.verdict_backend, plan.nccl_ranks) == (verdict_ranks, verdict_backend, nccl_ranks)
    work = Path("/nonexistent/case")
    for name in ("healthy", "sdc", "gpu_hang", "straggler"):
        launch = gpu_run._job_launch(name)(plan, work)
        assert isinstance(launch, gpu_run.Launch)
        assert (launch.ranks, launch.backend) == (verdict_ranks, verdict_backend)
        assert f"--nproc-per-node={verdict_ranks}" in launch.command
    straggler = gpu_run._job_launch("straggler")(plan, work)
    assert isinstance(straggler, gpu_run.Launch)
    assert straggler.command[straggler.command.index("--fault") + 1] == f"slow:{verdict_ranks - 1}:1.5"
    replay = gpu_run._replay_launch(plan, work)
    assert (replay.ranks, replay.backend, replay.env["SCOUT_REPLAY_BACKEND"]) == (
        verdict_ranks, verdict_backend, verdict_backend)
    conformance = gpu_run._conformance_launch(plan, work)
    assert (conformance.ranks, conformance.backend) == (nccl_ranks, "nccl")
    assert gpu_run._deadline_launch(plan, work).ranks == 1


def test_every_case_says_what_it_checks_and_fits_the_budget() -> None:
    names = [case.name for case in gpu_run.CASES]
    assert len(names) == len(set(names))
    assert all(case.checks and 0 < case.timeout_s <= gpu_run.DEFAULT_BUDGET_S for case in gpu_run.CASES)
    assert {case.name for case in gpu_run.CASES if case.cpu} == {"nccl_conformance", "replay_sdc"}
    assert gpu_run.DEFAULT_BUDGET_S < 600, "the device tool runs one command for at most 10 minutes"


def _run_script(tmp_path: Path, *arguments: str) -> tuple[Any, dict[str, Any], Path]:
    out = tmp_path / "out"
    completed = processes.run(
        [sys.executable, str(REPO / "tests" / "gpu" / "run.py"), "--out", str(out), "--work",
         str(tmp_path / "work"), *arguments],
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, cwd=REPO,
    )
    results_path = out / "gpu_results.json"
    assert results_path.is_file(), completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed, json.loads(results_path.read_text(encoding="utf-8")), out


@pytest.mark.torchdist
def test_the_cpu_plumbing_mode_runs_its_cases_and_reports_them(tmp_path: Path) -> None:
    """What CI runs, so that the script cannot rot: every case is in the results (the CUDA ones
    skipped with the reason), the CPU ones pass, $OUT holds three files, the table is printed."""
    pytest.importorskip("torch", reason="needs torch: pip install 'scout-localize[torch]'")
    completed, results, out = _run_script(tmp_path, "--device", "cpu")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    cases = results["cases"]
    assert list(cases) == [case.name for case in gpu_run.CASES]
    for case in gpu_run.CASES:
        entry = cases[case.name]
        if case.cpu:
            assert entry["status"] == "PASS", entry
            assert (entry["ranks"], entry["backend"]) == (gpu_run.CPU_RANKS, "gloo")
        else:
            assert (entry["status"], entry["detail"]) == ("SKIP", "needs CUDA (CPU plumbing mode)")
    assert "attributed" in cases["replay_sdc"]["detail"]
    assert cases["nccl_conformance"]["figures"]["passed"] == list(gpu_run.CPU_CONFORMANCE_CASES)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_logs.txt", "gpu_results.json", "gpu_summary.txt"]
    table = (out / "gpu_summary.txt").read_text(encoding="utf-8")
    assert table.strip() in completed.stdout
    assert all(case.name in table for case in gpu_run.CASES)


@pytest.mark.torchdist
def test_a_case_past_its_timeout_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs torch: pip install 'scout-localize[torch]'")
    completed, results, _ = _run_script(tmp_path, "--device", "cpu", "--cases", "replay_sdc",
                                        "--timeout", "replay_sdc=2")
    assert completed.returncode == 1
    entry = results["cases"]["replay_sdc"]
    assert entry["status"] == "TIMEOUT" and entry["seconds"] < 30, entry
    # The hygiene fixture fails this test if a rank or torchrun outlived the kill.


def test_bad_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    assert gpu_run.main(["--cases", "nope", "--work", str(tmp_path)]) == 2
    assert gpu_run.main(["--timeout", "sdc", "--work", str(tmp_path)]) == 2
    assert gpu_run.main(["--budget-s", "0", "--work", str(tmp_path)]) == 2


# -- on a GPU host: the whole script, one test per case --------------------------------------------


def _gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    listing = processes.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if _gpus() == 0:
        pytest.skip("no CUDA GPU on this machine (nvidia-smi absent or lists none): run tests/gpu/run.py on a "
                    "GPU host (tests/gpu/README.md)")
    tmp = tmp_path_factory.mktemp("gpu")
    completed, results, _ = _run_script(tmp)
    assert completed.returncode in (0, 1, 3), completed.stderr[-3000:]
    return results


@pytest.mark.gpu
@pytest.mark.parametrize("name", [case.name for case in gpu_run.CASES])
def test_gpu_case(gpu_results: dict[str, Any], name: str) -> None:
    """One case of the script on the GPU: replay_sdc proves FAULT-1, REPLAY-6 and SIG-7 there,
    signature_bandwidth SIG-12, nccl_deadline WAIT-1 to WAIT-3 on a real NCCL communicator."""
    entry = gpu_results["cases"][name]
    assert entry["status"] in ("PASS", "MISS"), f"{entry['status']}: {entry['detail']}\n{entry['log_tail']}"
