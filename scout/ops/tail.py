"""Follow ``run_dir/reports.jsonl`` as it grows: each call returns the complete records appended
since the last one. Writers append one whole line under a lock (:mod:`scout.reports`), so a
line without its newline yet is held back until it is complete; a file that shrank or was
replaced is followed again from its start. Every read is bounded (``READ_BYTES_MAX``)."""

from __future__ import annotations

import json
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
    its start. ``offset`` is the byte offset of the next unread line.
    """

    def __init__(self, path: str | os.PathLike[str], *, from_end: bool) -> None:
        self.path = Path(path)
        self.offset = 0
        self._identity: tuple[int, int] | None = None
        if from_end:
            try:
                status = self.path.stat()
            except OSError:
                return
            self.offset = status.st_size
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
            try:
                value = json.loads(raw)
            except ValueError:
                continue  # a torn line from a crash elsewhere, as reports.read_records skips it
            if isinstance(value, dict) and value.get("schema") == reports.SCHEMA:
                records.append(value)
        return records
