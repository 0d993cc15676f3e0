"""The sidecar's model and its metrics (spec/ops.md OPS-3, OPS-5): which node counts a report,
straggler state from reports, and the exposition Prometheus scrapes -- names and labels by
Prometheus conventions. No processes: plain data through prometheus_client's own text format."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.ops import paths
from scout.ops.launch import NodeOps
from scout.reports.kinds import ReportKind

prometheus_client = pytest.importorskip("prometheus_client", reason="the metrics extra (prometheus_client) is not installed")
from prometheus_client.exposition import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from scout.ops.metrics import METRIC_NAMES, NodeCollector, registry_for  # noqa: E402
from scout.ops.state import NodeState, RankProgress  # noqa: E402


def _record(kind: str, reason: str, reporter: int | None, ranks: list[int] = (), **evidence: Any) -> dict[str, Any]:
    # Each kind's own source (scout.reports.kinds): a straggler comes from replay, a hang from an observer.
    return reports.make_record(kind, source=ReportKind(kind).source.value, reason=reason, job_id="j",
                               generation=0, ranks=list(ranks), hosts=["h1"] if ranks else [], step=5,
                               evidence=evidence, reporter_rank=reporter)


def test_OPS_3_each_report_is_counted_by_exactly_one_node() -> None:
    first = NodeState("j", 0, "h0", frozenset({0, 1}), True)
    second = NodeState("j", 0, "h1", frozenset({2, 3}), False)
    records = [_record("hang", "behind-majority", 3, [2]), _record("hang", "behind-majority", 0, [1]),
               _record("finished", "closed", None)]
    for record in records:  # a shared run directory: both nodes read every record
        assert first.add_record(record) != second.add_record(record)
    assert first.reports == {("hang", "behind-majority"): 1, ("finished", "closed"): 1}
    assert second.reports == {("hang", "behind-majority"): 1}
    assert second.rank_faults == {(2, "h1", "hang"): 1}


def test_OPS_3_straggler_reports_confirm_and_clear_and_restarts_are_counted() -> None:
    state = NodeState("j", 1, "h0", frozenset({0, 1, 2, 3}), True)
    state.add_record(_record("straggler", "device-slow", 0, [3], straggler="device", change="confirmed"))
    assert state.straggler_confirmed == {(3, "device"): True}
    state.add_record(_record("straggler", "recovered-device-slow", 0, [3], straggler="device", change="recovered"))
    assert state.straggler_confirmed == {(3, "device"): False}
    state.add_record(_record("restart", "started", 0))
    state.add_record(_record("restart", "restored", 0))
    assert state.restarts == {"restored": 1}


def _families(state: NodeState, refreshed: list[int] | None = None) -> dict[str, Any]:
    lock = threading.Lock()
    calls = refreshed if refreshed is not None else []
    collector = NodeCollector(state, lock, lambda: calls.append(1), lambda: {"succeeded": 2, "failed": 1})
    text = generate_latest(registry_for(collector)).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}, text


def test_OPS_5_a_scrape_reads_first_and_exposes_every_metric_by_convention() -> None:
    state = NodeState("job-7", 2, "h0", frozenset({0, 1}), True)
    state.add_record(_record("hang", "behind-majority", 0, [1]), unix_s=1000.0)
    state.progress[0] = RankProgress(12, 0.05, True, False)
    state.progress[1] = RankProgress(11, 7.5, True, False)
    state.set_stats(1, {"step": 11, "wall_s": 20.0, "costs": {"replay_s": 0.5},
                        "stragglers": {"device": {"performance_ratio": 1.5, "score": 4}, "bogus": {"performance_ratio": 9}}})
    state.set_checkpoints([(0, 40, "RECOVERY_VERIFIED"), (0, 80, "CANDIDATE"), (0, 120, "CAPTURED")])
    for latency_s in (0.004, 0.2, 1.0):
        state.rounds.observe(latency_s)
    refreshed: list[int] = []
    families, text = _families(state, refreshed)
    assert refreshed == [1], "a scrape reads what changed before it answers (OPS-5)"
    # prometheus_client's parser strips _total from counter family names; the text keeps it.
    exported = {name for name in families} | {f"{name}_total" for name, f in families.items() if f.type == "counter"}
    assert set(METRIC_NAMES) <= exported, sorted(set(METRIC_NAMES) - exported)
    for name, family in families.items():
        assert name.startswith("scout_"), name
        if family.type == "counter":
            assert f"{name}_total" in text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("scout_reports_total", (("kind", "hang"), ("reason", "behind-majority")))] == 1
    assert samples[("scout_rank_reports_total", (("host", "h1"), ("kind", "hang"), ("rank", "1")))] == 1
    assert samples[("scout_progress_age_seconds", (("rank", "1"),))] == 7.5
    assert samples[("scout_straggler_ratio", (("kind", "device"), ("rank", "1")))] == 1.5
    assert samples[("scout_straggler_score", (("kind", "device"), ("rank", "1")))] == 4
    assert ("scout_straggler_ratio", (("kind", "bogus"), ("rank", "1"))) not in samples
    assert samples[("scout_replay_cost_ratio", (("rank", "1"),))] == pytest.approx(0.025)
    assert samples[("scout_checkpoints", (("trust", "RECOVERY_VERIFIED"),))] == 1
    assert samples[("scout_checkpoints", (("trust", "QUARANTINED"),))] == 0
    assert samples[("scout_recovery_verified_step", ())] == 40
    assert samples[("scout_restart_generation", ())] == 2
    assert samples[("scout_observer_round_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("scout_observer_round_duration_seconds_bucket", (("le", "1"),))] == 3
    assert samples[("scout_observer_round_duration_seconds_count", ())] == 3
    assert samples[("scout_on_report_total", (("outcome", "failed"),))] == 1
    assert samples[("scout_last_report_timestamp_seconds", (("kind", "hang"),))] == 1000.0


def test_OPS_5_a_node_without_the_manifest_exports_no_checkpoint_series() -> None:
    families, _ = _families(NodeState("j", 0, "h1", frozenset({2}), False))
    assert "scout_checkpoints" not in families and "scout_recovery_verified_step" not in families


def test_OPS_1_a_rank_that_stops_after_its_second_step_still_has_a_replay_cost(tmp_path: Path) -> None:
    # The wall clock starts at the first step's end; the second step's end writes at once, so a
    # rank stuck a moment later (a hang at step 12 a second after start-up) has a ratio to show.
    ops = NodeOps(rank=0, run_dir=tmp_path, write_stats=True, process=None, metrics_address=None)
    ops.after_step(0, {"replay_s": 0.01}, {})
    assert paths.read_state(paths.rank_stats_path(tmp_path, 0)) is None, "nothing measured yet: no file"
    ops.after_step(1, {"replay_s": 0.02}, {})
    value = paths.read_state(paths.rank_stats_path(tmp_path, 0))
    assert value is not None and value["step"] == 1 and value["wall_s"] > 0, value
    state = NodeState("j", 0, "h0", frozenset({0}), True)
    state.set_stats(0, value)
    ratio = state.stats[0].replay_cost_ratio
    assert ratio is not None and ratio > 0
    ops.after_step(2, {"replay_s": 0.03}, {})  # within a second of the last write: not rewritten
    assert paths.read_state(paths.rank_stats_path(tmp_path, 0))["step"] == 1


def test_OPS_1_a_ranks_straggler_values_are_what_the_metrics_read_back() -> None:
    """What a rank writes of its trackers (``_straggler_values``) is what the sidecar exports:
    the performance ratio (the median of its trail) and the confirmation score."""
    import math

    from scout.core.straggler.tracking import StragglerKind, StragglerTracker
    from scout.ops.launch import _straggler_values

    tracker = StragglerTracker(StragglerKind.DEVICE, (4, 5, 6), trail_checks=4)
    for step in range(1, 4):
        tracker.observe(step, [0.0, math.log(1.25), 0.0])
    written = _straggler_values(5, {"device": tracker, "loop": None})
    assert set(written) == {"device"} and written["device"]["performance_ratio"] == pytest.approx(1.25)
    state = NodeState("job-7", 0, "h0", frozenset({5}), True)
    state.set_stats(5, {"step": 3, "wall_s": 1.0, "costs": {}, "stragglers": written})
    families, _ = _families(state, [])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("scout_straggler_ratio", (("kind", "device"), ("rank", "5")))] == pytest.approx(1.25)
    assert samples[("scout_straggler_score", (("kind", "device"), ("rank", "5")))] == written["device"]["score"]
