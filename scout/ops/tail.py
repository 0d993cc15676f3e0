"""Follow ``run_dir/reports.jsonl`` as it grows: each call returns the complete records appended
since the last one. Writers append one whole line under a lock (:mod:`scout.reports`), so a
line without its newline yet is held back until it is complete; a file that shrank or was
replaced is followed again from its start. Every read is bounded (``READ_BYTES_MAX``). A line
that is not a report (:func:`scout.reports.parse_record`: torn, or of the wrong types) is
skipped and counted in ``skipped`` (spec/ops.md OPS-12): it never costs the lines after it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from scout import reports

__all__ = ["READ_BYTES_MAX", "ReportTail"]

#: Bytes read per call at most; a backlog larger than this is read over several calls.
READ_BYTES_MAX: Final = 4 << 20


class ReportTail:
    """The records appended to one reports file since the previous :meth:`read`.

    ``from_end``: start at the file's current end (only records written from now on), else at
    ``offset`` (the start of a line; 0, the file's start, by default). ``offset`` is the byte
    offset of the next unread line.
    """

    def __init__(self, path: str | os.PathLike[str], *, from_end: bool, offset: int = 0) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self.path = Path(path)
        self.offset = offset
        self.skipped = 0  # lines read that were not reports (OPS-12)
        self._identity: tuple[int, int] | None = None
        if from_end or offset:
            try:
                status = self.path.stat()
            except OSError:
                self.offset = 0
                return
            self.offset = status.st_size if from_end else offset
            self._identity = (status.st_dev, status.st_ino)

    def read(self, max_bytes: int = READ_BYTES_MAX) -> list[dict[str, Any]]:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        try:
            with open(self.path, "rb") as file:
                status = os.fstat(file.fileno())
                identity = (status.st_dev, status.st_ino)
                if self._identity is not None and identity != self._identity:
                    self.offset = 0  # the file was replaced: follow the new one from its start
                self._identity = identity
                if status.st_size < self.offset:
                    self.offset = 0  # truncated and rewritten
                file.seek(self.offset)
                data = file.read(max_bytes)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) >= max_bytes:  # one line longer than a read: skip it, it cannot be a report
                self.offset += len(data)
            return []
        self.offset += end + 1
        records = []
        for raw in data[: end + 1].splitlines():
            if not raw.strip():
                continue
            record = reports.parse_record(raw)
            if record is None:
                self.skipped += 1  # torn by a crash, or not a report: skipped as read_reports does
            else:
                records.append(record)
        return records
