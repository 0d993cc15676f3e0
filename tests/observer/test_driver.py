"""The one observer driver (spec/observer.md DRIVER-2..DRIVER-5), driven op by op with a
hand-held world: no processes, no simulator, so every delivery is exactly the one the test makes."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from scout.core.observer import (
    ObserverConfig,
    ObserverEffect,
    Progress,
    Request,
    RoundId,
    StallReport,
)
from scout.observer import driver, wire
from scout.observer.driver import WAKE_MARGIN_S, ObserverRun, Receive, Transmit, drive


class HeldWorld:
    """An ObserverWorld whose clock the test sets; the trainer sits at one coordinate."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.exit: bool | None = None
        self.reports: list[StallReport] = []

    def now(self) -> float:
        return self.now_s

    def trainer_exit(self) -> bool | None:
        return self.exit

    def read_progress(self) -> Progress | None:
        return Progress(step=3, op=7)

    def published_s(self) -> float | None:
        return None

    def join(self) -> bool | str:
        return True

    def emit(self, report: StallReport) -> None:
        self.reports.append(report)

    def fail(self, reason: str) -> None:  # pragma: no cover - a failure ends the test below
        raise AssertionError(reason)


def _until_receive(ops: Any, answer: Any, sent: list[Transmit]) -> Receive:
    """Answer the pending op with ``answer`` (a Receive's deliveries; None to start) and advance
    the driver to its next Receive, collecting what it transmits meanwhile."""
    bound = 1000  # a driver that never waits would be a bug; stop instead of spinning
    while bound:
        bound -= 1
        op = ops.send(answer)
        if isinstance(op, Receive):
            return op
        if isinstance(op, Transmit):
            sent.append(op)
        answer = None
    raise AssertionError("the driver did not wait for datagrams within 1000 ops")


def test_DRIVER_3_a_message_is_stepped_only_from_the_position_the_channel_authenticated() -> None:
    world = HeldWorld()
    config = ObserverConfig(position=0, group_size=3, stall_threshold_s=10.0)
    ops = drive(config, world, poll_interval_s=0.05)
    sent: list[Transmit] = []
    _until_receive(ops, None, [])  # joined, attached, watching: the first wait for datagrams
    request = wire.encode_message(Request(RoundId(initiator=1, number=1)))

    # Position 2 relays a request that claims to be position 1's round: refused, unanswered.
    _until_receive(ops, [(2, request)], sent)
    assert sent == []
    # The same bytes from position 1 itself: stepped, and answered to position 1.
    _until_receive(ops, [(1, request)], sent)
    assert [t.to for t in sent] == [1]
    world.exit = True
    try:
        _until_receive(ops, [], [])
    except StopIteration as stop:
        run: ObserverRun = stop.value
    else:  # pragma: no cover
        raise AssertionError("the driver went on after its trainer exited")
    assert run.impersonated == 1 and run.messages_received == 2 and run.messages_sent == 1


def test_DRIVER_2_every_effect_of_the_closed_union_has_a_branch_in_the_driver() -> None:
    """The dispatch ends in assert_never (mypy proves it total); this names each member, so a
    member added to ObserverEffect without a branch fails here too, not only under mypy."""
    members = typing.get_args(ObserverEffect)
    assert len(members) >= 7
    source = inspect.getsource(driver.drive)
    missing = [m.__name__ for m in members if f"isinstance(effect, {m.__name__})" not in source]
    assert missing == [], f"effects without a branch in scout.observer.driver.drive: {missing}"
    assert "assert_never(effect)" in source


class PublishingWorld(HeldWorld):
    """A HeldWorld whose trainer's position and its publish time the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.progress = Progress(step=1, op=0)
        self.published: float | None = 0.0

    def read_progress(self) -> Progress | None:
        return self.progress

    def published_s(self) -> float | None:
        return self.published


def _wait_until_request(ops: Any, world: PublishingWorld, receive: Receive, horizon_s: float) -> float | None:
    """Let time pass as the driver asks (each Receive's whole timeout, nothing delivered) until
    it sends a round's request; the time it did, or None if not before ``horizon_s``."""
    while world.now_s < horizon_s:
        world.now_s += receive.timeout_s
        sent: list[Transmit] = []
        receive = _until_receive(ops, [], sent)
        if sent:
            return world.now_s
    return None


def test_DRIVER_4_progress_is_dated_by_its_publish_so_a_long_watch_interval_delays_no_report() -> None:
    world = PublishingWorld()
    config = ObserverConfig(position=0, group_size=3, stall_threshold_s=2.0)
    ops = drive(config, world, poll_interval_s=0.05, watch_interval_s=1.0)
    receive = _until_receive(ops, None, [])  # attached at t = 0 and watching
    assert receive.timeout_s == 1.0  # healthy: one read of the record a second
    # The trainer moves at t = 0.1 and then hangs; the driver reads it only at t = 1.0.
    world.progress, world.published = Progress(step=1, op=1), 0.1
    world.now_s = 1.0
    receive = _until_receive(ops, [], [])
    # The round opens 2 s after the publish (t = 2.1), not 2 s after the read (t = 3.0).
    opened = _wait_until_request(ops, world, receive, horizon_s=5.0)
    assert opened is not None and 0 <= opened - 2.1 <= WAKE_MARGIN_S + 1e-9, opened


def test_DRIVER_4_without_a_publish_time_progress_is_dated_when_read() -> None:
    world = PublishingWorld()
    config = ObserverConfig(position=0, group_size=3, stall_threshold_s=2.0)
    ops = drive(config, world, poll_interval_s=0.05, watch_interval_s=1.0)
    receive = _until_receive(ops, None, [])
    world.progress, world.published = Progress(step=1, op=1), None
    world.now_s = 1.0
    receive = _until_receive(ops, [], [])
    opened = _wait_until_request(ops, world, receive, horizon_s=5.0)
    assert opened is not None and 0 <= opened - 3.0 <= WAKE_MARGIN_S + 1e-9, opened


def test_DRIVER_4_a_watch_interval_longer_than_a_threshold_is_refused() -> None:
    config = ObserverConfig(position=0, group_size=3, stall_threshold_s=0.5, settle_idle_s=0.25)
    with pytest.raises(ValueError, match="watch_interval_s must be in"):
        next(drive(config, PublishingWorld(), poll_interval_s=0.05, watch_interval_s=0.8))


def test_DRIVER_5_an_answer_carries_the_position_at_the_request_not_at_the_last_poll() -> None:
    world = PublishingWorld()
    config = ObserverConfig(position=0, group_size=3, stall_threshold_s=10.0)
    ops = drive(config, world, poll_interval_s=0.05, watch_interval_s=1.0)
    _until_receive(ops, None, [])  # read at t = 0: step 1, op 0
    # Between two reads the trainer moves on; a peer's request arrives before the next read.
    world.progress, world.published = Progress(step=4, op=9), 0.3
    world.now_s = 0.4
    sent: list[Transmit] = []
    _until_receive(ops, [(1, wire.encode_message(Request(RoundId(initiator=1, number=1))))], sent)
    assert [t.to for t in sent] == [1]
    answer = wire.decode_message(sent[0].body, 3)
    evidence = answer.evidence  # type: ignore[union-attr]
    assert (evidence.step, evidence.op) == (4, 9)
    assert abs(evidence.idle_s - 0.1) < 1e-9  # idle since its publish at t = 0.3


def test_DRIVER_5_a_wake_up_judges_what_was_published_until_then_not_the_last_read() -> None:
    """With the watch interval as long as the threshold, the driver sleeps until the stall would
    fall due; a trainer that published meanwhile is read before the wake-up is stepped, so a
    healthy trainer is never taken for stalled, and a stalled one still opens its round on time."""
    world = PublishingWorld()
    config = ObserverConfig(position=0, group_size=3, stall_threshold_s=2.0)
    ops = drive(config, world, poll_interval_s=0.05, watch_interval_s=2.0)
    receive = _until_receive(ops, None, [])  # attached at t = 0, progress published at t = 0
    assert receive.timeout_s == 2.0  # asleep until the threshold after the publish
    # A healthy trainer publishes at t = 1.9 (unread); the wake-up comes at t = 2.0.
    world.progress, world.published = Progress(step=2, op=0), 1.9
    world.now_s = 2.0
    sent: list[Transmit] = []
    receive = _until_receive(ops, [], sent)
    assert sent == [], "a healthy trainer was judged on a read one threshold old"
    # Then it stops: the round opens one threshold after its last publish (t = 3.9).
    opened = _wait_until_request(ops, world, receive, horizon_s=8.0)
    assert opened is not None and 0 <= opened - 3.9 <= WAKE_MARGIN_S + 1e-9, opened
