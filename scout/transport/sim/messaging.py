"""Messages between programs: the contract's ``Exchange`` and the simulator's ``Send``/``Receive``.

* ``Exchange`` sends the payload to every group member as one message each; it returns as soon
  as every member's answer for this ``round_id`` arrived, or at ``start + timeout_s`` with the
  silent members in ``missing``. Answers for an earlier round are dropped and counted in
  ``stats.late_or_wrong_round_dropped``; answers for a later round wait (at most
  ``max_rounds_buffered`` rounds per group) until the receiver gets there, as MPI's matching
  would.
* ``Send`` is one message to one program, ``Receive`` waits for the oldest queued one (with a
  tag, if given); a mailbox holds at most ``mailbox_limit`` messages, the rest are dropped.

Messages travel through :class:`~scout.transport.sim.network.Network` (latency, link faults);
this module decides what a delivered message means to the program that receives it.
"""

from __future__ import annotations

from typing import Any

from scout.core.guards import whole_number
from scout.transport.base import ExchangeResult, GroupError, check_timeout_s
from scout.transport.program import Exchange
from scout.transport.sim.groups import GroupTable
from scout.transport.sim.network import UNDECODED, Network
from scout.transport.sim.ops import Delivered, Receive, Send
from scout.transport.sim.process import (
    WAIT_EXCHANGE,
    WAIT_RECEIVE,
    Process,
    ProgramState,
)
from scout.transport.sim.runner import BLOCKED, ProgramRunner

__all__ = ["Messaging"]

_DONE = ProgramState.DONE
_CRASHED = ProgramState.CRASHED


class Messaging:
    """The exchange and mailbox ops, and what happens when their messages arrive."""

    __slots__ = (
        "_block",
        "_clock",
        "_ev_exchange_message",
        "_ev_mail",
        "_wake",
        "groups",
        "mailbox_limit",
        "max_rounds_buffered",
        "network",
        "runner",
        "trace",
    )

    def __init__(
        self,
        runner: ProgramRunner,
        network: Network,
        groups: GroupTable,
        *,
        max_rounds_buffered: int,
        mailbox_limit: int,
    ) -> None:
        self.runner = runner
        self.network = network
        self.groups = groups
        self.trace = runner.trace
        self.max_rounds_buffered = max_rounds_buffered
        self.mailbox_limit = mailbox_limit
        self._clock = runner.scheduler.clock
        self._block = runner.block
        self._wake = runner.wake
        self._ev_exchange_message = runner.scheduler.register(self._on_exchange_message)
        self._ev_mail = runner.scheduler.register(self._on_mail)
        runner.op_handlers[Exchange] = self._op_exchange
        runner.op_handlers[Send] = self._op_send
        runner.op_handlers[Receive] = self._op_receive
        runner.expirers[WAIT_EXCHANGE] = self._finish_exchange
        runner.expirers[WAIT_RECEIVE] = self._expire_receive

    # ---------------------------------------------------------------- exchange

    def _op_exchange(self, process: Process, op: Exchange) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "exchange")
        round_id = op.round_id
        if not whole_number(round_id):
            raise TypeError(f"exchange: round_id must be an int, got {round_id!r}")
        info = self.groups.member_group(process, op.group, "exchange")
        data, value, wire_data, wire_value = self.network.outgoing(process, op.payload, "exchange")
        rank = process.rank
        gid = info.gid
        process.stats.exchanges += 1
        self.trace.add(self._clock.now_s, rank, process.name, "exchange", (round_id, info.label))

        if info.size > 1:
            self.network.send_to_group(
                self._ev_exchange_message,
                rank,
                info.ranks,
                self.runner.by_name[process.name],
                (rank, gid, round_id, wire_data, wire_value),
                not self.runner.absent[process.name],
            )

        answers: dict[int, tuple[bytes, Any]] = {rank: (data, value)}
        box = process.boxes.get(gid)
        if box:
            for buffered_round in sorted(box):
                if buffered_round < round_id:
                    process.stats.late_or_wrong_round_dropped += len(box.pop(buffered_round))
                elif buffered_round == round_id:
                    answers.update(box.pop(buffered_round))
        process.w_info = info
        process.w_group = op.group if op.group is not None else self.groups.world
        process.w_gid = gid
        process.w_round = round_id
        process.w_answers = answers
        process.w_expected = info.size
        if len(answers) == info.size:
            return self._exchange_result(process)
        self._block(process, WAIT_EXCHANGE, timeout_s, "exchange")
        return BLOCKED

    def _on_exchange_message(
        self, process: Process, message: tuple[int, int, int, bytes, Any]
    ) -> None:
        state = process.state
        network = self.network
        if state is _DONE or state is _CRASHED:
            network.messages_discarded += 1
            return
        network.messages_delivered += 1
        src, gid, round_id, data, value = message
        if network.trace_messages:
            self.trace.add(
                self._clock.now_s, process.rank, process.name, "deliver", (src, round_id)
            )
        if process.w_gid == gid and process.wait == WAIT_EXCHANGE:
            waiting_round = process.w_round
            if round_id == waiting_round:
                answers = process.w_answers
                if src in answers:  # a second answer from one sender: not used (as on MPI)
                    process.stats.late_or_wrong_round_dropped += 1
                    return
                answers[src] = (data, value)
                if len(answers) == process.w_expected:
                    self._finish_exchange(process)
                return
            if round_id < waiting_round:
                process.stats.late_or_wrong_round_dropped += 1
                return
        else:
            last = process.last_round.get(gid)
            if last is not None and round_id <= last:
                process.stats.late_or_wrong_round_dropped += 1
                return
        # An answer for a round this program has not reached yet: hold it (bounded).
        boxes = process.boxes
        box = boxes.get(gid)
        if box is None:
            box = boxes[gid] = {}
        held = box.get(round_id)
        if held is None:
            if len(box) >= self.max_rounds_buffered:
                process.stats.late_or_wrong_round_dropped += 1
                return
            held = box[round_id] = {}
        elif src in held:
            process.stats.late_or_wrong_round_dropped += 1
            return
        held[src] = (data, value)

    def _exchange_result(self, process: Process) -> ExchangeResult:
        info = process.w_info
        answers = process.w_answers
        value_of = self.network.value_of
        values: dict[int, Any] = {}
        missing: list[int] = []
        for rank in info.ranks:
            got = answers.get(rank)
            if got is None:
                missing.append(rank)
                continue
            value = value_of(process, got[0], got[1])
            if value is UNDECODED:
                missing.append(rank)
            else:
                values[rank] = value
        round_id = process.w_round
        last = process.last_round.get(info.gid)
        if last is None or round_id > last:
            process.last_round[info.gid] = round_id
        missing.sort()
        if missing:
            process.stats.deadlines_exceeded += 1
        self.trace.add(
            self._clock.now_s,
            process.rank,
            process.name,
            "exchange-done",
            (round_id, tuple(missing)),
        )
        process.w_answers = {}
        return ExchangeResult(
            round_id=round_id, group=process.w_group, answers=values, missing=tuple(missing)
        )

    def _finish_exchange(self, process: Process) -> None:
        """Every answer arrived, or the deadline passed: the exchange returns what it has."""
        self._wake(process, self._exchange_result(process), None)

    # ---------------------------------------------------------------- send and receive

    def _op_send(self, process: Process, op: Send) -> None:
        dst = op.dst
        size = self.runner.size
        if not whole_number(dst) or not 0 <= dst < size:
            raise GroupError(f"send: rank {dst!r} is not in the world of {size} ranks")
        tag = op.tag
        if not whole_number(tag):
            raise TypeError(f"send: tag must be an int, got {tag!r}")
        program = process.name if op.program is None else op.program
        _, _, wire_data, wire_value = self.network.outgoing(process, op.payload, "send")
        column = self.runner.by_name.get(program)
        target = column[dst] if column is not None else None
        message = (process.rank, process.name, tag, wire_data, wire_value)
        self.network.send(self._ev_mail, process.rank, target, dst, message)
        return None

    def _op_receive(self, process: Process, op: Receive) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "receive")
        tag = op.tag
        mailbox = process.mailbox
        for index, delivered in enumerate(mailbox):
            if tag is None or delivered.tag == tag:
                del mailbox[index]
                return delivered
        process.w_tag = tag
        self._block(process, WAIT_RECEIVE, timeout_s, "receive")
        return BLOCKED

    def _expire_receive(self, process: Process) -> None:
        self._wake(process, None, None)

    def _on_mail(self, process: Process, message: tuple[int, str, int, bytes, Any]) -> None:
        network = self.network
        if process.state is ProgramState.DONE or process.state is ProgramState.CRASHED:
            network.messages_discarded += 1
            return
        network.messages_delivered += 1
        src, program, tag, data, value = message
        value = network.value_of(process, data, value)
        if value is UNDECODED:
            return
        delivered = Delivered(src=src, program=program, tag=tag, payload=value)
        now_s = self._clock.now_s
        if network.trace_messages:
            self.trace.add(now_s, process.rank, process.name, "deliver", (src, tag))
        if process.wait == WAIT_RECEIVE and (process.w_tag is None or process.w_tag == tag):
            self._wake(process, delivered, None)
            return
        if len(process.mailbox) >= self.mailbox_limit:
            network.messages_dropped += 1
            self.trace.add(now_s, process.rank, process.name, "mailbox-full", (src, tag))
            return
        process.mailbox.append(delivered)
