"""The collectives engine: ``AllGather``, ``Broadcast`` and ``Barrier`` on the simulator.

Calls are matched by call order per group (the k-th call of each member, as in MPI). A matched
collective completes, all or nothing, ``LatencyModel.collective_latency_s`` (plus the largest
active ``Delay`` among its members) after the last member arrives. A member whose deadline
passes first gets ``DeadlineExceeded`` naming the members that did not arrive -- or crashed, or
sit across a partition, or called a different collective. A contribution once made stays made,
as a collective in flight cannot be cancelled: a late member still completes it for itself.

A collective whose members an active link fault cuts in two stalls (its transport would
retransmit) and is tried again when the fault engine reports that a link healed
(:meth:`Collectives.retry_stalled`).
"""

from __future__ import annotations

from typing import Any

from scout.core.guards import whole_number
from scout.transport.base import DeadlineExceeded, GroupError, check_timeout_s
from scout.transport.codec import decode
from scout.transport.program import AllGather, Barrier, Broadcast
from scout.transport.sim.faults import describe_ranks
from scout.transport.sim.groups import GroupInfo, GroupTable
from scout.transport.sim.network import UNDECODED, Network
from scout.transport.sim.process import WAIT_COLLECTIVE, Process, ProgramState
from scout.transport.sim.runner import BLOCKED, ProgramRunner

__all__ = ["Collective", "Collectives"]


class Collective:
    """One matched collective call: the k-th all_gather/broadcast/barrier on a group."""

    __slots__ = (
        "arrived",
        "broken",
        "done_at_s",
        "info",
        "key",
        "kind",
        "program",
        "root",
        "signatures",
        "values",
    )

    def __init__(self, key: tuple[str, int, int], program: str, info: GroupInfo) -> None:
        self.key = key
        self.program = program
        self.info = info
        self.kind = ""  # of the first arrival; a member calling something else is a mismatch
        self.root = -1
        self.arrived = 0
        self.values: list[Any] = [None] * info.size  # (data, value) by position
        self.signatures: list[tuple[str, int] | None] = [None] * info.size
        self.done_at_s: float | None = None
        self.broken = ""  # why it can never complete, once it cannot


class Collectives:
    """Collectives in flight, keyed by (program, group id, call number), and their rules."""

    __slots__ = (
        "_at",
        "_block",
        "_clock",
        "_ev_done",
        "_wake",
        "collectives",
        "groups",
        "network",
        "runner",
        "stalled",
        "trace",
    )

    def __init__(self, runner: ProgramRunner, network: Network, groups: GroupTable) -> None:
        self.runner = runner
        self.network = network
        self.groups = groups
        self.trace = runner.trace
        self._clock = runner.scheduler.clock
        self._at = runner.scheduler.at
        self._block = runner.block
        self._wake = runner.wake
        self.collectives: dict[tuple[str, int, int], Collective] = {}
        self.stalled: list[Collective] = []  # cut by a link fault: retried when one heals
        self._ev_done = runner.scheduler.register(self._on_collective_done)
        runner.op_handlers[AllGather] = self._op_all_gather
        runner.op_handlers[Broadcast] = self._op_broadcast
        runner.op_handlers[Barrier] = self._op_barrier
        runner.expirers[WAIT_COLLECTIVE] = self.expire

    # ---------------------------------------------------------------- ops

    def _op_all_gather(self, process: Process, op: AllGather) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "all_gather")
        info = self.groups.member_group(process, op.group, "all_gather")
        data, value, _, _ = self.network.outgoing(process, op.payload, "all_gather")
        return self._join(process, "all_gather", info, -1, (data, value), timeout_s)

    def _op_broadcast(self, process: Process, op: Broadcast) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "broadcast")
        info = self.groups.member_group(process, op.group, "broadcast")
        root = op.root
        if not whole_number(root) or root not in info.positions:
            raise GroupError(
                f"broadcast: root {root!r} is not a member of group {info.label!r} "
                f"{describe_ranks(info.ranks)}"
            )
        contribution = None
        if process.rank == root:
            data, value, _, _ = self.network.outgoing(process, op.payload, "broadcast")
            contribution = (data, value)
        return self._join(process, "broadcast", info, root, contribution, timeout_s)

    def _op_barrier(self, process: Process, op: Barrier) -> Any:
        timeout_s = check_timeout_s(op.timeout_s, "barrier")
        info = self.groups.member_group(process, op.group, "barrier")
        return self._join(process, "barrier", info, -1, None, timeout_s)

    def _join(
        self,
        process: Process,
        kind: str,
        info: GroupInfo,
        root: int,
        contribution: Any,
        timeout_s: float,
    ) -> Any:
        gid = info.gid
        sequence = process.sequence.get(gid, 0)
        process.sequence[gid] = sequence + 1
        key = (process.name, gid, sequence)
        collective = self.collectives.get(key)
        if collective is None:
            collective = self.collectives[key] = Collective(key, process.name, info)
            collective.kind = kind
            collective.root = root
        position = info.positions[process.rank]
        collective.signatures[position] = (kind, root)
        collective.values[position] = contribution
        collective.arrived += 1
        now_s = self._clock.now_s
        self.trace.add(now_s, process.rank, process.name, kind, (info.label, sequence))
        process.w_collective = collective
        process.w_info = info
        if kind != collective.kind or root != collective.root:
            collective.broken = (
                f"rank {process.rank} called {kind} where rank "
                f"{info.ranks[collective.signatures.index((collective.kind, collective.root))]} "
                f"called {collective.kind}"
            )
            self.trace.add(now_s, process.rank, process.name, "mismatch", (kind, collective.kind))
        if collective.arrived == info.size:
            self._try_complete(collective)
        self._block(process, WAIT_COLLECTIVE, timeout_s, kind)
        return BLOCKED

    # ---------------------------------------------------------------- completion

    def _crashed_members(self, collective: Collective) -> list[int]:
        column = self.runner.by_name[collective.program]
        crashed = []
        for rank in collective.info.ranks:
            member = column[rank]
            if member is None or member.state is ProgramState.CRASHED:
                crashed.append(rank)
        return crashed

    def _try_complete(self, collective: Collective) -> None:
        """Every member arrived: schedule completion, unless something prevents it."""
        if collective.done_at_s is not None or collective.broken:
            return
        crashed = self._crashed_members(collective)
        if crashed:
            collective.broken = f"ranks {describe_ranks(crashed)} crashed"
            return
        info = collective.info
        if self.network.link_faults and self.network.cut(info.members):
            self.stalled.append(collective)  # retried when a link fault ends
            return
        latency_s = self.network.collective_latency_s(info.size, info.members)
        collective.done_at_s = self._clock.now_s + latency_s
        self._at(collective.done_at_s, self._ev_done, collective)

    def retry_stalled(self) -> None:
        """A link fault ended: try again every collective that a cut held back."""
        if self.stalled:
            stalled, self.stalled = self.stalled, []
            for collective in stalled:
                self._try_complete(collective)

    def _on_collective_done(self, collective: Collective, _: Any) -> None:
        info = collective.info
        column = self.runner.by_name[collective.program]
        now_s = self._clock.now_s
        stalled = False
        if not collective.broken:
            crashed = self._crashed_members(collective)
            if crashed:
                collective.broken = f"ranks {describe_ranks(crashed)} crashed"
            elif self.network.link_faults and self.network.cut(info.members):
                # A partition began while the collective was in flight: it waits for the heal.
                collective.done_at_s = None
                self.stalled.append(collective)
                stalled = True
        if collective.broken or stalled:
            # Deadlines that fell at the completion instant were deferred to this event.
            for rank in info.ranks:
                member = column[rank]
                if (
                    member is not None
                    and member.wait == WAIT_COLLECTIVE
                    and member.w_collective is collective
                    and member.w_deadline_s <= now_s
                    and not member.frozen
                ):
                    self.expire(member)
            return
        del self.collectives[collective.key]
        kind = collective.kind
        shared: Any = None
        private: list[int] = []  # positions whose value each member decodes for itself
        if kind == "all_gather":
            shared = []
            for position, (data, value) in enumerate(collective.values):
                shared.append(value if value is not UNDECODED else data)
                if value is UNDECODED:
                    private.append(position)
        elif kind == "broadcast":
            data, value = collective.values[info.positions[collective.root]]
            shared = value if value is not UNDECODED else data
            if value is UNDECODED:
                private.append(0)
        for rank in info.ranks:
            member = column[rank]
            if (
                member is None
                or member.wait != WAIT_COLLECTIVE
                or member.w_collective is not collective
            ):
                continue  # gave up at its deadline (its contribution still counted)
            if kind == "all_gather":
                result: Any = list(shared)
                for position in private:
                    result[position] = decode(shared[position])
            elif kind == "broadcast":
                result = decode(shared) if private else shared
            else:
                result = None
            self.trace.add(now_s, rank, member.name, f"{kind}-done", (info.label,))
            self._wake(member, result, None)

    # ---------------------------------------------------------------- deadlines

    def expire(self, process: Process) -> None:
        """The deadline of a member's wait passed before the collective completed for it."""
        collective = process.w_collective
        now_s = self._clock.now_s
        if (
            collective.done_at_s is not None
            and collective.done_at_s <= now_s
            and not collective.broken
        ):
            return  # completes at this very instant; its completion event wakes us
        missing = self._missing(process, collective)
        process.stats.deadlines_exceeded += 1
        self.trace.add(
            now_s,
            process.rank,
            process.name,
            "deadline",
            (collective.kind, tuple(missing)),
        )
        self._wake(process, None, DeadlineExceeded(process.w_op, process.w_timeout_s, missing))

    def _missing(self, process: Process, collective: Collective) -> list[int]:
        """Whom a member blames when its deadline passes: absent, crashed, mismatched or cut off."""
        info = collective.info
        mine = collective.signatures[info.positions[process.rank]]
        column = self.runner.by_name[collective.program]
        link_faults = self.network.link_faults
        missing = []
        for position, rank in enumerate(info.ranks):
            if rank == process.rank:
                continue
            signature = collective.signatures[position]
            member = column[rank]
            if (
                signature is None
                or signature != mine
                or member is None
                or member.state is ProgramState.CRASHED
                or (
                    collective.done_at_s is None
                    and link_faults
                    and self.network.cut_off(rank, process.rank)
                )
            ):
                missing.append(rank)
        return missing
