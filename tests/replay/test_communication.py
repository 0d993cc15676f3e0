"""Communication timing apart from compute (spec/replay.md STRAG-1, COMM-1..COMM-3, FAULT-4),
in one process: the timer's entry/wait split and its fault hook, the own-time rule, and the
replayer's wiring from evidence rows to the communication confirmation machine. The 4-process
runs are in test_replay_distributed.py."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from scout.core.straggler import Confirmed
from scout.core.verdict import Status, classify_timing
from scout.replay import faults
from scout.replay import replay as replay_module
from scout.replay.collectives import CollectiveTimer, CollectiveTimes
from scout.replay.replay import own_communication_ms
from tests.replay.test_replay_local import Rows, ScriptedPeers, _setup, _train_step


def test_COMM_1_a_collective_is_timed_as_entry_then_wait() -> None:
    timer = CollectiveTimer()
    started = timer.enter("all_gather")
    time.sleep(0.02)
    posted = timer.posted(started)
    time.sleep(0.03)
    timer.returned(posted)
    times = timer.take()
    assert times.count == 1
    assert 0.015 <= times.entry_s < 0.5 and 0.025 <= times.wait_s < 0.5
    assert times.total_s == times.entry_s + times.wait_s
    assert timer.peek() == CollectiveTimes()  # take() starts again from zero


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
    # Peer 2 entered 60 ms late: its entry is long, its wait short; the others waited.
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


class TimedPeers(ScriptedPeers):
    """Scripted peers with a timer; evidence rows get the communication slots of ``entry_wait``."""

    def __init__(self, entry_wait: Sequence[tuple[int, int]]) -> None:
        super().__init__(size=len(entry_wait))
        self.timer = CollectiveTimer()
        self.entry_wait = entry_wait

    def all_gather_int64(self, row: Sequence[int]) -> Rows:
        rows = super().all_gather_int64(row)
        if len(row) == replay_module.EVIDENCE_ROW_LENGTH:
            for peer, (entry, wait) in enumerate(self.entry_wait):
                rows[peer][-2:] = [entry, wait]
        return rows


def test_COMM_2_STRAG_2_communication_rounds_feed_their_own_confirmation_machine() -> None:
    peers = TimedPeers([(100, 60_200), (150, 60_100), (60_000, 300), (120, 60_150)])
    model, optimizer, replayer = _setup(peers)
    reports = []
    for step in range(1, 5):
        _train_step(model, optimizer, step)
        reports.append(replayer.after_optimizer_step())
    assert all(r.communication is not None for r in reports)
    assert [r.communication.outliers for r in reports if r.communication] == [(2,)] * 4
    assert [sorted(r.confirmed_communication_stragglers) for r in reports] == [[], [], [2], [2]]
    assert [r.communication_stragglers for r in reports] == [(), (), (Confirmed(2, 3),), ()]
    # Compute times are identical (every row is this process's): no compute straggler.
    assert all(not r.confirmed_stragglers and not r.stragglers for r in reports)
    assert reports[0].communication_ms == pytest.approx((0.4, 0.45, 60.3, 0.42))


def test_COMM_1_peers_without_a_timer_report_no_communication_round() -> None:
    model, optimizer, replayer = _setup(ScriptedPeers())
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert report.results and report.communication is None and report.communication_ms == ()
