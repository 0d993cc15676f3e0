"""Collective fingerprints: one stable 64-bit value per "which collective, on what".

The observer compares the fingerprint of the collective each rank is blocked in (docs/design.md §2.2):
ranks at the same progress coordinate whose fingerprints differ entered *different* collectives
(a desync), and the strict-majority rule (``classify_exact``) names the odd ones out.

What goes in (spec/observer.md, "Fingerprint"): the operation name, the group's member ranks,
each tensor's dtype and shape, the reduction operation and the root. What stays out: anything
that legitimately differs between the members of one call -- all-to-all split sizes (and so the
first dimension of an uneven all-to-all), the peer of a send/recv, the rank itself. A value that
differs between members would make every healthy call look like a desync.

The value must be the same in every process of a job, so it is computed from a canonical byte
encoding with BLAKE2b, never with Python's ``hash()`` (randomised per process for str and bytes).
0 is reserved for "no collective in flight"; a digest of 0 is remapped to 1.
"""

from __future__ import annotations

import hashlib
from typing import Final

import attrs

from scout.core.guards import whole_number

__all__ = [
    "FINGERPRINT_NONE",
    "CollectiveCall",
    "TensorMeta",
    "fingerprint",
]

#: The fingerprint field's value when no collective is in flight.
FINGERPRINT_NONE: Final = 0
# Bumped whenever the encoding changes, so that two versions never compare equal by accident.
_DOMAIN: Final = b"scout.fingerprint.v1\x00"
_FINGERPRINT_MAX: Final = 2**64 - 1


def _check_name(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise ValueError(f"{kind} must not contain NUL characters, got {value!r}")
    return value


def _check_dims(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, tuple):
        raise TypeError(f"TensorMeta.shape must be a tuple of ints or None, got {value!r}")
    for dim in value:
        if not whole_number(dim) or dim < 0:
            raise ValueError(f"TensorMeta.shape must hold ints >= 0, got {value!r}")
    return value


def _check_dtype(value: object) -> str:
    return _check_name("TensorMeta.dtype", value)


@attrs.frozen
class TensorMeta:
    """What the fingerprint sees of one tensor. ``shape=None``: the shape is rank-dependent
    (e.g. a member of an all-to-all list) and is left out on purpose."""

    dtype: str = attrs.field(converter=_check_dtype)
    shape: tuple[int, ...] | None = attrs.field(converter=_check_dims)


def _check_op(value: object) -> str:
    return _check_name("CollectiveCall.op", value)


def _check_group(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, tuple) or not value:
        raise ValueError(f"CollectiveCall.group must be a non-empty tuple of ranks or None, got {value!r}")
    for rank in value:
        if not whole_number(rank) or rank < 0:
            raise ValueError(f"CollectiveCall.group must hold ranks >= 0, got {value!r}")
    return value


def _check_tensors(value: object) -> tuple[TensorMeta, ...]:
    if not isinstance(value, tuple) or not all(isinstance(item, TensorMeta) for item in value):
        raise TypeError(f"tensor lists must be tuples of TensorMeta, got {value!r}")
    return value


def _check_reduce_op(value: object) -> str | None:
    return None if value is None else _check_name("CollectiveCall.reduce_op", value)


def _check_root(value: object) -> int | None:
    if value is None:
        return None
    if not whole_number(value) or value < 0:
        raise ValueError(f"CollectiveCall.root must be a rank >= 0 or None, got {value!r}")
    return value


def _check_detail(value: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, tuple):
        raise TypeError(f"CollectiveCall.detail must be a tuple of (name, int) pairs, got {value!r}")
    for item in value:
        if (
            not isinstance(item, tuple)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not whole_number(item[1])
        ):
            raise TypeError(f"CollectiveCall.detail must be a tuple of (name, int) pairs, got {value!r}")
        _check_name("CollectiveCall.detail name", item[0])
    return value


@attrs.frozen
class CollectiveCall:
    """A rank-independent description of one collective call.

    ``group`` lists the group's global ranks in group order (None: the default world group).
    ``root`` is the broadcast source / gather destination as a global rank. ``detail`` holds
    any further rank-independent integers (e.g. a send/recv tag, a list length).
    """

    op: str = attrs.field(converter=_check_op)
    group: tuple[int, ...] | None = attrs.field(default=None, converter=_check_group)
    inputs: tuple[TensorMeta, ...] = attrs.field(default=(), converter=_check_tensors)
    outputs: tuple[TensorMeta, ...] = attrs.field(default=(), converter=_check_tensors)
    reduce_op: str | None = attrs.field(default=None, converter=_check_reduce_op)
    root: int | None = attrs.field(default=None, converter=_check_root)
    detail: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_check_detail)


def _put_int(out: bytearray, value: int) -> None:
    # Signed, variable length, so that no value is truncated; the length prefix keeps the
    # encoding prefix-free.
    raw = value.to_bytes((value.bit_length() + 8) // 8 or 1, "little", signed=True)
    out.append(len(raw))
    out += raw


def _put_str(out: bytearray, value: str) -> None:
    raw = value.encode("utf-8")
    _put_int(out, len(raw))
    out += raw


def _put_optional_ints(out: bytearray, values: tuple[int, ...] | None) -> None:
    if values is None:
        out += b"N"
        return
    out += b"T"
    _put_int(out, len(values))
    for value in values:
        _put_int(out, value)


def _put_tensors(out: bytearray, tensors: tuple[TensorMeta, ...]) -> None:
    _put_int(out, len(tensors))
    for tensor in tensors:
        _put_str(out, tensor.dtype)
        _put_optional_ints(out, tensor.shape)


def canonical_bytes(call: CollectiveCall) -> bytes:
    """The unambiguous byte encoding the fingerprint hashes (every field tagged or length-prefixed,
    so two different calls never encode alike)."""
    out = bytearray(_DOMAIN)
    _put_str(out, call.op)
    _put_optional_ints(out, call.group)
    out += b"I"
    _put_tensors(out, call.inputs)
    out += b"O"
    _put_tensors(out, call.outputs)
    if call.reduce_op is None:
        out += b"N"
    else:
        out += b"R"
        _put_str(out, call.reduce_op)
    _put_optional_ints(out, None if call.root is None else (call.root,))
    _put_int(out, len(call.detail))
    for name, value in call.detail:
        _put_str(out, name)
        _put_int(out, value)
    return bytes(out)


#: Fingerprints already computed, by call: a training step makes the same few calls at every
#: step (DDP's buffer broadcast, its gradient buckets), and hashing a call's description costs
#: far less than encoding and digesting it again (issue 38: the fixed per-step cost). Bounded:
#: emptied when full.
_KNOWN: dict[CollectiveCall, int] = {}
KNOWN_CALLS_MAX: Final = 4096


def fingerprint(call: CollectiveCall) -> int:
    """The call's fingerprint: an int in ``[1, 2**64 - 1]``, equal in every process for equal calls."""
    known = _KNOWN.get(call)
    if known is not None:
        return known
    digest = hashlib.blake2b(canonical_bytes(call), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    result = value if value != FINGERPRINT_NONE else 1
    assert 1 <= result <= _FINGERPRINT_MAX
    if len(_KNOWN) >= KNOWN_CALLS_MAX:
        _KNOWN.clear()
    _KNOWN[call] = result
    return result
