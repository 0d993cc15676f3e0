"""What a job writes into its run directory (docs/attach.md): ``reports.jsonl`` (one
``scout.report/1`` record per line), ``timing.jsonl`` (one ``scout.timing/1`` record per
straggler check, spec/replay.md LOOP-6), ``exclude_hosts.txt`` (the hosts at fault, for the
scheduler), the gate's manifest under ``gate/``, and ``job.json``, the job ids the directory
is bound to (spec/recovery.md RECOVERY-6)."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from scout import reports
from scout.core.io_errors import name_write_error
from scout.reports.kinds import CheckpointReason, ReportKind
from scout.reports.timing import TIMING_FILE, TimingLog

__all__ = ["ADOPT_VARIABLE", "EXCLUDE_HOSTS_FILE", "GATE_DIR", "JOB_FILE", "RunDir", "bind", "bound_jobs",
           "check_binding", "our_records"]

logger = logging.getLogger("scout")

GATE_DIR: Final = "gate"
EXCLUDE_HOSTS_FILE: Final = "exclude_hosts.txt"
JOB_FILE: Final = "job.json"
#: RECOVERY-6: set to 1 to adopt a run directory bound to another job (``adopt_run_dir=True``).
ADOPT_VARIABLE: Final = "SCOUT_ADOPT_RUN_DIR"
JOB_FILE_BYTES_MAX: Final = 1 << 20


def bound_jobs(path: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """The job ids ``path`` is bound to, oldest first; None when it is not bound (RECOVERY-6).
    A binding that cannot be read is a ``ValueError`` naming the file."""
    file = Path(path) / JOB_FILE
    try:
        with open(file, "rb") as stream:
            text = stream.read(JOB_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    try:
        if len(text) > JOB_FILE_BYTES_MAX:
            raise ValueError(f"over {JOB_FILE_BYTES_MAX} bytes")
        jobs = json.loads(text)["jobs"]
        if not isinstance(jobs, list) or not jobs or not all(isinstance(j, str) and j for j in jobs):
            raise ValueError(f"'jobs' is not a list of job ids: {jobs!r:.200}")
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise ValueError(f"the run directory's binding {file} cannot be read ({error}); remove it to bind the "
                         "directory to this job") from None
    return tuple(jobs)


def our_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """RECOVERY-6: the reports in run directory ``path`` written by the jobs it is bound to (every
    report when it is not bound); none when it holds no reports yet."""
    file = Path(path) / reports.REPORTS_FILE
    if not file.exists():
        return []
    jobs = bound_jobs(path)
    return [record for record in reports.read_records(file) if jobs is None or record["job_id"] in jobs]


def check_binding(path: str | os.PathLike[str], job_id: str, *, adopt: bool) -> tuple[str, ...]:
    """RECOVERY-6: the ids ``path`` is to be bound to for job ``job_id``; raises ``ValueError``
    with the one line for the user when it belongs to another job and ``adopt`` is false."""
    jobs = bound_jobs(path)
    if jobs is None:
        return (job_id,)
    if job_id in jobs:
        return jobs
    if adopt:
        return (*jobs, job_id)
    raise ValueError(
        f"run_dir {str(path)!r} belongs to job {jobs[-1]!r}, not to this job {job_id!r}: to start fresh pass "
        f"another run_dir (or remove this one); to continue that run, adopt it with adopt_run_dir=True or "
        f"{ADOPT_VARIABLE}=1")


def bind(path: str | os.PathLike[str], jobs: Sequence[str]) -> None:
    """Write the binding (atomically: a reader sees the old one or the new one)."""
    target = Path(path) / JOB_FILE
    if bound_jobs(path) == tuple(jobs):
        return
    temporary = target.with_name(f".{JOB_FILE}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps({"jobs": list(jobs), "bound": datetime.datetime.now(datetime.timezone.utc)
                                         .isoformat(timespec="seconds")}) + "\n", encoding="utf-8")
        os.replace(temporary, target)
    except OSError as error:  # spec/ops.md OPS-13: a full run_dir names itself
        with contextlib.suppress(OSError):
            temporary.unlink()
        named = name_write_error(error, target, "binding the run directory")
        if named is error:
            raise
        raise named from error


class RunDir:
    """The report sink of the reporting rank (``scout.job.gate_driver.ReportSink``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.reports_path = self.path / reports.REPORTS_FILE
        self.exclude_hosts_path = self.path / EXCLUDE_HOSTS_FILE
        self.gate_path = self.path / GATE_DIR
        self.timing_log = TimingLog(self.path / TIMING_FILE)

    def write(self, record: Mapping[str, Any]) -> None:
        try:
            reports.append_record(self.reports_path, record)
        except OSError as error:
            logger.warning("scout: could not append to %s: %s", self.reports_path, error)
        if ReportKind(record["kind"]).warns or record["reason"] == CheckpointReason.QUARANTINED:
            logger.warning("%s", reports.record_line(record))

    def exclude_hosts(self, hosts: Sequence[str]) -> None:
        reports.append_hosts(self.exclude_hosts_path, list(hosts))

    def timing(self, record: Mapping[str, Any]) -> None:
        self.timing_log.write(record)

    def records(self) -> list[dict[str, Any]]:
        return reports.read_records(self.reports_path)
