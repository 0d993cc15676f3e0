"""The one torchrun launcher (scout/scenarios/launcher.py): the command and environment it builds
(in process), a bounded run that kills the job's whole process group, and one real 2-rank job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scout.scenarios import launcher
from scout.scenarios.launcher import Rendezvous, launch, torchrun_command, torchrun_env

pytestmark = pytest.mark.processes

RUN = [sys.executable, "-m", "torch.distributed.run"]


def test_the_command_is_this_interpreters_torchrun_standalone_with_the_script_and_its_arguments() -> None:
    assert torchrun_command("train.py", 4, ["--steps", 3]) == [
        *RUN, "--nproc-per-node", "4", "--standalone", "train.py", "--steps", "3"]
    assert torchrun_command("scout.scenarios.device_job", 2, module=True, max_restarts=1) == [
        *RUN, "--nproc-per-node", "2", "--standalone", "--max-restarts", "1", "-m", "scout.scenarios.device_job"]


def test_a_rendezvous_replaces_standalone_for_one_node_of_several() -> None:
    command = torchrun_command(Path("/x/train.py"), 2, rendezvous=Rendezvous("127.0.0.1:29400", "job-7", 2))
    assert command == [*RUN, "--nproc-per-node", "2", "--nnodes", "2", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "job-7", "/x/train.py"]


@pytest.mark.parametrize("ranks", [0, -1, True, 2.0])
def test_a_rank_count_that_is_not_a_whole_number_of_at_least_one_is_refused(ranks: object) -> None:
    with pytest.raises(ValueError, match="ranks must be a whole number >= 1"):
        torchrun_command("train.py", ranks)  # type: ignore[arg-type]


def test_a_negative_restart_count_is_refused() -> None:
    with pytest.raises(ValueError, match="max_restarts must be a whole number >= 0"):
        torchrun_command("train.py", 2, max_restarts=-1)


def test_the_environment_has_one_thread_an_unshared_store_and_the_settings_as_SCOUT_variables() -> None:
    base = {"PATH": "/bin", "SCOUT_ON_SDC": "stop", "PL_X": "1", "SCOUT_REPORT_AUDIT_FILE": "/a", "PYTHONPATH": "/p"}
    env = torchrun_env({"stall_threshold_s": 5.0, "on_sdc": "restart"}, extra={"TMPDIR": "/t"}, base=base,
                       drop_prefixes=("SCOUT_", "PL_"), keep={"SCOUT_REPORT_AUDIT_FILE"}, pythonpath=["/repo"])
    assert env == {"PATH": "/bin", "SCOUT_REPORT_AUDIT_FILE": "/a", "OMP_NUM_THREADS": "1",
                   "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "TMPDIR": "/t", "SCOUT_STALL_THRESHOLD_S": "5.0",
                   "SCOUT_ON_SDC": "restart", "PYTHONPATH": os.pathsep.join(["/repo", "/p"])}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in torchrun_env(base={}, share_store=True)
    assert torchrun_env(base={"SCOUT_ON_SDC": "stop"})["SCOUT_ON_SDC"] == "stop"  # kept unless dropped


@pytest.mark.parametrize("name", ["SCOUT_STALL_THRESHOLD_S", "stall-threshold", ""])
def test_a_setting_named_other_than_as_in_the_configuration_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="without the SCOUT_ prefix"):
        torchrun_env({name: 1}, base={})


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as file:
            return file.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_job_past_its_timeout_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; echo started; wait"
    started = time.monotonic()
    finished = launch(["sh", "-c", script], {"PATH": os.environ["PATH"]}, timeout_s=1.0)
    assert time.monotonic() - started < 1.0 + launcher.KILL_WAIT_S
    assert finished.timed_out and finished.returncode is None
    assert finished.stdout == "started\n"
    assert "ran past timeout_s=1.0 and its process group was killed" in finished.stderr
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5.0
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"the job's child {child} outlived the kill"


def test_run_in_session_raises_TimeoutExpired_like_subprocess_run() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.run_in_session(["sleep", "30"], timeout_s=0.5)
    with pytest.raises(ValueError, match="every run is bounded"):
        launcher.run_in_session(["true"], timeout_s=0)


def test_a_logged_job_writes_both_streams_to_its_log_and_reads_it_back(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    finished = launch(["sh", "-c", "echo out; echo err >&2; exit 3"], {"PATH": os.environ["PATH"]}, timeout_s=30,
                      log_path=log)
    assert finished.returncode == 3 and not finished.timed_out
    assert sorted(finished.stdout.split()) == ["err", "out"] and log.read_text() == finished.stdout


RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    line = " ".join(["rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], os.environ["OMP_NUM_THREADS"],
                     os.environ["SCOUT_STALL_THRESHOLD_S"], sys.argv[1]])
    # One write per line: the two ranks share torchrun's stdout, and print() of several values
    # unbuffered is several writes, which interleaved once in CI ("rankrank 1 of 2 ...").
    os.write(1, (line + "\\n").encode())
    """
)


@pytest.mark.torchdist
def test_a_two_rank_job_under_torchrun_gets_its_settings_and_arguments(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    finished = launch(torchrun_command(script, 2, ["hello"]), torchrun_env({"stall_threshold_s": 7}),
                      timeout_s=120, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    lines = sorted(line for line in finished.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 of 2 1 7 hello", "rank 1 of 2 1 7 hello"]
