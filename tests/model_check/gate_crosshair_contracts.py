"""Pre/postconditions of the gate's step, checked by CrossHair (PEP 316 docstrings).

Each function builds a consistent gate state from a few small symbolic inputs (control state,
which recipes are covered, whether a candidate or a verified checkpoint exists, the verdict of
every peer group), takes one real step through the table's compiled machine, and states what must
hold after it. ``test_gate_crosshair.py`` runs ``crosshair check`` with an explicit iteration
budget, and on a mutant of the bindings to show the check can fail. The ``GATE_ACTIONS_IMPL``
indirection lets the mutant reuse these exact contracts.
"""

from __future__ import annotations

from pathlib import Path

import scout
from scout.core.machine import MachineState, build_machine, load_table
from scout.gate import machine as GATE_ACTIONS_IMPL
from scout.gate.model import (
    Certificate,
    CheckpointCaptured,
    CheckpointEntry,
    CheckpointId,
    CycleBoundary,
    CycleRecord,
    GateConfig,
    GateContext,
    GateReport,
    GateReportKind,
    GateState,  # noqa: F401 -- named by the contracts (docstrings) CrossHair evaluates
    GroupVerdict,
    Outcome,
    RecipeVerdicts,
    Replay,
    Restart,
    SdcRecord,
    Trust,
    TrustChange,
)

GATE_TABLE_PATH = Path(scout.__file__).resolve().parents[1] / "spec" / "gate.toml"

MACHINE = build_machine(load_table(GATE_TABLE_PATH), GATE_ACTIONS_IMPL.ACTIONS)
CONTROLS = ("CHECKING", "UNCLEAN", "TAINTED")
OUTCOMES = (Outcome.AGREE, Outcome.ATTRIBUTED, Outcome.INCONCLUSIVE, Outcome.MISSING)
RECIPES = ("r0", "r1")
GROUPS = ("g0", "g1", "g2")
CONFIG = GateConfig("job-ch", RECIPES, GROUPS)
START = 20  # the open cycle starts at step 20; the cycle before ran 10..20


def _verdict(group: str, code: int) -> GroupVerdict:
    outcome = OUTCOMES[code]
    if outcome is Outcome.ATTRIBUTED:
        return GroupVerdict(group, outcome, (1,))
    return GroupVerdict(group, outcome, (), "" if outcome is Outcome.AGREE else "no-majority")


def _clean_cycle(cycle: int, start: int, end: int) -> CycleRecord:
    agree = tuple(GroupVerdict(g, Outcome.AGREE) for g in GROUPS)
    return CycleRecord(cycle, start, end, tuple(Replay(r, start, agree) for r in RECIPES))


def _state(control_index: int, covered_mask: int, with_candidate: bool, with_verified: bool) -> MachineState[GateContext]:
    """A state the gate can reach: cycle 3 open at step 20 after a clean cycle 2 (10..20); an
    optional verified checkpoint at 10 (cycles 1 and 2), an optional candidate at 20, a CAPTURED
    checkpoint at 15 unless tainted."""
    control = CONTROLS[control_index]
    covered = tuple(r for i, r in enumerate(RECIPES) if covered_mask >> i & 1)
    before = _clean_cycle(2, 10, START)
    entries = []
    if with_verified:
        certificate = Certificate(CheckpointId(0, 10), RECIPES, GROUPS, _clean_cycle(1, 0, 10), before, START)
        entries.append(CheckpointEntry(CheckpointId(0, 10), Trust.RECOVERY_VERIFIED, "v", None, certificate))
    tainted = control == "TAINTED"
    entries.append(CheckpointEntry(CheckpointId(0, 15), Trust.QUARANTINED if tainted else Trust.CAPTURED, "c"))
    if with_candidate and not tainted:
        entries.append(CheckpointEntry(CheckpointId(0, START), Trust.CANDIDATE, "k", before))
    agree = tuple(GroupVerdict(g, Outcome.AGREE) for g in GROUPS)
    replays = tuple(Replay(r, START, agree) for r in covered) if control == "CHECKING" else ()
    context = GateContext(
        config=CONFIG,
        timeline=0,
        cycle=3,
        cycle_start_step=START,
        covered=covered,
        unchecked=covered if control == "UNCLEAN" else (),
        replays=replays,
        previous_clean=None if tainted else before,
        checkpoints=tuple(entries),
        last_step=START,
        last_capture_step=START if with_candidate and not tainted else 15,
        sdc=SdcRecord("r0", 3, START, ("g0",)) if tainted else None,
    )
    return MachineState(control, context)


def _trust(state: MachineState[GateContext]) -> dict[CheckpointId, Trust]:
    return {entry.id: entry.trust for entry in state.context.checkpoints}


def _changes(effects: tuple[object, ...], after: Trust) -> list[TrustChange]:
    return [e for e in effects if isinstance(e, TrustChange) and e.after is after]


def _reports(effects: tuple[object, ...], kind: GateReportKind) -> list[GateReport]:
    return [e for e in effects if isinstance(e, GateReport) and e.kind is kind]


def result_step(control_index: int, codes: list[int], recipe_index: int, with_candidate: bool, with_verified: bool) -> tuple:
    """
    pre: 0 <= control_index <= 2
    pre: len(codes) == 3 and all(0 <= c <= 3 for c in codes)
    pre: 0 <= recipe_index <= 1
    post: not _changes(__return__[2], Trust.RECOVERY_VERIFIED)
    post: (1 not in codes) or (__return__[1].control is GateState.TAINTED and all(t not in (Trust.CAPTURED, Trust.CANDIDATE) for t in _trust(__return__[1]).values()))
    post: (1 in codes) or not _changes(__return__[2], Trust.QUARANTINED)
    post: (1 in codes) or not _reports(__return__[2], GateReportKind.SDC)
    post: (1 in codes) or (set(codes) <= {0}) or len(_reports(__return__[2], GateReportKind.UNCHECKED)) == 1
    post: all(_trust(__return__[1])[c] is Trust.RECOVERY_VERIFIED for c, t in _trust(__return__[0]).items() if t is Trust.RECOVERY_VERIFIED)
    """
    state = _state(control_index, 0, with_candidate, with_verified)
    event = RecipeVerdicts(RECIPES[recipe_index], 3, START, tuple(_verdict(g, c) for g, c in zip(GROUPS, codes, strict=True)))
    new, effects = MACHINE.step(state, event)
    return state, new, effects


def boundary_step(control_index: int, covered_mask: int, with_candidate: bool, with_verified: bool) -> tuple:
    """
    pre: 0 <= control_index <= 2
    pre: 0 <= covered_mask <= 3
    post: bool(_changes(__return__[2], Trust.RECOVERY_VERIFIED)) == (control_index == 0 and covered_mask == 3 and with_candidate)
    post: all(c.certificate is not None and c.certificate.after.replays for c in _changes(__return__[2], Trust.RECOVERY_VERIFIED))
    post: all(_trust(__return__[1])[c] is t for c, t in _trust(__return__[0]).items() if t in (Trust.QUARANTINED, Trust.RECOVERY_VERIFIED))
    post: __return__[1].context.cycle == 4 and __return__[1].context.cycle_start_step == 30
    post: sum(t is Trust.CANDIDATE for t in _trust(__return__[1]).values()) == 0
    """
    state = _state(control_index, covered_mask, with_candidate, with_verified)
    new, effects = MACHINE.step(state, CycleBoundary(30))
    return state, new, effects


def capture_step(control_index: int, at_cycle_start: bool) -> tuple:
    """
    pre: 0 <= control_index <= 2
    post: __return__[1].context.checkpoints[-1].trust is (Trust.QUARANTINED if control_index == 2 else (Trust.CANDIDATE if at_cycle_start else Trust.CAPTURED))
    post: len(__return__[1].context.checkpoints) == len(__return__[0].context.checkpoints) + 1
    """
    state = _state(control_index, 0, False, False)
    step = START if at_cycle_start else START + 5
    new, effects = MACHINE.step(state, CheckpointCaptured(step))
    return state, new, effects


RESTORE_STEPS = (10, 15, START)  # the verified checkpoint, the CAPTURED one, the candidate


def restart_step(control_index: int, restore_index: int, with_candidate: bool) -> tuple:
    """
    pre: 0 <= control_index <= 2
    pre: 0 <= restore_index <= 2
    pre: restore_index == 0 or control_index != 2
    pre: restore_index != 2 or with_candidate
    post: __return__[1].control is GateState.IDLE and __return__[1].context.timeline == 1 and __return__[1].context.sdc is None
    post: all(_trust(__return__[1])[c] is t for c, t in _trust(__return__[0]).items() if t in (Trust.QUARANTINED, Trust.RECOVERY_VERIFIED))
    post: all(t is not Trust.CANDIDATE for t in _trust(__return__[1]).values())
    post: all(_trust(__return__[1])[c] is Trust.SUPERSEDED for c, t in _trust(__return__[0]).items() if t in (Trust.CAPTURED, Trust.CANDIDATE) and c.step > RESTORE_STEPS[restore_index])
    post: all(_trust(__return__[1])[c] is Trust.CAPTURED for c, t in _trust(__return__[0]).items() if t in (Trust.CAPTURED, Trust.CANDIDATE) and c.step <= RESTORE_STEPS[restore_index])
    """
    state = _state(control_index, 0, with_candidate, True)
    new, effects = MACHINE.step(state, Restart(RESTORE_STEPS[restore_index]))
    return state, new, effects
