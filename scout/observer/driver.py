"""The observer's driver loop: one function, run by the real observer process and by the
simulator (spec/observer.md; machine: :mod:`scout.core.observer`).

:func:`drive` feeds the world into the pure machine and executes the effects the machine returns:

    poll the trainer (exit? new progress?) -> wait for datagrams until the next wake time
    -> decode and check each one -> step the machine -> execute effects -> tick

It is a generator. The only things that must wait -- receiving datagrams, sending one, pausing
-- are yielded as ops (:class:`Receive`, :class:`Transmit`, :class:`Pause`) to an executor: the
observer process answers them with its UDP channel and the real clock
(:mod:`scout.observer.process`), the simulator with its messaging ops and virtual clock
(:mod:`scout.scenarios.observer`). Everything that does not wait goes through an
:class:`ObserverWorld` (clock, trainer status, progress record, rendezvous, report sink). So the
thousands-of-ranks simulations run exactly this code.

Every effect of the machine is one of :data:`~scout.core.observer.ObserverEffect`; dispatch ends
in ``assert_never``, so a new effect cannot be dropped silently. ``WakeAt`` bounds the wait for
datagrams, so a round's deadline or a stall threshold is acted on when it falls due, not at the
next poll.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any, Final, Protocol, TypeAlias, cast

import attrs

from scout.core.compat import assert_never
from scout.core.machine import Machine, MachineState, packaged_machine
from scout.core.observer import (
    FINAL_STATES,
    Attached,
    EmitReport,
    Failed,
    Joined,
    JoinFailed,
    Noted,
    ObserverConfig,
    ObserverContext,
    ObserverEffect,
    ObserverState,
    Progress,
    ProgressSeen,
    Request,
    RoundClosed,
    Send,
    StallReport,
    Stopped,
    Tick,
    TrainerExit,
    WakeAt,
    event_for,
    initial_context,
)
from scout.observer import wire

__all__ = [
    "DriverOp",
    "ObserverRun",
    "ObserverWorld",
    "Pause",
    "Receive",
    "Transmit",
    "drive",
    "load_observer_machine",
]

#: Pending wake times kept at once; the machine asks for at most a few (a round deadline, the
#: next recheck, a stall threshold).
WAKE_TIMES_MAX: Final = 16
#: A wait for a wake-up time ends this much after it: the machine's guards compare elapsed time
#: with thresholds (``idle >= threshold``), and a wait that ends at the exact float sum of a
#: publish time and a threshold can read an idle time a rounding error short of it -- with a
#: long watch interval (DRIVER-6) the stall would then wait for the next read. 1 ms of latency.
WAKE_MARGIN_S: Final = 0.001
#: Bytes of one message body accepted for decoding (a report of a 4096-rank group fits).
MESSAGE_BYTES_MAX: Final = 60_000


def load_observer_machine() -> Machine[ObserverContext]:
    """The observer machine of ``spec/observer.toml`` (its packaged copy, built once)."""
    machine: Machine[ObserverContext] = packaged_machine("observer")
    return machine


# Ops the driver yields to its executor --------------------------------------------------------


@attrs.frozen
class Receive:
    """Wait up to ``timeout_s`` for datagrams; the executor answers with a list of
    ``(sender position, body)`` -- the position as the transport authenticated it."""

    timeout_s: float


@attrs.frozen
class Transmit:
    """Send ``body`` to the observer at group position ``to``; the executor answers None."""

    to: int
    body: bytes


@attrs.frozen
class Pause:
    """Wait ``timeout_s`` without receiving (before the group is joined); answered None."""

    timeout_s: float


DriverOp: TypeAlias = Receive | Transmit | Pause


class ObserverWorld(Protocol):
    """What the driver reads and writes without waiting."""

    def now(self) -> float:
        """A monotonic clock, in seconds."""

    def trainer_exit(self) -> bool | None:
        """None while the trainer runs; True once it exited cleanly, False if it died."""

    def read_progress(self) -> Progress | None:
        """The trainer's position, or None when there is no consistent snapshot (yet)."""

    def published_s(self) -> float | None:
        """When the trainer published the position :meth:`read_progress` last returned, on the
        clock of :meth:`now`; None when the world cannot tell (it is then dated when read)."""

    def join(self) -> bool | str:
        """One non-blocking rendezvous attempt: True once every peer is known, False while
        still waiting, a string saying why when the rendezvous failed for good."""

    def emit(self, report: StallReport) -> None:
        """A report this observer emits (OBS-6, OBS-7)."""

    def fail(self, reason: str) -> None:
        """The observer cannot do its job (rendezvous or attach failed)."""


@attrs.define
class ObserverRun:
    """What one observer did: its driver's return value and statistics."""

    position: int
    rank: int = -1  # the global rank, set by an executor that knows it
    messages_sent: int = 0
    messages_received: int = 0
    undecodable: int = 0
    impersonated: int = 0
    rounds: int = 0
    reports: int = 0
    stale_replies: int = 0
    rounds_aborted: int = 0
    failed: bool = False
    stopped_s: float | None = None
    stopped_reason: str = ""


_NOTED: Final = {"stale_reply_ignored": "stale_replies", "round_aborted_by_progress": "rounds_aborted"}
ObserverMachineState: TypeAlias = MachineState[ObserverContext]


def drive(
    config: ObserverConfig,
    world: ObserverWorld,
    *,
    poll_interval_s: float,
    watch_interval_s: float | None = None,
    machine: Machine[ObserverContext] | None = None,
    on_round_closed: Callable[[float], None] | None = None,
) -> Generator[DriverOp, Any, ObserverRun]:
    """Run one observer from its start until its trainer exits (or it fails). ``poll_interval_s``
    paces joining and attaching; ``watch_interval_s`` (default: the same) bounds each wait while
    watching (DRIVER-4: progress is dated by its publish, so a longer bound delays no report as
    long as it is at most the shortest stage threshold). ``on_round_closed``: told each round
    this observer opened and closed, with its latency in seconds from request to decision (the
    ops metrics; spec/ops.md OPS-5)."""
    if not 0 < poll_interval_s <= 1.0:
        raise ValueError(f"poll_interval_s must be in (0, 1] seconds, got {poll_interval_s!r}")
    watch_s = poll_interval_s if watch_interval_s is None else watch_interval_s
    shortest_threshold_s = min(config.stall_threshold_s, config.data_stall_threshold_s,
                               config.checkpoint_stall_threshold_s)
    if not 0 < watch_s <= shortest_threshold_s:
        raise ValueError(f"watch_interval_s must be in (0, {shortest_threshold_s:g}] seconds (at most the shortest "
                         f"stage threshold, DRIVER-4), got {watch_interval_s!r}")
    machine = machine or load_observer_machine()
    run = ObserverRun(config.position)
    wakes: list[float] = []
    last: Progress | None = None  # the trainer's position last stepped
    state: ObserverMachineState = machine.initial_state(initial_context(config, world.now()))

    def step(event: Any) -> Generator[DriverOp, Any, None]:
        nonlocal state
        opened = state.context.round
        state, effects = machine.step(state, event)
        for effect in cast(tuple[ObserverEffect, ...], effects):
            if isinstance(effect, Send):
                body = wire.encode_message(effect.message)
                for position in effect.to:
                    run.messages_sent += 1
                    yield Transmit(position, body)
            elif isinstance(effect, WakeAt):
                if math.isfinite(effect.at_s):
                    wakes.append(effect.at_s)
                    wakes.sort()
                    del wakes[WAKE_TIMES_MAX:]
            elif isinstance(effect, EmitReport):
                run.reports += 1
                world.emit(effect.report)
            elif isinstance(effect, RoundClosed):
                run.rounds += 1
                if on_round_closed is not None and opened is not None and opened.round == effect.round:
                    on_round_closed(world.now() - opened.opened_s)
            elif isinstance(effect, Noted):
                name = _NOTED.get(effect.what)
                if name is not None:
                    setattr(run, name, getattr(run, name) + 1)
            elif isinstance(effect, Failed):
                run.failed = True
                world.fail(effect.reason)
            elif isinstance(effect, Stopped):
                run.stopped_s = world.now()
                run.stopped_reason = effect.reason
            else:
                assert_never(effect)

    def exited() -> TrainerExit | None:
        status = world.trainer_exit()
        return None if status is None else TrainerExit(world.now(), clean=status)

    def progressed() -> Generator[DriverOp, Any, None]:
        """Step new progress, dated by its publish (DRIVER-4)."""
        nonlocal last
        progress = world.read_progress()
        if progress is not None and progress != last:
            last = progress
            now = world.now()
            published = world.published_s()
            yield from step(ProgressSeen(now if published is None else min(now, published), progress))

    # JOINING: the rendezvous with the group's other observers (OBS-4).
    while state.control is ObserverState.JOINING:
        exit_event = exited()
        if exit_event is not None:
            yield from step(exit_event)
            break
        joined = world.join()
        if joined is True:
            yield from step(Joined(world.now()))
        elif isinstance(joined, str):
            yield from step(JoinFailed(world.now(), joined))
        else:
            yield from step(Tick(world.now()))
            if state.control is ObserverState.JOINING:
                yield Pause(poll_interval_s)

    # ATTACHING: the trainer's progress record appears.
    while state.control is ObserverState.ATTACHING:
        exit_event = exited()
        if exit_event is not None:
            yield from step(exit_event)
            break
        last = world.read_progress()
        if last is not None:
            yield from step(Attached(world.now(), last))
            break
        yield from step(Tick(world.now()))
        if state.control is ObserverState.ATTACHING:
            yield Pause(poll_interval_s)

    # Joined and attached: watch, and answer rounds (OBS-5).
    if state.control not in FINAL_STATES:
        yield from progressed()
    while state.control not in FINAL_STATES:
        exit_event = exited()
        if exit_event is not None:
            yield from step(exit_event)
            break
        now = world.now()
        while wakes and wakes[0] <= now:
            wakes.pop(0)
        # A deferral to a lower peer's round (OBS-5) ends without a WakeAt: wake then too, or a
        # deferring observer would take up its own stall only at its next read (DRIVER-6).
        due = [at for at in (wakes[0] if wakes else math.inf, state.context.deferred_until_s) if at > now]
        timeout_s = min(watch_s, min(due, default=math.inf) - now + WAKE_MARGIN_S)
        deliveries = yield Receive(max(0.0, timeout_s))
        # Read the record before stepping what ended the wait: a datagram is answered with the
        # trainer's position now, not at the last read (DRIVER-5), and a wake-up -- a stall's
        # threshold falling due, DRIVER-4 -- judges what the trainer published until now.
        yield from progressed()
        for sender, body in deliveries:
            run.messages_received += 1
            if len(body) > MESSAGE_BYTES_MAX:
                run.undecodable += 1
                continue
            try:
                message = wire.decode_message(body, config.group_size)
            except wire.WireError:
                run.undecodable += 1
                continue
            claimed = message.round.initiator if isinstance(message, Request) else message.sender
            if claimed != sender:
                run.impersonated += 1
                continue
            yield from step(event_for(message, world.now()))
            if state.control in FINAL_STATES:
                break
        if state.control not in FINAL_STATES:
            yield from step(Tick(world.now()))
    return run
