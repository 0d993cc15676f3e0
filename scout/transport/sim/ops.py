"""Ops that exist only on the simulator: one-way messages between programs.

The transport contract's ops (``scout.transport.program``) cover rank programs that run on every
binding. Drivers of core machines (an observer answering round requests whatever its own state,
a trainer publishing progress) are message-driven instead: they wait for *any* message or a
timer. :class:`Send` and :class:`Receive` give such a driver exactly that, under the same
latency model and faults as everything else. A program that uses them runs only on the
simulator.

Programs on one rank share memory through ``ctx.shared`` (a dict per rank, like the
shared-memory progress record between a trainer and its observer); that needs no op.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Delivered", "Receive", "Send"]


@attrs.frozen
class Send:
    """Send ``payload`` to program ``program`` (default: the sender's own name) on rank ``dst``.

    Returns at once (``None``); the message arrives after the link latency unless a fault drops
    it. Nothing tells the sender whether it arrived.
    """

    dst: int
    payload: Any
    tag: int = 0
    program: str | None = None


@attrs.frozen
class Receive:
    """Wait up to ``timeout_s`` for the oldest queued message (with ``tag``, if given).

    Returns a :class:`Delivered`, or ``None`` when the timeout passes first.
    """

    timeout_s: float
    tag: int | None = None


@attrs.frozen
class Delivered:
    src: int
    program: str
    tag: int
    payload: Any
