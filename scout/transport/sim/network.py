"""The simulated network: how a payload becomes a message and when (if ever) a message arrives.

* Payloads are encoded with the transport codec and limited on the encoded size; an active
  ``Corrupt`` fault rewrites the value before encoding or the bytes on the wire.
* A message sent at ``t`` arrives at ``t + base_latency_s + uniform(0, jitter_s)`` plus the
  extra latency of every active ``Delay`` that touches its direction; an active ``Partition``
  between its ends, or a ``Drop`` that names them (after its seeded coin), loses it.
* A collective's members are *cut* while a ``Partition`` or a certain ``Drop`` separates two of
  them: its transport would retransmit, so it stalls until the fault ends.

The fault engine (:mod:`scout.transport.sim.fault_engine`) decides when link and corruption
faults begin and end; this module only applies the ones active now. Every random draw comes from
the scheduler's one generator, in the order messages are sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scout.transport.base import PayloadTooLarge
from scout.transport.codec import DecodeError, decode, encode
from scout.transport.sim.faults import Corrupt, Delay, Drop, Partition
from scout.transport.sim.latency import LatencyModel
from scout.transport.sim.process import Process
from scout.transport.sim.scheduler import Scheduler
from scout.transport.sim.trace import Trace

__all__ = ["UNDECODED", "LinkFault", "Network", "immutable"]

LinkFault = Delay | Drop | Partition

UNDECODED: Any = object()  # "each receiver decodes its own copy" (the value is mutable)
_IMMUTABLE_LEAVES = (int, float, str, bytes, bool, type(None))


def immutable(value: Any) -> bool:
    """True if a decoded value can be shared by every receiver without aliasing surprises."""
    kind = type(value)
    if kind in _IMMUTABLE_LEAVES:
        return True
    if kind is tuple:
        return all(immutable(item) for item in value)
    return False


class Network:
    """Links between ranks under the active faults, payload encoding, and message counts."""

    __slots__ = (
        "_at",
        "_base_latency_s",
        "_clock",
        "_jitter_s",
        "_random",
        "corrupting",
        "latency",
        "link_faults",
        "max_payload_bytes",
        "messages_delivered",
        "messages_discarded",
        "messages_dropped",
        "messages_sent",
        "scheduler",
        "trace",
        "trace_messages",
    )

    def __init__(
        self,
        scheduler: Scheduler,
        trace: Trace,
        latency: LatencyModel,
        *,
        max_payload_bytes: int,
        trace_messages: bool,
    ) -> None:
        self.scheduler = scheduler
        self.trace = trace
        self.latency = latency
        self.max_payload_bytes = max_payload_bytes
        self.trace_messages = trace_messages
        self._clock = scheduler.clock
        self._at: Callable[..., None] = scheduler.at
        self._random = scheduler.rng.random
        self._base_latency_s = latency.base_latency_s
        self._jitter_s = latency.jitter_s
        self.link_faults: list[tuple[int, LinkFault]] = []  # (injection index, fault), active
        self.corrupting: dict[int, list[Corrupt]] = {}  # rank -> active Corrupt faults
        self.messages_sent = 0
        self.messages_delivered = 0
        self.messages_dropped = 0  # by a fault, or a full mailbox
        self.messages_discarded = 0  # to a program that is not there, ended, or crashed

    # ---------------------------------------------------------------- active faults

    def add_link_fault(self, index: int, fault: LinkFault) -> None:
        self.link_faults.append((index, fault))

    def remove_link_fault(self, index: int) -> None:
        self.link_faults = [entry for entry in self.link_faults if entry[0] != index]

    def add_corruption(self, fault: Corrupt) -> None:
        self.corrupting.setdefault(fault.rank, []).append(fault)

    def remove_corruption(self, fault: Corrupt) -> None:
        active = self.corrupting[fault.rank]
        active.remove(fault)
        if not active:
            del self.corrupting[fault.rank]

    # ---------------------------------------------------------------- payloads

    def outgoing(
        self, process: Process, payload: Any, op_name: str
    ) -> tuple[bytes, Any, bytes, Any]:
        """Encode a payload for sending: ``(data, value, wire_data, wire_value)``.

        ``value`` is the decoded payload when receivers may share it, else ``UNDECODED``.
        ``wire_*`` is what peers get (different from ``data`` under a wire-layer Corrupt).
        """
        corrupting = self.corrupting.get(process.rank) if self.corrupting else None
        if corrupting:
            for fault in corrupting:
                if fault.layer == "value" and (
                    fault.programs is None or process.name in fault.programs
                ):
                    before = payload
                    payload = fault.rewrite(payload)
                    self.trace.add(
                        self._clock.now_s,
                        process.rank,
                        process.name,
                        "corrupt",
                        (op_name, "value", repr(before), repr(payload)),
                    )
        data = encode(payload)
        if len(data) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"{op_name}: payload encodes to {len(data)} bytes, more than "
                f"max_payload_bytes={self.max_payload_bytes}; send a digest or split it"
            )
        if immutable(payload):
            value = payload  # decode(encode(x)) == x for these exact types: skip the round trip
        else:
            value = decode(data)
            if not immutable(value):
                value = UNDECODED
        wire_data, wire_value = data, value
        if corrupting:
            for fault in corrupting:
                if fault.layer == "wire" and (
                    fault.programs is None or process.name in fault.programs
                ):
                    wire_data = bytes(fault.rewrite(wire_data))
                    wire_value = UNDECODED
                    self.trace.add(
                        self._clock.now_s,
                        process.rank,
                        process.name,
                        "corrupt",
                        (op_name, "wire", data.hex(), wire_data.hex()),
                    )
        return data, value, wire_data, wire_value

    @staticmethod
    def value_of(process: Process, data: bytes, value: Any) -> Any:
        """The receiver's copy of a payload, or ``UNDECODED`` if it does not decode."""
        if value is not UNDECODED:
            return value
        try:
            return decode(data)
        except DecodeError:
            process.stats.undecodable_dropped += 1
            return UNDECODED

    # ---------------------------------------------------------------- links

    def delivery_time_s(self, src: int, dst: int, send_s: float) -> float | None:
        """Arrival time of a message sent now from ``src`` to ``dst``; None if a fault drops it."""
        arrive_s = send_s + self._base_latency_s + self._random() * self._jitter_s
        if not self.link_faults:
            return arrive_s
        for _, fault in self.link_faults:
            if isinstance(fault, Delay):
                touches_from = src in fault.ranks and fault.direction != "to"
                touches_to = dst in fault.ranks and fault.direction != "from"
                if touches_from or touches_to:
                    arrive_s += fault.extra_latency_s
            elif isinstance(fault, Partition):
                if (src in fault.side_a and dst in fault.side_b) or (
                    src in fault.side_b and dst in fault.side_a
                ):
                    return None
            elif (
                src in fault.src_ranks
                and dst in fault.dst_ranks
                and (fault.probability >= 1.0 or self._random() < fault.probability)
            ):
                return None
        return arrive_s

    def send(self, kind: int, src: int, target: Process | None, dst: int, message: Any) -> None:
        """Schedule event ``kind`` for ``target`` (program on rank ``dst``) when ``message`` arrives."""
        self.messages_sent += 1
        if target is None:
            self.messages_discarded += 1
            return
        arrive_s = self.delivery_time_s(src, dst, self._clock.now_s)
        if arrive_s is None:
            self.messages_dropped += 1
            if self.trace_messages:
                self.trace.add(self._clock.now_s, src, target.name, "dropped", (dst,))
            return
        self._at(arrive_s, kind, target, message)

    def send_to_group(
        self,
        kind: int,
        src: int,
        ranks: tuple[int, ...],
        targets: list[Process | None],
        message: Any,
        every_target_present: bool,
    ) -> None:
        """``send`` to each of ``ranks`` but ``src``; ``targets`` is the program's column by rank."""
        if self.link_faults or not every_target_present:
            send = self.send
            for dst in ranks:
                if dst != src:
                    send(kind, src, targets[dst], dst, message)
            return
        # Fast path (no link fault active, the program runs on every rank): the same arithmetic
        # as delivery_time_s, in one batch.
        sent_s = self._clock.now_s + self._base_latency_s
        jitter_s = self._jitter_s
        draw = self._random
        deliveries = [(sent_s + draw() * jitter_s, targets[dst]) for dst in ranks if dst != src]
        self.messages_sent += len(deliveries)
        self.scheduler.fan_out(kind, deliveries, message)

    def cut(self, members: frozenset[int]) -> bool:
        """True if an active link fault cuts a set of ranks in two (their collective stalls).

        Drops with a probability below 1 do not count: a collective's transport retransmits.
        """
        for _, fault in self.link_faults:
            if isinstance(fault, Partition):
                if members & fault.side_a and members & fault.side_b:
                    return True
            elif isinstance(fault, Drop) and fault.probability >= 1.0:
                sources = members & fault.src_ranks
                targets = members & fault.dst_ranks
                if sources and targets and len(sources | targets) > 1:
                    return True
        return False

    def cut_off(self, src: int, dst: int) -> bool:
        """True if a certain fault (a partition, a drop of every message) separates src from dst.

        Unlike ``delivery_time_s`` it draws no random number: deadlines use it to name whom a
        member cannot hear.
        """
        for _, fault in self.link_faults:
            if isinstance(fault, Partition):
                if (src in fault.side_a and dst in fault.side_b) or (
                    src in fault.side_b and dst in fault.side_a
                ):
                    return True
            elif (
                isinstance(fault, Drop)
                and fault.probability >= 1.0
                and src in fault.src_ranks
                and dst in fault.dst_ranks
            ):
                return True
        return False

    def collective_latency_s(self, size: int, members: frozenset[int]) -> float:
        """How long a collective of ``size`` ranks takes once its last member arrived: the
        latency model's tree steps plus the largest active ``Delay`` among its members."""
        extra_s = 0.0
        for _, fault in self.link_faults:
            if isinstance(fault, Delay) and fault.ranks & members:
                extra_s = max(extra_s, fault.extra_latency_s)
        return self.latency.collective_latency_s(self.scheduler.rng, size) + extra_s
