"""Spent restarts are said (spec/recovery.md RECOVERY-5): the launcher's last attempt, stopped by
the fault policy, writes a ``restart``/``exhausted`` report naming who was at fault in every
attempt, and its ``FaultDetected`` does not promise a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.job.gate_driver import Reporter, restarts_left
from scout.job.pipeline import FaultDetected, Stop
from scout.reports.kinds import ReportKind, Source, at_fault_in_every_attempt
from scout.reports.picture import attempts_of
from scout.reports.summary import load_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
THRESHOLD_S = 2.0
OBSERVER_KINDS = {kind.value for kind in ReportKind if kind.source is Source.OBSERVER}


def _record(kind: ReportKind, generation: int, ranks: list[int], reason: str = "x") -> dict[str, Any]:
    return reports.make_record(kind, reason=reason, job_id="j", generation=generation, ranks=ranks,
                               hosts=[f"h{r // 2}" for r in ranks], step=10, reporter_rank=0)


def test_RECOVERY_5_restarts_left_is_what_torchrun_says_and_none_elsewhere() -> None:
    assert restarts_left({"TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "1"}) == 1
    assert restarts_left({"TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "2"}) == 0
    assert restarts_left({"TORCHELASTIC_MAX_RESTARTS": "0"}) == 0
    assert restarts_left({}) is None
    assert restarts_left({"TORCHELASTIC_MAX_RESTARTS": "many"}) is None


def test_RECOVERY_5_at_fault_in_every_attempt_is_the_intersection_over_the_attempts_that_wrote_reports() -> None:
    records = [
        _record(ReportKind.RESTART, 0, [], "started"), _record(ReportKind.SDC, 0, [1, 3]),
        _record(ReportKind.RESTART, 0, [1, 3], "sdc"),
        _record(ReportKind.RESTART, 1, [], "restored"), _record(ReportKind.HANG, 1, [1]),
        _record(ReportKind.STRAGGLER, 1, [3], "confirmed"),  # a straggler is a fault with a failure class
        _record(ReportKind.CHECKPOINT, 1, [2], "quarantined"),  # not a fault: names nobody at fault
    ]
    assert at_fault_in_every_attempt(records, 2, [1, 2], ["h0", "h1"]) == ((1,), ("h0", "h1"))
    assert at_fault_in_every_attempt(records[:3], 2, [3], ["h1"]) == ((3,), ("h1",))
    assert at_fault_in_every_attempt([*records, _record(ReportKind.RESTART, 1, [], "x")], 2, [2], ["h9"]) == ((), ())
    assert at_fault_in_every_attempt([], 0, [2], ["h1"]) == ((2,), ("h1",))  # the first attempt is every attempt


class _Sink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Any) -> None:
        self.records.append(dict(record))

    def exclude_hosts(self, hosts: Any) -> None:
        pass

    def timing(self, record: Any) -> None:
        pass


def test_RECOVERY_5_the_last_attempts_stop_is_an_exhausted_restart_report_and_fault_detected_says_so() -> None:
    earlier = [_record(ReportKind.SDC, 0, [1]), _record(ReportKind.SDC, 1, [1, 2])]
    sink = _Sink()
    reporter = Reporter(sink, job_id="j", generation=2, hosts=["h0", "h0", "h1", "h1"], rank=0, restarts_left=0,
                        earlier_records=lambda: earlier)
    stop = Stop(ReportKind.SDC, 30, (1,), ("h0",), "attributed", restarts_spent=True)
    reporter.stopped(stop)
    (record,) = sink.records
    assert (record["kind"], record["reason"], record["ranks"], record["hosts"]) == ("restart", "exhausted", [1], ["h0"])
    assert record["evidence"]["attempts"] == 3 and record["evidence"]["fault"] == "sdc"
    assert "restarts are spent" in str(FaultDetected.of(stop))
    assert "launcher restarts it" in str(FaultDetected.of(Stop(ReportKind.SDC, 30, (1,), ("h0",), "attributed")))


@pytest.mark.torchdist
@pytest.mark.slow  # a 4-rank torchrun job (77 s at load 20 on 2 cores); the tests above are its bounded versions
def test_RECOVERY_5_under_torchrun_without_restarts_an_sdc_stop_says_the_restarts_are_spent(tmp_path: Path) -> None:
    """Also PROGRESS-11 for ``FaultDetected``: every rank takes THRESHOLD_S + 3 s to exit after
    it, and no observer reads that as a stall."""
    run_dir = tmp_path / "run"
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "SCOUT_ON_SDC": "restart",
                "SCOUT_STALL_THRESHOLD_S": str(THRESHOLD_S), "SCOUT_RECHECK_INTERVAL_S": "1.0",
                "SCOUT_ROUND_DEADLINE_S": "0.5"})
    command = [str(TORCHRUN), "--nproc-per-node", "4", "--standalone", "--max-restarts", "0", str(EXAMPLE),
               "--steps", "24", "--run-dir", str(run_dir), "--checkpoint-dir", str(tmp_path / "ckpt"),
               "--fault", f"sdc:1:9,slow-exit:-1:{THRESHOLD_S + 3}"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode != 0, run.stderr[-3000:]
    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    (sdc,) = [r for r in records if r["kind"] == "sdc"]
    assert [reports.record_line(r) for r in records if r["kind"] in OBSERVER_KINDS] == []
    (exhausted,) = [r for r in records if r["kind"] == "restart" and r["reason"] == "exhausted"]
    assert (exhausted["ranks"], exhausted["hosts"], exhausted["step"]) == ([1], sdc["hosts"], sdc["step"])
    assert [r for r in records if r["kind"] == "restart" and r["reason"] == "sdc"] == []
    assert run.stderr.count("scout: restarts are spent: the job stops at step") == 1, run.stderr[-3000:]
    assert "launcher restarts it" not in run.stderr
    (attempt,) = attempts_of(load_run(run_dir))
    assert attempt.ended == f"job stopped at step {sdc['step']}: restarts spent" and attempt.ended_badly


@pytest.mark.torchdist
@pytest.mark.slow  # a 4-rank torchrun job with a 7 s hang; the unit tests above are its bounded versions
def test_RECOVERY_5_under_torchrun_without_restarts_a_hang_stopped_by_the_observer_says_the_restarts_are_spent(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "SCOUT_ON_HANG": "restart",
                "SCOUT_STALL_THRESHOLD_S": "3", "SCOUT_RECHECK_INTERVAL_S": "2"})
    command = [str(TORCHRUN), "--nproc-per-node", "4", "--standalone", "--max-restarts", "0", str(EXAMPLE),
               "--steps", "14", "--run-dir", str(run_dir), "--fault", "hang-before-backward:2:10:30"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode != 0, run.stderr[-3000:]
    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    (hang,) = [r for r in records if r["kind"] == "hang"]
    (exhausted,) = [r for r in records if r["kind"] == "restart" and r["reason"] == "exhausted"]
    assert (exhausted["ranks"], exhausted["hosts"], exhausted["step"]) == ([2], hang["hosts"], hang["step"])
    assert exhausted["evidence"]["policy"] == "on_hang=restart"
    assert run.stderr.count("scout: restarts are spent: the job stops at step") == 1, run.stderr[-3000:]
    assert "the restarts are spent, so the job stops" in run.stderr
