"""The recovery decision: after a failure, which checkpoint to restore, and why (docs/design.md §2.3).

Pure. The rules are ``spec/recovery.toml`` (normative, rendered in ``spec/recovery.md``); this
module reads them from the generated :mod:`scout.gate.recovery_table`, so no rule exists only in
code. :func:`decide` maps a :class:`Situation` to the first matching rule; :func:`recover` derives
the situation from a gate state and names the checkpoint the gate will accept a restart from.

The principle behind the rows: restore the newest checkpoint the evidence does not rule out.
Observed corruption (an SDC now, or one since the last restart) rules out everything unverified
(RECOVERY-1, -2). Failures that can corrupt silently (hang, lost host, unknown cause) rule out
everything unverified unless a full-catalog replay after the failure came back clean
(RECOVERY-3). Slowness and stalls say nothing about numbers (RECOVERY-4). ``none`` means start
from initialization; the decision says so rather than guessing.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from scout.core.failure import FailureClass
from scout.core.machine import MachineState
from scout.gate.model import RESTORABLE, CheckpointId, GateContext, Trust
from scout.gate.recovery_table import ROWS

__all__ = [
    "Choice",
    "EmergencyReplay",
    "FailureClass",
    "RecoveryDecision",
    "RecoveryRule",
    "RULES",
    "Situation",
    "decide",
    "every_situation",
    "recover",
    "situation_of",
]


class EmergencyReplay(enum.Enum):
    CLEAN = "clean"
    UNCLEAN = "unclean"
    NOT_RUN = "not-run"


class Choice(enum.Enum):
    VERIFIED = "verified"
    LATEST = "latest"
    NONE = "none"


@attrs.frozen
class Situation:
    """Everything the decision depends on (the table's inputs)."""

    failure: FailureClass
    sdc_since_restart: bool
    verified: bool
    latest: bool
    emergency_replay: EmergencyReplay = EmergencyReplay.NOT_RUN


@attrs.frozen
class RecoveryRule:
    number: int
    failures: frozenset[FailureClass]  # empty: any failure
    sdc_since_restart: bool | None
    verified: bool | None
    latest: bool | None
    emergency_replay: EmergencyReplay | None
    choose: Choice
    reason: str
    why: str

    def matches(self, situation: Situation) -> bool:
        return (
            (not self.failures or situation.failure in self.failures)
            and (self.sdc_since_restart is None or self.sdc_since_restart == situation.sdc_since_restart)
            and (self.verified is None or self.verified == situation.verified)
            and (self.latest is None or self.latest == situation.latest)
            and (self.emergency_replay is None or self.emergency_replay is situation.emergency_replay)
        )


RULES: Final = tuple(
    RecoveryRule(
        number,
        frozenset(FailureClass(f) for f in failures),
        sdc_since_restart,
        verified,
        latest,
        None if replay is None else EmergencyReplay(replay),
        Choice(choose),
        reason,
        why,
    )
    for number, failures, sdc_since_restart, verified, latest, replay, choose, reason, why in ROWS
)


@attrs.frozen
class RecoveryDecision:
    """Which checkpoint to restore and why. ``checkpoint`` is None exactly when ``choice`` is
    ``none`` (start from initialization). ``notes`` say what else the decision rests on, such as
    a manifest reading that failed closed (GATE-31)."""

    situation: Situation
    choice: Choice
    reason: str
    why: str
    rule: int
    checkpoint: CheckpointId | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "failure": self.situation.failure.value,
            "sdc_since_restart": self.situation.sdc_since_restart,
            "verified_available": self.situation.verified,
            "latest_available": self.situation.latest,
            "emergency_replay": self.situation.emergency_replay.value,
            "choice": self.choice.value,
            "reason": self.reason,
            "why": self.why,
            "rule": self.rule,
            "checkpoint": None
            if self.checkpoint is None
            else {"timeline": self.checkpoint.timeline, "step": self.checkpoint.step},
            "notes": list(self.notes),
        }


def decide(situation: Situation) -> RecoveryDecision:
    """The first rule of spec/recovery.toml that matches. The table is total (a test proves
    every situation matches a rule), so this never falls through."""
    for rule in RULES:
        if rule.matches(situation):
            return RecoveryDecision(situation, rule.choose, rule.reason, rule.why, rule.number)
    raise AssertionError(f"spec/recovery.toml has no rule for {situation!r}; the table must be total")


def every_situation() -> tuple[Situation, ...]:
    """The whole finite domain: 7 failures x 2 x 2 x 2 x 3 emergency-replay outcomes."""
    return tuple(
        Situation(failure, tainted, verified, latest, replay)
        for failure in FailureClass
        for tainted in (False, True)
        for verified in (False, True)
        for latest in (False, True)
        for replay in EmergencyReplay
    )


def situation_of(
    state: MachineState[GateContext],
    failure: FailureClass,
    emergency_replay: EmergencyReplay = EmergencyReplay.NOT_RUN,
) -> Situation:
    context = state.context
    verified = context.verified
    latest = context.latest
    newer_than_verified = (
        latest is not None
        and latest.trust is not Trust.RECOVERY_VERIFIED
        and (verified is None or latest.id.step > verified.id.step)
    )
    return Situation(
        failure,
        sdc_since_restart=context.sdc is not None,
        verified=verified is not None,
        latest=newer_than_verified,
        emergency_replay=emergency_replay,
    )


def recover(
    state: MachineState[GateContext],
    failure: FailureClass,
    emergency_replay: EmergencyReplay = EmergencyReplay.NOT_RUN,
) -> RecoveryDecision:
    """Decide for the gate's current state and name the checkpoint; ``Restart(step)`` with its
    step is an event the gate accepts."""
    decision = decide(situation_of(state, failure, emergency_replay))
    context = state.context
    checkpoint: CheckpointId | None = None
    if decision.choice is Choice.VERIFIED:
        verified = context.verified
        assert verified is not None, "a rule chose 'verified' without a verified checkpoint"
        checkpoint = verified.id
    elif decision.choice is Choice.LATEST:
        latest = context.latest
        assert latest is not None and latest.trust in RESTORABLE, "a rule chose 'latest' without one"
        checkpoint = latest.id
    return attrs.evolve(decision, checkpoint=checkpoint)
