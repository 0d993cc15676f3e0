"""Communication timing apart from compute (spec/replay.md STRAG-1, COMM-1..COMM-3, FAULT-4),
in one process: the timer's entry/wait split and its fault hook, the own-time rule, and the
replayer's wiring from evidence rows to the communication confirmation machine. The 4-process
runs are in test_replay_distributed.py."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from scout.core.replay_round import COMMUNICATION_SLOT
from scout.core.straggler import Confirmed
from scout.core.verdict import Status, classify_timing
from scout.replay import faults
from scout.replay import replay as replay_module
from scout.replay.collectives import CollectiveTimer, CollectiveTimes
from scout.replay.replay import own_communication_ms
from scout.reports.kinds import straggler_reason
from tests.replay.test_replay_local import Rows, ScriptedPeers, _setup, _train_step


def test_COMM_1_a_collective_is_timed_as_entry_then_wait() -> None:
    timer = CollectiveTimer()
    started = timer.enter("all_gather")
    time.sleep(0.02)
    posted = timer.posted(started)
    time.sleep(0.03)
    timer.returned(posted)
    times = timer.take()
    assert times.count == 1 and len(times.calls) == 1
    assert 0.015 <= times.entry_s < 0.5 and 0.025 <= times.wait_s < 0.5
    assert times.calls[0] == (times.entry_s, times.wait_s)  # per call, in call order
    assert times.total_s == times.entry_s + times.wait_s
    assert timer.peek() == CollectiveTimes()  # take() starts again from zero
    for _ in range(CollectiveTimer.PER_CALL_MAX + 3):  # per-call times are bounded
        timer.returned(timer.posted(timer.enter("broadcast")))
    assert len(timer.peek().calls) == CollectiveTimer.PER_CALL_MAX
    assert timer.peek().count == CollectiveTimer.PER_CALL_MAX + 3


def test_FAULT_4_slow_communication_delays_the_entry_only_and_can_be_removed() -> None:
    class Peers:
        timer = CollectiveTimer()

    peers = Peers()
    handle = faults.slow_communication(peers, 0.02)
    started = peers.timer.enter("broadcast")
    peers.timer.returned(peers.timer.posted(started))
    slowed = peers.timer.take()
    assert slowed.entry_s >= 0.015 and slowed.wait_s < 0.015
    handle.remove()
    handle.remove()  # idempotent
    started = peers.timer.enter("broadcast")
    peers.timer.returned(peers.timer.posted(started))
    assert peers.timer.take().entry_s < 0.015
    with pytest.raises(ValueError, match="delay_s must be >= 0, got -1"):
        faults.slow_communication(peers, -1)
    with pytest.raises(TypeError, match="needs a peer group with a timer, got ScriptedPeers"):
        faults.slow_communication(ScriptedPeers(), 0.01)


def test_COMM_2_own_time_names_the_peer_the_others_waited_for() -> None:
    # One call per check. Peer 2 entered 60 ms late: its entry is long, its wait short; the
    # others waited.
    late = own_communication_ms([[100, 60_200], [150, 60_100], [60_000, 300], [120, 60_150]])
    assert late == pytest.approx((0.4, 0.45, 60.3, 0.42))
    verdict = classify_timing(late, replay_module.DEFAULT_COMMUNICATION_TIMING)
    assert verdict.status is Status.ATTRIBUTED and verdict.outliers == (2,)
    # Peer 1 computed 60 ms longer before the call: it waits least, but its entry is as short
    # as anyone's -- no communication straggler (COMM-2: compute never enters these values).
    compute_late = own_communication_ms([[100, 60_200], [110, 250], [90, 60_300], [120, 60_150]])
    verdict = classify_timing(compute_late, replay_module.DEFAULT_COMMUNICATION_TIMING)
    assert verdict.status is Status.AGREE
    # A slow link delays everyone's wait alike: a group-wide value, not one peer (COMM-3).
    assert own_communication_ms([[100, 90_000], [100, 90_000]]) == (90.1, 90.1)
    assert own_communication_ms([]) == ()


def test_COMM_2_a_peer_is_judged_by_its_fastest_call_of_the_check() -> None:
    """Two calls per check (-1 pads a third that never happened). Peer 0 was descheduled in
    its first call's entry (30 ms), not in its second: one call does not make it slow. Peer 3
    is slow in both calls: its side of the path is slow."""
    rows = [
        [30_000, 500, 100, 40_300, -1, -1],
        [120, 29_900, 110, 40_200, -1, -1],
        [100, 29_950, 90, 40_250, -1, -1],
        [20_000, 9_900, 40_000, 250, -1, -1],
    ]
    own = own_communication_ms(rows)
    assert own == pytest.approx((0.35, 0.36, 0.34, 20.5))
    assert own_communication_ms([[-1, -1], [-1, -1]]) == ()


class TimedPeers(ScriptedPeers):
    """Scripted peers with a timer; evidence rows get the communication slots of ``entry_wait``."""

    def __init__(self, entry_wait: Sequence[tuple[int, int]]) -> None:
        super().__init__(size=len(entry_wait))
        self.timer = CollectiveTimer()
        self.entry_wait = entry_wait

    def all_gather_int64(self, row: Sequence[int]) -> Rows:
        rows = super().all_gather_int64(row)
        if len(row) == replay_module.EVIDENCE_ROW_LENGTH:
            slot = COMMUNICATION_SLOT
            for peer, (entry, wait) in enumerate(self.entry_wait):
                rows[peer][-slot:] = [entry, wait] + [-1] * (slot - 2)
        return rows


def test_COMM_2_STRAG_4_communication_checks_feed_their_own_sequential_test() -> None:
    peers = TimedPeers([(100, 60_200), (150, 60_100), (60_000, 300), (120, 60_150)])
    model, optimizer, replayer = _setup(peers)
    reports = []
    for step in range(1, 7):
        _train_step(model, optimizer, step)
        reports.append(replayer.after_optimizer_step())
    assert all(r.communication is not None for r in reports)
    assert [r.communication.outliers for r in reports if r.communication] == [(2,)] * 6
    # 60 ms against a 5 ms floor is far beyond the clip (1.5x): 4 checks confirm (STRAG-12).
    assert [sorted(r.confirmed_communication_stragglers) for r in reports] == [[]] * 3 + [[2]] * 3
    assert [r.communication_stragglers for r in reports] == [(), (), (), (Confirmed(2, 1000, 4),), (), ()]
    (event,) = reports[3].straggler_events
    assert (event.kind.value, straggler_reason(event).value, event.rank, event.step) == (
        "communication", "communication-slow", 2, 4,
    )  # fmt: skip
    assert event.performance_ratio == pytest.approx((60.3 + 5) / (0.42 + 5))
    # Compute times are identical (every row is this process's): no device straggler.
    assert all(not r.confirmed_stragglers and not r.stragglers for r in reports)
    assert reports[0].communication_ms == pytest.approx((0.4, 0.45, 60.3, 0.42))


def test_COMM_1_peers_without_a_timer_report_no_communication_round() -> None:
    model, optimizer, replayer = _setup(ScriptedPeers())
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert report.results and report.communication is None and report.communication_ms == ()
