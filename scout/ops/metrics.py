"""Prometheus metrics of one node (docs/metrics.md has each one with a Grafana panel).

:class:`NodeCollector` is a ``prometheus_client`` collector: at every scrape it first asks the
sidecar to read what changed (new reports, progress, ops files; OPS-5: a report appended before
a scrape is in that scrape), then builds the metric families from the :class:`NodeState`. Names
follow Prometheus conventions: ``scout_`` prefix, base units (seconds, ratios), ``_total`` on
counters, ``_seconds`` on durations; ranks are labels (``rank="3"``).

prometheus_client is the ``metrics`` extra (``pip install 'scout-localize[metrics]'``) and is
imported only here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from scout.gate.model import Trust
from scout.ops.state import NodeState

__all__ = ["METRIC_NAMES", "NodeCollector", "registry_for"]

#: Every metric family this collector exports (docs/metrics.md documents each).
METRIC_NAMES: Final = (
    "scout_job_info", "scout_restart_generation", "scout_reports_total", "scout_rank_reports_total",
    "scout_last_report_timestamp_seconds", "scout_restarts_total", "scout_straggler_ratio",
    "scout_straggler_score", "scout_straggler_confirmed", "scout_checkpoints", "scout_recovery_verified_step",
    "scout_progress_step", "scout_progress_age_seconds", "scout_trainer_up", "scout_observer_round_duration_seconds",
    "scout_replay_cost_ratio", "scout_replay_seconds_total", "scout_training_seconds_total", "scout_on_report_total",
)


class NodeCollector(Collector):
    """Metric families from ``state``, refreshed by ``refresh`` at each scrape; ``lock`` is held
    while the state is read or changed (the sidecar's loop changes it too)."""

    def __init__(self, state: NodeState, lock: threading.Lock, refresh: Callable[[], None],
                 hook_counts: Callable[[], Mapping[str, int]] | None = None) -> None:
        self.state = state
        self.lock = lock
        self.refresh = refresh
        self.hook_counts = hook_counts

    def collect(self) -> Iterator[Metric]:
        self.refresh()
        with self.lock:
            families = list(self._families())
        yield from families

    def _families(self) -> Iterator[Metric]:
        state = self.state
        info = GaugeMetricFamily("scout_job_info", "The job this node's scout serves (value 1).",
                                 labels=["job_id", "host"])
        info.add_metric([state.job_id, state.host], 1)
        yield info
        yield GaugeMetricFamily("scout_restart_generation",
                                "The attempt this node runs: 0, then one more at every launcher restart.",
                                value=state.generation)

        reports = CounterMetricFamily("scout_reports", "Reports written since this node's scout started, by kind "
                                      "and reason (OPS-3: each report counted by one node).", labels=["kind", "reason"])
        for (kind, reason), count in sorted(state.reports.items()):
            reports.add_metric([kind, reason], count)
        yield reports
        rank_reports = CounterMetricFamily("scout_rank_reports", "Reports naming a rank at fault, by rank, its host "
                                           "and the report kind.", labels=["rank", "host", "kind"])
        for (rank, host, kind), count in sorted(state.rank_faults.items()):
            rank_reports.add_metric([str(rank), host, kind], count)
        yield rank_reports
        last = GaugeMetricFamily("scout_last_report_timestamp_seconds", "Unix time of the newest report of each kind.",
                                 labels=["kind"])
        for kind, unix_s in sorted(state.last_report_unix_s.items()):
            last.add_metric([kind], unix_s)
        yield last
        restarts = CounterMetricFamily("scout_restarts", "Restart reports: a fault policy stopped the job (sdc, "
                                       "hang, ...) or a restarted attempt restored a checkpoint (restored).",
                                       labels=["reason"])
        for reason, count in sorted(state.restarts.items()):
            restarts.add_metric([reason], count)
        yield restarts

        yield from self._stragglers()
        yield from self._checkpoints()
        yield from self._progress()
        yield self._rounds()

        if self.hook_counts is not None:
            hooks = CounterMetricFamily("scout_on_report", "on_report commands by outcome (OPS-4).",
                                        labels=["outcome"])
            for outcome, count in self.hook_counts().items():
                hooks.add_metric([outcome], count)
            yield hooks

    def _stragglers(self) -> Iterator[Metric]:
        state = self.state
        ratio = GaugeMetricFamily("scout_straggler_ratio", "A rank's time over its replica group's centre (1.0 on "
                                  "par, 1.5 half again as slow), median over its recent checks.", labels=["rank", "kind"])
        score = GaugeMetricFamily("scout_straggler_score", "A rank's confirmation score in the sequential straggler "
                                  "test (spec/straggler.md); confirmed at the configured evidence.",
                                  labels=["rank", "kind"])
        for rank, stats in sorted(state.stats.items()):
            for kind, values in sorted(stats.stragglers.items()):
                if _finite(values.get("performance_ratio")):
                    ratio.add_metric([str(rank), kind], float(values["performance_ratio"]))
                if _finite(values.get("score")):
                    score.add_metric([str(rank), kind], float(values["score"]))
        yield ratio
        yield score
        confirmed = GaugeMetricFamily("scout_straggler_confirmed", "1 while a rank is a confirmed straggler of that "
                                      "kind (from its straggler reports), 0 once it recovered.", labels=["rank", "kind"])
        for (rank, kind), value in sorted(state.straggler_confirmed.items()):
            confirmed.add_metric([str(rank), kind], 1 if value else 0)
        yield confirmed

    def _checkpoints(self) -> Iterator[Metric]:
        state = self.state
        if not state.checkpoints_known:
            return
        by_trust = GaugeMetricFamily("scout_checkpoints", "Checkpoints in the gate's manifest by trust state.",
                                     labels=["trust"])
        counts = state.checkpoints_by_trust()
        for trust in Trust:
            by_trust.add_metric([trust.value], counts.get(trust.value, 0))
        yield by_trust
        newest = state.newest_verified_step()
        if newest is not None:
            yield GaugeMetricFamily("scout_recovery_verified_step", "The newest recovery-verified checkpoint's "
                                    "training step (what a restart after SDC restores).", value=newest)

    def _progress(self) -> Iterator[Metric]:
        state = self.state
        step = GaugeMetricFamily("scout_progress_step", "The step each rank of this node is in (its progress "
                                 "record).", labels=["rank"])
        age = GaugeMetricFamily("scout_progress_age_seconds", "Seconds since each rank last published progress; "
                                "grows while it is stuck, whatever the trainer does (OPS-1).", labels=["rank"])
        up = GaugeMetricFamily("scout_trainer_up", "1 while the rank's trainer process runs.", labels=["rank"])
        for rank, progress in sorted(state.progress.items()):
            step.add_metric([str(rank)], progress.step)
            if progress.alive and not progress.closed:
                age.add_metric([str(rank)], progress.age_s)
            up.add_metric([str(rank)], 1 if progress.alive and not progress.closed else 0)
        yield step
        yield age
        yield up
        cost = GaugeMetricFamily("scout_replay_cost_ratio", "Replay's share of the rank's wall time since its first "
                                 "step (0.01: 1 %).", labels=["rank"])
        replay = CounterMetricFamily("scout_replay_seconds", "Seconds the rank spent in replay.", labels=["rank"])
        training = CounterMetricFamily("scout_training_seconds", "Wall seconds since the rank's first step.",
                                       labels=["rank"])
        for rank, stats in sorted(state.stats.items()):
            ratio = stats.replay_cost_ratio
            if ratio is not None:
                cost.add_metric([str(rank)], ratio)
            replay.add_metric([str(rank)], stats.replay_s)
            training.add_metric([str(rank)], stats.wall_s)
        yield cost
        yield replay
        yield training

    def _rounds(self) -> Metric:
        rounds = self.state.rounds
        family = HistogramMetricFamily("scout_observer_round_duration_seconds", "Observer consensus rounds of this "
                                       "node's observers, from the request to the decision (answers or deadline).")
        family.add_metric([], rounds.cumulative(), sum_value=rounds.sum_s)
        return family


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def registry_for(collector: NodeCollector) -> CollectorRegistry:
    """A registry of its own (not the global default) holding the node's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
