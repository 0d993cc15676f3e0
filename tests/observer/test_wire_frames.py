"""An observer message is exactly its fields and its bytes (spec/observer.md OBS-AUTH-8;
scout/observer/wire.py on top of scout/transport/codec.py).

The rule (issue 26): a delivered body with one byte more than its message, or a message with
one field more than its kind has, is refused with a WireError -- never decoded as if the extra
were not there. Stated on the encodings of real messages, so it holds whatever fields a message
kind carries."""

from __future__ import annotations

import pytest

from scout.core.observer import Reply, Request, RoundId
from scout.observer import wire
from scout.transport import codec

MESSAGES = [Request(RoundId(1, 3)), Reply(RoundId(0, 2), 2, None)]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_OBS_AUTH_8_a_body_with_one_trailing_byte_is_refused(message: object) -> None:
    body = wire.encode_message(message)  # type: ignore[arg-type]
    assert wire.decode_message(body, 3) == message
    for extra in (b"\x00", b"N", b"\xff"):
        with pytest.raises(wire.WireError) as error:
            wire.decode_message(body + extra, 3)
        assert str(error.value) == "payload has 1 trailing bytes"


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_OBS_AUTH_8_a_message_with_one_field_more_or_less_is_refused(message: object) -> None:
    fields = codec.decode(wire.encode_message(message))  # type: ignore[arg-type]
    assert isinstance(fields, tuple)
    for changed in (fields + (None,), fields + (0,), fields[:-1]):
        with pytest.raises(wire.WireError) as error:
            wire.decode_message(codec.encode(changed), 3)
        assert str(error.value) == f"message {fields[0]!r} has {len(changed)} fields"
