"""Reading a completion coordinate out of a Flight Recorder dump (spec/observer.md INSTR-12).

PyTorch's Flight Recorder keeps, per process, a ring of its last collectives: one entry per
collective with the process group, ``collective_seq_id``, ``profiling_name`` (``nccl:all_reduce``),
input and output sizes and dtypes, ``time_created_ns`` (wall clock, at enqueue), ``state``
(``scheduled``, ``started``, ``completed``) and ``retired``, and per process group a status
(``last_enqueued_collective``, ``last_started_collective``, ``last_completed_collective``).
``torch._C._distributed_c10d._dump_fr_trace`` returns it pickled; torch 2.13 keeps it for NCCL
and for gloo when ``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is set before
the process group is made. The emulated backend (:mod:`scout.transport.nccl.emulated`) writes
the same format.

This module is the decision logic only -- a dump in, a coordinate out -- so it is tested on CPU
with recorded dumps (``tests/observer/flight_recorder_dumps.py``): no torch, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.core.guards import whole_number
from scout.core.observer import PendingState

__all__ = ["FORMAT_MAJOR", "TraceCoordinate", "TraceError", "coordinate_from_trace", "entry_fingerprint"]

#: The dump format this module reads (``version`` "2.x"; torch 2.13 writes "2.10").
FORMAT_MAJOR: Final = "2"


class TraceError(ValueError):
    """A dump that is not in the Flight Recorder format this module reads."""


@attrs.frozen
class TraceCoordinate:
    """What one dump says about one process group (PROGRESS-9's fields)."""

    enqueued: int
    completed: int
    pending_fingerprint: int = 0  # 0: the oldest pending entry is not in the dump's ring
    pending_state: PendingState = PendingState.NONE
    pending_since_ns: int = 0  # on the monotonic clock; 0 when unknown or nothing pending
    completed_fingerprint: int = 0  # of collective number ``completed``, when the ring holds it
    status_key: str | None = None  # the ``pg_status`` key the group was found under


def _op_name(profiling_name: str) -> str:
    # "nccl:all_reduce" / "gloo:broadcast" / "scoutemu:all_reduce": the backend prefix is the
    # same on every rank of a group, the operation is what the fingerprint describes.
    return profiling_name.split(":", 1)[-1]


def _metas(sizes: Sequence[Sequence[int]], dtypes: Sequence[str], *, with_shape: bool) -> tuple[TensorMeta, ...]:
    return tuple(
        TensorMeta(str(dtype), tuple(int(d) for d in size) if with_shape else None)
        for size, dtype in zip(sizes, dtypes, strict=False)
    )


def entry_fingerprint(entry: Mapping[str, Any], group_ranks: tuple[int, ...] | None) -> int:
    """The fingerprint of one Flight Recorder entry: operation, group, input and output dtypes
    and shapes (FINGERPRINT-1..3). All-to-all shapes are rank-dependent (uneven splits) and
    left out, as FINGERPRINT-4 leaves them out of a described call."""
    op = _op_name(str(entry.get("profiling_name", "")))
    uneven = "all_to_all" in op or "alltoall" in op
    call = CollectiveCall(
        op, group_ranks,
        _metas(entry.get("input_sizes") or (), entry.get("input_dtypes") or (), with_shape=not uneven),
        _metas(entry.get("output_sizes") or (), entry.get("output_dtypes") or (), with_shape=not uneven),
        detail=(("flight_recorder", 1),),
    )
    return fingerprint(call)


def _int(value: Any, what: str) -> int:
    if not whole_number(value):
        raise TraceError(f"{what} must be an int, got {value!r}")
    return value


def coordinate_from_trace(
    trace: Mapping[str, Any],
    group_name: str,
    *,
    group_ranks: tuple[int, ...] | None,
    started_known: bool,
    wall_minus_monotonic_ns: int,
    status_key: str | None = None,
) -> TraceCoordinate:
    """The completion coordinate of process group ``group_name`` in one dump.

    ``enqueued`` and ``completed`` come from the group's status (``pg_status``, keyed by the
    group's ``pg_id``: taken from the group's entries, else ``status_key``, else the group's
    name); the oldest pending collective is number ``completed + 1``, described by its entry
    when the dump has entries and the ring still holds it. Its state, when ``started_known``
    (NCCL with ``TORCH_NCCL_ENABLE_TIMING``, the emulated backend), is the entry's (``started``
    or ``scheduled``) or, without the entry, the status's ``last_started_collective``; otherwise
    unknown (gloo, NCCL without timing: the recorder never sees a start). A dump without
    entries (``includeCollectives=False``: microseconds, where a full one takes milliseconds)
    gives the numbers and the state, with fingerprints 0. Point-to-point entries are not
    collectives of the group's sequence and are skipped. ``wall_minus_monotonic_ns`` converts the
    entries' wall-clock enqueue times to the monotonic clock of the progress record."""
    version = str(trace.get("version", ""))
    if version.split(".", 1)[0] != FORMAT_MAJOR:
        raise TraceError(f"Flight Recorder dump version {version!r}; this reader knows {FORMAT_MAJOR}.x")
    entries = trace.get("entries") or []
    if not isinstance(entries, list):
        raise TraceError(f"'entries' must be a list, got {type(entries).__name__}")
    mine = [
        e for e in entries
        if isinstance(e, Mapping) and not e.get("is_p2p", False)
        and tuple(e.get("process_group") or ("",))[0] == group_name
    ]
    status_by_pg = trace.get("pg_status") or {}
    if not isinstance(status_by_pg, Mapping):
        raise TraceError(f"'pg_status' must be a mapping, got {type(status_by_pg).__name__}")
    pg_ids = {str(e.get("pg_id")) for e in mine if "pg_id" in e}
    keys = [*sorted(pg_ids), *([status_key] if status_key is not None else []), group_name]
    key = next((k for k in keys if k in status_by_pg), None)
    if key is None:
        return TraceCoordinate(0, 0)  # the group has issued no collective yet
    status = status_by_pg[key]
    enqueued = max(0, _int(status.get("last_enqueued_collective", 0), "last_enqueued_collective"))
    completed = max(0, _int(status.get("last_completed_collective", 0), "last_completed_collective"))
    started = _int(status.get("last_started_collective", -1), "last_started_collective")
    completed = min(completed, enqueued)
    last = next((e for e in mine if e.get("collective_seq_id") == completed), None) if completed else None
    completed_fingerprint = entry_fingerprint(last, group_ranks) if last is not None else 0
    if enqueued == completed:
        return TraceCoordinate(enqueued, completed, completed_fingerprint=completed_fingerprint, status_key=key)
    oldest = completed + 1
    entry = next((e for e in mine if e.get("collective_seq_id") == oldest), None)
    state = PendingState.UNKNOWN
    if started_known:
        reached = entry.get("state") in ("started", "completed") if entry is not None else started >= oldest
        state = PendingState.STARTED if reached else PendingState.ENQUEUED
    if entry is None:
        return TraceCoordinate(enqueued, completed, 0, state, 0, completed_fingerprint, key)
    created = entry.get("time_created_ns")
    since = max(0, _int(created, "time_created_ns") - wall_minus_monotonic_ns) if created is not None else 0
    return TraceCoordinate(enqueued, completed, entry_fingerprint(entry, group_ranks), state, since,
                           completed_fingerprint, key)
