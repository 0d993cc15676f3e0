"""What the two real bindings (MPI, torch.distributed) share: the contract's semantics.

The bindings differ only in how bytes move (MPI point-to-point messages; keys in a
torch.distributed Store). Everything else the contract in :mod:`scout.transport.base` asks for
lives here, once: argument checks, the frame that carries a piece of evidence, bounded
deadline polling, and the rules that turn "which pieces arrived" into an
:class:`~scout.transport.base.ExchangeResult` or a :class:`~scout.transport.base.DeadlineExceeded`.

A binding implements two primitives (see :class:`PieceBinding`):

* ``_post(stream, number, group, frame, targets)`` -- make this rank's frame visible to
  ``targets`` (send it, or store it under a key);
* ``_collect(stream, number, group, sources, deadline_s)`` -- wait until a frame from every rank
  in ``sources`` arrived or the monotonic ``deadline_s`` passed; return the frames that did.

Every exchange and collective is one (post, collect) pair on a *stream*: the exchange stream of
a group is numbered by the caller's ``round_id``; the collective stream of a group is numbered
by a per-group counter that every member advances in the same order (as MPI numbers its
collectives implicitly).
"""

from __future__ import annotations

import abc
import enum
import hashlib
import math
import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from scout.core.guards import whole_number
from scout.transport import codec
from scout.transport.base import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DeadlineExceeded,
    ExchangeResult,
    Group,
    GroupError,
    PayloadTooLarge,
    TransportClosed,
    TransportStats,
    check_timeout_s,
)

__all__ = [
    "FRAME_HEADER_BYTES",
    "Frame",
    "FrameError",
    "Op",
    "PieceBinding",
    "PollSettings",
    "Stream",
    "UNDECODABLE",
    "group_key",
    "pack_frame",
    "unpack_frame",
    "wait_until",
]

_MAGIC = b"SCT1"
# magic, stream, op, 2 pad bytes, group key, number (round id or collective index), sender rank.
_HEADER = struct.Struct("<4sBBxxQqI")
FRAME_HEADER_BYTES = _HEADER.size


class Stream(enum.IntEnum):
    """Which numbered sequence a frame belongs to."""

    EXCHANGE = 1  # numbered by the caller's round_id
    COLLECTIVE = 2  # numbered by the per-group collective counter
    NOTICE = 3  # "I entered fast-path collective #n" (names the missing on a deadline)
    RELAY = 4  # a member's exchange record to the round's leader (relayed exchange)
    TABLE = 5  # the leader's table of every record it gathered (relayed exchange)


class Op(enum.IntEnum):
    """What a frame carries; lets a receiver notice members that called different collectives."""

    EXCHANGE = 1
    GATHER = 2  # one member's all_gather piece
    BCAST = 3  # the broadcast root's payload
    ARRIVE = 4  # "I am here" (a broadcast member other than the root; a fast-path notice)
    BARRIER = 5
    TABLE = 6  # the relayed exchange's table: [[rank, encoded payload], ...]


_COLLECTIVE_OP_NAMES = {
    Op.EXCHANGE: "exchange",
    Op.GATHER: "all_gather",
    Op.BCAST: "broadcast",
    Op.ARRIVE: "broadcast",
    Op.BARRIER: "barrier",
    Op.TABLE: "exchange",
}


class FrameError(ValueError):
    """Bytes that are not a scout frame (wrong magic, too short, unknown stream or op)."""


@attrs.frozen
class Frame:
    """One received piece of evidence, header checked, body not yet decoded."""

    stream: Stream
    op: Op
    group_key: int
    number: int
    sender: int
    body: bytes


def pack_frame(stream: Stream, op: Op, key: int, number: int, sender: int, body: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, stream, op, key, number, sender) + body


def unpack_frame(data: bytes | bytearray | memoryview) -> Frame:
    view = memoryview(data).cast("B")
    if len(view) < FRAME_HEADER_BYTES:
        raise FrameError(
            f"frame of {len(view)} bytes is shorter than its {FRAME_HEADER_BYTES}-byte header"
        )
    magic, stream, op, key, number, sender = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC:
        raise FrameError(f"frame starts with {bytes(magic)!r}, not {_MAGIC!r}")
    try:
        return Frame(Stream(stream), Op(op), key, number, sender, bytes(view[FRAME_HEADER_BYTES:]))
    except ValueError:
        raise FrameError(f"frame names unknown stream {stream} or op {op}") from None


def group_key(group: Group) -> int:
    """A 64-bit name for a group that every member computes alike, without communication."""
    text = f"{group.name}\x00{','.join(map(str, group.ranks))}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@attrs.frozen
class PollSettings:
    """How a binding waits: yield the CPU for ``busy_poll_s``, then sleep with doubling backoff.

    Yielding (not sleeping) first keeps latency low when peers answer within microseconds;
    MPI in particular only makes progress while some call polls it, so a bulk collective must
    not fall into the sleeping phase (docs/transports.md, "Waiting"). After ``busy_poll_s`` the
    wait sleeps from ``min_sleep_s`` doubling up to ``poll_interval_s`` so a long deadline with a
    silent peer costs almost no CPU.
    """

    busy_poll_s: float = 0.01
    poll_interval_s: float = 0.002
    min_sleep_s: float = 0.00005

    def __attrs_post_init__(self) -> None:
        for name in ("busy_poll_s", "poll_interval_s", "min_sleep_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if self.poll_interval_s <= 0:
            raise ValueError(
                f"poll_interval_s must be > 0 (it bounds each sleep), got {self.poll_interval_s!r}"
            )
        if self.min_sleep_s > self.poll_interval_s:
            raise ValueError(
                f"min_sleep_s={self.min_sleep_s!r} is larger than poll_interval_s="
                f"{self.poll_interval_s!r}; lower min_sleep_s"
            )


def wait_until(ready: Callable[[], bool], deadline_s: float, poll: PollSettings) -> bool:
    """Call ``ready`` until it returns True (-> True) or ``deadline_s`` passes (-> False).

    ``deadline_s`` is on the ``time.monotonic`` clock. ``ready`` is called at least once, so a
    zero timeout still takes whatever already arrived. The loop is bounded by the deadline.
    """
    start_s = time.monotonic()
    sleep_s = poll.min_sleep_s
    while True:
        if ready():
            return True
        now_s = time.monotonic()
        if now_s >= deadline_s:
            return False
        if now_s - start_s < poll.busy_poll_s:
            os.sched_yield()
        else:
            time.sleep(min(sleep_s, deadline_s - now_s))
            sleep_s = min(sleep_s * 2, poll.poll_interval_s)


def check_round_id(round_id: Any) -> int:
    if not whole_number(round_id):
        raise TypeError(f"exchange: round_id must be an int, got {type(round_id).__name__}")
    if not -(2**63) <= round_id < 2**63:
        raise ValueError(f"exchange: round_id must fit in 64 bits, got {round_id!r}")
    return round_id


def check_max_payload_bytes(max_payload_bytes: Any) -> int:
    if not whole_number(max_payload_bytes):
        raise TypeError(f"max_payload_bytes must be an int, got {type(max_payload_bytes).__name__}")
    if max_payload_bytes < 1:
        raise ValueError(f"max_payload_bytes must be >= 1, got {max_payload_bytes!r}")
    return max_payload_bytes


class PieceBinding(abc.ABC):
    """The contract's operations, written once over a binding's post/collect primitives.

    Not thread-safe: one transport is driven by one thread (the observer's, or the trainer's).
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        poll: PollSettings | None = None,
    ) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a world of size {size}")
        self._rank = rank
        self._size = size
        self._world = Group(tuple(range(size)), "world")
        self._max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        self._poll = poll if poll is not None else PollSettings()
        self._stats = TransportStats()
        self._closed = False
        self._collective_numbers: dict[int, int] = {}

    # -- the two primitives a binding provides ------------------------------------------------

    @abc.abstractmethod
    def _post(
        self, stream: Stream, number: int, group: Group, frame: bytes, targets: Sequence[int]
    ) -> None:
        """Make ``frame`` visible to every rank in ``targets``. Never waits for a peer."""

    @abc.abstractmethod
    def _collect(
        self,
        stream: Stream,
        number: int,
        group: Group,
        sources: Sequence[int],
        deadline_s: float,
    ) -> dict[int, Frame]:
        """Frames for (stream, group, number) from ``sources``, waiting until ``deadline_s``."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Free the binding's resources; called once by close()."""

    # -- properties ----------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def world(self) -> Group:
        return self._world

    @property
    def max_payload_bytes(self) -> int:
        return self._max_payload_bytes

    @property
    def stats(self) -> TransportStats:
        return self._stats

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the contract ----------------------------------------------------------------------------

    def group(self, ranks: Sequence[int], name: str) -> Group:
        self._check_open("group")
        ranks = tuple(ranks)
        for r in ranks:
            if not whole_number(r):
                raise GroupError(f"group {name!r}: rank {r!r} is not an int")
            if not 0 <= r < self._size:
                raise GroupError(
                    f"group {name!r}: rank {r} is outside this transport's world of size "
                    f"{self._size} (ranks 0..{self._size - 1})"
                )
        return Group(ranks, name)

    def exchange(
        self, payload: Any, *, round_id: int, timeout_s: float, group: Group | None = None
    ) -> ExchangeResult:
        self._check_open("exchange")
        timeout_s = check_timeout_s(timeout_s, "exchange")
        round_id = check_round_id(round_id)
        group = self._member_group(group, "exchange")
        body = self._encode(payload, "exchange")
        deadline_s = time.monotonic() + timeout_s
        peers = [r for r in group.ranks if r != self._rank]
        frame = pack_frame(
            Stream.EXCHANGE, Op.EXCHANGE, group_key(group), round_id, self._rank, body
        )
        self._post(Stream.EXCHANGE, round_id, group, frame, peers)
        answers: dict[int, Any] = {self._rank: codec.decode(body)}
        frames = self._collect(Stream.EXCHANGE, round_id, group, peers, deadline_s)
        for sender, received in frames.items():
            decoded = self._decode(received, Op.EXCHANGE)
            if decoded is not _UNDECODABLE:
                answers[sender] = decoded
        self._stats.exchanges += 1
        missing = tuple(r for r in group.ranks if r not in answers)
        if missing:
            self._stats.deadlines_exceeded += 1  # as the simulator counts a partial exchange
        return ExchangeResult(round_id=round_id, group=group, answers=answers, missing=missing)

    def all_gather(
        self, payload: Any, *, timeout_s: float, group: Group | None = None
    ) -> list[Any]:
        self._check_open("all_gather")
        timeout_s = check_timeout_s(timeout_s, "all_gather")
        group = self._member_group(group, "all_gather")
        body = self._encode(payload, "all_gather")
        peers = [r for r in group.ranks if r != self._rank]
        values = self._collective(
            "all_gather", Op.GATHER, group, body, peers, dict.fromkeys(peers, Op.GATHER), timeout_s
        )
        values[self._rank] = codec.decode(body)
        return [values[r] for r in group.ranks]

    def broadcast(
        self, payload: Any, *, root: int, timeout_s: float, group: Group | None = None
    ) -> Any:
        self._check_open("broadcast")
        timeout_s = check_timeout_s(timeout_s, "broadcast")
        group = self._member_group(group, "broadcast")
        if root not in group.ranks:
            raise GroupError(
                f"broadcast: root {root!r} is not a member of group {group.name!r} "
                f"{list(group.ranks)}"
            )
        # All or nothing on every member, as the other collectives: each member also waits
        # for every other member's arrival, so a silent member is named everywhere.
        peers = [r for r in group.ranks if r != self._rank]
        expected = {r: Op.BCAST if r == root else Op.ARRIVE for r in peers}
        if self._rank == root:
            body = self._encode(payload, "broadcast")
            self._collective("broadcast", Op.BCAST, group, body, peers, expected, timeout_s)
            return codec.decode(body)
        values = self._collective(
            "broadcast", Op.ARRIVE, group, _NONE_BODY, peers, expected, timeout_s
        )
        return values[root]

    def barrier(self, *, timeout_s: float, group: Group | None = None) -> None:
        self._check_open("barrier")
        timeout_s = check_timeout_s(timeout_s, "barrier")
        group = self._member_group(group, "barrier")
        peers = [r for r in group.ranks if r != self._rank]
        self._collective(
            "barrier",
            Op.BARRIER,
            group,
            _NONE_BODY,
            peers,
            dict.fromkeys(peers, Op.BARRIER),
            timeout_s,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._release()

    # -- helpers for subclasses -----------------------------------------------------------------

    def _collective(
        self,
        operation: str,
        op: Op,
        group: Group,
        body: bytes,
        targets: Sequence[int],
        expected: dict[int, Op],
        timeout_s: float,
    ) -> dict[int, Any]:
        """Post this member's piece, then collect ``expected`` (sender -> op); all or nothing."""
        key = group_key(group)
        number = self._collective_numbers.get(key, 0)
        self._collective_numbers[key] = number + 1
        deadline_s = time.monotonic() + timeout_s
        frame = pack_frame(Stream.COLLECTIVE, op, key, number, self._rank, body)
        self._post(Stream.COLLECTIVE, number, group, frame, targets)
        frames = self._collect(Stream.COLLECTIVE, number, group, list(expected), deadline_s)
        values: dict[int, Any] = {}
        mismatched: list[str] = []
        for sender, received in frames.items():
            if received.op != expected[sender]:
                # That member called another collective at this position: it did not take
                # part in this one (as on the simulator), and the message says what it did.
                self._stats.late_or_wrong_round_dropped += 1
                mismatched.append(f"rank {sender} called {_COLLECTIVE_OP_NAMES[received.op]}")
                continue
            decoded = self._decode(received, expected[sender])
            if decoded is not _UNDECODABLE:
                values[sender] = decoded
        missing = [r for r in expected if r not in values]
        if missing:
            self._stats.deadlines_exceeded += 1
            where = f"{operation} #{number} on group {group.name!r}"
            if mismatched:
                where += f" ({', '.join(mismatched)} there instead)"
            raise DeadlineExceeded(where, timeout_s, missing)
        return values

    def _decode(self, frame: Frame, op: Op) -> Any:
        """The frame's payload, or _UNDECODABLE (counted) if it is not a valid ``op`` payload."""
        if frame.op != op or len(frame.body) > self._max_payload_bytes:
            self._stats.undecodable_dropped += 1
            return _UNDECODABLE
        try:
            return codec.decode(frame.body)
        except codec.DecodeError:
            self._stats.undecodable_dropped += 1
            return _UNDECODABLE

    def _encode(self, payload: Any, operation: str) -> bytes:
        body = codec.encode(payload)
        if len(body) > self._max_payload_bytes:
            raise PayloadTooLarge(
                f"{operation}: payload encodes to {len(body)} bytes, more than "
                f"max_payload_bytes={self._max_payload_bytes}; send a digest instead, or raise "
                "max_payload_bytes on every rank"
            )
        return body

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise TransportClosed(
                f"{operation}: this {type(self).__name__} (rank {self._rank}) was closed; "
                "build a new transport"
            )

    def _member_group(self, group: Group | None, operation: str) -> Group:
        """The group to act on: the world if None; GroupError unless this rank belongs to it."""
        if group is None:
            return self._world
        if not isinstance(group, Group):
            raise GroupError(
                f"{operation}: group must be a scout Group (from transport.group()), "
                f"got {type(group).__name__}"
            )
        outside = [r for r in group.ranks if r >= self._size]
        if outside:
            raise GroupError(
                f"{operation}: group {group.name!r} names ranks {outside} outside this "
                f"transport's world of size {self._size}; it belongs to another transport"
            )
        if self._rank not in group.ranks:
            raise GroupError(
                f"{operation}: rank {self._rank} is not a member of group {group.name!r} "
                f"{list(group.ranks)}; only members may call it"
            )
        return group


class _Undecodable:
    def __repr__(self) -> str:
        return "<undecodable>"


_UNDECODABLE = _Undecodable()
UNDECODABLE = _UNDECODABLE  # for bindings that decode frames themselves
_NONE_BODY = codec.encode(None)
