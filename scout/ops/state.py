"""What one node's sidecar knows, as plain data: the model the metrics are read from.

The sidecar feeds it (reports as they are appended, progress snapshots, the ranks' and the
observers' ops files, the gate's checkpoints); :mod:`scout.ops.metrics` turns it into metric
families at each scrape. No I/O, no clock, no prometheus_client here, so every rule is
checked by plain unit tests.

Which reports a node counts (spec/ops.md OPS-3): those whose reporter is one of the node's own
ranks, and those with no reporter on the node of rank 0. Each report is then counted by
exactly one node, whether the nodes share a run directory or each keeps its own, so a sum over
the nodes' series counts every report once.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from scout.core.guards import whole_number
from scout.reports.kinds import STRAGGLER_KINDS, ReportKind, RestartReason, StragglerReason

__all__ = ["ROUND_BUCKETS_S", "NodeState", "RankProgress", "RankStats", "RoundHistogram"]

#: Upper bounds of the observer round latency histogram: a round ends at its deadline
#: (``round_deadline_s``, 1 s by default) or when every peer answered (milliseconds on a LAN).
ROUND_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Straggler kinds (spec/replay.md STRAG-21).


@attrs.define
class RankProgress:
    """One rank's progress record, as the sidecar last read it."""

    step: int
    age_s: float  # since the trainer last published anything (OPS-1: grows while it is stuck)
    alive: bool  # the trainer process runs
    closed: bool  # the trainer closed its record (clean exit)


@attrs.define
class RankStats:
    """One rank's own numbers from its ops file (``rank-<r>.json``)."""

    step: int = 0
    wall_s: float = 0.0  # wall time since the rank's first step
    replay_s: float = 0.0  # of which in replay (scout's checks)
    stragglers: dict[str, dict[str, Any]] = attrs.Factory(dict)  # kind -> {performance_ratio, score, confirmed}

    @property
    def replay_cost_ratio(self) -> float | None:
        return self.replay_s / self.wall_s if self.wall_s > 0 else None


@attrs.define
class RoundHistogram:
    """Cumulative counts of observer round latencies (seconds) over ``ROUND_BUCKETS_S``."""

    counts: list[int] = attrs.Factory(lambda: [0] * len(ROUND_BUCKETS_S))
    total: int = 0
    sum_s: float = 0.0

    def observe(self, latency_s: float) -> None:
        if not math.isfinite(latency_s) or latency_s < 0:
            return
        index = bisect.bisect_left(ROUND_BUCKETS_S, latency_s)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += 1
        self.sum_s += latency_s

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus wants them, ending with ``+Inf``."""
        out, running = [], 0
        for bound, count in zip(ROUND_BUCKETS_S, self.counts, strict=True):
            running += count
            out.append((f"{bound:g}", running))
        out.append(("+Inf", self.total))
        return out


@attrs.define
class NodeState:
    """Everything one node's metrics say. ``local_ranks``: the node's global ranks;
    ``has_rank_zero``: the node of rank 0 (it counts reports that name no reporter)."""

    job_id: str
    generation: int
    host: str
    local_ranks: frozenset[int]
    has_rank_zero: bool
    reports: collections.Counter[tuple[str, str]] = attrs.Factory(collections.Counter)
    rank_faults: collections.Counter[tuple[int, str, str]] = attrs.Factory(collections.Counter)
    last_report_unix_s: dict[str, float] = attrs.Factory(dict)
    restarts: collections.Counter[str] = attrs.Factory(collections.Counter)
    #: (rank, kind) -> confirmed now, from the straggler reports this node counts.
    straggler_confirmed: dict[tuple[int, str], bool] = attrs.Factory(dict)
    progress: dict[int, RankProgress] = attrs.Factory(dict)
    stats: dict[int, RankStats] = attrs.Factory(dict)
    rounds: RoundHistogram = attrs.Factory(RoundHistogram)
    checkpoints: tuple[tuple[int, int, str], ...] = ()  # (timeline, step, trust)
    checkpoints_known: bool = False  # this node holds the gate's manifest

    def counts(self, record: Mapping[str, Any]) -> bool:
        """OPS-3: this node counts (and runs ``on_report`` for) ``record``."""
        reporter = record.get("reporter_rank")
        if reporter is None:
            return self.has_rank_zero
        return reporter in self.local_ranks

    def add_record(self, record: Mapping[str, Any], unix_s: float | None = None) -> bool:
        """Count one report if this node counts it; True when it did."""
        if not self.counts(record):
            return False
        kind, reason = str(record["kind"]), str(record["reason"])
        self.reports[(kind, reason)] += 1
        if unix_s is not None:
            self.last_report_unix_s[kind] = max(unix_s, self.last_report_unix_s.get(kind, 0.0))
        hosts = list(record.get("hosts") or [])
        for rank in record.get("ranks") or []:
            host = hosts[0] if len(hosts) == 1 else ""
            self.rank_faults[(int(rank), host, kind)] += 1
        if kind == ReportKind.RESTART and reason != RestartReason.STARTED:
            self.restarts[reason] += 1
        if kind == ReportKind.STRAGGLER:
            evidence = record.get("evidence") or {}
            parsed = StragglerReason.parse(reason)
            flavour = str(evidence.get("straggler") or (parsed.straggler if parsed is not None else reason))
            recovered = parsed is not None and parsed.change == "recovered"
            confirmed = evidence.get("change", "recovered" if recovered else "confirmed")
            for rank in record.get("ranks") or []:
                self.straggler_confirmed[(int(rank), flavour)] = confirmed == "confirmed"
        return True

    def set_checkpoints(self, checkpoints: Iterable[tuple[int, int, str]]) -> None:
        self.checkpoints = tuple(checkpoints)
        self.checkpoints_known = True

    def checkpoints_by_trust(self) -> dict[str, int]:
        return dict(collections.Counter(trust for _, _, trust in self.checkpoints))

    def newest_verified_step(self) -> int | None:
        steps = [step for _, step, trust in self.checkpoints if trust == "RECOVERY_VERIFIED"]
        return max(steps) if steps else None

    def set_stats(self, rank: int, value: Mapping[str, Any]) -> None:
        """A rank's ops file; fields that are missing or of the wrong type are ignored."""
        costs = value.get("costs")
        costs = costs if isinstance(costs, dict) else {}
        stragglers = value.get("stragglers")
        stragglers = stragglers if isinstance(stragglers, dict) else {}
        self.stats[rank] = RankStats(
            step=_int(value.get("step")), wall_s=_number(value.get("wall_s")), replay_s=_number(costs.get("replay_s")),
            stragglers={k: v for k, v in stragglers.items() if k in STRAGGLER_KINDS and isinstance(v, dict)})


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return float(value)


def _int(value: Any) -> int:
    return value if whole_number(value) else 0
