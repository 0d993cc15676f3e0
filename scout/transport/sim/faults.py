"""Faults the simulator can inject: frozen values, each scheduled at a virtual time.

=============  ===========================================================================
``Delay``      extra latency on messages from and/or to some ranks, for a span
``Freeze``     a rank's program(s) make no progress for a span, like SIGSTOP; messages to
               them still arrive and queue (the kernel keeps receiving), timers fire late
``Crash``      a rank's program(s) stop forever; peers see silence
``Drop``       messages from one set of ranks to another are lost (with a probability)
``Partition``  no message crosses between two sets of ranks, either way, for a span
``Corrupt``    a hook rewrites a rank's outgoing payloads (the value, like silent data
               corruption, or the encoded bytes on the wire)
=============  ===========================================================================

A fault starts at ``start_s`` (or, for ``Freeze`` and ``Crash``, optionally when a program is
about to execute its ``at_op``-th op: "hang inside collective k") and lasts ``duration_s``
(``math.inf`` = for the rest of the run). Link faults (``Delay``, ``Drop``, ``Partition``) act on
a message when it is *sent*; a collective cannot complete while a ``Partition`` or a certain
``Drop`` separates two of its members (its transport would retransmit, so it completes when the
fault ends, if the deadlines allow). Every fault is recorded in the trace when it begins and ends.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from scout.core.guards import whole_number

__all__ = [
    "Corrupt",
    "Crash",
    "Delay",
    "Drop",
    "Fault",
    "FlipBit",
    "Freeze",
    "Partition",
    "describe_ranks",
]


def _rank_set(value: int | Iterable[int]) -> frozenset[int]:
    ranks = frozenset([value]) if isinstance(value, int) else frozenset(value)
    for rank in ranks:
        if not whole_number(rank) or rank < 0:
            raise ValueError(f"a fault names rank {rank!r}: ranks are ints >= 0")
    return ranks


def _programs(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names:
        raise ValueError("programs=() names no program; use None for every program on the rank")
    return names


def _rank(instance: object, attribute: attrs.Attribute, value: int) -> None:  # type: ignore[type-arg]
    if not whole_number(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a rank (int >= 0), got {value!r}")


def _time_s(instance: object, attribute: attrs.Attribute, value: float | None) -> None:  # type: ignore[type-arg]
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name} must be seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be finite and >= 0, got {value!r}")


def _duration_s(instance: object, attribute: attrs.Attribute, value: float) -> None:  # type: ignore[type-arg]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name} must be seconds, got {value!r}")
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be > 0 (math.inf for ever), got {value!r}")


def _at_op(instance: object, attribute: attrs.Attribute, value: int | None) -> None:  # type: ignore[type-arg]
    if value is not None and (not whole_number(value) or value < 1):
        raise ValueError(f"{attribute.name} counts ops from 1, got {value!r}")


def describe_ranks(ranks: Iterable[int], limit: int = 8) -> str:
    """``[1, 2, 3]`` for a few ranks, ``[0, 2, 4, ... 4 of 2048]`` for many: traces stay short."""
    ordered = sorted(ranks)
    if len(ordered) <= limit:
        return str(ordered)
    shown = ", ".join(str(rank) for rank in ordered[: limit - 1])
    return f"[{shown}, ... {ordered[-1]}; {len(ordered)} ranks]"


def _span(start_s: float, duration_s: float) -> str:
    if math.isinf(duration_s):
        return f"from {start_s:.6f} s on"
    return f"from {start_s:.6f} s for {duration_s:.6f} s"


def _trigger(start_s: float | None, at_op: int | None, programs: tuple[str, ...] | None) -> None:
    if (start_s is None) == (at_op is None):
        raise ValueError("give exactly one of start_s (a virtual time) and at_op (an op count)")
    if at_op is not None and (programs is None or len(programs) != 1):
        raise ValueError(
            f"at_op={at_op} counts the ops of one program: name it with programs=('trainer',)"
        )


@attrs.frozen
class Delay:
    """Messages sent from (``direction="from"``), to (``"to"``) or either way (``"both"``)
    between ``ranks`` and anyone take ``extra_latency_s`` longer while the fault lasts."""

    ranks: frozenset[int] = attrs.field(converter=_rank_set)
    extra_latency_s: float = attrs.field(validator=_time_s)
    start_s: float = attrs.field(default=0.0, validator=_time_s)
    duration_s: float = attrs.field(default=math.inf, validator=_duration_s)
    direction: str = attrs.field(
        default="both", validator=attrs.validators.in_(("from", "to", "both"))
    )

    def describe(self) -> str:
        return (
            f"delay messages {self.direction} ranks {describe_ranks(self.ranks)} by "
            f"{self.extra_latency_s:.6f} s {_span(self.start_s, self.duration_s)}"
        )


@attrs.frozen
class Freeze:
    """Program(s) of ``rank`` are stopped (SIGSTOP) for ``duration_s``.

    ``programs=None`` stops every program on the rank; ``programs=("trainer",)`` stops only the
    trainer, so its observer keeps running. With ``at_op=k`` the freeze begins when the (single)
    named program is about to execute its k-th op, e.g. inside a collective.
    """

    rank: int = attrs.field(validator=_rank)
    start_s: float | None = attrs.field(default=None, validator=_time_s)
    duration_s: float = attrs.field(default=math.inf, validator=_duration_s)
    programs: tuple[str, ...] | None = attrs.field(default=None, converter=_programs)
    at_op: int | None = attrs.field(default=None, validator=_at_op)

    def __attrs_post_init__(self) -> None:
        _trigger(self.start_s, self.at_op, self.programs)

    def describe(self) -> str:
        who = "every program" if self.programs is None else f"programs {list(self.programs)}"
        when = f"at op {self.at_op}" if self.at_op is not None else f"at {self.start_s:.6f} s"
        length = "for ever" if math.isinf(self.duration_s) else f"for {self.duration_s:.6f} s"
        return f"freeze rank {self.rank} ({who}) {when} {length}"


@attrs.frozen
class Crash:
    """Program(s) of ``rank`` stop for ever at ``at_s`` (or at their ``at_op``-th op)."""

    rank: int = attrs.field(validator=_rank)
    at_s: float | None = attrs.field(default=None, validator=_time_s)
    programs: tuple[str, ...] | None = attrs.field(default=None, converter=_programs)
    at_op: int | None = attrs.field(default=None, validator=_at_op)

    def __attrs_post_init__(self) -> None:
        _trigger(self.at_s, self.at_op, self.programs)

    def describe(self) -> str:
        who = "every program" if self.programs is None else f"programs {list(self.programs)}"
        when = f"at op {self.at_op}" if self.at_op is not None else f"at {self.at_s:.6f} s"
        return f"crash rank {self.rank} ({who}) {when}"


@attrs.frozen
class Drop:
    """Messages sent from ``src_ranks`` to ``dst_ranks`` are lost with ``probability``."""

    src_ranks: frozenset[int] = attrs.field(converter=_rank_set)
    dst_ranks: frozenset[int] = attrs.field(converter=_rank_set)
    start_s: float = attrs.field(default=0.0, validator=_time_s)
    duration_s: float = attrs.field(default=math.inf, validator=_duration_s)
    probability: float = attrs.field(default=1.0)

    def __attrs_post_init__(self) -> None:
        if not (0.0 < self.probability <= 1.0):
            raise ValueError(f"probability must be in (0, 1], got {self.probability!r}")

    def describe(self) -> str:
        return (
            f"drop messages {describe_ranks(self.src_ranks)} -> {describe_ranks(self.dst_ranks)} "
            f"with probability {self.probability} {_span(self.start_s, self.duration_s)}"
        )


@attrs.frozen
class Partition:
    """No message crosses between ``side_a`` and ``side_b`` (either way) for the span."""

    side_a: frozenset[int] = attrs.field(converter=_rank_set)
    side_b: frozenset[int] = attrs.field(converter=_rank_set)
    start_s: float = attrs.field(default=0.0, validator=_time_s)
    duration_s: float = attrs.field(default=math.inf, validator=_duration_s)

    def __attrs_post_init__(self) -> None:
        both = self.side_a & self.side_b
        if both:
            raise ValueError(f"ranks {sorted(both)} are on both sides of the partition")
        if not self.side_a or not self.side_b:
            raise ValueError("a partition needs at least one rank on each side")

    def describe(self) -> str:
        return (
            f"partition {describe_ranks(self.side_a)} | {describe_ranks(self.side_b)} "
            f"{_span(self.start_s, self.duration_s)}"
        )


def _rewrite_name(rewrite: Callable[[Any], Any]) -> str:
    # attrs values have a deterministic repr; a function's repr holds its address, its
    # qualified name does not -- the trace must not depend on memory layout.
    if attrs.has(type(rewrite)):
        return repr(rewrite)
    return str(getattr(rewrite, "__qualname__", type(rewrite).__name__))


@attrs.frozen
class Corrupt:
    """``rewrite`` replaces what ``rank`` sends while the fault lasts.

    ``layer="value"`` (silent data corruption): ``rewrite(value) -> value`` runs on the payload
    before it is encoded, so the rank itself and all its peers see the wrong value.
    ``layer="wire"``: ``rewrite(data: bytes) -> bytes`` runs on the encoded bytes of every
    message to a peer (the rank's own answer is untouched); the result may not even decode.
    """

    rank: int = attrs.field(validator=_rank)
    rewrite: Callable[[Any], Any] = attrs.field()
    start_s: float = attrs.field(default=0.0, validator=_time_s)
    duration_s: float = attrs.field(default=math.inf, validator=_duration_s)
    programs: tuple[str, ...] | None = attrs.field(default=None, converter=_programs)
    layer: str = attrs.field(default="value", validator=attrs.validators.in_(("value", "wire")))

    def __attrs_post_init__(self) -> None:
        if not callable(self.rewrite):
            raise TypeError(f"rewrite must be callable, got {self.rewrite!r}")

    def describe(self) -> str:
        who = "every program" if self.programs is None else f"programs {list(self.programs)}"
        return (
            f"corrupt {self.layer} sent by rank {self.rank} ({who}) with "
            f"{_rewrite_name(self.rewrite)} {_span(self.start_s, self.duration_s)}"
        )


Fault = Delay | Freeze | Crash | Drop | Partition | Corrupt

_FLOAT_BITS = struct.Struct("<d")
_INT_BITS = struct.Struct("<Q")


@attrs.frozen
class FlipBit:
    """A ``rewrite`` for :class:`Corrupt`: flip bit ``bit`` of numeric and bytes leaves.

    Ints flip ``value ^ (1 << bit)``; floats flip a bit of their IEEE-754 form (``bit`` < 64);
    bytes flip bit ``bit % (8 * len)``. ``leaf=k`` flips only the k-th such leaf in depth-first
    order (``None``: every leaf). Bools, strings and None are left alone.
    """

    bit: int = 0
    leaf: int | None = None

    def __attrs_post_init__(self) -> None:
        if not whole_number(self.bit) or self.bit < 0:
            raise ValueError(f"bit must be an int >= 0, got {self.bit!r}")

    def __call__(self, value: Any) -> Any:
        counter = [0]
        return self._rewrite(value, counter)

    def _rewrite(self, value: Any, counter: list[int]) -> Any:
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, (int, float, bytes, bytearray)):
            index = counter[0]
            counter[0] += 1
            if self.leaf is not None and index != self.leaf:
                return value
            return self._flip(value)
        if isinstance(value, tuple):
            return tuple(self._rewrite(item, counter) for item in value)
        if isinstance(value, list):
            return [self._rewrite(item, counter) for item in value]
        if isinstance(value, dict):
            return {key: self._rewrite(item, counter) for key, item in value.items()}
        return value

    def _flip(self, value: int | float | bytes | bytearray) -> int | float | bytes:
        if isinstance(value, int):
            return value ^ (1 << self.bit)
        if isinstance(value, float):
            (bits,) = _INT_BITS.unpack(_FLOAT_BITS.pack(value))
            (flipped,) = _FLOAT_BITS.unpack(_INT_BITS.pack(bits ^ (1 << (self.bit % 64))))
            return float(flipped)
        data = bytearray(value)
        if not data:
            return bytes(data)
        position = self.bit % (8 * len(data))
        data[position // 8] ^= 1 << (position % 8)
        return bytes(data)
