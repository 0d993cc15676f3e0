"""The observer wire's rules stated whole (scout/observer/wire.py; docs/observer.md "Report
schema"): every refusal of a delegated report, a completion coordinate or a piece of evidence
with its exact message, and the ``scout.report/1`` records of observer findings and failures
compared field by field (issue 26: the observer-wire mutation target's survivors)."""

from __future__ import annotations

from typing import Any

import pytest

from scout.core.observer import (
    Completion,
    Delegate,
    Evidence,
    Finding,
    HostContract,
    PendingState,
    Reply,
    RoundId,
    Scope,
    Stage,
    StallKind,
    StallReport,
)
from scout.observer import wire
from scout.transport import codec

RANKS = (10, 11, 12, 13)
PLAIN = Evidence(4, 2, 0xAB, Stage.COMPUTE, 1.23456)
PENDING = Completion(0x77, 12, 10, 0xF00D, PendingState.STARTED, 0xBEEF)
TRACKED = Evidence(4, 2, 0xAB, Stage.COLLECTIVE, 0.5, PENDING, 2.3456)
IDLE_DONE = Evidence(4, 2, 0xAB, Stage.IDLE, 0.0, Completion(0x77, 10, 10, 0, PendingState.NONE, 0xBEEF), 0.0)


def report(outcome: Finding, **changes: Any) -> StallReport:
    fields: dict[str, Any] = dict(
        kind=StallKind.HANG, outcome=outcome, scope=Scope.RANK, key=(4, 2), round=RoundId(2, 7), decided_by=3,
        reporter=1, attributed=(0,), ahead=(), missing=(), evidence=(PLAIN, TRACKED, IDLE_DONE, None),
        idle_s=6.54321, reason="why", blocking=0)
    fields.update(changes)
    return StallReport(**fields)


def record(item: StallReport, hosts: tuple[str, ...] | None = None) -> dict[str, Any]:
    out = wire.report_record(item, group_ranks=RANKS, job_id="job-1", generation=5, hosts=hosts)
    assert out.pop("time")
    return out


def peers() -> list[dict[str, Any]]:
    return [
        {"rank": 10, "step": 4, "op": 2, "fingerprint": "0x00000000000000ab", "stage": "compute", "idle_s": 1.235,
         "host_contract": "blocking"},
        {"rank": 11, "step": 4, "op": 2, "fingerprint": "0x00000000000000ab", "stage": "collective", "idle_s": 0.5,
         "host_contract": "blocking", "completion": {"source": "0x0000000000000077", "enqueued": 12, "completed": 10,
                        "completed_fingerprint": "0x000000000000beef",
                        "pending": {"sequence": 11, "fingerprint": "0x000000000000f00d", "state": "started",
                                    "age_s": 2.346}}},
        {"rank": 12, "step": 4, "op": 2, "fingerprint": "0x00000000000000ab", "stage": "idle", "idle_s": 0.0,
         "host_contract": "blocking", "completion": {"source": "0x0000000000000077", "enqueued": 10, "completed": 10,
                        "completed_fingerprint": "0x000000000000beef"}},
        {"rank": 13, "missing": True},
    ]


def expected(kind: str, reason: str, finding: str, ranks: list[int], hosts: list[str], **evidence: Any) -> dict[str, Any]:
    return {
        "schema": "scout.report/1", "kind": kind, "source": "observer", "reason": reason, "job_id": "job-1",
        "generation": 5, "ranks": ranks, "hosts": hosts, "step": 4, "reporter_rank": 11,
        "evidence": {
            "scope": "rank", "finding": finding, "stuck_position": {"step": 4, "op": 2}, "group_ranks": [10, 11, 12, 13],
            "attributed_ranks": [10], "ahead_ranks": [], "missing_ranks": [],
            "round": {"initiator_rank": 12, "number": 7}, "decided_by_rank": 13, "idle_s": 6.543, "peers": peers(),
            "basis": "progress", "blocking_collective": None, "blocking_group": None, "detail": "why", **evidence,
        },
    }


HOSTS = ("h10", "h11", "h12", "h13")


def test_OBS_wire_a_behind_rank_is_reported_as_its_stall_kind_behind_or_ahead_of_the_majority() -> None:
    assert record(report(Finding.BEHIND), HOSTS) == expected("hang", "behind-majority", "behind", [10], ["h10"])
    ahead = report(Finding.BEHIND, kind=StallKind.DATA_STALL, attributed=(0, 2), ahead=(2, 0))
    assert record(ahead) == expected("data_stall", "ahead-of-majority", "behind", [10, 12], [],
                                     attributed_ranks=[10, 12], ahead_ranks=[12, 10])
    partly = report(Finding.BEHIND, kind=StallKind.CHECKPOINT_STALL, attributed=(0, 2), ahead=(2,))
    assert record(partly) == expected("checkpoint_stall", "behind-majority", "behind", [10, 12], [],
                                      attributed_ranks=[10, 12], ahead_ranks=[12])


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [(Finding.DESYNC, "collective-differs"), (Finding.GROUP_STALL, "same-point-same-collective"),
     (Finding.INCONCLUSIVE, "no-majority")],
)
def test_OBS_wire_other_findings_are_their_own_kind_with_their_reason(outcome: Finding, reason: str) -> None:
    assert wire.report_kind(report(outcome)) == outcome.value
    assert record(report(outcome, missing=(3,)), HOSTS) == expected(
        outcome.value, reason, outcome.value, [10], ["h10"], missing_ranks=[13])


def test_OBS_wire_an_unresponsive_group_names_the_missing_ranks_not_the_attributed() -> None:
    item = report(Finding.UNRESPONSIVE, missing=(3, 1), scope=Scope.GROUP, key=(-1, 0), blocking=9)
    out = record(item, HOSTS)
    wanted = expected("unresponsive", "no-answer", "unresponsive", [13, 11], ["h11", "h13"], missing_ranks=[13, 11],
                      scope="group", stuck_position={"step": -1, "op": 0}, basis="completion", blocking_collective=9)
    wanted["step"] = 0  # the record's step is never negative; the stuck position keeps -1 (hosts: sorted by make_record)
    assert out == wanted


def test_OBS_wire_report_record_refuses_each_position_outside_the_group_and_evidence_of_another_size() -> None:
    for changes in (dict(attributed=(4,)), dict(ahead=(-1,)), dict(missing=(4,)), dict(round=RoundId(4, 1)),
                    dict(decided_by=4), dict(reporter=-1), dict(evidence=(PLAIN, PLAIN, PLAIN))):
        item = report(Finding.BEHIND, **changes)
        positions = [*item.attributed, *item.ahead, *item.missing, item.round.initiator, item.decided_by, item.reporter]
        with pytest.raises(wire.WireError) as error:
            wire.report_record(item, group_ranks=RANKS, job_id="j", generation=0)
        assert str(error.value) == (f"report positions {positions} or evidence of {len(item.evidence)} "
                                    "do not fit a group of 4")


def test_OBS_wire_failure_record_is_the_observers_failure_with_its_detail_cut_to_2000_characters() -> None:
    out = wire.failure_record(rank=3, job_id="job-1", generation=2, reason="x" * 2001, host="h3", exit_code=-9)
    assert out.pop("time")
    assert out == {
        "schema": "scout.report/1", "kind": "observer_failure", "source": "observer", "reason": "observer-failed",
        "job_id": "job-1", "generation": 2, "ranks": [3], "hosts": ["h3"], "step": None, "reporter_rank": 3,
        "evidence": {"detail": "x" * 2000, "exit_code": -9},
    }
    bare = wire.failure_record(rank=0, job_id="j", generation=0, reason="gone")
    assert (bare["hosts"], bare["evidence"], bare["ranks"]) == ([], {"detail": "gone", "exit_code": None}, [0])


# ------------------------------------------------------------------------------------------
# Decoding: every field checked, every refusal named
# ------------------------------------------------------------------------------------------


def delegate_fields(item: StallReport) -> list[Any]:
    payload = codec.decode(wire.encode_message(Delegate(RoundId(2, 7), 1, item)))
    assert isinstance(payload, tuple)
    return list(payload[4])


def decode_report(fields: list[Any]) -> StallReport:
    message = wire.decode_message(codec.encode(("d", 2, 7, 1, tuple(fields))), 4)
    assert isinstance(message, Delegate)
    return message.report


def refused(payload: object, group_size: int = 4) -> str:
    with pytest.raises(wire.WireError) as error:
        wire.decode_message(codec.encode(payload), group_size)
    return str(error.value)


def test_OBS_wire_a_delegated_report_round_trips_every_field() -> None:
    item = report(Finding.BEHIND, missing=(3,), ahead=(2,), attributed=(0, 2), blocking=5)
    assert decode_report(delegate_fields(item)) == item
    long = report(Finding.BEHIND, reason="r" * 501)
    assert decode_report(delegate_fields(long)).reason == "r" * 500


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (0, "stuck", "'stuck' is not a valid StallKind"),
        (1, "lost", "'lost' is not a valid Finding"),
        (2, "team", "'team' is not a valid Scope"),
        (1, "unsettled", "a delegated report cannot be unsettled"),
        (3, (4,), "malformed delegated report"),
        (3, [4, 2], "key must be a tuple of ints"),
        (3, (4, "2"), "key must be an int, got str"),
        (4, (2, 7, 1), "malformed delegated report"),
        (4, None, "round must be a tuple of ints"),
        (5, True, "decided_by must be an int, got bool"),
        (6, 1.0, "reporter must be an int, got float"),
        (7, (0, False), "attributed must be an int, got bool"),
        (8, 2, "ahead must be a tuple of ints"),
        (9, ("3",), "missing must be an int, got str"),
        (10, [None, None, None, None], "malformed delegated report"),
        (11, float("inf"), "idle_s must be a finite number, got inf"),
        (11, True, "idle_s must be a finite number, got True"),
        (12, b"why", "malformed delegated report"),
        (13, -1, "blocking must be >= 0, got -1"),
        (13, 1.5, "blocking must be an int, got float"),
    ],
)
def test_OBS_wire_each_field_of_a_delegated_report_is_checked(index: int, value: object, message: str) -> None:
    fields = delegate_fields(report(Finding.BEHIND))
    fields[index] = value
    assert refused(("d", 2, 7, 1, tuple(fields))) == message


def test_OBS_wire_a_delegated_report_of_15_or_17_fields_is_refused() -> None:
    fields = delegate_fields(report(Finding.BEHIND))
    for changed in (fields[:-1], [*fields, 0]):
        assert refused(("d", 2, 7, 1, tuple(changed))) == "a delegated report must be a 16-tuple"
    assert refused(("d", 2, 7, 1, fields)) == "a delegated report must be a 16-tuple"  # a list, not a tuple


def test_COMPLETION_9_a_delegated_report_carries_its_group_and_a_known_reason_code() -> None:
    from scout.core.observer.machine import HOST_PROGRESS_ONLY

    item = report(Finding.INCONCLUSIVE, attributed=(), source=0x77, code=HOST_PROGRESS_ONLY)
    assert decode_report(delegate_fields(item)) == item
    assert record(item)["reason"] == "host-progress-only"
    fields = delegate_fields(item)
    fields[15] = 9
    assert refused(("d", 2, 7, 1, tuple(fields))) == "unknown finding code 9 in a delegated report"
    fields[15], fields[14] = 0, -1
    assert refused(("d", 2, 7, 1, tuple(fields))) == "source -1 outside [0, 2**64)"


def test_OBS_wire_a_delegated_report_must_fit_the_group() -> None:
    fields = delegate_fields(report(Finding.BEHIND))
    fields[10] = fields[10][:3]
    assert refused(("d", 2, 7, 1, tuple(fields))) == "a delegated report carries 3 pieces of evidence for a group of 4"
    for index, name in ((7, "attributed"), (8, "ahead"), (9, "missing")):
        fields = delegate_fields(report(Finding.BEHIND))
        fields[index] = (2, 1, 2)
        assert refused(("d", 2, 7, 1, tuple(fields))) == (
            f"a delegated report names {name} positions [2, 1, 2] more than once")
    for index, value, positions in ((4, (4, 7), [2, 1, 4, 3, 1, 0]), (5, 4, [2, 1, 2, 4, 1, 0]),
                                    (6, -1, [2, 1, 2, 3, -1, 0]), (9, (4,), [2, 1, 2, 3, 1, 0, 4])):
        fields = delegate_fields(report(Finding.BEHIND))
        fields[index] = value
        assert refused(("d", 2, 7, 1, tuple(fields))) == f"positions {positions} outside the group of 4"


def test_OBS_wire_evidence_is_5_or_8_fields_and_negative_times_read_as_zero() -> None:
    def reply(evidence: object) -> Evidence | None:
        message = wire.decode_message(codec.encode(("r", 0, 1, 2, evidence)), 4)
        assert isinstance(message, Reply)
        return message.evidence

    assert reply((4, 2, 0xAB, 1, -3.0)) == Evidence(4, 2, 0xAB, Stage.COMPUTE, 0.0)
    assert reply((4, 2, 0xAB, 1, 2)) == Evidence(4, 2, 0xAB, Stage.COMPUTE, 2.0)
    assert reply((4, 2, 0xAB, 1, 0.5, (), (), 0)) == Evidence(4, 2, 0xAB, Stage.COMPUTE, 0.5)
    completion = (0x77, 12, 10, 0xF00D, 2, 0xBEEF, 0)
    assert reply((4, 2, 0xAB, 2, 0.5, (completion,), (-1.0,), 0)) == Evidence(
        4, 2, 0xAB, Stage.COLLECTIVE, 0.5, PENDING, 0.0)
    assert reply((4, 2, 0xAB, 2, 0.5, (completion,), (2.5,), 3)) == Evidence(
        4, 2, 0xAB, Stage.COLLECTIVE, 0.5, PENDING, 2.5, HostContract.ENQUEUE, True)
    for bad in ((4, 2, 0xAB, 1), (4, 2, 0xAB, 1, 0.5, None), (4, 2, 0xAB, 1, 0.5, (), (), 0, 0), [4, 2, 0xAB, 1, 0.5]):
        assert refused(("r", 0, 1, 2, bad)) == f"evidence must be a 5- or 8-tuple, got {bad!r}"
    for index, value, message in (
        (0, "4", "step must be an int, got str"), (1, None, "op must be an int, got NoneType"),
        (2, 1.0, "fingerprint must be an int, got float"), (3, True, "unknown stage True"),
        (3, 6, "unknown stage 6"), (4, "0", "idle_s must be a finite number, got '0'"),
        (6, (float("nan"),), "pending_age_s must be a finite number, got nan"),
        (7, True, "flags must be an int, got bool"),
    ):
        fields: list[Any] = [4, 2, 0xAB, 2, 0.5, (completion,), (2.5,), 0]
        fields[index] = value
        assert refused(("r", 0, 1, 2, tuple(fields))) == message
    many = tuple((s, 1, 1, 0, 0, 0, 0) for s in range(1, 18))
    assert refused(("r", 0, 1, 2, (4, 2, 0xAB, 2, 0.5, many, (0.0,) * 17, 0))) == (
        "evidence carries 17 completion coordinates, more than 16")


@pytest.mark.parametrize(
    ("completion", "message"),
    [
        ((0x77, 12, 10, 0xF00D, 2, 0), "completion must be a 7-tuple, got (119, 12, 10, 61453, 2, 0)"),
        ([0x77, 12, 10, 0xF00D, 2, 0, 0], "completion must be a 7-tuple, got [119, 12, 10, 61453, 2, 0, 0]"),
        ((0x77, 12, 10, 0xF00D, 4, 0, 0), "unknown pending state 4"),
        ((0x77, 12, 10, 0xF00D, "2", 0, 0), "unknown pending state '2'"),
        ((True, 12, 10, 0, 2, 0, 0), "source must be an int, got bool"),
        ((0x77, 1.0, 0, 0, 0, 0, 0), "enqueued must be an int, got float"),
        ((0x77, 12, "10", 0, 2, 0, 0), "completed must be an int, got str"),
        ((0x77, 12, 10, None, 2, 0, 0), "pending_fingerprint must be an int, got NoneType"),
        ((0x77, 12, 10, 0, 2, b"", 0), "completed_fingerprint must be an int, got bytes"),
        ((0x77, 12, 10, 0, 2, 0, 2), "point_to_point must be 0 or 1, got 2"),
    ],
)
def test_OBS_wire_each_field_of_a_completion_coordinate_is_checked(completion: object, message: str) -> None:
    assert refused(("r", 0, 1, 2, (4, 2, 0xAB, 2, 0.5, (completion,), (0.0,), 0))) == message


def test_OBS_wire_a_completion_coordinate_keeps_its_own_checks() -> None:
    message = refused(("r", 0, 1, 2, (4, 2, 0xAB, 2, 0.5, ((0x77, 3, 5, 0, 0, 0, 0),), (0.0,), 0)))
    with pytest.raises(ValueError) as direct:
        Completion(0x77, 3, 5, 0, PendingState.NONE, 0)
    assert message == str(direct.value)


def test_OBS_wire_each_field_of_each_message_kind_is_checked_by_name() -> None:
    fields = tuple(delegate_fields(report(Finding.BEHIND)))
    cases = [
        (("q", "0", 1), "initiator must be an int, got str"),
        (("q", 0, 1.0), "number must be an int, got float"),
        (("r", None, 1, 2, None), "initiator must be an int, got NoneType"),
        (("r", 0, True, 2, None), "number must be an int, got bool"),
        (("r", 0, 1, "2", None), "sender must be an int, got str"),
        (("d", b"", 7, 1, fields), "initiator must be an int, got bytes"),
        (("d", 2, 7.5, 1, fields), "number must be an int, got float"),
        (("d", 2, 7, (1,), fields), "sender must be an int, got tuple"),
        (("q", 0, 0), "round number 0 must be >= 1"),
        (("r", 0, -3, 1, None), "round number -3 must be >= 1"),
        (("d", 2, 0, 1, fields), "round number 0 must be >= 1"),
        ((), "not an observer message"),
        (("z", 1, 2), "not an observer message"),
        (["q", 0, 1], "not an observer message"),
    ]
    for payload, message in cases:
        assert refused(payload) == message, payload


def test_OBS_wire_a_message_with_the_field_count_of_another_kind_is_refused() -> None:
    fields = tuple(delegate_fields(report(Finding.BEHIND)))
    for payload in (("q", 0, 1, 2, None), ("q", 0, 1, 2, fields), ("r", 0, 1), ("r", 0, 1, 2, None, None),
                    ("d", 2, 7, 1), ("d", 2, 7, 1, fields, 0), ("d", 2, 7)):
        assert refused(payload) == f"message {payload[0]!r} has {len(payload)} fields", payload
