"""The checkpoint restored is the one the decision table's choice names (spec/recovery.md,
RECOVERY-1..RECOVERY-4; scout/gate/recovery.py ``recover``).

``test_recovery.py`` checks the table's choice over its whole domain, and that the checkpoint
``recover`` names is one the gate accepts a restart from. That is not enough: a ``recover`` that
restored the oldest verified checkpoint, or the verified one where the table says *latest*, or
an unverified one where it says *verified*, names a checkpoint the gate accepts too. The rule
stated here, for every failure class, every emergency-replay outcome and every checkpoint layout
the gate reaches (the story's states and every state of a 2-recipe catalog with up to 2
captures: several verified checkpoints, unverified ones below and above the verified one,
quarantined and superseded ones, later timelines), is the exact one: the checkpoint is the one
spec/recovery.md's words name, read literally from the checkpoint list --

- *verified*: the newest ``RECOVERY_VERIFIED`` checkpoint;
- *latest*: the newest ``CAPTURED`` or ``CANDIDATE`` checkpoint newer than every verified one;
- *none*: no checkpoint (start from initialization);

and the choice is the first matching row of spec/recovery.toml, read literally.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from scout.gate.model import CheckpointId, GateState, Trust
from scout.gate.recovery import EmergencyReplay, FailureClass, Situation, recover
from tests.model_check.test_recovery import _gate_states, naive_decision


def _named(state: Any) -> tuple[Situation, dict[str, CheckpointId | None]]:
    """The situation and what each choice names, from the checkpoint list and the gate's state
    alone (not from GateContext.verified / .latest, which recover itself uses)."""
    entries = state.context.checkpoints
    verified = [e for e in entries if e.trust is Trust.RECOVERY_VERIFIED]
    newer = [e for e in entries if e.trust in (Trust.CAPTURED, Trust.CANDIDATE)
             and all(e.id.step > v.id.step for v in verified)]
    restorable = [e.id.step for e in entries if e.trust in (Trust.CAPTURED, Trust.CANDIDATE, Trust.RECOVERY_VERIFIED)]
    # "The newest" is one checkpoint: no two restorable ones share a step (a second capture at a
    # step is refused, and a restart supersedes every unverified checkpoint above its step).
    assert len(restorable) == len(set(restorable)), entries
    named = {
        "verified": max(verified, key=lambda e: e.id.step).id if verified else None,
        "latest": max(newer, key=lambda e: e.id.step).id if newer else None,
        "none": None,
    }
    situation = Situation(FailureClass.SDC, state.control is GateState.TAINTED, bool(verified), bool(newer))
    return situation, named


def test_RECOVERY_1_to_4_the_checkpoint_restored_is_the_one_the_tables_choice_names() -> None:
    """The rule (issue 26), for every failure class and every checkpoint layout."""
    # For each failure class, the choices met on a layout with at least two restorable
    # checkpoints (where restoring the wrong one is possible), and the layouts met.
    choices_met: dict[FailureClass, set[str]] = defaultdict(set)
    layouts: set[tuple[str, ...]] = set()
    decided = 0
    for state in _gate_states():
        base, named = _named(state)
        entries = sorted(state.context.checkpoints, key=lambda e: (e.id.step, e.id.timeline))
        layouts.add(tuple(e.trust.name for e in entries))
        several = sum(e.trust in (Trust.CAPTURED, Trust.CANDIDATE, Trust.RECOVERY_VERIFIED) for e in entries) >= 2
        for failure in FailureClass:
            for replay in EmergencyReplay:
                situation = Situation(failure, base.sdc_since_restart, base.verified, base.latest, replay)
                choice, reason = naive_decision(situation)
                decision = recover(state, failure, replay)
                assert (decision.choice.value, decision.reason) == (choice, reason), situation
                assert decision.checkpoint == named[choice], (situation, choice, entries)
                if several:
                    choices_met[failure].add(choice)
                decided += 1
    # Every choice the table can make for a failure class was made where another restorable
    # checkpoint was there to be confused with it. (A slowness failure chooses *none* only when
    # nothing is restorable, RECOVERY-2/4; an SDC never chooses *latest*, RECOVERY-1.)
    for failure in FailureClass:
        if failure is FailureClass.SDC:
            expected = {"verified", "none"}
        elif failure in (FailureClass.HANG, FailureClass.INACCESSIBLE, FailureClass.UNCERTAIN):
            expected = {"verified", "latest", "none"}
        else:
            expected = {"verified", "latest"}
        assert choices_met[failure] == expected, failure
    # The layouts include two verified checkpoints, an unverified one below the verified one,
    # unverified ones above it (a candidate and a newer capture), and quarantined and superseded
    # ones above it, and a lost newest verified one above an older verified one (GATE-42).
    assert {
        ("RECOVERY_VERIFIED", "RECOVERY_VERIFIED"),
        ("CAPTURED", "RECOVERY_VERIFIED"),
        ("RECOVERY_VERIFIED", "CAPTURED", "CANDIDATE"),
        ("CANDIDATE", "CAPTURED"),
        ("RECOVERY_VERIFIED", "QUARANTINED"),
        ("SUPERSEDED", "RECOVERY_VERIFIED"),
        ("RECOVERY_VERIFIED", "LOST"),
    } <= layouts
    assert decided == len(_gate_states()) * len(FailureClass) * len(EmergencyReplay)


def test_RECOVERY_a_restart_on_a_later_timeline_restores_by_step_not_by_timeline() -> None:
    """After a restart the newer timeline's checkpoints have the higher timeline number and may
    have lower steps than the old timeline's superseded ones; *newest* is by step among the
    restorable ones. Some explored state must show a restorable checkpoint on timeline >= 1."""
    later = [s for s in _gate_states() if any(e.id.timeline >= 1 and e.trust is not Trust.SUPERSEDED
                                              for e in s.context.checkpoints)]
    assert later
    for state in later:
        _situation, named = _named(state)
        for failure in FailureClass:
            decision = recover(state, failure, EmergencyReplay.NOT_RUN)
            assert decision.checkpoint == named[decision.choice.value]
