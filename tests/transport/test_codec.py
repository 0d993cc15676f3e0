"""The evidence codec (scout/transport/codec.py; docs/transports.md, guarantee 4), in one process.

Every binding and the observers' wire decode what a peer sent with :func:`codec.decode`, so what
it refuses is what scout refuses. The rules stated here: the bytes of every kind of value are
pinned (peers of one job must agree on them); a payload is exactly one value -- one trailing
byte, a truncated one or a length that claims more than is there is a :class:`DecodeError`, and
nothing else ever escapes; depth is bounded on both sides at exactly ``MAX_DEPTH``; every error
names the value and where it is. Mutation target ``transport-codec`` (tests/mutation/).
"""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import pytest

from scout.transport import codec
from scout.transport.codec import MAX_DEPTH, DecodeError, EncodeError, decode, encode


def _len(n: int) -> bytes:
    return struct.pack("<I", n)


# One value of every kind, with its exact encoding (little-endian, 4-byte lengths).
PINNED: list[tuple[Any, bytes]] = [
    (None, b"N"),
    (True, b"T"),
    (False, b"F"),
    (0, b"i" + bytes(8)),
    (1, b"i\x01" + bytes(7)),
    (-2, b"i" + b"\xfe" + b"\xff" * 7),
    (2**63 - 1, b"i" + b"\xff" * 7 + b"\x7f"),
    (-(2**63), b"i" + bytes(7) + b"\x80"),
    (2**63, b"I" + _len(19) + b"9223372036854775808"),
    (-(2**63) - 1, b"I" + _len(20) + b"-9223372036854775809"),
    (1.5, b"f" + struct.pack("<d", 1.5)),
    ("", b"s" + _len(0)),
    ("héllo", b"s" + _len(6) + "héllo".encode()),
    (b"", b"b" + _len(0)),
    (b"\x00\xff", b"b" + _len(2) + b"\x00\xff"),
    ((), b"t" + _len(0)),
    ([], b"l" + _len(0)),
    ((1, None), b"t" + _len(2) + b"i\x01" + bytes(7) + b"N"),
    ([None, [True]], b"l" + _len(2) + b"N" + b"l" + _len(1) + b"T"),
    ({}, b"d" + _len(0)),
    ({"a": None, 2: False}, b"d" + _len(2) + b"s" + _len(1) + b"a" + b"N" + b"i\x02" + bytes(7) + b"F"),
]


@pytest.mark.parametrize(("value", "data"), PINNED, ids=[repr(v)[:30] for v, _ in PINNED])
def test_codec_every_kind_of_value_has_pinned_bytes_and_round_trips(value: Any, data: bytes) -> None:
    assert encode(value) == data
    decoded = decode(data)
    assert decoded == value and type(decoded) is type(value)


def test_codec_bools_ints_tuples_and_lists_keep_their_types() -> None:
    decoded = decode(encode({"t": (1, True), "l": [0, False], "nested": ([(),], {1: b"x"})}))
    assert decoded == {"t": (1, True), "l": [0, False], "nested": ([()], {1: b"x"})}
    assert [type(v) for v in decoded["t"]] == [int, bool] and [type(v) for v in decoded["l"]] == [int, bool]
    assert type(decoded["nested"]) is tuple and type(decoded["nested"][0]) is list


def test_codec_floats_keep_every_bit() -> None:
    for value in (0.0, -0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308):
        decoded = decode(encode(value))
        assert struct.pack("<d", decoded) == struct.pack("<d", value)
    assert math.isnan(decode(encode(math.nan)))


def test_codec_bytes_like_values_travel_as_bytes() -> None:
    assert encode(bytearray(b"ab")) == encode(memoryview(b"ab")) == encode(b"ab") == b"b" + _len(2) + b"ab"
    data = encode([1, "x"])
    assert decode(bytearray(data)) == decode(memoryview(data)) == [1, "x"]


@pytest.mark.parametrize(("value", "data"), PINNED, ids=[repr(v)[:30] for v, _ in PINNED])
def test_codec_a_payload_with_one_trailing_byte_is_refused(value: Any, data: bytes) -> None:
    """The rule (issue 26): a payload is exactly one value. One byte more, whatever it is, is
    refused with a DecodeError saying so -- never ignored."""
    for extra in (b"\x00", b"N", b"\xff"):
        with pytest.raises(DecodeError) as error:
            decode(data + extra)
        assert str(error.value) == "payload has 1 trailing bytes"


def test_codec_trailing_bytes_are_counted() -> None:
    with pytest.raises(DecodeError, match=r"\Apayload has 3 trailing bytes\Z"):
        decode(encode("x") + b"NNN")


@pytest.mark.parametrize(("value", "data"), PINNED[3:], ids=[repr(v)[:30] for v, _ in PINNED[3:]])
def test_codec_every_truncation_is_a_decode_error(value: Any, data: bytes) -> None:
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            decode(data[:cut])


def test_codec_truncation_errors_name_what_is_missing_and_where() -> None:
    cases = [
        (b"", "payload truncated: need 1 bytes at offset 0"),
        (b"i\x01\x00", "payload truncated: need 8 bytes at offset 1"),
        (b"f", "payload truncated: need 8 bytes at offset 1"),
        (b"s\x05\x00\x00\x00abc", "payload truncated: need 5 bytes at offset 5"),
        (b"b" + _len(2), "payload truncated: need 2 bytes at offset 5"),
        (b"s\x01\x00", "payload truncated: need 4 bytes at offset 1"),
        (b"t" + _len(1) + b"s", "payload truncated: need 4 bytes at offset 6"),
    ]
    for data, message in cases:
        with pytest.raises(DecodeError) as error:
            decode(data)
        assert str(error.value) == message, data


def test_codec_a_length_is_checked_against_the_bytes_left() -> None:
    # Exactly as many one-byte items as bytes left decodes; one more item is refused before any
    # is decoded (a hostile length cannot make the decoder allocate or loop).
    assert decode(b"l" + _len(3) + b"NNN") == [None, None, None]
    assert decode(b"t" + _len(2) + b"TF") == (True, False)
    assert decode(b"d" + _len(2) + b"NNNN") == {None: None}  # the second key overwrites the first
    with pytest.raises(DecodeError) as error:
        decode(b"l" + _len(4) + b"NNN")
    assert str(error.value) == "sequence claims 4 items in 3 bytes"
    with pytest.raises(DecodeError) as error:
        decode(b"t" + _len(2**32 - 1))
    assert str(error.value) == "sequence claims 4294967295 items in 0 bytes"
    with pytest.raises(DecodeError) as error:
        decode(b"d" + _len(5) + b"NNNN")
    assert str(error.value) == "dict claims 5 items in 4 bytes"


def test_codec_bytes_that_are_no_value_say_why() -> None:
    cases = [
        (b"z", "unknown tag b'z' at offset 0"),
        (b"l" + _len(2) + b"N?", "unknown tag b'?' at offset 6"),
        (b"I" + _len(3) + b"12x", "bad big integer '12x'"),
        (b"I" + _len(30) + b"9" * 29 + b"x", "bad big integer '99999999999999999999'"),
        (b"d" + _len(1) + b"l" + _len(0) + b"N", "unhashable dict key of type list"),
    ]
    for data, message in cases:
        with pytest.raises(DecodeError) as error:
            decode(data)
        assert str(error.value) == message, data


def test_codec_text_that_does_not_decode_is_a_decode_error_naming_the_payload_size() -> None:
    for data in (b"s" + _len(1) + b"\xff", b"I" + _len(1) + b"\xe9"):
        with pytest.raises(DecodeError) as error:
            decode(data)
        assert str(error.value).startswith(f"malformed payload of {len(data)} bytes: ")
        assert "can't decode byte" in str(error.value)


def test_codec_a_big_integer_is_read_as_an_int() -> None:
    assert decode(b"I" + _len(2) + b"-7") == -7
    assert decode(b"I" + _len(3) + b"+42") == 42


def _nested(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


def test_codec_depth_is_bounded_exactly_at_MAX_DEPTH_when_encoding() -> None:
    assert MAX_DEPTH == 32
    assert decode(encode(_nested(MAX_DEPTH))) == _nested(MAX_DEPTH)  # None at depth 32
    with pytest.raises(EncodeError) as error:
        encode(_nested(MAX_DEPTH + 1))
    assert str(error.value) == "payload" + "[0]" * (MAX_DEPTH + 1) + f": nested deeper than {MAX_DEPTH} levels"
    with pytest.raises(EncodeError, match=r"\Apayload\['k'\]\[0\]\[0\]"):
        encode({"k": _nested(MAX_DEPTH)})


def test_codec_depth_is_bounded_exactly_at_MAX_DEPTH_when_decoding() -> None:
    def nested_bytes(depth: int, tag: bytes) -> bytes:
        return (tag + _len(1)) * depth + b"N"

    assert decode(nested_bytes(MAX_DEPTH, b"l")) == _nested(MAX_DEPTH)
    for tag in (b"l", b"t"):
        with pytest.raises(DecodeError) as error:
            decode(nested_bytes(MAX_DEPTH + 1, tag))
        assert str(error.value) == f"payload nested deeper than {MAX_DEPTH} levels"
    # Inside a dict, a key and a value each count one level.
    with pytest.raises(DecodeError, match="nested deeper"):
        decode(b"d" + _len(1) + b"N" + nested_bytes(MAX_DEPTH, b"l"))
    assert decode(b"d" + _len(1) + b"N" + nested_bytes(MAX_DEPTH - 1, b"l")) == {None: _nested(MAX_DEPTH - 1)}
    with pytest.raises(DecodeError, match="nested deeper"):
        decode(b"d" + _len(1) + nested_bytes(MAX_DEPTH, b"t") + b"N")


def test_codec_values_that_cannot_travel_are_refused_naming_the_type_and_the_path() -> None:
    advice = "use None, bool, int, float, str, bytes, or tuples/lists/dicts of them"
    cases = [
        (object(), "payload: a value of type object cannot be sent as evidence; " + advice),
        ({"a": [1, {2.5}]}, "payload['a'][1]: a value of type set cannot be sent as evidence; " + advice),
        ((None, (frozenset(),)), "payload[1][0]: a value of type frozenset cannot be sent as evidence; " + advice),
        ({(1, object()): 2}, "payload key (1, <object>)[1]: a value of type object cannot be sent as evidence; " + advice),
    ]
    for value, message in cases:
        with pytest.raises(EncodeError) as error:
            encode(value)
        text = str(error.value)
        if "<object>" in message:
            head, tail = message.split("<object>")
            assert text.startswith(head) and text.endswith(tail), text
        else:
            assert text == message
    assert issubclass(EncodeError, TypeError) and issubclass(DecodeError, ValueError)


def test_codec_random_bytes_never_raise_anything_but_decode_error() -> None:
    # A deterministic sweep of short byte strings built from the tags and small lengths: any
    # exception other than DecodeError escaping decode() would reach a binding as a crash.
    alphabet = [b"N", b"T", b"i", b"I", b"f", b"s", b"b", b"t", b"l", b"d", b"\x00", b"\x01", b"\xff", b"\x80"]
    for first in alphabet:
        for second in alphabet:
            for third in alphabet:
                data = first + second + third + b"\x00\x00"
                with contextlib.suppress(DecodeError):
                    decode(data)


def test_codec_module_exports_only_its_contract() -> None:
    assert sorted(codec.__all__) == ["DecodeError", "EncodeError", "decode", "encode"]
