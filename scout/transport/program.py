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


def execute_op(transport: Transport, op: Any) -> Any:
    """Run one op against a blocking transport and return its result."""
    if isinstance(op, Exchange):
        return transport.exchange(
            op.payload, round_id=op.round_id, timeout_s=op.timeout_s, group=op.group
        )
    if isinstance(op, AllGather):
        return transport.all_gather(op.payload, timeout_s=op.timeout_s, group=op.group)
    if isinstance(op, Broadcast):
        return transport.broadcast(
            op.payload, root=op.root, timeout_s=op.timeout_s, group=op.group
        )
    if isinstance(op, Barrier):
        return transport.barrier(timeout_s=op.timeout_s, group=op.group)
    if isinstance(op, Sleep):
        if op.duration_s < 0:
            raise ValueError(f"Sleep.duration_s must be >= 0, got {op.duration_s!r}")
        time.sleep(op.duration_s)
        return None
    if isinstance(op, Now):
        return time.monotonic()
    raise TypeError(f"a rank program yielded {op!r}, which is not a transport op")


def run_blocking(program: RankProgram[T], transport: Transport) -> T:
    """Drive ``program`` to completion on a real (blocking) transport."""
    ctx = RankContext(
        rank=transport.rank,
        size=transport.size,
        world=transport.world,
        max_payload_bytes=transport.max_payload_bytes,
    )
    gen = program(ctx)
    try:
        op = next(gen)
        while True:
            try:
                result = execute_op(transport, op)
            except Exception as exc:  # delivered into the program, as on the simulator
                op = gen.throw(exc)
            else:
                op = gen.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
