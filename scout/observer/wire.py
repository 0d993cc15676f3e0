"""Observer messages on the wire, and observer findings as report records (``scout.report/1``).

Messages are encoded as plain tuples with :mod:`scout.transport.codec` (no pickle: a hostile or
corrupt datagram can at worst fail to decode) and checked field by field on the way in.
"""

from __future__ import annotations

import math
from typing import Any, Final

from scout import reports
from scout.core.guards import whole_number
from scout.core.observer import (
    COMPLETION_GROUPS_MAX,
    Completion,
    Delegate,
    Evidence,
    Finding,
    FindingCode,
    HostContract,
    Message,
    PendingState,
    Reply,
    Request,
    RoundId,
    Scope,
    Stage,
    StallKind,
    StallReport,
)
from scout.reports.kinds import ObserverReason, ReportKind, observer_kind, observer_reason
from scout.transport import codec

__all__ = [
    "WireError",
    "decode_message",
    "encode_message",
    "failure_record",
    "report_kind",
    "report_record",
]


class WireError(ValueError):
    """A datagram that is not a valid observer message."""


def _completion_out(completion: Completion) -> Any:
    return (completion.source, completion.enqueued, completion.completed, completion.pending_fingerprint,
            int(completion.pending_state), completion.completed_fingerprint, int(completion.point_to_point))


_STALE_FLAG: Final = 2  # bit 1 of an evidence's flags; bit 0 is the host contract (PROGRESS-13)


def _evidence_out(evidence: Evidence | None) -> Any:
    """Evidence is a 5-tuple without completion tracking or contract; an 8-tuple with them:
    the coordinates, their pending ages, and flags (host contract, stale section)."""
    if evidence is None:
        return None
    flags = int(evidence.contract) | (_STALE_FLAG if evidence.completion_stale else 0)
    if not evidence.completions and not flags:
        return (evidence.step, evidence.op, evidence.fingerprint, int(evidence.stage), evidence.idle_s)
    return (evidence.step, evidence.op, evidence.fingerprint, int(evidence.stage), evidence.idle_s,
            tuple(_completion_out(c) for c in evidence.completions), tuple(evidence.pending_age_s), flags)


def _int(value: Any, what: str) -> int:
    if not whole_number(value):
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


def _completion_in(value: Any) -> Completion:
    if not isinstance(value, tuple) or len(value) != 7:
        raise WireError(f"completion must be a 7-tuple, got {value!r}")
    source, enqueued, completed, pending_fingerprint, pending_state, completed_fingerprint, p2p = value
    try:
        state = PendingState(_int(pending_state, "pending_state"))
    except ValueError:
        raise WireError(f"unknown pending state {pending_state!r}") from None
    if _int(p2p, "point_to_point") not in (0, 1):
        raise WireError(f"point_to_point must be 0 or 1, got {p2p!r}")
    try:
        return Completion(_int(source, "source"), _int(enqueued, "enqueued"), _int(completed, "completed"),
                          _int(pending_fingerprint, "pending_fingerprint"), state,
                          _int(completed_fingerprint, "completed_fingerprint"), bool(p2p))
    except ValueError as error:  # the value's own checks (completed <= enqueued, ...)
        raise WireError(str(error)) from None


def _evidence_in(value: Any) -> Evidence | None:
    """Evidence is a 5-tuple without completion tracking, an 8-tuple with it (PROGRESS-9, PROGRESS-13)."""
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) not in (5, 8):
        raise WireError(f"evidence must be a 5- or 8-tuple, got {value!r}")
    step, op, fingerprint, stage, idle_s = value[:5]
    try:
        stage_value = Stage(_int(stage, "stage"))
    except ValueError:
        raise WireError(f"unknown stage {stage!r}") from None
    completions: tuple[Completion, ...] = ()
    ages: tuple[float, ...] = ()
    contract, stale = HostContract.BLOCKING, False
    if len(value) == 8:
        items, age_items, flags = value[5:]
        if not isinstance(items, tuple) or not isinstance(age_items, tuple) or len(items) != len(age_items):
            raise WireError("evidence's completions and pending ages must be tuples of one length")
        if len(items) > COMPLETION_GROUPS_MAX:
            raise WireError(f"evidence carries {len(items)} completion coordinates, more than {COMPLETION_GROUPS_MAX}")
        completions = tuple(_completion_in(item) for item in items)
        if len({c.source for c in completions}) != len(completions):
            raise WireError("evidence names a group's completion twice")
        ages = tuple(max(0.0, _float(age, "pending_age_s")) for age in age_items)
        flag_bits = _int(flags, "flags")
        if flag_bits & ~(1 | _STALE_FLAG):
            raise WireError(f"unknown evidence flags {flag_bits:#x}")
        contract, stale = HostContract(flag_bits & 1), bool(flag_bits & _STALE_FLAG)
    return Evidence(_int(step, "step"), _int(op, "op"), _int(fingerprint, "fingerprint"), stage_value,
                    max(0.0, _float(idle_s, "idle_s")), completions, ages, contract, stale)


def _report_out(report: StallReport) -> Any:
    return (
        report.kind.value, report.outcome.value, report.scope.value, report.key,
        (report.round.initiator, report.round.number), report.decided_by, report.reporter,
        report.attributed, report.ahead, report.missing,
        tuple(_evidence_out(e) for e in report.evidence), report.idle_s, report.reason, report.blocking,
        report.source, int(report.code),
    )


def _report_in(value: Any) -> StallReport:
    if not isinstance(value, tuple) or len(value) != 16:
        raise WireError("a delegated report must be a 16-tuple")
    (kind, outcome, scope, key, round_, decided_by, reporter, attributed, ahead, missing, evidence, idle_s, reason,
     blocking, source, code) = value
    try:
        kind_value, outcome_value, scope_value = StallKind(kind), Finding(outcome), Scope(scope)
    except ValueError as error:
        raise WireError(str(error)) from None
    if outcome_value is Finding.UNSETTLED:
        # A round's internal outcome, never reported: it has no report kind or reason.
        raise WireError("a delegated report cannot be unsettled")
    key_value = _ints(key, "key")
    round_value = _ints(round_, "round")
    if len(key_value) != 2 or len(round_value) != 2 or not isinstance(evidence, tuple) or not isinstance(reason, str):
        raise WireError("malformed delegated report")
    try:
        code_value = FindingCode(_int(code, "code"))
    except ValueError:
        raise WireError(f"unknown finding code {code!r} in a delegated report") from None
    source_value = _int(source, "source")
    if not 0 <= source_value < 2**64:
        raise WireError(f"source {source_value} outside [0, 2**64)")
    return StallReport(
        kind_value, outcome_value, scope_value, (key_value[0], key_value[1]), RoundId(*round_value),
        _int(decided_by, "decided_by"), _int(reporter, "reporter"), _ints(attributed, "attributed"),
        _ints(ahead, "ahead"), _ints(missing, "missing"), tuple(_evidence_in(e) for e in evidence),
        _float(idle_s, "idle_s"), reason[:500], _count(blocking, "blocking"), source_value, code_value,
    )


def _count(value: Any, what: str) -> int:
    number = _int(value, what)
    if number < 0:
        raise WireError(f"{what} must be >= 0, got {number}")
    return number


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
    if isinstance(message, Delegate):
        report = message.report
        positions += [report.round.initiator, report.decided_by, report.reporter, *report.attributed,
                      *report.ahead, *report.missing]
        if len(report.evidence) != group_size:
            raise WireError(f"a delegated report carries {len(report.evidence)} pieces of evidence for a group of {group_size}")
        for name, items in (("attributed", report.attributed), ("ahead", report.ahead), ("missing", report.missing)):
            if len(set(items)) != len(items):
                raise WireError(f"a delegated report names {name} positions {list(items)} more than once")
    if any(not 0 <= p < group_size for p in positions):
        raise WireError(f"positions {positions} outside the group of {group_size}")
    if message.round.number < 1:
        raise WireError(f"round number {message.round.number} must be >= 1")
    return message


def report_kind(report: StallReport) -> ReportKind:
    """The ``kind`` of an observer finding in the report schema (:func:`scout.reports.kinds.observer_kind`)."""
    return observer_kind(report.outcome, report.kind)


def report_record(
    report: StallReport,
    *,
    group_ranks: tuple[int, ...],
    job_id: str,
    generation: int,
    hosts: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The ``scout.report/1`` record of one observer report (docs/observer.md). ``hosts`` names
    each group position's host, when known."""
    size = len(group_ranks)
    positions = [*report.attributed, *report.ahead, *report.missing, report.round.initiator, report.decided_by,
                 report.reporter]
    if len(report.evidence) != size or any(not 0 <= p < size for p in positions):
        raise WireError(f"report positions {positions} or evidence of {len(report.evidence)} do not fit a group of {size}")

    def ranks(items: tuple[int, ...]) -> list[int]:
        return [group_ranks[p] for p in items]

    peers: list[dict[str, Any]] = []
    for position, item in enumerate(report.evidence):
        if item is None:
            peers.append({"rank": group_ranks[position], "missing": True})
        else:
            peer: dict[str, Any] = {
                "rank": group_ranks[position], "step": item.step, "op": item.op,
                "fingerprint": f"{item.fingerprint:#018x}", "stage": item.stage.name.lower(),
                "idle_s": round(item.idle_s, 3),
            }
            peer["host_contract"] = item.contract.name.lower()
            if item.completion_stale:
                peer["completion_stale"] = True
            own = item.completion_of(report.source) if report.source else item.completion
            if own is not None:
                peer["completion"] = _completion_record(own, item.age_of(own.source))
            peers.append(peer)
    at_fault = report.missing if report.outcome is Finding.UNRESPONSIVE else report.attributed
    return reports.make_record(
        report_kind(report),
        reason=observer_reason(report.outcome, report.attributed, report.ahead, code=report.code, group_size=size),
        job_id=job_id,
        generation=generation,
        ranks=ranks(at_fault),
        hosts=[hosts[p] for p in at_fault] if hosts is not None else [],
        step=max(0, report.key[0]),
        reporter_rank=group_ranks[report.reporter],
        evidence={
            "scope": report.scope.value,
            "finding": report.outcome.value,
            "stuck_position": {"step": report.key[0], "op": report.key[1]},
            "group_ranks": list(group_ranks),
            "attributed_ranks": ranks(report.attributed),
            "ahead_ranks": ranks(report.ahead),
            "missing_ranks": ranks(report.missing),
            "round": {"initiator_rank": group_ranks[report.round.initiator], "number": report.round.number},
            "decided_by_rank": group_ranks[report.decided_by],
            "idle_s": round(report.idle_s, 3),
            "peers": peers,
            "basis": "completion" if report.blocking else "progress",
            "blocking_collective": report.blocking or None,
            "blocking_group": f"{report.source:#018x}" if report.source else None,
            "detail": report.reason,
        },
    )


def _completion_record(completion: Completion, age_s: float) -> dict[str, Any]:
    """One peer's completion coordinate in a report (docs/observer.md "Report schema")."""
    record: dict[str, Any] = {
        "source": f"{completion.source:#018x}", "enqueued": completion.enqueued, "completed": completion.completed,
        "completed_fingerprint": f"{completion.completed_fingerprint:#018x}",
    }
    if completion.pending:
        record["pending"] = {
            "sequence": completion.completed + 1, "fingerprint": f"{completion.pending_fingerprint:#018x}",
            "state": completion.pending_state.name.lower(), "age_s": round(age_s, 3),
        }
    return record


def failure_record(
    *, rank: int, job_id: str, generation: int, reason: str, host: str | None = None, exit_code: int | None = None
) -> dict[str, Any]:
    """An ``observer_failure`` record: the observer of ``rank`` cannot do its job."""
    return reports.make_record(
        ReportKind.OBSERVER_FAILURE, reason=ObserverReason.OBSERVER_FAILED, job_id=job_id, generation=generation,
        ranks=[rank], hosts=[host] if host else [], reporter_rank=rank,
        evidence={"detail": reason[:2000], "exit_code": exit_code},
    )
