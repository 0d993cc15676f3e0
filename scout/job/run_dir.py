"""What a job writes into its run directory (docs/attach.md): ``reports.jsonl`` (one
``scout.report/1`` record per line), ``exclude_hosts.txt`` (the hosts at fault, for the
scheduler) and the gate's manifest under ``gate/``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from scout import reports
from scout.reports.kinds import ReportKind

__all__ = ["EXCLUDE_HOSTS_FILE", "GATE_DIR", "RunDir"]

logger = logging.getLogger("scout")

GATE_DIR: Final = "gate"
EXCLUDE_HOSTS_FILE: Final = "exclude_hosts.txt"


class RunDir:
    """The report sink of the reporting rank (``scout.job.gate_driver.ReportSink``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.reports_path = self.path / reports.REPORTS_FILE
        self.exclude_hosts_path = self.path / EXCLUDE_HOSTS_FILE
        self.gate_path = self.path / GATE_DIR

    def write(self, record: Mapping[str, Any]) -> None:
        try:
            reports.append_record(self.reports_path, record)
        except OSError as error:
            logger.warning("scout: could not append to %s: %s", self.reports_path, error)
        if ReportKind(record["kind"]).warns or record["reason"] == "quarantined":
            logger.warning("%s", reports.record_line(record))

    def exclude_hosts(self, hosts: Sequence[str]) -> None:
        reports.append_hosts(self.exclude_hosts_path, list(hosts))

    def records(self) -> list[dict[str, Any]]:
        return reports.read_records(self.reports_path)
