"""The pieces the MPI and torch bindings share (scout/transport/_binding.py), in one process."""

from __future__ import annotations

import math
import time

import pytest

from scout.transport._binding import (
    FRAME_HEADER_BYTES,
    FrameError,
    Op,
    PollSettings,
    Stream,
    check_round_id,
    group_key,
    pack_frame,
    unpack_frame,
    wait_until,
)
from scout.transport.base import Group


def test_frame_round_trip_keeps_every_field() -> None:
    data = pack_frame(Stream.COLLECTIVE, Op.BCAST, 2**64 - 1, -(2**63), 7, b"payload")
    frame = unpack_frame(bytearray(data))
    assert len(data) == FRAME_HEADER_BYTES + len(b"payload")
    assert (frame.stream, frame.op, frame.group_key, frame.number, frame.sender, frame.body) == (
        Stream.COLLECTIVE,
        Op.BCAST,
        2**64 - 1,
        -(2**63),
        7,
        b"payload",
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"SCT1",
        b"XXXX" + bytes(FRAME_HEADER_BYTES),
        pack_frame(Stream.EXCHANGE, Op.EXCHANGE, 1, 1, 1, b"")[:-1],
        b"SCT1" + bytes([99]) + bytes(FRAME_HEADER_BYTES - 5),  # unknown stream
    ],
)
def test_bytes_that_are_no_frame_raise_frame_error(data: bytes) -> None:
    with pytest.raises(FrameError):
        unpack_frame(data)


def test_group_key_depends_on_name_and_rank_order_only() -> None:
    assert group_key(Group((0, 1, 2), "dp")) == group_key(Group((0, 1, 2), "dp"))
    assert group_key(Group((0, 1, 2), "dp")) != group_key(Group((0, 1, 2), "tp"))
    assert group_key(Group((0, 1, 2), "dp")) != group_key(Group((2, 1, 0), "dp"))
    assert 0 <= group_key(Group((5,), "x")) < 2**64


def test_wait_until_calls_ready_once_with_a_past_deadline() -> None:
    calls = []
    assert not wait_until(lambda: calls.append(1) or False, time.monotonic() - 1, PollSettings())
    assert calls == [1]


def test_wait_until_returns_as_soon_as_ready() -> None:
    start_s = time.monotonic()
    ready_at_s = start_s + 0.05
    assert wait_until(lambda: time.monotonic() >= ready_at_s, start_s + 5, PollSettings())
    assert time.monotonic() - start_s < 1.0


def test_wait_until_keeps_its_deadline() -> None:
    poll = PollSettings(busy_poll_s=0.001, poll_interval_s=0.01)
    start_s = time.monotonic()
    assert not wait_until(lambda: False, start_s + 0.2, poll)
    elapsed_s = time.monotonic() - start_s
    assert 0.2 <= elapsed_s < 0.2 + 0.5


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"busy_poll_s": -1}, ValueError),
        ({"busy_poll_s": math.nan}, ValueError),
        ({"poll_interval_s": 0}, ValueError),
        ({"poll_interval_s": math.inf}, ValueError),
        ({"poll_interval_s": "1"}, TypeError),
        ({"min_sleep_s": 0.1, "poll_interval_s": 0.01}, ValueError),
    ],
)
def test_poll_settings_reject_bad_values(settings: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        PollSettings(**settings)


def test_round_ids_are_64_bit_ints() -> None:
    assert check_round_id(-(2**63)) == -(2**63)
    with pytest.raises(TypeError, match="bool"):
        check_round_id(True)
    with pytest.raises(TypeError, match="float"):
        check_round_id(1.0)
    with pytest.raises(ValueError, match=str(2**63)):
        check_round_id(2**63)
