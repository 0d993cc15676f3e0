"""The event trace: what happened in a run, as compact records, in the order it happened.

A record is a plain tuple ``(time_s, rank, program, event, detail)``:

* ``time_s``  -- virtual time in seconds;
* ``rank``    -- global rank, or -1 for the cluster itself (faults that span ranks);
* ``program`` -- the program's name on that rank ("" for the cluster);
* ``event``   -- a short word: ``start``, ``exit``, ``exchange``, ``exchange-done``,
  ``all_gather``, ``deadline``, ``fault``, ``crash``, ``freeze``, ``thaw``, ``corrupt``, ...;
* ``detail``  -- ints, floats, strings and tuples of them (never objects with addresses).

Two runs with the same seed and scenario produce equal traces; :meth:`Trace.digest` condenses
a trace to a hex string for cheap comparison across processes. Records are only plain data, so
the digest does not depend on ``PYTHONHASHSEED`` or memory layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["DEFAULT_MAX_TRACE_RECORDS", "Trace", "TraceRecord", "format_record"]

DEFAULT_MAX_TRACE_RECORDS = 5_000_000

TraceRecord = tuple[float, int, str, str, Any]


class Trace:
    """An append-only list of records with a bound; past the bound, records are counted only."""

    __slots__ = ("max_records", "omitted", "records")

    def __init__(self, max_records: int = DEFAULT_MAX_TRACE_RECORDS) -> None:
        if max_records < 0:
            raise ValueError(f"max_records must be >= 0, got {max_records}")
        self.max_records = max_records
        self.records: list[TraceRecord] = []
        self.omitted = 0  # records not kept because the bound was reached

    def add(self, time_s: float, rank: int, program: str, event: str, detail: Any = ()) -> None:
        if len(self.records) < self.max_records:
            self.records.append((time_s, rank, program, event, detail))
        else:
            self.omitted += 1

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[TraceRecord]:
        return iter(self.records)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return self.records == other.records and self.omitted == other.omitted

    __hash__ = None  # type: ignore[assignment]  # mutable

    def where(self, event: str) -> list[TraceRecord]:
        """The records of one kind of event, in order."""
        return [record for record in self.records if record[3] == event]

    def digest(self) -> str:
        """SHA-256 over the records' text form: equal digests mean equal traces."""
        hasher = hashlib.sha256()
        for record in self.records:
            hasher.update(format_record(record).encode("utf-8"))
            hasher.update(b"\n")
        hasher.update(f"omitted={self.omitted}".encode("ascii"))
        return hasher.hexdigest()

    def format(self, limit: int | None = None) -> str:
        records: Iterable[TraceRecord] = self.records if limit is None else self.records[:limit]
        lines = [format_record(record) for record in records]
        shown = len(lines)
        if shown < len(self.records) or self.omitted:
            lines.append(f"... {len(self.records) - shown + self.omitted} more records")
        return "\n".join(lines)


def format_record(record: TraceRecord) -> str:
    time_s, rank, program, event, detail = record
    # repr() of floats is exact and of ints/strings/tuples deterministic, so the text form is
    # a faithful, host-independent encoding of the record.
    where = f"rank {rank}/{program}" if rank >= 0 else "cluster"
    return f"{time_s!r} {where} {event} {detail!r}"
