"""Structured fuzzing of observer messages (scout/observer/wire.py over scout/transport/codec.py).

Random bytes (test_wire.py) almost never get past the codec, so they never reach the field
checks of ``decode_message``. Here every input is a *valid codec encoding*: a valid message is
generated, turned into its wire tuple, mutated structurally (a field replaced by a value of
another type or out of range, a field dropped, added or duplicated, a tuple turned into a list,
an enum string changed), and encoded again. What ``decode_message`` must do with it:

* raise ``WireError`` and nothing else, or
* return a message every receiver can use: positions inside the group, a round number >= 1,
  a delegated report with one piece of evidence per peer, no position named twice, finite
  idle times, and a report the observer process can turn into a ``scout.report/1`` record
  (``wire.report_record``); re-encoding it gives the same message (a fixed point).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout import reports
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
from scout.transport import codec

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# The outcomes an observer ever reports or delegates (Finding.UNSETTLED is internal to a round).
REPORTED_FINDINGS = tuple(f for f in Finding if f is not Finding.UNSETTLED)


@st.composite
def completion(draw) -> Completion:
    enqueued = draw(st.integers(min_value=0, max_value=2**40))
    completed = draw(st.integers(min_value=0, max_value=enqueued))
    pending = enqueued > completed
    return Completion(
        draw(st.integers(min_value=1, max_value=2**63 - 1)), enqueued, completed,
        draw(st.integers(min_value=0, max_value=2**64 - 1)) if pending else 0,
        draw(st.sampled_from(tuple(s for s in PendingState if s is not PendingState.NONE))) if pending
        else PendingState.NONE,
        draw(st.integers(min_value=0, max_value=2**64 - 1)),
    )


@st.composite
def evidence(draw) -> Evidence:
    tracked = draw(st.one_of(st.none(), completion()))
    return Evidence(
        draw(st.integers(min_value=-1, max_value=2**40)),
        draw(st.integers(min_value=0, max_value=2**40)),
        draw(st.integers(min_value=0, max_value=2**64 - 1)),
        draw(st.sampled_from(tuple(Stage))),
        draw(st.floats(min_value=0.0, max_value=1e6)),
        tracked,
        draw(st.floats(min_value=0.0, max_value=1e6)) if tracked is not None else 0.0,
    )


def positions(group_size: int):
    return st.integers(min_value=0, max_value=group_size - 1)


def distinct_positions(group_size: int):
    return st.lists(positions(group_size), unique=True, max_size=group_size).map(tuple)


@st.composite
def report(draw, group_size: int) -> StallReport:
    return StallReport(
        draw(st.sampled_from(tuple(StallKind))),
        draw(st.sampled_from(REPORTED_FINDINGS)),
        draw(st.sampled_from(tuple(Scope))),
        (draw(st.integers(min_value=-1, max_value=2**40)), draw(st.integers(min_value=0, max_value=2**40))),
        RoundId(draw(positions(group_size)), draw(st.integers(min_value=1, max_value=2**40))),
        draw(positions(group_size)),
        draw(positions(group_size)),
        draw(distinct_positions(group_size)),
        draw(distinct_positions(group_size)),
        draw(distinct_positions(group_size)),
        tuple(draw(st.one_of(st.none(), evidence())) for _ in range(group_size)),
        draw(st.floats(min_value=0.0, max_value=1e6)),
        draw(st.text(max_size=60)),
        draw(st.integers(min_value=0, max_value=2**40)),
    )


@st.composite
def message(draw) -> tuple[int, Any]:
    group_size = draw(st.integers(min_value=1, max_value=6))
    round_id = RoundId(draw(positions(group_size)), draw(st.integers(min_value=1, max_value=2**62)))
    kind = draw(st.sampled_from(("q", "r", "d")))
    if kind == "q":
        return group_size, Request(round_id)
    sender = draw(positions(group_size))
    if kind == "r":
        return group_size, Reply(round_id, sender, draw(st.one_of(st.none(), evidence())))
    return group_size, Delegate(round_id, sender, draw(report(group_size)))


# Values a hostile or corrupt peer could put in any field: other types, edges of every range.
ODD_VALUES = st.sampled_from(
    [None, True, False, 0, -1, 1, 2**63 - 1, -(2**63), 2**64, -(2**70), 0.0, -0.0, 1.5, -1e300,
     math.nan, math.inf, -math.inf, "", "hang", "unsettled", "behind", "rank", "x" * 600, b"", b"\x00",
     (), (0,), (0, 0), [], [0], {}, {"a": 1}]
)


ENUM_VALUES = st.sampled_from(
    sorted({str(member.value) for enum in (Finding, StallKind, Scope) for member in enum} | {"q", "r", "d"})
)


def paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position in a nested tuple/list, the root included."""
    found = [prefix]
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


def get(value: Any, path: tuple[int, ...]) -> Any:
    for index in path:
        value = value[index]
    return value


def replace(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    items = list(value)
    items[path[0]] = replace(items[path[0]], path[1:], new)
    return type(value)(items)


@st.composite
def mutated_wire_tuple(draw) -> tuple[int, Any]:
    """A valid message's wire tuple after one to three structural mutations."""
    group_size, original = draw(message())
    value = codec.decode(wire.encode_message(original))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        every = paths(value)
        strings = [p for p in every if isinstance(get(value, p), str)]
        # Enum fields travel as strings; swapping one for another enum's value reaches the
        # checks behind the type checks (a kind, outcome or scope that parses but is wrong).
        if strings and draw(st.booleans()):
            value = replace(value, draw(st.sampled_from(strings)), draw(ENUM_VALUES))
            continue
        where = draw(st.sampled_from(every))
        target = get(value, where)
        operation = draw(st.sampled_from(("replace", "drop", "append", "duplicate", "to-list", "int-edge")))
        if operation == "replace":
            new = draw(ODD_VALUES)
        elif operation == "int-edge":
            new = draw(st.one_of(st.sampled_from([-1, group_size, group_size - 1, 0, 2**63 - 1]), INT64))
        elif isinstance(target, (tuple, list)) and target:
            index = draw(st.integers(min_value=0, max_value=len(target) - 1))
            items = list(target)
            if operation == "drop":
                del items[index]
            elif operation == "append":
                items.append(draw(ODD_VALUES))
            elif operation == "duplicate":
                items.insert(index, items[index])
            new = list(items) if operation == "to-list" else type(target)(items)
        else:
            new = draw(ODD_VALUES)
        value = replace(value, where, new)
    return group_size, value


def check_usable(decoded: Any, group_size: int) -> None:
    """What every receiver relies on in a message decode_message accepted."""
    assert isinstance(decoded, (Request, Reply, Delegate))
    assert 0 <= decoded.round.initiator < group_size and decoded.round.number >= 1
    if not isinstance(decoded, Request):
        assert 0 <= decoded.sender < group_size
    if isinstance(decoded, Reply) and decoded.evidence is not None:
        assert math.isfinite(decoded.evidence.idle_s) and decoded.evidence.idle_s >= 0
        assert isinstance(decoded.evidence.stage, Stage)
    if isinstance(decoded, Delegate):
        report_ = decoded.report
        assert len(report_.evidence) == group_size
        for items in (report_.attributed, report_.ahead, report_.missing):
            assert len(set(items)) == len(items) and all(0 <= p < group_size for p in items)
        assert math.isfinite(report_.idle_s)
        # The receiving observer re-emits a delegated report as a record (accept_decision, then
        # ObserverProcess.emit): that must work for anything the decoder let through.
        record = wire.report_record(report_, group_ranks=tuple(range(100, 100 + group_size)), job_id="job", generation=0)
        assert record["kind"] in reports.KINDS
        reports.record_line(record)
    again = wire.decode_message(wire.encode_message(decoded), group_size)
    assert again == decoded, "re-encoding an accepted message must give the same message"


@SETTINGS
@given(message())
def test_OBS_wire_every_valid_message_round_trips_and_is_usable(case) -> None:
    group_size, original = case
    decoded = wire.decode_message(wire.encode_message(original), group_size)
    assert decoded == original  # reasons here stay under the 500 characters kept on the way in
    check_usable(decoded, group_size)


@SETTINGS
@given(mutated_wire_tuple())
def test_OBS_wire_mutated_messages_are_refused_or_usable(case) -> None:
    group_size, value = case
    data = codec.encode(value)  # a valid codec encoding: the fuzz reaches the field checks
    try:
        decoded = wire.decode_message(data, group_size)
    except wire.WireError:
        return
    check_usable(decoded, group_size)


ALL_ENUM_STRINGS = sorted({str(m.value) for enum in (Finding, StallKind, Scope) for m in enum} | {"q", "r", "d", ""})


@settings(max_examples=40, deadline=None)
@given(message())
def test_OBS_wire_every_enum_string_swap_is_refused_or_usable(case) -> None:
    """Every string field (tag, kind, outcome, scope, reason) of a valid message, set to every
    enum value the protocol knows: systematic where the random mutations are sparse."""
    group_size, original = case
    value = codec.decode(wire.encode_message(original))
    for where in paths(value):
        if not isinstance(get(value, where), str):
            continue
        for text in ALL_ENUM_STRINGS:
            data = codec.encode(replace(value, where, text))
            try:
                decoded = wire.decode_message(data, group_size)
            except wire.WireError:
                continue
            check_usable(decoded, group_size)


@SETTINGS
@given(message(), st.sampled_from([1, 2, 4, 8]))
def test_OBS_wire_a_message_for_another_group_size_is_refused_or_usable(case, other_size) -> None:
    """The same bytes read by a receiver that believes the group is another size."""
    _group_size, original = case
    try:
        decoded = wire.decode_message(wire.encode_message(original), other_size)
    except wire.WireError:
        return
    check_usable(decoded, other_size)


def test_OBS_wire_a_delegated_unsettled_report_is_refused() -> None:
    """Found by the enum-swap fuzz: UNSETTLED is a round's internal outcome, never reported; a
    delegate carrying it has no report kind or reason, and used to crash report_record with a
    KeyError in the receiving observer. The decoder refuses it."""
    report_ = StallReport(StallKind.HANG, Finding.UNSETTLED, Scope.RANK, (1, 3), RoundId(0, 1), 0, 1, (), (), (),
                          (None, None), 0.0, "")
    with pytest.raises(wire.WireError, match="unsettled"):
        wire.decode_message(wire.encode_message(Delegate(RoundId(0, 1), 0, report_)), 2)
