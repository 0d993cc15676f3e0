"""Straggler tracking and reports (spec/replay.md STRAG-2..STRAG-4, STRAG-21). Pure: the replay
runner, the loop timer, the job's pipeline and the simulator share it.

One :class:`StragglerTracker` per kind of evidence and group: it steps the pure sequential
test (:mod:`scout.core.straggler`) with each check's per-peer log ratios, keeps every peer's
evidence trail (the last ``trail_checks`` checks, bounded) and turns each confirmation or
recovery into a :class:`StragglerEvent` that carries what a report needs: the kind and its
stable reason code, the global rank, the per-rank performance ratio and the evidence trail.
:func:`straggler_record_arguments` turns an event into the arguments of
``scout.reports.make_record`` (schema ``scout.report/1``, kind ``straggler``, source
``replay``).

Kinds (STRAG-21), each with its own reason code:

* ``device`` (``device-slow``): the peer's controlled replays take longer than its peers'
  -- its device computes slowly (replay compute, STRAG-1);
* ``communication`` (``communication-slow``): its own side of the replay collectives is slow
  (COMM-2);
* ``loop`` (``loop-slow``): its peers wait for it at the step's collectives, step after step
  -- its training loop is slow (host-side work, a slow data path; LOOP-1..LOOP-4). A device
  straggler slows its loop too; ``loop-slow`` without ``device-slow`` points at the host side;
* ``forward`` (``forward-slow``): its live forward of the hidden layers takes longer than its
  peers' (LOOP-7) -- a forward hook that waits or computes, a unit whose live work replay does
  not repeat; ``forward-slow`` without ``device-slow`` points at the live path.

A recovery has the reason ``recovered-<kind>-slow``; a slow link or host named by live
cross-group localization (STRAG-20), ``localized-<kind>-slow``.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from scout.core.straggler.confirmation import (
    DEFAULT_SEQUENTIAL_CONFIG,
    ConfirmationState,
    SequentialConfig,
    check_evidence,
    confirmation_start,
    confirmation_step,
)
from scout.core.straggler.localize import GroupTiming
from scout.core.straggler.model import Confirmed, Recovered
from scout.core.verdict import MISSING, TimingConfig, Verdict, classify_timing

__all__ = [
    "ReplayStragglers",
    "StragglerEvent",
    "StragglerKind",
    "StragglerTracker",
    "TrailEntry",
    "group_timings",
]


class StragglerKind(str, enum.Enum):
    DEVICE = "device"
    COMMUNICATION = "communication"
    LOOP = "loop"
    FORWARD = "forward"


@attrs.frozen
class TrailEntry:
    """One check of a peer's evidence trail: the step, its time over the group's centre at that
    check (None: the check said nothing about it) and its confirmation score after the check."""

    step: int
    time_ratio: float | None  # one check's; a report's ``performance_ratio`` is their median
    score_mnp: int


@attrs.frozen
class StragglerEvent:
    """One confirmation or recovery, with what its report needs."""

    kind: StragglerKind
    change: str  # "confirmed" or "recovered"
    step: int
    peer: int  # position in the group
    rank: int  # global rank
    group_ranks: tuple[int, ...]
    performance_ratio: float | None  # median of the trail's ratios (1.5: 1.5x the centre)
    checks: int  # checks with evidence since the peer's previous report (capped)
    trail: tuple[TrailEntry, ...]
    config: SequentialConfig
    effect: Confirmed | Recovered  # the machine's effect (STRAG-11)


def _median_ratio(trail: Sequence[TrailEntry]) -> float | None:
    ratios = [entry.time_ratio for entry in trail if entry.time_ratio is not None]
    return statistics.median(ratios) if ratios else None


class StragglerTracker:
    """The sequential test of one kind of evidence over one group, with per-peer trails.

    ``ranks``: the group's global ranks by position. Not thread-safe: one caller per group.
    """

    def __init__(
        self,
        kind: StragglerKind,
        ranks: Sequence[int],
        config: SequentialConfig = DEFAULT_SEQUENTIAL_CONFIG,
        trail_checks: int = 16,
    ) -> None:
        if not ranks:
            raise ValueError("a straggler tracker needs a group of at least one rank")
        if trail_checks < 1:
            raise ValueError(f"trail_checks must be >= 1, got {trail_checks}")
        self.kind = StragglerKind(kind)
        self.ranks = tuple(int(r) for r in ranks)
        self.config = config
        self.state: ConfirmationState = confirmation_start(len(self.ranks), config)
        self._trails: tuple[deque[TrailEntry], ...] = tuple(
            deque(maxlen=trail_checks) for _ in self.ranks
        )
        self.checks = 0

    @property
    def confirmed(self) -> frozenset[int]:
        """Peer positions confirmed now."""
        return self.state.confirmed

    def trail(self, peer: int) -> tuple[TrailEntry, ...]:
        return tuple(self._trails[peer])

    def performance_ratios(self) -> tuple[float | None, ...]:
        """Per peer: the median time ratio to the group's centre over its trail -- 1.0 on par,
        1.5 half again as slow (NVRx's score is its inverse); None without evidence."""
        return tuple(_median_ratio(trail) for trail in self._trails)

    def observe(self, step: int, evidence: Sequence[float | None]) -> tuple[StragglerEvent, ...]:
        """One check: every peer's log ratio (None: no evidence). Returns the confirmations
        and recoveries of this check, in peer order."""
        self.checks += 1
        self.state, effects = confirmation_step(self.state, evidence)
        for peer, value in enumerate(evidence):
            ratio = None if value is None else math.exp(value)
            self._trails[peer].append(TrailEntry(step, ratio, self.state.scores[peer]))
        events = []
        for effect in effects:
            change = "confirmed" if isinstance(effect, Confirmed) else "recovered"
            assert isinstance(effect, (Confirmed, Recovered))
            trail = self.trail(effect.peer)
            events.append(
                StragglerEvent(
                    self.kind,
                    change,
                    step,
                    effect.peer,
                    self.ranks[effect.peer],
                    self.ranks,
                    _median_ratio(trail),
                    effect.checks,
                    trail,
                    self.config,
                    effect,
                )
            )
        return tuple(events)


@attrs.frozen
class ReplayTiming:
    """What one replay check's timing said: the evidence of each kind (STRAG-2: each peer's
    log ratio to the centre, None where the check said nothing about it), the communication
    verdict (COMM-2) and the confirmations and recoveries of this check (STRAG-21)."""

    evidence: dict[str, tuple[float | None, ...]]
    communication: Verdict | None
    events: tuple[StragglerEvent, ...]


class ReplayStragglers:
    """The sequential tests of one replay group (STRAG-2..STRAG-4, COMM-2): one over the
    replay compute times (``device``), one over the peers' own communication times; each
    check's single comparison is the timing verdict the round already took."""

    def __init__(
        self,
        ranks: Sequence[int],
        config: SequentialConfig = DEFAULT_SEQUENTIAL_CONFIG,
        trail_checks: int = 16,
        *,
        device_floor_ms: float,
        communication_timing: TimingConfig,
    ) -> None:
        self.size = len(ranks)
        self.device = StragglerTracker(StragglerKind.DEVICE, ranks, config, trail_checks)
        self.communication = StragglerTracker(StragglerKind.COMMUNICATION, ranks, config, trail_checks)
        self.device_floor_ms = device_floor_ms
        self.communication_timing = communication_timing

    def observe(
        self,
        step: int,
        peer_compute_ms: Mapping[str, Sequence[Any]],
        timing: Mapping[str, Verdict],
        communication_ms: Sequence[float],
    ) -> ReplayTiming:
        device_evidence = check_evidence(peer_compute_ms, timing, self.device_floor_ms, self.size)
        events = list(self.device.observe(step, device_evidence))
        evidence = {StragglerKind.DEVICE.value: device_evidence}
        communication: Verdict | None = None
        if communication_ms:  # COMM-2: one check per step that exchanged evidence
            communication = classify_timing(list(communication_ms), self.communication_timing)
            communication_evidence = check_evidence({"communication": communication_ms},
                                                    {"communication": communication},
                                                    self.communication_timing.absolute_floor_ms, self.size)
            evidence[StragglerKind.COMMUNICATION.value] = communication_evidence
            events += self.communication.observe(step, communication_evidence)
        return ReplayTiming(evidence, communication, tuple(events))

    def performance_ratios(self) -> dict[str, tuple[float | None, ...]]:
        """STRAG-21: every peer's performance ratio (median over its trail) by kind."""
        return {StragglerKind.DEVICE.value: self.device.performance_ratios(),
                StragglerKind.COMMUNICATION.value: self.communication.performance_ratios()}


def group_timings(report: Any, ranks: Sequence[int], family: str) -> dict[str, GroupTiming]:
    """STRAG-20: this group's live centres at one check (a ``StepReport``), by kind, for
    ``scout.core.straggler.localize_live`` once every group's are gathered: ``device`` -- the
    median over peers of their summed replay compute times; ``communication`` -- the median of
    their own communication times. A kind without times this check has no entry."""
    members = frozenset(int(r) for r in ranks)
    timings: dict[str, GroupTiming] = {}
    per_recipe = list(report.peer_compute_ms.values())
    if per_recipe:
        totals = [
            sum(times[p] for times in per_recipe)
            for p in range(len(per_recipe[0]))
            if all(times[p] is not MISSING for times in per_recipe)
        ]
        if totals:
            timings[StragglerKind.DEVICE.value] = GroupTiming(
                members, family, statistics.median(totals)
            )
    if report.communication_ms:
        timings[StragglerKind.COMMUNICATION.value] = GroupTiming(
            members, family, statistics.median(report.communication_ms)
        )
    return timings
