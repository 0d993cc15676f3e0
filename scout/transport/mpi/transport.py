"""The MPI binding: the transport contract over an mpi4py communicator.

Design (docs/transports.md has the long form):

* The binding duplicates the user's communicator once (``Idup``, bounded by ``setup_timeout_s``)
  so that none of its messages can ever match a receive of the user's program.
* MPI collectives have no timeouts, so the exchange and the evidence collectives
  (``all_gather``, ``broadcast``, ``barrier``) are point-to-point: each member sends one
  tagged frame (stream, group key, round or collective number, sender, encoded payload) with
  ``Isend`` and drains its inbox with ``Improbe``/``Mrecv`` while polling against a
  ``time.monotonic`` deadline. Because every piece is a separate message, the members that are missing at the
  deadline are known exactly, and the group stays usable after a deadline: a late piece
  carries an old number and is dropped and counted.
* Frames that arrive before this rank asks for them (a faster peer already in the next round)
  wait in a bounded mailbox; frames for a round below the one being collected are late and
  are dropped and counted, as are frames that do not parse.
* The exchange is *relayed* for groups of three or more: the round's leader
  (``group.ranks[round_id % n]``, so one dead leader costs only its own rounds) gathers every
  member's record and sends back one table, 2·(n-1) messages per round instead of n·(n-1).
  The partial-result contract is kept by falling back to direct messages only where the relay
  fails: a member that has no table after ``RELAY_FALLBACK_FRACTION`` of its timeout (a silent
  or late leader) or that finds itself absent from the table (it came late) sends its record
  to every peer itself; every member keeps collecting such direct records from the members the
  table lacks until its own deadline. So a member whose record reaches a peer before that
  peer's deadline is in the peer's answers, as with direct messages, and a silent member costs
  extra messages only in the rounds it is silent.
* :meth:`MpiTransport.all_gather_into` is the bulk fast path: equal-size byte buffers gathered
  with ``Iallgather`` into a caller's buffer, no encoding, no copies. A nonblocking collective
  cannot say who is missing, so each member first sends a small "arrived at fast-path call #n"
  notice to every peer; on a deadline the members without a notice are the missing ones. After a
  deadline the fast path of this transport is unusable (MPI cannot cancel the collective in
  flight); the exchange and the evidence collectives keep working.
"""

from __future__ import annotations

import collections
import struct
import time
from collections.abc import Collection, Sequence
from typing import Any

from mpi4py import MPI

from scout.core.guards import whole_number
from scout.transport import codec
from scout.transport._binding import (
    FRAME_HEADER_BYTES,
    UNDECODABLE,
    Frame,
    FrameError,
    Op,
    PieceBinding,
    PollSettings,
    Stream,
    check_round_id,
    group_key,
    pack_frame,
    unpack_frame,
    wait_until,
)
from scout.transport.base import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DeadlineExceeded,
    ExchangeResult,
    Group,
    GroupError,
    TransportError,
    TransportStats,
    check_timeout_s,
)

__all__ = ["FRAME_TAG", "MpiTransport"]

# Every scout frame travels on this tag of the duplicated communicator; user traffic cannot
# reach it because the communicator is private to the transport.
FRAME_TAG = 7301
# Bound on messages received per poll, so one poll stays short even under a flood.
_MAX_RECEIVES_PER_DRAIN = 1024
# Empty probes in a row that end the sweep at a deadline (see MpiTransport._drain).
_FINAL_SWEEP_EMPTY_PROBES = 16
# Relayed exchange (MpiTransport.exchange): the part of timeout_s a member waits for the
# leader's table before it also sends its record to every peer itself.
RELAY_FALLBACK_FRACTION = 0.5
# A table entry: the member's rank and its record's length, then the record as it was sent.
_TABLE_ENTRY = struct.Struct("<II")
_TABLE_ENTRY_OVERHEAD_BYTES = _TABLE_ENTRY.size
_StreamKey = tuple[Stream, int]  # (stream, group key)


class _Mailbox:
    """Frames received but not yet asked for, bounded in count and bytes.

    Per (stream, group) the mailbox keeps a *floor*: the lowest number still wanted. Frames
    below it are late (dropped, counted); frames at or above it wait until collected or until
    the bounds evict them, oldest first (also counted).
    """

    def __init__(self, stats: TransportStats, max_messages: int, max_bytes: int) -> None:
        self._stats = stats
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._boxes: dict[tuple[Stream, int, int], dict[int, Frame]] = {}
        self._arrival_order: collections.OrderedDict[tuple[Stream, int, int, int], int] = (
            collections.OrderedDict()
        )
        self._floors: dict[_StreamKey, int] = {}
        self._bytes = 0

    def add(self, frame: Frame) -> None:
        floor = self._floors.get((frame.stream, frame.group_key))
        box_key = (frame.stream, frame.group_key, frame.number)
        box = self._boxes.get(box_key)
        if (floor is not None and frame.number < floor) or (
            box is not None and frame.sender in box
        ):
            # Late for its round, or a second answer from the same sender: not used.
            self._count_dropped(frame.stream)
            return
        if box is None:
            box = self._boxes[box_key] = {}
        box[frame.sender] = frame
        self._arrival_order[(frame.stream, frame.group_key, frame.number, frame.sender)] = len(
            frame.body
        )
        self._bytes += len(frame.body)
        while len(self._arrival_order) > self._max_messages or self._bytes > self._max_bytes:
            (stream, key, number, sender), _ = self._arrival_order.popitem(last=False)
            self._remove(stream, key, number, sender)
            self._count_dropped(stream)

    def open(self, stream_key: _StreamKey, number: int) -> None:
        """Start collecting ``number``: frames for lower numbers are dropped from now on."""
        self._floors[stream_key] = number
        stream, key = stream_key
        for entry in [e for e in self._arrival_order if e[:2] == stream_key and e[2] < number]:
            self._remove(stream, key, entry[2], entry[3])
            del self._arrival_order[entry]
            self._count_dropped(stream)

    def senders(self, stream_key: _StreamKey, number: int) -> Collection[int]:
        """The ranks whose frame for ``number`` is waiting here."""
        return self._boxes.get((stream_key[0], stream_key[1], number), {}).keys()

    def peek(self, stream_key: _StreamKey, number: int) -> dict[int, Frame]:
        """The frames for ``number`` waiting here, left in place (a copy of the mapping)."""
        return dict(self._boxes.get((stream_key[0], stream_key[1], number), {}))

    def close(self, stream_key: _StreamKey, number: int) -> dict[int, Frame]:
        """Stop collecting ``number``: return its frames; later frames for it are late."""
        stream, key = stream_key
        box = self._boxes.pop((stream, key, number), {})
        for sender, frame in box.items():
            self._arrival_order.pop((stream, key, number, sender), None)
            self._bytes -= len(frame.body)
        self._floors[stream_key] = number + 1
        return box

    def _remove(self, stream: Stream, key: int, number: int, sender: int) -> None:
        box = self._boxes.get((stream, key, number))
        if box is None or sender not in box:
            return
        self._bytes -= len(box.pop(sender).body)
        if not box:
            del self._boxes[(stream, key, number)]

    def _count_dropped(self, stream: Stream) -> None:
        # Fast-path notices are only needed on a deadline; discarding old ones is routine.
        if stream != Stream.NOTICE:
            self._stats.late_or_wrong_round_dropped += 1


class MpiTransport(PieceBinding):
    """The transport contract over an mpi4py intracommunicator (``MPI.COMM_WORLD`` by default).

    Ranks are the ranks of ``comm``: over a split communicator the transport's world is that
    split. Construction is collective over ``comm`` (every rank must construct it, in the same
    order as any other collective on ``comm``) and bounded by ``setup_timeout_s``.

    Not thread-safe: drive one transport from one thread.
    """

    def __init__(
        self,
        comm: MPI.Intracomm | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        setup_timeout_s: float = 60.0,
        busy_poll_s: float = 0.05,
        poll_interval_s: float = 0.002,
        max_stashed_messages: int = 4096,
        max_stashed_bytes: int = 64 * 1024 * 1024,
        max_pending_sends_per_peer: int = 64,
    ) -> None:
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(
                f"MpiTransport needs an mpi4py intracommunicator such as MPI.COMM_WORLD or "
                f"one made by comm.Split(), got {comm!r}"
            )
        for name, value in (
            ("max_stashed_messages", max_stashed_messages),
            ("max_stashed_bytes", max_stashed_bytes),
            ("max_pending_sends_per_peer", max_pending_sends_per_peer),
        ):
            if not whole_number(value) or value < 1:
                raise ValueError(f"MpiTransport: {name} must be an int >= 1, got {value!r}")
        setup_timeout_s = check_timeout_s(setup_timeout_s, "MpiTransport setup")
        poll = PollSettings(busy_poll_s=busy_poll_s, poll_interval_s=poll_interval_s)
        super().__init__(
            rank=comm.Get_rank(),
            size=comm.Get_size(),
            max_payload_bytes=max_payload_bytes,
            poll=poll,
        )
        self._comm = _duplicate(comm, setup_timeout_s, poll)
        self._status = MPI.Status()
        self._mailbox = _Mailbox(self._stats, max_stashed_messages, max_stashed_bytes)
        self._max_pending_sends_per_peer = max_pending_sends_per_peer
        # Sends not yet complete (only large frames to a peer that does not receive); each
        # entry keeps its buffer alive until MPI is done with it.
        self._pending_sends: collections.deque[tuple[int, Any, bytes]] = collections.deque()
        self._pending_by_peer: collections.Counter[int] = collections.Counter()
        self._sends_skipped = 0
        self._fast_number = 0
        self._fast_unusable_reason: str | None = None
        # A fast-path collective abandoned at its deadline is still in flight inside MPI;
        # its request and buffers stay referenced here for as long as the transport lives.
        self._abandoned: list[tuple[Any, Any, Any]] = []
        self._world_key = group_key(self._world)

    @property
    def comm(self) -> MPI.Intracomm:
        """The transport's private duplicate of the user's communicator (for diagnosis)."""
        return self._comm

    @property
    def sends_skipped(self) -> int:
        """Frames not sent because a peer left max_pending_sends_per_peer sends unreceived."""
        return self._sends_skipped

    # -- relayed exchange ------------------------------------------------------------------------

    def exchange(
        self, payload: Any, *, round_id: int, timeout_s: float, group: Group | None = None
    ) -> ExchangeResult:
        self._check_open("exchange")
        timeout_s = check_timeout_s(timeout_s, "exchange")
        round_id = check_round_id(round_id)
        group = self._member_group(group, "exchange")
        if group.size <= 2:
            return super().exchange(payload, round_id=round_id, timeout_s=timeout_s, group=group)
        body = self._encode(payload, "exchange")
        started_s = time.monotonic()
        answers = self._relayed_exchange(
            body,
            round_id,
            group,
            fallback_s=started_s + RELAY_FALLBACK_FRACTION * timeout_s,
            deadline_s=started_s + timeout_s,
        )
        self._stats.exchanges += 1
        missing = tuple(r for r in group.ranks if r not in answers)
        if missing:
            self._stats.deadlines_exceeded += 1
        return ExchangeResult(round_id=round_id, group=group, answers=answers, missing=missing)

    def _relayed_exchange(
        self, body: bytes, round_id: int, group: Group, fallback_s: float, deadline_s: float
    ) -> dict[int, Any]:
        me = self._rank
        key = group_key(group)
        leader = group.ranks[round_id % group.size]
        peers = [r for r in group.ranks if r != me]
        relay, table_key, direct = (Stream.RELAY, key), (Stream.TABLE, key), (Stream.EXCHANGE, key)
        answers: dict[int, Any] = {me: codec.decode(body)}
        direct_frame = pack_frame(Stream.EXCHANGE, Op.EXCHANGE, key, round_id, me, body)
        sent_direct = False

        def send_direct() -> None:
            nonlocal sent_direct
            if not sent_direct:
                sent_direct = True
                self._post(Stream.EXCHANGE, round_id, group, direct_frame, peers)

        self._drain()
        for stream_key in (relay, table_key, direct):
            self._mailbox.open(stream_key, round_id)
        try:
            if me == leader:
                wait_until(lambda: self._arrived(relay, round_id, peers), fallback_s, self._poll)
                bodies = {me: body}
                for sender, frame in self._mailbox.close(relay, round_id).items():
                    if self._take(answers, sender, frame, peers):
                        bodies[sender] = frame.body
                # The records as received, not re-encoded: [rank u32, length u32, body] each.
                table = b"".join(
                    _TABLE_ENTRY.pack(rank, len(record)) + record
                    for rank, record in sorted(bodies.items())
                )
                table_frame_bytes = pack_frame(Stream.TABLE, Op.TABLE, key, round_id, me, table)
                self._post(Stream.TABLE, round_id, group, table_frame_bytes, peers)
            else:
                record = pack_frame(Stream.RELAY, Op.EXCHANGE, key, round_id, me, body)
                self._post(Stream.RELAY, round_id, group, record, [leader])
                if not wait_until(
                    lambda: self._arrived(table_key, round_id, [leader]), fallback_s, self._poll
                ):
                    send_direct()  # the leader is silent or late: reach the peers directly

                    def table_or_everyone() -> bool:
                        return self._arrived(table_key, round_id, [leader]) or self._arrived(
                            direct, round_id, peers
                        )

                    wait_until(table_or_everyone, deadline_s, self._poll)
                table_frame = self._mailbox.peek(table_key, round_id).get(leader)
                if table_frame is None:
                    # MPI moves only a few messages per poll: a table sent long ago (a late
                    # member, a zero timeout) may still be on its way in.
                    self._drain(empty_probes=_FINAL_SWEEP_EMPTY_PROBES)
                    table_frame = self._mailbox.peek(table_key, round_id).get(leader)
                if table_frame is not None:
                    entries = self._table_entries(table_frame, group)
                    if entries is not None:
                        for rank, value in entries.items():
                            answers.setdefault(rank, value)
                        if me not in entries:
                            send_direct()  # it came late for the table: the others still wait
            # Direct records from the members the table lacks, until this member's deadline.
            wanted = [r for r in peers if r not in answers]
            if wanted and not wait_until(
                lambda: self._arrived(direct, round_id, wanted), deadline_s, self._poll
            ):
                self._drain(empty_probes=_FINAL_SWEEP_EMPTY_PROBES)
            for sender, frame in self._mailbox.peek(direct, round_id).items():
                if sender not in answers:
                    self._take(answers, sender, frame, peers)
        finally:
            for stream_key in (relay, table_key, direct):
                self._mailbox.close(stream_key, round_id)
        return answers

    def _arrived(self, stream_key: _StreamKey, number: int, sources: Sequence[int]) -> bool:
        self._drain()
        arrived = self._mailbox.senders(stream_key, number)
        return all(source in arrived for source in sources)

    def _take(self, answers: dict[int, Any], sender: int, frame: Frame, members: Sequence[int]) -> bool:
        """Decode a member's record into ``answers``; False (counted) if it is not one."""
        if sender not in members:
            self._stats.late_or_wrong_round_dropped += 1
            return False
        value = self._decode(frame, Op.EXCHANGE)
        if value is UNDECODABLE:
            return False
        answers[sender] = value
        return True

    def _table_entries(self, frame: Frame, group: Group) -> dict[int, Any] | None:
        """The leader's table as {rank: payload}, or None (counted) if it is not a valid one."""
        if frame.op != Op.TABLE:
            self._stats.undecodable_dropped += 1
            return None
        view = memoryview(frame.body)
        table: dict[int, Any] = {}
        offset = 0
        try:
            while offset < len(view):
                if offset + _TABLE_ENTRY.size > len(view):
                    raise codec.DecodeError("truncated table entry header")
                rank, length = _TABLE_ENTRY.unpack_from(view, offset)
                offset += _TABLE_ENTRY.size
                if rank not in group.ranks or rank in table:
                    raise codec.DecodeError(f"table entry for rank {rank} is not valid")
                if length > self._max_payload_bytes or offset + length > len(view):
                    raise codec.DecodeError(f"table entry for rank {rank} is too large")
                table[rank] = codec.decode(bytes(view[offset : offset + length]))
                offset += length
        except codec.DecodeError:
            self._stats.undecodable_dropped += 1
            return None
        return table

    # -- fast path -------------------------------------------------------------------------------

    def all_gather_into(
        self,
        send_buffer: Any,
        recv_buffer: Any = None,
        *,
        timeout_s: float,
        group: Group | None = None,
    ) -> Any:
        """Gather equal-size byte buffers from every rank into ``recv_buffer`` (``Iallgather``).

        ``send_buffer`` is any C-contiguous buffer (bytes, bytearray, numpy array); every rank
        passes the same number of bytes. ``recv_buffer`` is writable and holds ``size`` times
        that, rank ``r``'s bytes at offset ``r * nbytes``; a bytearray is allocated when it is
        None. Returns ``recv_buffer``. Runs on the world group only: for a subgroup build an
        ``MpiTransport`` over ``comm.Split(...)``. Payload limits do not apply (no encoding).

        On a deadline it raises :class:`DeadlineExceeded` naming the ranks that never entered
        the call, and from then on this transport's fast path is unusable: the collective is
        still in flight and MPI may still write into ``recv_buffer``.
        """
        self._check_open("all_gather_into")
        timeout_s = check_timeout_s(timeout_s, "all_gather_into")
        group = self._member_group(group, "all_gather_into")
        if group.ranks != self._world.ranks:
            raise GroupError(
                f"all_gather_into runs on the world group only, got group {group.name!r} "
                f"{list(group.ranks)}; for a subgroup build an MpiTransport over "
                "comm.Split(color, key), or use all_gather()"
            )
        if self._fast_unusable_reason is not None:
            raise TransportError(self._fast_unusable_reason)
        send = _byte_view(send_buffer, "send_buffer", writable=False)
        if recv_buffer is None:
            recv_buffer = bytearray(send.nbytes * self._size)
        recv = _byte_view(recv_buffer, "recv_buffer", writable=True)
        if recv.nbytes != send.nbytes * self._size:
            raise ValueError(
                f"all_gather_into: recv_buffer holds {recv.nbytes} bytes; it needs "
                f"size * len(send_buffer) = {self._size} * {send.nbytes} = "
                f"{send.nbytes * self._size}"
            )
        number = self._fast_number
        self._fast_number += 1
        deadline_s = time.monotonic() + timeout_s
        notice_key = (Stream.NOTICE, self._world_key)
        self._drain()
        self._mailbox.open(notice_key, number)
        peers = [r for r in self._world.ranks if r != self._rank]
        frame = pack_frame(Stream.NOTICE, Op.ARRIVE, self._world_key, number, self._rank, b"")
        self._post(Stream.NOTICE, number, self._world, frame, peers)
        request = self._comm.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE])
        if wait_until(request.Test, deadline_s, self._poll):
            return recv_buffer
        self._drain(empty_probes=_FINAL_SWEEP_EMPTY_PROBES)
        arrived = self._mailbox.senders(notice_key, number)
        missing = [r for r in peers if r not in arrived]
        self._mailbox.close(notice_key, number)
        self._abandoned.append((request, send, recv))
        self._fast_unusable_reason = (
            f"all_gather_into: call #{number} passed its deadline (timeout_s={timeout_s}) with "
            f"ranks {missing} absent; MPI cannot cancel a collective in flight, so this "
            "transport's fast path is unusable. exchange() and all_gather() still work; "
            "build a new MpiTransport for bulk gathers"
        )
        self._stats.deadlines_exceeded += 1
        raise DeadlineExceeded("all_gather_into on group 'world'", timeout_s, missing)

    # -- the binding primitives ------------------------------------------------------------------

    def _post(
        self, stream: Stream, number: int, group: Group, frame: bytes, targets: Sequence[int]
    ) -> None:
        self._reap_sends()
        for target in targets:
            if self._pending_by_peer[target] >= self._max_pending_sends_per_peer:
                self._sends_skipped += 1  # the peer has not received our last frames
                continue
            request = self._comm.Isend([frame, MPI.BYTE], target, FRAME_TAG)
            if not request.Test():
                self._pending_sends.append((target, request, frame))
                self._pending_by_peer[target] += 1

    def _collect(
        self,
        stream: Stream,
        number: int,
        group: Group,
        sources: Sequence[int],
        deadline_s: float,
    ) -> dict[int, Frame]:
        stream_key = (stream, group_key(group))
        self._drain()
        self._mailbox.open(stream_key, number)

        def all_arrived() -> bool:
            self._drain()
            arrived = self._mailbox.senders(stream_key, number)
            return all(source in arrived for source in sources)

        if not wait_until(all_arrived, deadline_s, self._poll):
            # MPI moves messages only while polled: one more sweep takes what is already here.
            self._drain(empty_probes=_FINAL_SWEEP_EMPTY_PROBES)
        frames = self._mailbox.close(stream_key, number)
        wanted = set(sources)
        for sender in frames:
            if sender not in wanted:  # a non-member, or a frame this op does not expect
                self._stats.late_or_wrong_round_dropped += 1
        return {sender: frame for sender, frame in frames.items() if sender in wanted}

    def _release(self) -> None:
        self._reap_sends()
        if self._pending_sends or self._abandoned:
            # MPI may still read or write these buffers; keep them alive with the process.
            _ORPHANED.append((self._pending_sends, self._abandoned))
        self._comm.Free()

    # -- internals -------------------------------------------------------------------------------

    def _drain(self, *, empty_probes: int = 1) -> None:
        """Receive the scout frames that have arrived (bounded per call) into the mailbox.

        MPI moves only a few messages per progress poll, so a probe that finds nothing does
        not prove that nothing is on its way in; a final sweep at a deadline passes a larger
        ``empty_probes`` to take everything that was already sent.
        """
        status = self._status
        empty = 0
        for _ in range(_MAX_RECEIVES_PER_DRAIN):
            message = self._comm.Improbe(MPI.ANY_SOURCE, FRAME_TAG, status)
            if message is None:
                empty += 1
                if empty >= empty_probes:
                    return
                continue
            nbytes = status.Get_count(MPI.BYTE)
            source = status.Get_source()
            data = bytearray(nbytes)
            message.Recv([data, MPI.BYTE])
            self._accept(source, data)

    def _accept(self, source: int, data: bytearray) -> None:
        # A relayed exchange's table holds one record per member; every other frame one.
        table_bytes = self._size * (self._max_payload_bytes + _TABLE_ENTRY_OVERHEAD_BYTES) + 64
        if len(data) > FRAME_HEADER_BYTES + max(self._max_payload_bytes, table_bytes):
            self._stats.undecodable_dropped += 1
            return
        try:
            frame = unpack_frame(data)
        except FrameError:
            self._stats.undecodable_dropped += 1
            return
        if frame.stream != Stream.TABLE and len(frame.body) > self._max_payload_bytes:
            self._stats.undecodable_dropped += 1
            return
        if frame.sender != source:  # a header that lies about its sender is corrupt
            self._stats.undecodable_dropped += 1
            return
        self._mailbox.add(frame)

    def _reap_sends(self) -> None:
        for _ in range(len(self._pending_sends)):
            target, request, frame = self._pending_sends.popleft()
            if request.Test():
                self._pending_by_peer[target] -= 1
            else:
                self._pending_sends.append((target, request, frame))


# Requests (with their buffers) still in flight when their transport was closed.
_ORPHANED: list[Any] = []


def _duplicate(comm: MPI.Intracomm, timeout_s: float, poll: PollSettings) -> MPI.Intracomm:
    duplicate, request = comm.Idup()
    if wait_until(request.Test, time.monotonic() + timeout_s, poll):
        return duplicate
    _ORPHANED.append((duplicate, request))
    raise TransportError(
        f"MpiTransport setup: duplicating the communicator (size {comm.Get_size()}) did not "
        f"complete within setup_timeout_s={timeout_s}; every rank of the communicator must "
        "construct MpiTransport at the same point of the program"
    )


def _byte_view(buffer: Any, name: str, *, writable: bool) -> memoryview:
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(
            f"all_gather_into: {name} must support the buffer protocol (bytes, bytearray, "
            f"numpy array), got {type(buffer).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(f"all_gather_into: {name} must be C-contiguous")
    if writable and view.readonly:
        raise ValueError(f"all_gather_into: {name} is read-only; pass a bytearray or array")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
