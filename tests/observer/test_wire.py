"""Observer messages on the wire: round trips, and hostile input that must fail cleanly."""

from __future__ import annotations

import contextlib

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scout.core.observer import (
    Completion,
    Delegate,
    Evidence,
    Finding,
    PendingState,
    Reply,
    Request,
    RoundId,
    Scope,
    Stage,
    StallKind,
    StallReport,
)
from scout.observer import wire
from scout.reports import record_line
from scout.transport import codec

EVIDENCE = Evidence(1, 3, 2**64 - 1, Stage.COLLECTIVE, 1.5)
TRACKED = Evidence(1, 3, 0, Stage.COMPUTE, 2.5, Completion(7, 12, 10, 0xF00D, PendingState.STARTED), 2.25)
REPORT = StallReport(StallKind.HANG, Finding.BEHIND, Scope.RANK, (1, 3), RoundId(2, 7), 2, 0, (1,), (), (3,),
                (EVIDENCE, EVIDENCE, EVIDENCE, None), 1.5, "progress differs from the strict majority")


@pytest.mark.parametrize(
    "message",
    [Request(RoundId(1, 2)), Reply(RoundId(1, 2), 3, EVIDENCE), Reply(RoundId(0, 1), 2, None),
     Reply(RoundId(1, 2), 3, TRACKED), Delegate(RoundId(2, 7), 2, REPORT)],
)
def test_OBS_wire_messages_round_trip(message: object) -> None:
    assert wire.decode_message(wire.encode_message(message), 4) == message  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (("q", 9, 1), r"positions \[9\] outside the group of 4"),
        (("r", 0, 1, 2, (1, 2, 3, 99, 1.0)), "unknown stage 99"),
        (("r", 0, 1, 2, (1, 2, 3, 2, float("nan"))), "idle_s must be a finite number"),
        (("x",), "not an observer message"),
        (("q", "0", 1), "initiator must be an int"),
        (("d", 0, 1, 2, ("hang",)), "16-tuple"),
            (("r", 0, 1, 2, (1, 2, 3, 2, 1.0, ((7, 3, 5, 0, 0, 0, 0),), (0.0,), 0)),
             r"completed \(5\) exceeds enqueued \(3\)"),
            (("r", 0, 1, 2, (1, 2, 3, 2, 1.0, ((7, 5, 3, 9, 9, 0, 0),), (0.0,), 0)), "unknown pending state 9"),
            (("r", 0, 1, 2, (1, 2, 3, 2, 1.0, ((7, 5, 5, 0, 0, 0, 0),) * 2, (0.0, 0.0), 0)), "twice"),
            (("r", 0, 1, 2, (1, 2, 3, 2, 1.0, ((7, 5, 5, 0, 0, 0, 0),), (0.0,), 4)), "unknown evidence flags"),
            (("r", 0, 1, 2, (1, 2, 3, 2, 1.0, ((7, 5, 5, 0, 0, 0, 0),), (), 0)), "one length"),
    ],
)
def test_OBS_wire_hostile_messages_fail_cleanly(payload: object, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.decode_message(codec.encode(payload), 4)


@given(st.binary(max_size=200))
def test_OBS_wire_random_bytes_never_raise_anything_but_wire_error(data: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        wire.decode_message(data, 4)


def test_OBS_wire_report_record_uses_ranks_not_positions() -> None:
    hosts = ("h10", "h11", "h12", "h13")
    record = wire.report_record(REPORT, group_ranks=(10, 11, 12, 13), job_id="j", generation=2, hosts=hosts)
    evidence = record["evidence"]
    assert (record["kind"], record["ranks"], record["hosts"], record["step"]) == ("hang", [11], ["h11"], 1)
    assert (evidence["attributed_ranks"], evidence["missing_ranks"], record["reporter_rank"]) == ([11], [13], 10)
    assert evidence["peers"][3] == {"rank": 13, "missing": True}
    assert evidence["peers"][0]["fingerprint"] == "0xffffffffffffffff"
    assert record_line(record) == "scout: hang rank(s) [11] on h11 at step 1: behind-majority"


def test_OBS_wire_report_record_refuses_positions_outside_the_group() -> None:
    with pytest.raises(wire.WireError, match="do not fit a group of 3"):
        wire.report_record(REPORT, group_ranks=(10, 11, 12), job_id="j", generation=2)


def test_OBS_wire_report_record_carries_each_peers_completion_coordinate() -> None:
    report = StallReport(StallKind.HANG, Finding.BEHIND, Scope.RANK, (1, 3), RoundId(0, 1), 0, 0, (2,), (), (),
                         (TRACKED, TRACKED, attrs.evolve(TRACKED, completions=Completion(7, 11, 10, 0xF00D,
                                                                                         PendingState.ENQUEUED))),
                         2.5, "enqueued the collective but its device never started it", 11, 7)
    record = wire.report_record(report, group_ranks=(0, 1, 2), job_id="j", generation=0)
    evidence = record["evidence"]
    assert (evidence["basis"], evidence["blocking_collective"], evidence["blocking_group"]) == (
        "completion", 11, "0x0000000000000007")
    assert evidence["peers"][2]["completion"] == {
        "source": "0x0000000000000007", "enqueued": 11, "completed": 10,
        "completed_fingerprint": "0x0000000000000000", "pending": {"sequence": 11, "fingerprint": "0x000000000000f00d", "state": "enqueued", "age_s": 2.25}}
    assert record["reason"] == "behind-majority" and record["ranks"] == [2]
    plain = wire.report_record(REPORT, group_ranks=(10, 11, 12, 13), job_id="j", generation=2)
    assert (plain["evidence"]["basis"], plain["evidence"]["blocking_collective"]) == ("progress", None)
