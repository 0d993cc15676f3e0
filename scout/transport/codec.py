"""Restricted wire format for evidence payloads (transport contract, guarantee 4).

Peers exchange small evidence values: signatures, progress coordinates, fingerprints, status
codes, timings. They are encoded in a tagged binary format that can only ever produce plain
data -- ``None``, bool, int, float, str, bytes, tuple, list and dict of those -- so that a
corrupt or hostile answer can at worst fail to decode (:class:`DecodeError`), never execute
code (unlike pickle). Depth and length are bounded so decoding is bounded in time and memory.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["DecodeError", "EncodeError", "decode", "encode"]

MAX_DEPTH = 32
_INT64 = struct.Struct("<q")
_FLOAT = struct.Struct("<d")
_LEN = struct.Struct("<I")


class EncodeError(TypeError):
    """The value cannot travel as evidence; the message names the offending type and path."""


class DecodeError(ValueError):
    """Bytes received from a peer are not a valid payload."""


def encode(value: Any) -> bytes:
    out = bytearray()
    _encode(value, out, "payload", 0)
    return bytes(out)


def _encode(value: Any, out: bytearray, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise EncodeError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None:
        out += b"N"
    elif value is True:
        out += b"T"
    elif value is False:
        out += b"F"
    elif isinstance(value, int):
        if -(2**63) <= value < 2**63:
            out += b"i"
            out += _INT64.pack(value)
        else:
            raw = str(value).encode("ascii")
            out += b"I"
            out += _LEN.pack(len(raw))
            out += raw
    elif isinstance(value, float):
        out += b"f"
        out += _FLOAT.pack(value)
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"s"
        out += _LEN.pack(len(raw))
        out += raw
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out += b"b"
        out += _LEN.pack(len(raw))
        out += raw
    elif isinstance(value, (tuple, list)):
        out += b"t" if isinstance(value, tuple) else b"l"
        out += _LEN.pack(len(value))
        for index, item in enumerate(value):
            _encode(item, out, f"{path}[{index}]", depth + 1)
    elif isinstance(value, dict):
        out += b"d"
        out += _LEN.pack(len(value))
        for key, item in value.items():
            _encode(key, out, f"{path} key {key!r}", depth + 1)
            _encode(item, out, f"{path}[{key!r}]", depth + 1)
    else:
        raise EncodeError(
            f"{path}: a value of type {type(value).__name__} cannot be sent as evidence; "
            "use None, bool, int, float, str, bytes, or tuples/lists/dicts of them"
        )


def decode(data: bytes | bytearray | memoryview) -> Any:
    view = memoryview(data).cast("B")
    try:
        value, offset = _decode(view, 0, 0)
    except (IndexError, struct.error, UnicodeDecodeError, RecursionError, TypeError) as exc:
        raise DecodeError(f"malformed payload of {len(view)} bytes: {exc}") from None
    if offset != len(view):
        raise DecodeError(f"payload has {len(view) - offset} trailing bytes")
    return value


def _take(view: memoryview, offset: int, count: int) -> bytes:
    end = offset + count
    if end > len(view):
        raise DecodeError(f"payload truncated: need {count} bytes at offset {offset}")
    return bytes(view[offset:end])


def _decode(view: memoryview, offset: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise DecodeError(f"payload nested deeper than {MAX_DEPTH} levels")
    tag = _take(view, offset, 1)
    offset += 1
    if tag == b"N":
        return None, offset
    if tag == b"T":
        return True, offset
    if tag == b"F":
        return False, offset
    if tag == b"i":
        return _INT64.unpack(_take(view, offset, 8))[0], offset + 8
    if tag == b"f":
        return _FLOAT.unpack(_take(view, offset, 8))[0], offset + 8
    if tag in (b"I", b"s", b"b"):
        (length,) = _LEN.unpack(_take(view, offset, 4))
        raw = _take(view, offset + 4, length)
        offset += 4 + length
        if tag == b"b":
            return raw, offset
        text = raw.decode("utf-8") if tag == b"s" else raw.decode("ascii")
        if tag == b"I":
            try:
                return int(text), offset
            except ValueError:
                raise DecodeError(f"bad big integer {text[:20]!r}") from None
        return text, offset
    if tag in (b"t", b"l"):
        (length,) = _LEN.unpack(_take(view, offset, 4))
        offset += 4
        if length > len(view) - offset:
            raise DecodeError(f"sequence claims {length} items in {len(view) - offset} bytes")
        items = []
        for _ in range(length):
            item, offset = _decode(view, offset, depth + 1)
            items.append(item)
        return (tuple(items) if tag == b"t" else items), offset
    if tag == b"d":
        (length,) = _LEN.unpack(_take(view, offset, 4))
        offset += 4
        if length > len(view) - offset:
            raise DecodeError(f"dict claims {length} items in {len(view) - offset} bytes")
        result: dict[Any, Any] = {}
        for _ in range(length):
            key, offset = _decode(view, offset, depth + 1)
            item, offset = _decode(view, offset, depth + 1)
            try:
                result[key] = item
            except TypeError:
                raise DecodeError(f"unhashable dict key of type {type(key).__name__}") from None
        return result, offset
    raise DecodeError(f"unknown tag {tag!r} at offset {offset - 1}")
