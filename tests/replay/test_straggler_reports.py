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


class FakeTime:
    """The clocks of scout/replay/faults.py, moved only by the code under test, so that what a
    fault adds is asserted exactly and no figure depends on this machine's load: every read of
    the thread's CPU clock advances it (and the wall clock) by ``tick_s``, as a real clock moves
    while code runs; a sleep moves the wall clock alone; ``run_queue_s`` is the time the host
    kept the thread off a CPU (Linux's schedstat), moved by the test."""

    def __init__(self, tick_s: float = 10e-6) -> None:
        self.tick_s = tick_s
        self.cpu_s = self.wall_s = self.run_queue_s = 0.0
        self.slept: list[float] = []

    def thread_time(self) -> float:
        self.cpu_s += self.tick_s
        self.wall_s += self.tick_s
        return self.cpu_s

    def perf_counter(self) -> float:
        return self.wall_s

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.wall_s += seconds

    def own_ns(self) -> int:  # STRAG-1's own clock: the wall clock less the run-queue delay
        return round((self.wall_s - self.run_queue_s) * 1e9)

    def run_queue_delay(self) -> float:
        return self.run_queue_s


def _slowed(factor: float, monkeypatch: pytest.MonkeyPatch, *, waits: bool) -> tuple[faults.SlowOps, FakeTime]:
    """200 matrix products under ``SlowOps(factor)`` on fake clocks."""
    import torch

    fake = FakeTime()
    monkeypatch.setattr(faults, "time", fake)
    a = torch.randn(8, 8)
    slow = faults.SlowOps(factor, waits=waits)
    slow._own_ns = fake.own_ns  # type: ignore[assignment]
    with slow:
        for _ in range(200):
            torch.mm(a, a)
    return slow, fake


def test_FAULT_5_slow_ops_compute_factor_times_as_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """After each operation the thread computes ``factor - 1`` times the CPU time the operation
    and the Python before it used (the mechanism, on fake clocks; what a slowed rank looks like
    on this host is bench/stragglers.py's)."""
    asked: list[float] = []

    def compute_for(cpu_s: float) -> None:
        asked.append(cpu_s)
        faults.time.cpu_s += cpu_s  # type: ignore[attr-defined]

    monkeypatch.setattr(faults, "compute_for", compute_for)
    same, plain = _slowed(1.0, monkeypatch, waits=False)
    assert asked == [] and same.operations == 200
    slow, slowed = _slowed(2.0, monkeypatch, waits=False)
    doubled, asked[:] = asked[:], []
    slower, _slowest = _slowed(3.0, monkeypatch, waits=False)
    assert slow.operations == slower.operations == len(doubled) == len(asked) == 200
    # One clock read's tick inside the operation, one between two operations (the first has none).
    tick_s = plain.tick_s
    assert doubled == pytest.approx([tick_s] + [2 * tick_s] * 199)
    assert asked == pytest.approx([2 * d for d in doubled])
    assert slowed.cpu_s == pytest.approx(plain.cpu_s + sum(doubled))
    assert plain.slept == slowed.slept == [] and slow.waited_s == 0.0  # it computes; it never sleeps


def test_FAULT_5_slow_ops_that_wait_cost_wall_time_and_no_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``waits=True``: the extra time is slept, in sleeps of at least ``wait_quantum_s``, and not
    computed: the thread's CPU time is the plain run's, the time slept grows as ``factor - 1``,
    and ``waited_s`` is what the own clock saw slept (the mechanism, not a timing of this host)."""
    monkeypatch.setattr(faults, "compute_for", lambda cpu_s: pytest.fail(f"a waiting fault computed {cpu_s} s"))
    same, plain = _slowed(1.0, monkeypatch, waits=True)
    slow, slowed = _slowed(2.0, monkeypatch, waits=True)
    slower, slowest = _slowed(3.0, monkeypatch, waits=True)
    assert same.operations == slow.operations == slower.operations == 200
    assert plain.slept == [] and same.waited_s == 0.0
    assert slowed.cpu_s == pytest.approx(plain.cpu_s) and slowest.cpu_s == pytest.approx(plain.cpu_s)
    assert slowed.slept and all(s >= slow.wait_quantum_s for s in slowed.slept + slowest.slept)
    assert slow.waited_s == pytest.approx(sum(slowed.slept)) and slower.waited_s == pytest.approx(sum(slowest.slept))
    assert slowed.wall_s == pytest.approx(plain.wall_s + slow.waited_s)
    # Owed and not yet slept stays below one quantum; the time owed is (factor - 1) x the same spent.
    owed_2, owed_3 = slow._local.owed, slower._local.owed
    assert 0 <= owed_2 < slow.wait_quantum_s and 0 <= owed_3 < slower.wait_quantum_s
    assert slower.waited_s + owed_3 == pytest.approx(2 * (slow.waited_s + owed_2))
    with pytest.raises(ValueError, match="wait_quantum_s must be a finite number > 0, got 0"):
        faults.SlowOps(2.0, waits=True, wait_quantum_s=0)


def test_FAULT_6_a_slow_loop_waits_factor_minus_one_times_its_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait is ``factor - 1`` times the block's wall time less the time the host kept the
    thread off a CPU meanwhile (LOOP-1's own time): on fake clocks, exactly."""
    fake = FakeTime()
    monkeypatch.setattr(faults, "time", fake)
    loop = faults.SlowLoop(1.5)
    loop._run_queue_delay = fake.run_queue_delay  # type: ignore[assignment]
    with loop:
        began = fake.wall_s
        faults.compute_for(0.02)
        own_s = fake.wall_s - began
        fake.wall_s += 0.5  # descheduled half a second: contention, not the loop's own time
        fake.run_queue_s += 0.5
    assert fake.slept == [pytest.approx(0.5 * own_s)] and loop.waited_s == pytest.approx(0.5 * own_s)
    with pytest.raises(ValueError, match="factor must be finite and >= 1"):
        faults.SlowOps(0.5)
    with pytest.raises(TypeError, match="factor must be a number"):
        faults.SlowLoop("2")  # type: ignore[arg-type]
