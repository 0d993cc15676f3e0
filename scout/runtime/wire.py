"""Observer messages on the wire, and reports as JSON lines (schema in docs/observer.md).

Messages are encoded as plain tuples with :mod:`scout.transport.codec` (no pickle: a hostile or
corrupt datagram can at worst fail to decode) and checked field by field on the way in.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Final

from scout.core.observer import (
    Delegate,
    Evidence,
    Message,
    Outcome,
    Reply,
    Report,
    ReportKind,
    Request,
    RoundId,
    Scope,
    Stage,
)
from scout.transport import codec

__all__ = [
    "REPORT_SCHEMA",
    "WireError",
    "decode_message",
    "encode_message",
    "failure_report",
    "report_line",
    "report_record",
]

REPORT_SCHEMA: Final = "scout.observer.report/1"


class WireError(ValueError):
    """A datagram that is not a valid observer message."""


def _evidence_out(evidence: Evidence | None) -> Any:
    if evidence is None:
        return None
    return (evidence.step, evidence.op, evidence.fingerprint, int(evidence.stage), evidence.idle_s)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what} must be an int, got {type(value).__name__}")
    return value


def _float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WireError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise WireError(f"{what} must be a tuple of ints")
    return tuple(_int(v, what) for v in value)


def _evidence_in(value: Any) -> Evidence | None:
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 5:
        raise WireError(f"evidence must be a 5-tuple, got {value!r}")
    step, op, fingerprint, stage, idle_s = value
    try:
        stage_value = Stage(_int(stage, "stage"))
    except ValueError:
        raise WireError(f"unknown stage {stage!r}") from None
    return Evidence(_int(step, "step"), _int(op, "op"), _int(fingerprint, "fingerprint"), stage_value,
                    max(0.0, _float(idle_s, "idle_s")))


def _report_out(report: Report) -> Any:
    return (
        report.kind.value, report.outcome.value, report.scope.value, report.key,
        (report.round.initiator, report.round.number), report.decided_by, report.reporter,
        report.attributed, report.ahead, report.missing,
        tuple(_evidence_out(e) for e in report.evidence), report.idle_s, report.reason,
    )


def _report_in(value: Any) -> Report:
    if not isinstance(value, tuple) or len(value) != 13:
        raise WireError("a delegated report must be a 13-tuple")
    kind, outcome, scope, key, round_, decided_by, reporter, attributed, ahead, missing, evidence, idle_s, reason = value
    try:
        kind_value, outcome_value, scope_value = ReportKind(kind), Outcome(outcome), Scope(scope)
    except ValueError as error:
        raise WireError(str(error)) from None
    key_value = _ints(key, "key")
    round_value = _ints(round_, "round")
    if len(key_value) != 2 or len(round_value) != 2 or not isinstance(evidence, tuple) or not isinstance(reason, str):
        raise WireError("malformed delegated report")
    return Report(
        kind_value, outcome_value, scope_value, (key_value[0], key_value[1]), RoundId(*round_value),
        _int(decided_by, "decided_by"), _int(reporter, "reporter"), _ints(attributed, "attributed"),
        _ints(ahead, "ahead"), _ints(missing, "missing"), tuple(_evidence_in(e) for e in evidence),
        _float(idle_s, "idle_s"), reason[:500],
    )


def encode_message(message: Message) -> bytes:
    if isinstance(message, Request):
        payload: Any = ("q", message.round.initiator, message.round.number)
    elif isinstance(message, Reply):
        payload = ("r", message.round.initiator, message.round.number, message.sender, _evidence_out(message.evidence))
    else:
        payload = ("d", message.round.initiator, message.round.number, message.sender, _report_out(message.report))
    return codec.encode(payload)


def decode_message(data: bytes, group_size: int) -> Message:
    """Decode and check one message; WireError (never anything else) for bad input."""
    try:
        value = codec.decode(data)
    except codec.DecodeError as error:
        raise WireError(str(error)) from None
    if not isinstance(value, tuple) or not value or value[0] not in ("q", "r", "d"):
        raise WireError("not an observer message")
    try:
        tag = value[0]
        if tag == "q" and len(value) == 3:
            message: Message = Request(RoundId(_int(value[1], "initiator"), _int(value[2], "number")))
        elif tag == "r" and len(value) == 5:
            message = Reply(RoundId(_int(value[1], "initiator"), _int(value[2], "number")),
                            _int(value[3], "sender"), _evidence_in(value[4]))
        elif tag == "d" and len(value) == 5:
            message = Delegate(RoundId(_int(value[1], "initiator"), _int(value[2], "number")),
                               _int(value[3], "sender"), _report_in(value[4]))
        else:
            raise WireError(f"message {tag!r} has {len(value)} fields")
    except (TypeError, ValueError) as error:
        raise WireError(str(error)) from None
    positions = [message.round.initiator] + ([] if isinstance(message, Request) else [message.sender])
    if any(not 0 <= p < group_size for p in positions):
        raise WireError(f"positions {positions} outside the group of {group_size}")
    return message


def report_record(report: Report, *, group_ranks: tuple[int, ...], job_id: str, generation: int) -> dict[str, Any]:
    """The JSON object of one report (schema ``scout.observer.report/1``, docs/observer.md)."""

    def ranks(positions: tuple[int, ...]) -> list[int]:
        return [group_ranks[p] for p in positions]

    evidence: list[dict[str, Any]] = []
    for position, item in enumerate(report.evidence):
        if item is None:
            evidence.append({"rank": group_ranks[position], "missing": True})
        else:
            evidence.append({
                "rank": group_ranks[position], "step": item.step, "op": item.op,
                "fingerprint": f"{item.fingerprint:#018x}", "stage": item.stage.name.lower(),
                "idle_s": round(item.idle_s, 3),
            })
    return {
        "schema": REPORT_SCHEMA,
        "kind": report.kind.value,
        "scope": report.scope.value,
        "outcome": report.outcome.value,
        "attributed_ranks": ranks(report.attributed),
        "ahead_ranks": ranks(report.ahead),
        "missing_ranks": ranks(report.missing),
        "group_ranks": list(group_ranks),
        "stuck_position": {"step": report.key[0], "op": report.key[1]},
        "round": {"initiator_rank": group_ranks[report.round.initiator], "number": report.round.number},
        "decided_by_rank": group_ranks[report.decided_by],
        "reporter_rank": group_ranks[report.reporter],
        "idle_s": round(report.idle_s, 3),
        "evidence": evidence,
        "reason": report.reason,
        "job_id": job_id,
        "generation": generation,
        "time_unix_s": round(time.time(), 3),
    }


def failure_report(
    *, rank: int, group_ranks: tuple[int, ...], job_id: str, generation: int, reason: str, exit_code: int | None = None
) -> dict[str, Any]:
    """An ``observer_failure`` record: the observer of ``rank`` cannot do its job."""
    return {
        "schema": REPORT_SCHEMA,
        "kind": "observer_failure",
        "scope": "rank",
        "outcome": "observer_failure",
        "attributed_ranks": [rank],
        "ahead_ranks": [],
        "missing_ranks": [],
        "group_ranks": list(group_ranks),
        "reason": reason,
        "exit_code": exit_code,
        "job_id": job_id,
        "generation": generation,
        "time_unix_s": round(time.time(), 3),
    }


def report_line(record: dict[str, Any]) -> str:
    """One readable line for stderr."""
    if record["kind"] == "observer_failure":
        return f"scout: observer of rank {record['attributed_ranks'][0]} failed: {record['reason']}"
    where = record["stuck_position"]
    who = {
        "behind": f"rank(s) {record['attributed_ranks']} behind the majority",
        "desync": f"rank(s) {record['attributed_ranks']} entered a different collective",
        "group_stall": f"all ranks {record['group_ranks']} stuck at the same collective",
        "unresponsive": f"rank(s) {record['missing_ranks']} unresponsive",
        "inconclusive": "no strict majority",
    }[record["outcome"]]
    return (
        f"scout: {record['kind']} ({record['scope']}-scoped): {who} at step {where['step']} op {where['op']}, "
        f"idle {record['idle_s']} s; reported by rank {record['reporter_rank']} (round "
        f"{record['round']['initiator_rank']}/{record['round']['number']})"
    )


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)
