"""The golden canary, pure part (spec/canary.md CANARY-*): decide one canary check of the
whole job from every rank's canary signatures and the recorded golden ones. No torch, no I/O.

Replay compares replicas with each other, so corruption that a strict majority shares is
invisible to it (docs/design.md §2.1: a vote names only a minority). The canary compares each
rank with *the past* instead: a small fixed computation per recipe class (fixed inputs, fixed
weights, deterministic kernels) whose signature is recorded once and re-checked every cycle. A
rank whose canary changed is named even when its whole group changed with it, and a change on
every rank is reported as *common mode*.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from scout.core.verdict import MISSING, MissingType, Status, classify_exact

__all__ = ["CanaryDecision", "CanaryOutcome", "decide_canary"]

Readings = Mapping[str, int]


class CanaryOutcome(enum.Enum):
    RECORDED = "recorded"  # CANARY-3: first check; the golden signatures were recorded
    UNCHANGED = "unchanged"  # every rank matches the golden
    ATTRIBUTED = "attributed"  # CANARY-4: some ranks' canaries changed, not all
    COMMON_MODE = "common_mode"  # CANARY-5: every rank's canary changed
    INCONCLUSIVE = "inconclusive"  # CANARY-6: a rank did not report, or classes differ


@attrs.frozen
class CanaryDecision:
    """``ranks``: the ranks whose canary changed (ATTRIBUTED, COMMON_MODE; at recording: the
    minority that disagreed with the majority). ``classes``: the recipe classes whose canary
    changed. ``golden``: the golden signatures after this check. ``status``: what the gate gets
    (AGREE, ATTRIBUTED or INCONCLUSIVE; CANARY-7)."""

    outcome: CanaryOutcome
    ranks: tuple[int, ...]
    classes: tuple[str, ...]
    golden: tuple[tuple[str, int], ...]
    reason: str = ""

    @property
    def status(self) -> Status:
        if self.outcome in (CanaryOutcome.RECORDED, CanaryOutcome.UNCHANGED):
            return Status.ATTRIBUTED if self.ranks else Status.AGREE
        if self.outcome is CanaryOutcome.INCONCLUSIVE:
            return Status.INCONCLUSIVE
        return Status.ATTRIBUTED


def decide_canary(
    golden: Readings | None, readings: Sequence[Readings | MissingType]
) -> CanaryDecision:
    """One job-wide canary check (CANARY-3..CANARY-6). ``readings[r]``: rank ``r``'s canary
    signature per recipe class, or MISSING. ``golden``: the recorded signatures (None before
    the first record)."""
    if not readings:
        raise ValueError("no ranks: a canary check needs at least one reading")
    missing = [r for r, reading in enumerate(readings) if reading is MISSING]
    if missing:
        return CanaryDecision(CanaryOutcome.INCONCLUSIVE, (), (), tuple(sorted((golden or {}).items())),
                              f"no canary reading from ranks {missing}")
    present: list[Readings] = [r for r in readings if r is not MISSING]
    classes = sorted(present[0])
    if any(sorted(r) != classes for r in present):
        return CanaryDecision(CanaryOutcome.INCONCLUSIVE, (), (), tuple(sorted((golden or {}).items())),
                              "ranks ran canaries of different recipe classes")
    if golden is None:
        # CANARY-3: the first record is voted like any replay: the majority's values become
        # the golden; a minority that differs already is named.
        recorded: dict[str, int] = {}
        outliers: set[int] = set()
        changed: list[str] = []
        for name in classes:
            verdict = classify_exact([r[name] for r in present])
            if verdict.status is Status.INCONCLUSIVE:
                return CanaryDecision(CanaryOutcome.INCONCLUSIVE, (), (), (),
                                      f"canary {name}: no strict majority to record ({verdict.reason})")
            assert isinstance(verdict.healthy_value, int)
            recorded[name] = verdict.healthy_value
            if verdict.outliers:
                outliers.update(verdict.outliers)
                changed.append(name)
        return CanaryDecision(CanaryOutcome.RECORDED, tuple(sorted(outliers)), tuple(changed),
                              tuple(sorted(recorded.items())))
    if sorted(golden) != classes:
        return CanaryDecision(CanaryOutcome.INCONCLUSIVE, (), (), tuple(sorted(golden.items())),
                              f"canary classes {classes} differ from the golden's {sorted(golden)}")
    # CANARY-4, CANARY-5: each rank against the golden, not against its peers.
    changed_ranks = tuple(r for r, reading in enumerate(present) if any(reading[c] != golden[c] for c in classes))
    changed_classes = tuple(c for c in classes if any(reading[c] != golden[c] for reading in present))
    kept = tuple(sorted(golden.items()))
    if not changed_ranks:
        return CanaryDecision(CanaryOutcome.UNCHANGED, (), (), kept)
    if len(changed_ranks) == len(present):
        return CanaryDecision(CanaryOutcome.COMMON_MODE, changed_ranks, changed_classes, kept,
                              "every rank's canary changed since it was recorded: common-mode corruption")
    return CanaryDecision(CanaryOutcome.ATTRIBUTED, changed_ranks, changed_classes, kept,
                          f"ranks {list(changed_ranks)} changed their canary since it was recorded")


