"""A run directory is bound to its job (spec/recovery.md RECOVERY-6): another job is refused
with one line saying how to go on, adopting is explicit, and another job's reports never drive
``restore()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scout import reports
from scout.job.run_dir import JOB_FILE, bind, bound_jobs, check_binding
from scout.reports.kinds import ReportKind

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_RECOVERY_6_the_first_attach_binds_the_same_job_passes_another_is_refused_unless_it_adopts(
        tmp_path: Path) -> None:
    assert bound_jobs(tmp_path) is None
    assert check_binding(tmp_path, "job-a", adopt=False) == ("job-a",)
    bind(tmp_path, ("job-a",))
    assert bound_jobs(tmp_path) == ("job-a",)
    assert check_binding(tmp_path, "job-a", adopt=False) == ("job-a",)
    with pytest.raises(ValueError) as refused:
        check_binding(tmp_path, "job-b", adopt=False)
    message = str(refused.value)
    assert "\n" not in message
    for says in ("belongs to job 'job-a'", "this job 'job-b'", "another run_dir", "adopt_run_dir=True",
                 "SCOUT_ADOPT_RUN_DIR=1"):
        assert says in message, message
    assert check_binding(tmp_path, "job-b", adopt=True) == ("job-a", "job-b")
    bind(tmp_path, ("job-a", "job-b"))
    assert bound_jobs(tmp_path) == ("job-a", "job-b")
    assert check_binding(tmp_path, "job-a", adopt=False) == ("job-a", "job-b")


@pytest.mark.parametrize("text", ["{", '{"jobs": []}', '{"jobs": [1]}', "[" * 100_000, '{"other": 1}'])
def test_RECOVERY_6_a_binding_that_cannot_be_read_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / JOB_FILE).write_text(text)
    with pytest.raises(ValueError, match=f"binding {tmp_path / JOB_FILE} cannot be read .*remove it"):
        bound_jobs(tmp_path)


def _job(tmp_path: Path, run_dir: Path, job_id: str, **environ: str) -> subprocess.CompletedProcess[str]:
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "SCOUT_JOB_ID": job_id,
                **environ})
    command = [str(TORCHRUN), "--nproc-per-node", "4", "--standalone", str(EXAMPLE), "--steps", "3",
               "--run-dir", str(run_dir)]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _old_run(run_dir: Path) -> None:
    """A run directory another job wrote: its binding and a report saying it ended by an SDC."""
    run_dir.mkdir()
    bind(run_dir, ("old-job",))
    for kind, reason in ((ReportKind.RESTART, "started"), (ReportKind.SDC, "attributed")):
        reports.append_record(run_dir / reports.REPORTS_FILE, reports.make_record(
            kind, reason=reason, job_id="old-job", generation=0, ranks=[1] if kind is ReportKind.SDC else [],
            hosts=[], step=5, reporter_rank=0))


@pytest.mark.torchdist
@pytest.mark.slow  # 55 s at load 15 (rank 0's error, then the others leave 5 s later); the unit tests above bound it
def test_RECOVERY_6_under_torchrun_a_run_directory_of_another_job_is_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _old_run(run_dir)
    run = _job(tmp_path, run_dir, "new-job")
    output = run.stdout + run.stderr
    assert run.returncode != 0
    says = "run_dir '" + str(run_dir) + "' belongs to job 'old-job', not to this job 'new-job'"
    assert output.count(says) == 1, output[-4000:]
    assert "[rank 0]" in output and "ConfigError" in output, output[-4000:]
    assert len(reports.read_records(run_dir / reports.REPORTS_FILE)) == 2  # nothing written
    assert bound_jobs(run_dir) == ("old-job",)


@pytest.mark.torchdist
@pytest.mark.slow  # a second 4-rank torchrun job; the unit tests above are its bounded versions
def test_RECOVERY_6_under_torchrun_a_directory_without_binding_is_bound_and_other_jobs_records_do_not_decide(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _old_run(run_dir)
    (run_dir / JOB_FILE).unlink()  # written before bindings existed: the first attach binds it
    run = _job(tmp_path, run_dir, "new-job")
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((run_dir / JOB_FILE).read_text())["jobs"] == ["new-job"]
    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    (started,) = [r for r in records if r["job_id"] == "new-job" and r["kind"] == "restart"]
    # old-job's SDC is not this job's previous attempt: a fresh start, no failure to recover from.
    assert (started["reason"], started["evidence"]["failure"]) == ("started", None), started
    (finished,) = [r for r in records if r["kind"] == "finished"]
    assert (finished["job_id"], finished["step"]) == ("new-job", 3)


def test_RECOVERY_7_a_chosen_checkpoint_whose_files_are_gone_is_named_with_how_to_go_on(tmp_path: Path) -> None:
    from scout.core.failure import FailureClass
    from scout.gate.dcp import checkpoint_path
    from scout.gate.model import CheckpointId
    from scout.gate.recovery import Choice
    from scout.job.attach import missing_checkpoint
    from scout.job.gate_driver import RestoreDecision

    decision = RestoreDecision(40, CheckpointId(0, 40), FailureClass.SDC, Choice.VERIFIED, 1)
    message = missing_checkpoint(decision, tmp_path / "ckpt")
    assert message is not None and "\n" not in message
    for says in ("verified checkpoint t0/s40", "(step 40) for a sdc failure", str(checkpoint_path(tmp_path / "ckpt",
                 CheckpointId(0, 40))), "put it back", "another run_dir"):
        assert says in message, message
    path = checkpoint_path(tmp_path / "ckpt", CheckpointId(0, 40))
    path.mkdir(parents=True)
    assert missing_checkpoint(decision, tmp_path / "ckpt") is not None  # a directory without DCP's metadata
    (path / ".metadata").write_bytes(b"")
    assert missing_checkpoint(decision, tmp_path / "ckpt") is None
    assert missing_checkpoint(RestoreDecision(0, None, None, None, 0), tmp_path / "gone") is None
