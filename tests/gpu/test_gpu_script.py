"""The GPU script (tests/gpu/run.py): its plan for 1, 2, 4 and 8 GPUs (which cases run, which
are skipped and why, and that the plan fits its slot), the plan printed without running
anything, results written after every case and a run stopped by SIGTERM returning what it
finished, its CPU plumbing mode (gloo ranks on CPU, the cases that need no GPU) as CI runs it, a
case killed at its timeout, and -- on a host with a CUDA GPU -- the whole script once, one test
per case, so that a failing case fails its own test and no other."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import processes
from tests.gpu import run as gpu_run

pytestmark = pytest.mark.processes

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
    assert all(0 < case.estimate_s <= case.timeout_s and 0 < case.cpu_estimate_s <= case.timeout_s
               for case in gpu_run.CASES)
    assert all(case.gpus_why for case in gpu_run.CASES if case.gpus_min > 1)
    assert {case.name for case in gpu_run.CASES if case.cpu} == {"nccl_conformance", "replay_sdc"}
    # The whole command, start-up and teardown included, ends with margin inside the device
    # tool's 10-minute limit on one command.
    slot_s = gpu_run.STARTUP_S + gpu_run.DEFAULT_BUDGET_S + gpu_run.TEARDOWN_S
    assert slot_s <= gpu_run.SLOT_PLAN_S == 480 <= gpu_run.DEVICE_COMMAND_LIMIT_S - 120


def _plan(gpus: int) -> tuple[gpu_run.Plan, dict[str, gpu_run.Planned], int]:
    plan = gpu_run.Plan(device="cuda", gpus=gpus, python=sys.executable, work=Path("/nonexistent"))
    parallel = 2 if gpus == 1 else 4
    planned = gpu_run.make_plan(plan, gpu_run.CASES, budget_s=gpu_run.DEFAULT_BUDGET_S, parallel=parallel)
    return plan, {item.case.name: item for item in planned}, parallel


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_the_plan_runs_only_what_the_gpus_allow_and_fits_the_slot(gpus: int) -> None:
    """A case that needs more GPUs than there are is skipped with its reason (never run to
    fail); a case that would end past the budget is planned out with its reason; what runs is
    estimated to end, with start-up and teardown, within the 480 s slot plan."""
    plan, planned, parallel = _plan(gpus)
    assert list(planned) == [case.name for case in gpu_run.CASES]
    for item in planned.values():
        assert item.action in ("run", "skip") and (item.action == "run") == (item.why == "")
        if item.action == "run":
            assert item.case.gpus_min <= gpus and item.start_s is not None
            if item.backend == "nccl":
                assert item.ranks <= gpus, f"{item.case.name}: two NCCL ranks on one GPU"
        elif item.case.gpus_min > gpus:
            assert item.why.startswith(f"needs {item.case.gpus_min} GPUs, {gpus} here: ")
        else:
            assert "does not fit the" in item.why and f"--cases {item.case.name}" in item.why
    end_s = gpu_run.plan_end_s(list(planned.values()), parallel)
    assert end_s <= gpu_run.DEFAULT_BUDGET_S
    assert gpu_run.STARTUP_S + end_s + gpu_run.TEARDOWN_S <= gpu_run.SLOT_PLAN_S
    shared = {"device_pytest", "nccl_deadline", "completion_device", "nccl_conformance", "replay_sdc", "healthy",
              "sdc"}
    assert all(planned[name].action == "run" for name in shared)
    hang, straggler = planned["gpu_hang"], planned["straggler"]
    if gpus < gpu_run.VERDICT_RANKS_MIN:
        # One or two GPUs: the 3 ranks would share GPUs over gloo, where a GPU-side hang cannot
        # be told from a group stall and device times are shared.
        assert hang.action == straggler.action == "skip"
        assert "gloo" in hang.why and "not started" in hang.why
    else:
        assert (hang.action, hang.ranks, hang.backend) == ("run", gpus, "nccl")
        assert (straggler.action, straggler.ranks, straggler.backend) == ("run", gpus, "nccl")


def test_a_case_planned_out_for_the_budget_fits_a_slot_of_its_own() -> None:
    _, planned, _ = _plan(1)
    out = [name for name, item in planned.items() if item.action == "skip" and "does not fit" in item.why]
    assert out, "every case fits one slot: the budget test above is no longer exercised"
    plan = gpu_run.Plan(device="cuda", gpus=1, python=sys.executable, work=Path("/nonexistent"))
    alone = gpu_run.make_plan(plan, [c for c in gpu_run.CASES if c.name in out], budget_s=gpu_run.DEFAULT_BUDGET_S,
                              parallel=2)
    assert all(item.action == "run" for item in alone)


def test_the_plan_is_printed_without_running_anything_or_importing_torch(tmp_path: Path) -> None:
    """``--plan --gpus N`` on a machine without torch: a torch that cannot be imported is first
    on the path, and nothing is started (no work folder, no probe)."""
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('the plan must not import torch')\n")
    completed = processes.run(
        [sys.executable, str(REPO / "tests" / "gpu" / "run.py"), "--plan", "--gpus", "1", "--work",
         str(tmp_path / "work")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(fake)},
    )
    assert completed.returncode == 0, completed.stderr
    assert not (tmp_path / "work").exists()
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("scout GPU plan: 1 GPU(s), 2 case(s) at a time, budget 420 s")
    for case in gpu_run.CASES:
        assert any(line.startswith(case.name + " ") for line in lines), case.name
    _, planned, _ = _plan(1)
    end_s = gpu_run.plan_end_s(list(planned.values()), 2)
    assert f"cases end at {end_s:.0f} s" in lines[-1] and f"total {end_s + 60:.0f} s" in lines[-1]


def _completion_rank(rank: int) -> dict[str, Any]:
    """What a rank of completion_worker writes when everything held."""
    return {"rank": rank, "local_rank": rank, "step": "done", "marks_device": rank, "current_device_at_start": 0,
            "recorder_source": "PyTorch's Flight Recorder",
            "markers_before": [1, 1, 0], "markers_during": [2, 1, 1], "markers_after": [2, 2, 0],
            "recorder_before": [1, 1, 0], "recorder_during": [2, 1, 1], "recorder_after": [2, 2, 0],
            "capture_replays_right": True, "skipped_polls": 14,
            "collective_capture": {"ok": True, "untracked": 1, "enqueued_unchanged": True, "value": 2.0},
            "unguarded_query": {"capture": "RuntimeError: ...", "query_errors": []}}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"marks_device": 0}, "marks on cuda:0, its GPU is 1"),
        ({"markers_during": [2, 1, 3]}, "markers during the kernel"),  # unknown, not enqueued
        ({"recorder_during": [1, 1, 0]}, "recorder during the kernel"),  # the wrong recorder sees nothing
        ({"recorder_after": [2, 1, 1]}, "recorder after the kernel"),
        ({"skipped_polls": 0}, "no poll was skipped"),
        ({"capture_replays_right": False}, "did not replay right"),
        ({"collective_capture": {"ok": True, "untracked": 0, "enqueued_unchanged": False}}, "captured all_reduce"),
        ({"step": "capture", "error": "Traceback\nRuntimeError: boom"}, "failed in step capture: RuntimeError"),
    ],
)
def test_the_completion_case_passes_a_good_run_and_names_what_did_not_hold(change: dict[str, Any],
                                                                          named: str) -> None:
    from tests.gpu import completion_worker

    good = [_completion_rank(0), _completion_rank(1)]
    assert completion_worker.check(good) == []
    bad = [good[0], {**good[1], **change}]
    problems = completion_worker.check(bad)
    assert problems and all(p.startswith("rank 1") for p in problems) and named in " ".join(problems), problems
    # An unsupported captured collective is reported, not failed.
    unsupported = {**good[1], "collective_capture": {"ok": False, "error": "RuntimeError: not supported"}}
    assert completion_worker.check([good[0], unsupported]) == []


# -- results as they come ---------------------------------------------------------------------------


def _synthetic_case(name: str, code: str, judge: Any = None) -> gpu_run.Case:
    """A case of the driver that runs ``python -c code`` (the driver is under test, not a check)."""

    def launch(plan: gpu_run.Plan, work: Path) -> gpu_run.Launch:
        return gpu_run.Launch([sys.executable, "-c", code], ranks=1, backend="-")

    def passed(plan: gpu_run.Plan, work: Path, status: int, log: str) -> gpu_run.Outcome:
        return gpu_run.Outcome("PASS" if status == 0 else "FAIL", f"exit {status}")

    return gpu_run.Case(name, f"synthetic {name}", 120, alone=False, cpu=True, needs_cuda=False, launch=launch,
                        judge=judge or passed, estimate_s=1, cpu_estimate_s=1)


def synthetic_run(out: Path, cases: list[gpu_run.Case]) -> int:
    """The driver's run of ``cases``, one at a time, as main() runs the real ones."""
    plan = gpu_run.Plan(device="cpu", gpus=0, python=sys.executable, work=out.parent / "work")
    planned = gpu_run.make_plan(plan, cases, budget_s=60, parallel=1)
    return gpu_run.execute(plan, planned, budget_s=60, parallel=1, env=dict(os.environ), out=out, header="synthetic",
                           environment={})


def _lines(out: Path) -> list[dict[str, Any]]:
    path = out / "gpu_results.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_results_are_written_after_every_case(tmp_path: Path) -> None:
    """The second case's judge reads the files while the run goes on: the first case's line is
    already in gpu_results.jsonl and its row in gpu_summary.txt."""
    out = tmp_path / "out"
    seen: dict[str, Any] = {}

    def look(plan: gpu_run.Plan, work: Path, status: int, log: str) -> gpu_run.Outcome:
        seen["lines"] = _lines(out)
        seen["summary"] = (out / "gpu_summary.txt").read_text(encoding="utf-8")
        return gpu_run.Outcome("PASS", "looked")

    status = synthetic_run(out, [_synthetic_case("first", "print('one')"), _synthetic_case("second", "", look)])
    assert status == 0
    assert [(line["kind"], line.get("name")) for line in seen["lines"]] == [("plan", None), ("case", "first")]
    assert seen["lines"][1]["status"] == "PASS"
    assert "first" in seen["summary"] and "not finished yet: second" in seen["summary"]
    final = _lines(out)
    assert [(line["kind"], line.get("name")) for line in final] == [
        ("plan", None), ("case", "first"), ("case", "second"), ("end", None)]
    assert final[-1]["exit_status"] == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_run.RESULT_FILES)


def _wait_for(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_run_stopped_by_sigterm_returns_what_it_finished_and_kills_what_ran(tmp_path: Path) -> None:
    out = tmp_path / "out"
    program = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from pathlib import Path; "
               "from tests.gpu import test_gpu_script as t; "
               "raise SystemExit(t.synthetic_run(Path(sys.argv[1]), [t._synthetic_case('first', 'pass'), "
               "t._synthetic_case('stuck', 'import time; time.sleep(300)'), t._synthetic_case('never', 'pass')]))")
    driver = subprocess.Popen([sys.executable, "-c", program, str(out)], cwd=REPO, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert _wait_for(lambda: (tmp_path / "work" / "stuck" / "log.txt").is_file(), 60), "stuck never started"
        assert [line.get("name") for line in _lines(out) if line["kind"] == "case"] == ["first"]
        driver.send_signal(signal.SIGTERM)
        output, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
    assert driver.returncode == 1, output
    lines = _lines(out)
    cases = {line["name"]: line for line in lines if line["kind"] == "case"}
    assert cases["first"]["status"] == "PASS"
    assert cases["stuck"]["status"] == "INTERRUPTED" and "stopped after" in cases["stuck"]["detail"]
    assert cases["never"]["status"] == "INTERRUPTED" and "not started" in cases["never"]["detail"]
    assert lines[-1]["kind"] == "end" and lines[-1]["interrupted"] == "SIGTERM"
    document = json.loads((out / "gpu_results.json").read_text(encoding="utf-8"))
    assert document["exit_status"] == 1 and list(document["cases"]) == ["first", "stuck", "never"]
    # The hygiene fixture fails this test if the stuck case's process outlived the driver.


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
    skipped with the reason), the CPU ones pass, $OUT holds the four result files (one line per
    case in gpu_results.jsonl), the table is printed."""
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
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_run.RESULT_FILES)
    table = (out / "gpu_summary.txt").read_text(encoding="utf-8")
    assert table.strip() in completed.stdout
    assert all(case.name in table for case in gpu_run.CASES)
    lines = _lines(out)
    assert [line["kind"] for line in lines] == ["plan", *["case"] * len(gpu_run.CASES), "end"]
    assert {line["name"]: line["status"] for line in lines[1:-1]} == {name: r["status"] for name, r in cases.items()}


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
