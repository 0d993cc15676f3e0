"""A simulated process: one named program (a generator) hosted by one rank.

A rank may host several programs -- e.g. ``trainer`` and ``observer`` -- each its own
generator with its own op state, mailbox and stats, so that freezing or crashing one does not
stop the other unless the fault says so. Programs with the same name on different ranks form one
communication domain (like one communicator): a trainer's exchange never mixes with an
observer's.

This module only holds state; :mod:`scout.transport.sim.cluster` moves it.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Generator
from typing import Any

import attrs

from scout.transport.base import TransportStats
from scout.transport.program import RankContext

__all__ = ["ProgramState", "SimContext"]


class ProgramState(enum.Enum):
    READY = "ready"  # spawned, not started yet
    RUNNING = "running"  # started; between ops or waiting for one
    DONE = "done"  # returned
    CRASHED = "crashed"  # stopped for ever by a Crash fault


@attrs.frozen
class SimContext(RankContext):
    """What a program sees on the simulator: the rank context plus simulator-only extras.

    ``shared`` is one dict per rank, shared by all programs of that rank (simulated shared
    memory). ``random`` is the run's single seeded generator: a program that draws from it stays
    reproducible, one that uses the ``random`` module does not.
    """

    program: str = attrs.field(kw_only=True)
    shared: dict[str, Any] = attrs.field(kw_only=True, eq=False, repr=False)
    random: random.Random = attrs.field(kw_only=True, eq=False, repr=False)


# What a process is waiting for. Plain ints: they are compared on every message.
WAIT_NONE = 0
WAIT_SLEEP = 1
WAIT_EXCHANGE = 2
WAIT_COLLECTIVE = 3
WAIT_RECEIVE = 4

NO_OP: Any = object()  # "no op is held": distinct from any value a program can yield


class Process:
    """Mutable per-program state. ``token`` changes whenever a wait ends, so a timer or deadline
    that was scheduled for an earlier wait recognises itself as stale."""

    __slots__ = (
        "boxes",
        "ctx",
        "deadline_due",
        "frozen",
        "gen",
        "held_op",
        "last_round",
        "mailbox",
        "name",
        "op_faults",
        "ops",
        "pending",
        "rank",
        "result",
        "sequence",
        "state",
        "stats",
        "token",
        "w_answers",
        "w_collective",
        "w_deadline_s",
        "w_expected",
        "w_gid",
        "w_group",
        "w_info",
        "w_op",
        "w_round",
        "w_tag",
        "w_timeout_s",
        "wait",
    )

    def __init__(
        self, rank: int, name: str, ctx: SimContext, gen: Generator[Any, Any, Any]
    ) -> None:
        self.rank = rank
        self.name = name
        self.ctx = ctx
        self.gen = gen
        self.state = ProgramState.READY
        self.frozen = 0  # depth: overlapping freezes nest
        self.pending: tuple[Any, BaseException | None] | None = None  # wake-up held while frozen
        self.held_op: Any = NO_OP  # op held by a freeze that began at that op
        self.deadline_due = False  # a deadline passed while frozen
        self.token = 0
        self.wait = WAIT_NONE
        self.w_deadline_s = 0.0
        self.w_timeout_s = 0.0
        self.w_op = ""
        self.w_info: Any = None
        self.w_group: Any = None
        self.w_gid = -1
        self.w_round = 0
        self.w_answers: dict[int, tuple[bytes, Any]] = {}
        self.w_expected = 0
        self.w_collective: Any = None
        self.w_tag: int | None = None
        # gid -> round_id -> src -> (data, value): answers that arrived before this program
        # reached their round (a peer ahead of it).
        self.boxes: dict[int, dict[int, dict[int, tuple[bytes, Any]]]] = {}
        self.last_round: dict[int, int] = {}  # gid -> highest finished round
        self.sequence: dict[int, int] = {}  # gid -> collectives entered (matches the k-th calls)
        self.mailbox: deque[Any] = deque()
        self.stats = TransportStats()
        self.ops = 0
        self.op_faults: dict[int, list[tuple[int, Any]]] | None = None
        self.result: Any = None

    def __repr__(self) -> str:
        return f"Process(rank={self.rank}, name={self.name!r}, state={self.state.value})"
