"""Slurm for real (spec/ops.md OPS-7, OPS-8; issue 22): a single-host Slurm cluster with two
node names runs ``examples/scout.sbatch`` (the script docs/cluster.md shows) with ``sbatch``:
``srun torchrun`` starts the example GPT on 3 ranks; rank 1 falls asleep, the observers report
the hang (``on_hang=restart`` ends the job) and name the Slurm node; ``scout slurm-requeue``
requeues the job excluding it, and the requeued run -- the same Slurm job id -- lands on the other
node and finishes. Skipped with a one-line reason where Slurm cannot start."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout import reports
from tests import processes
from tests.ops import slurm_cluster
from tests.ops.services import free_port

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "scout.sbatch"
JOB_TIMEOUT_S = 150.0


def _wait_state(cluster: slurm_cluster.Cluster, job_id: str, states: set[str], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = cluster.job(job_id)
        if job.get("JobState") in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not in {states} after {timeout_s} s: {job}\n{cluster.log_tail()}")
        time.sleep(0.5)


def test_docs_show_the_exact_sbatch_script() -> None:
    assert SCRIPT.read_text() in (REPO / "docs" / "cluster.md").read_text()


def test_OPS_7_OPS_8_a_requeued_job_never_lands_on_the_host_scout_excluded(tmp_path: Path) -> None:
    try:
        context = slurm_cluster.start(tmp_path / "slurm-logs", str(Path(sys.executable).parent))
        cluster = context.__enter__()
    except slurm_cluster.Unavailable as why:
        pytest.skip(str(why))
    try:
        run_dir = tmp_path / "run"
        env = {**cluster.env, "OMP_NUM_THREADS": "1", "RUN_DIR": str(run_dir), "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
               "TRAIN": str(REPO / "examples" / "train_gpt.py"), "NPROC_PER_NODE": "3", "RDZV_HOST": "127.0.0.1",
               "RDZV_PORT": str(free_port()), "SCOUT_STALL_THRESHOLD_S": "3", "SCOUT_RECHECK_INTERVAL_S": "2",
               "SCOUT_ON_HANG": "restart", "SCOUT_KILL_GRACE_S": "2"}
        submitted = processes.run(
            ["sbatch", "--parsable", "--nodes=1", f"--output={tmp_path}/slurm-%j.out", str(SCRIPT),
             "--steps", "4", "--fault", "hang-before-backward:1:2:120"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().split(";")[0]
        began, phases = time.monotonic(), {}
        first = _wait_state(cluster, job_id, {"FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL"},
                            JOB_TIMEOUT_S)
        output = (tmp_path / f"slurm-{job_id}.out").read_text(errors="replace")
        assert first["JobState"] == "FAILED", f"{first}\n{output[-3000:]}"
        phases["first run failed"] = time.monotonic() - began
        records = reports.read_records(run_dir / reports.REPORTS_FILE)
        hangs = [r for r in records if r["kind"] == "hang"]
        assert hangs, output[-3000:]
        # The job id comes from Slurm; the host is Slurm's node name (OPS-7).
        assert (hangs[0]["ranks"], hangs[0]["job_id"], hangs[0]["hosts"]) == ([1], job_id, [first["NodeList"]])
        excluded = (run_dir / "exclude_hosts.txt").read_text().split()
        assert excluded == [first["NodeList"]]

        requeued = processes.run([sys.executable, "-m", "scout.cli", "slurm-requeue", job_id, str(run_dir)],
                                 env=cluster.env, capture_output=True, text=True, timeout=90)
        assert requeued.returncode == 0, requeued.stderr
        phases["requeued"] = time.monotonic() - began
        second = _wait_state(cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"},
                             JOB_TIMEOUT_S)
        output = (tmp_path / f"slurm-{job_id}.out").read_text(errors="replace")
        assert second["JobState"] == "COMPLETED", f"{second}\n{output[-3000:]}"
        assert second["Restarts"] == "1" and excluded[0] in second["ExcNodeList"].split(",")
        assert second["NodeList"] not in excluded, "the requeued job landed on an excluded node"
        starts = [r for r in reports.read_records(run_dir / reports.REPORTS_FILE)
                  if r["kind"] == "restart" and r["reason"] in ("started", "restored")]
        assert [set(r["evidence"]["hosts"]) for r in starts] == [{first["NodeList"]}, {second["NodeList"]}]
        finished = [r for r in reports.read_records(run_dir / reports.REPORTS_FILE) if r["kind"] == "finished"]
        assert [r["step"] for r in finished] == [4], "the requeued run trains to its end"
        phases["second run ended"] = time.monotonic() - began
        print("Slurm phases (s after sbatch): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    finally:
        context.__exit__(None, None, None)


def _requeue(cluster: slurm_cluster.Cluster, *arguments: str) -> subprocess.CompletedProcess[str]:
    return processes.run([sys.executable, "-m", "scout.cli", "slurm-requeue", *arguments], env=cluster.env,
                         capture_output=True, text=True, timeout=90)


def _untouched(job: dict[str, str]) -> bool:
    """Still running its first run, not held, nothing excluded."""
    return (job["JobState"], job["Restarts"], job.get("ExcNodeList", "(null)")) == ("RUNNING", "0", "(null)") and \
        "Held" not in job.get("Reason", "")


def test_OPS_10_requeue_refuses_what_it_cannot_use_before_touching_the_job(tmp_path: Path) -> None:
    # Issue 39, attacks 3 and 11, against a real scontrol: no exclude_hosts.txt (a misspelt
    # RUN_DIR, or a node-local one read from elsewhere) requeued with nothing excluded and exit 0;
    # a non-UTF-8 file or a directory in its place gave tracebacks; a list too long for one
    # argument left the job held without a word on how to release it.
    try:
        context = slurm_cluster.start(tmp_path / "slurm-logs", str(Path(sys.executable).parent))
        cluster = context.__enter__()
    except slurm_cluster.Unavailable as why:
        pytest.skip(str(why))
    try:
        submitted = processes.run(["sbatch", "--parsable", "--requeue", "--nodes=1", f"--output={tmp_path}/job-%j.out",
                                   "--wrap", "sleep 300"], env=cluster.env, cwd=tmp_path, capture_output=True,
                                  text=True, timeout=30)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().split(";")[0]
        _wait_state(cluster, job_id, {"RUNNING"}, JOB_TIMEOUT_S)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "job.json").write_text('{"jobs": ["x"]}\n')

        for arguments, said in (
                ((str(tmp_path / "rnu"),), "is not a directory here"),  # a misspelt RUN_DIR
                ((str(run_dir),), "exclude_hosts.txt does not exist"),  # a node-local run_dir, read elsewhere
                ((str(run_dir), "--exclude-file", str(tmp_path / "nowhere.txt")), "does not exist")):
            done = _requeue(cluster, job_id, *arguments)
            assert done.returncode == 2 and said in done.stderr and "--allow-no-exclude-file" in done.stderr, done
            assert "Traceback" not in done.stderr and _untouched(cluster.job(job_id)), cluster.job(job_id)

        exclude = run_dir / "exclude_hosts.txt"
        exclude.write_bytes(b"scoutnode2\n\xff\xfenode\n")
        done = _requeue(cluster, job_id, str(run_dir))
        assert done.returncode == 2 and "is not UTF-8 text" in done.stderr and "Traceback" not in done.stderr, done
        exclude.unlink()
        exclude.mkdir()
        done = _requeue(cluster, job_id, str(run_dir))
        assert done.returncode == 2 and "is a directory" in done.stderr and "Traceback" not in done.stderr, done
        exclude.rmdir()
        # 20,000 names: an ExcNodeList of 220 kB, over what one argument may hold (128 KiB).
        exclude.write_text("".join(f"gpu{index:06d}\n" for index in range(20_000)))
        done = _requeue(cluster, job_id, str(run_dir))
        assert done.returncode == 2 and "argument list too long" in done.stderr and "not touched" in done.stderr, done
        assert "Traceback" not in done.stderr and _untouched(cluster.job(job_id)), cluster.job(job_id)

        # On purpose, with nothing to exclude: requeued, and the output says no host was added.
        exclude.unlink()
        done = _requeue(cluster, job_id, str(run_dir), "--allow-no-exclude-file")
        assert done.returncode == 0 and "no host added" in done.stdout, done
        requeued = _wait_state(cluster, job_id, {"RUNNING", "FAILED"}, JOB_TIMEOUT_S)
        assert requeued["Restarts"] == "1", requeued
        if requeued["JobState"] == "FAILED":
            # Released and launched again -- but this one-host cluster's slurmd can still hold the
            # job id it killed for the requeue a moment before, and refuses the launch (seen once
            # in CI, slurm-wlm 22.05). Any other failure is a failure.
            logs = cluster.log_tail(1_000_000)
            assert "already killed, do not launch batch job" in logs, logs
    finally:
        context.__exit__(None, None, None)
