"""Straggler measurement, trails and reports in one process (spec/replay.md STRAG-1, STRAG-20,
STRAG-21): warm-up and repetitions, the clock, the per-rank performance ratio, the evidence
trail, the ``scout.report/1`` records and the live group timings."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from scout.core.straggler import GroupTiming, LocalizationStatus, SequentialConfig, localize_live
from scout.replay import faults
from scout.replay.replay import ReplayConfig
from scout.replay.stragglers import (
    StragglerKind,
    StragglerTracker,
    group_timings,
    localization_record_arguments,
    straggler_record_arguments,
)
from scout.reports import make_record
from scout.reports.kinds import StragglerReason
from tests.replay.test_communication import TimedPeers
from tests.replay.test_replay_local import ScriptedPeers, _setup, _train_step

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "scout/reports/report.schema.json").read_text()
)


def _check_schema(record: dict[str, object]) -> None:
    """The schema's own rules, field by field (no validator dependency)."""
    assert set(record) == set(SCHEMA["required"])
    properties = SCHEMA["properties"]
    assert record["kind"] in properties["kind"]["enum"]
    assert record["source"] in properties["source"]["enum"]
    assert isinstance(record["evidence"], dict)
    json.dumps(record)  # JSON all the way down


def test_STRAG_21_reason_codes_are_stable() -> None:
    assert {StragglerReason.of(kind.value, "confirmed").value for kind in StragglerKind} == {
        "device-slow",
        "communication-slow",
        "loop-slow",
        "forward-slow",
    }
    assert StragglerReason.of(StragglerKind.LOOP.value, "recovered").value == "recovered-loop-slow"
    assert StragglerReason.of("communication", "localized").value == "localized-communication-slow"


def test_STRAG_21_confirmation_and_recovery_become_scout_report_records() -> None:
    tracker = StragglerTracker(
        StragglerKind.DEVICE, (4, 5, 6, 7), SequentialConfig(), trail_checks=5
    )
    events = []
    for step in range(2, 60, 2):
        slow = step <= 20
        events += tracker.observe(step, [0.0, math.log(1.5) if slow else 0.01, 0.0, None])
    confirmed, recovered = events
    assert (confirmed.change, confirmed.rank, confirmed.step) == ("confirmed", 5, 8)
    assert confirmed.performance_ratio == pytest.approx(1.5, rel=1e-3)
    assert [entry.step for entry in confirmed.trail] == [2, 4, 6, 8]
    assert [entry.score_mnp for entry in confirmed.trail] == [310, 620, 930, 1000]
    assert (recovered.change, recovered.rank) == ("recovered", 5)
    assert recovered.step > 20 and len(recovered.trail) == 5  # bounded trail
    assert tracker.performance_ratios()[3] is None  # no evidence, no ratio
    hosts = {5: "node-b"}
    for event in (confirmed, recovered):
        arguments = straggler_record_arguments(
            event, hosts=hosts, group_ratios=tracker.performance_ratios()
        )
        record = make_record(**arguments, job_id="job", generation=0, reporter_rank=4)
        _check_schema(record)
        assert record["kind"] == "straggler" and record["source"] == "replay"
        assert record["ranks"] == [5] and record["hosts"] == ["node-b"]
        assert record["step"] == event.step
        assert record["reason"] == {"confirmed": "device-slow", "recovered": "recovered-device-slow"}[event.change]
        evidence = record["evidence"]
        assert evidence["straggler"] == "device" and evidence["group_ranks"] == [4, 5, 6, 7]
        assert evidence["performance_ratio"] == event.performance_ratio
        assert len(evidence["trail"]) == len(event.trail) and "5" in evidence["group_ratios"]


def test_STRAG_1_each_check_times_repetitions_after_a_warm_up() -> None:
    model, optimizer, replayer = _setup(ScriptedPeers(), timing_warmup_runs=2, timing_repetitions=5)
    seen: list[float] = []
    replayer.add_compute_hook(seen.append)
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert len(seen) == 5 * len(report.compute_ms)  # warm-up runs are not timed
    for name, ms in report.compute_ms.items():
        repetitions = report.repetitions_ms[name]
        assert len(repetitions) == 5 and ms == pytest.approx(sorted(repetitions)[2])  # median
    assert set(report.peer_compute_ms) == set(report.compute_ms)
    assert all(len(times) == 4 for times in report.peer_compute_ms.values())
    with pytest.raises(ValueError, match="timing_repetitions must be >= 1"):
        ReplayConfig(timing_repetitions=0)
    with pytest.raises(ValueError, match="timing_clock must be one of auto, cpu, wall, own"):
        ReplayConfig(timing_clock="gpu")


def _waited_and_computed(**settings: Any) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Replay compute times (ms) of three steps: plain, with 30 ms slept inside each timed
    replay, and with 30 ms computed there instead."""
    model, optimizer, replayer = _setup(ScriptedPeers(), timing_repetitions=1, **settings)
    _train_step(model, optimizer, 1)
    baseline = replayer.after_optimizer_step().compute_ms
    sleeper = replayer.add_compute_hook(lambda elapsed_s: time.sleep(0.03))
    _train_step(model, optimizer, 2)
    slept = replayer.after_optimizer_step().compute_ms
    sleeper.remove()
    replayer.add_compute_hook(lambda elapsed_s: faults.compute_for(0.03))
    _train_step(model, optimizer, 3)
    return baseline, slept, replayer.after_optimizer_step().compute_ms


def test_STRAG_1_on_a_cpu_a_replay_that_waits_is_as_slow_as_one_that_computes() -> None:
    """A straggler is the wall time a rank costs (issue 24): at the default clock a replay that
    waits (sleeps) is as slow as one that computes longer; the CPU clock sees only the second."""
    baseline, slept, computed = _waited_and_computed()
    for name in ("embedding", "output", "optimizer.0"):
        assert slept[name] >= baseline[name] + 25 and computed[name] >= baseline[name] + 25
    baseline, slept, computed = _waited_and_computed(timing_clock="cpu")
    for name in ("embedding", "output", "optimizer.0"):
        assert slept[name] < baseline[name] + 10 and computed[name] >= baseline[name] + 25
    model, optimizer, wall = _setup(ScriptedPeers(), timing_repetitions=1, timing_clock="wall")
    wall.add_compute_hook(lambda elapsed_s: time.sleep(0.03))
    _train_step(model, optimizer, 1)
    assert min(wall.after_optimizer_step().compute_ms.values()) >= 25


def test_STRAG_20_a_step_report_gives_its_groups_live_timings() -> None:
    peers = TimedPeers([(100, 60_200), (150, 60_100), (60_000, 300), (120, 60_150)])
    model, optimizer, replayer = _setup(peers)
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    timings = group_timings(report, (8, 9, 10, 11), "replicas")
    assert set(timings) == {"device", "communication"}
    assert timings["communication"].members == frozenset({8, 9, 10, 11})
    assert timings["communication"].centre_ms == pytest.approx((0.42 + 0.45) / 2)
    assert timings["device"].centre_ms == pytest.approx(sum(report.compute_ms.values()), abs=0.01)
    # Three groups of one family, one of them slow as a whole: no single rank and no host
    # explains one slow group whose hosts are all different.
    slow_group = group_timings(report, (0, 1, 2, 3), "replicas")["device"]
    family = [
        slow_group.__class__(slow_group.members, "replicas", slow_group.centre_ms * 2),
        slow_group.__class__(frozenset({4, 5, 6, 7}), "replicas", slow_group.centre_ms),
        slow_group.__class__(frozenset({8, 9, 10, 11}), "replicas", slow_group.centre_ms),
    ]
    assert localize_live(family).status is LocalizationStatus.INCONCLUSIVE
    assert group_timings(ScriptedPeersReport(), (0, 1), "x") == {}


class ScriptedPeersReport:
    """A check without times (nothing was due)."""

    peer_compute_ms: dict[str, tuple[float, ...]] = {}
    communication_ms: tuple[float, ...] = ()


def test_STRAG_20_STRAG_21_a_localized_host_becomes_a_report() -> None:
    groups = [GroupTiming(frozenset(range(j, 15, 5)), "replicas", 10.0) for j in range(5)]
    groups[0] = GroupTiming(groups[0].members, "replicas", 15.0)
    groups[1] = GroupTiming(groups[1].members, "replicas", 15.0)
    hosts = {r: f"h{r}" for r in range(15)}
    hosts[0] = hosts[6] = "A"
    found = localize_live(groups, hosts)
    arguments = localization_record_arguments(found, StragglerKind.COMMUNICATION, 100, groups)
    assert arguments is not None
    record = make_record(**arguments, job_id="job", generation=1)
    _check_schema(record)
    assert (record["reason"], record["ranks"], record["hosts"]) == (
        "localized-communication-slow", [0, 6], ["A"],
    )  # fmt: skip
    assert record["evidence"]["localized"] == "host" and len(record["evidence"]["groups"]) == 5
    healthy = localize_live([GroupTiming(g.members, "replicas", 10.0) for g in groups], hosts)
    assert localization_record_arguments(healthy, StragglerKind.DEVICE, 100) is None


def test_FAULT_5_FAULT_6_slow_ops_compute_longer_and_slow_loops_wait() -> None:
    import torch

    a = torch.randn(96, 96)

    def work() -> float:
        started = time.thread_time()
        for _ in range(200):
            torch.mm(a, a)
        return time.thread_time() - started

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time of this thread is then all of the work
    try:
        with faults.SlowOps(1.0) as same:  # the mode's own cost, as on a healthy rank
            work()
            plain = min(work() for _ in range(3))
        with faults.SlowOps(2.0) as slow:
            slowed = min(work() for _ in range(3))
    finally:
        torch.set_num_threads(threads)
    assert same.operations >= 800 and slow.operations >= 600
    assert 1.6 * plain <= slowed <= 2.6 * plain, (plain, slowed)
    loop = faults.SlowLoop(1.5)
    with loop:
        faults.compute_for(0.02)
    assert 0.009 <= loop.waited_s <= 0.05
    with pytest.raises(ValueError, match="factor must be finite and >= 1"):
        faults.SlowOps(0.5)
    with pytest.raises(TypeError, match="factor must be a number"):
        faults.SlowLoop("2")  # type: ignore[arg-type]


def test_FAULT_5_slow_ops_that_wait_cost_wall_time_and_no_cpu_time() -> None:
    import torch

    a = torch.randn(96, 96)

    def work() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(200):
            torch.mm(a, a)
        return time.perf_counter() - wall, time.thread_time() - cpu

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with faults.SlowOps(1.0, waits=True) as same:
            work()
            plain = min(work())
        with faults.SlowOps(2.0, waits=True) as slow:
            waited = [work() for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    assert same.waited_s == 0.0 and slow.operations >= 600
    wall_s, cpu_s = min(w for w, _ in waited), min(c for _, c in waited)
    # The extra time is slept: wall time about doubles, CPU time hardly moves.
    assert wall_s >= 1.6 * plain and cpu_s <= 1.4 * plain, (plain, waited)
    assert slow.waited_s >= 0.8 * sum(c for _, c in waited), (slow.waited_s, waited)
    with pytest.raises(ValueError, match="wait_quantum_s must be a finite number > 0, got 0"):
        faults.SlowOps(2.0, waits=True, wait_quantum_s=0)
