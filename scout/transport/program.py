"""Rank programs: one piece of driver code that runs on every binding.

A *rank program* is a generator function ``program(ctx) -> Generator[Op, Any, T]``. It yields
operation values (below) and receives each operation's result, exactly like a core machine
returns effects for a driver to execute. This is what lets one conformance suite and one
scenario run on all three bindings:

* on a real binding (MPI, torch.distributed) :func:`run_blocking` executes each op by calling
  the matching blocking :class:`~scout.transport.base.Transport` method;
* on the simulator, thousands of programs interleave on one thread under a virtual clock.

An op that fails raises its exception *inside* the program (``generator.throw``), so a program
can catch :class:`~scout.transport.base.DeadlineExceeded` the same way everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import attrs

from scout.core.drive import Handler, drive
from scout.transport.base import DEFAULT_MAX_PAYLOAD_BYTES, Group, Transport

__all__ = [
    "AllGather",
    "Barrier",
    "Broadcast",
    "Exchange",
    "Now",
    "Op",
    "RankContext",
    "Sleep",
    "run_blocking",
]

T = TypeVar("T")


@attrs.frozen
class Exchange:
    payload: Any
    round_id: int
    timeout_s: float
    group: Group | None = None


@attrs.frozen
class AllGather:
    payload: Any
    timeout_s: float
    group: Group | None = None


@attrs.frozen
class Broadcast:
    payload: Any
    root: int
    timeout_s: float
    group: Group | None = None


@attrs.frozen
class Barrier:
    timeout_s: float
    group: Group | None = None


@attrs.frozen
class Sleep:
    """Let ``duration_s`` of (real or virtual) time pass; stands in for compute or idling."""

    duration_s: float


@attrs.frozen
class Now:
    """Ask for the monotonic time in seconds (virtual on the simulator)."""


Op = Exchange | AllGather | Broadcast | Barrier | Sleep | Now


@attrs.frozen
class RankContext:
    """What a program knows about where it runs."""

    rank: int
    size: int
    world: Group
    # The binding's limit on an encoded payload, so a program can size its evidence (and the
    # conformance suite can probe the limit) without knowing which binding runs it.
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def group(self, ranks: tuple[int, ...] | list[int], name: str) -> Group:
        return Group(tuple(ranks), name)


RankProgram = Callable[[RankContext], Generator[Any, Any, T]]


def _sleep(op: Sleep) -> None:
    if op.duration_s < 0:
        raise ValueError(f"Sleep.duration_s must be >= 0, got {op.duration_s!r}")
    time.sleep(op.duration_s)


def transport_answers(transport: Transport) -> dict[type, Handler]:
    """Each :data:`Op` answered by the matching blocking call of ``transport``."""
    return {
        Exchange: lambda op: transport.exchange(op.payload, round_id=op.round_id, timeout_s=op.timeout_s,
                                                group=op.group),
        AllGather: lambda op: transport.all_gather(op.payload, timeout_s=op.timeout_s, group=op.group),
        Broadcast: lambda op: transport.broadcast(op.payload, root=op.root, timeout_s=op.timeout_s, group=op.group),
        Barrier: lambda op: transport.barrier(timeout_s=op.timeout_s, group=op.group),
        Sleep: _sleep,
        Now: lambda op: time.monotonic(),
    }


def run_blocking(program: RankProgram[T], transport: Transport) -> T:
    """Drive ``program`` to completion on a real (blocking) transport. An op that fails -- or one
    that is not a transport op -- raises inside the program, as on the simulator."""
    ctx = RankContext(
        rank=transport.rank,
        size=transport.size,
        world=transport.world,
        max_payload_bytes=transport.max_payload_bytes,
    )
    return drive(program(ctx), transport_answers(transport), who="run_blocking", throw=True)
