"""Guards, effects and invariant predicates of the checkpoint gate (``spec/gate.toml``).

The table decides which row fires; these functions compute the new context and the effects.
They assume an event that :func:`scout.gate.step.check_event` accepted (known recipe, open cycle,
steps in order), so they never validate. Pure: no I/O, inputs never mutated.

Each effect returns ``(context, effects)``. A row that changes the control state always emits
:class:`Persist` first; a self-loop emits it exactly when the context changed (GATE-9).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from scout.core.machine import Actions, MachineState
from scout.gate.model import (
    ABSORBING,
    RESTORABLE,
    UNVERIFIED_RESTORABLE,
    Certificate,
    CheckpointCaptured,
    CheckpointEntry,
    CheckpointId,
    CheckpointLost,
    CycleBoundary,
    CycleRecord,
    GateConfig,
    GateContext,
    GateEffect,
    GateReport,
    GateReportKind,
    GateState,
    Outcome,
    Persist,
    RecipeVerdicts,
    Replay,
    Restart,
    ResultClass,
    SdcRecord,
    Trust,
    TrustChange,
    is_complete_and_clean,
)

GateMachineState = MachineState[GateContext]
Effects = tuple[GateEffect, ...]
EffectOutcome = tuple[GateContext, Effects]

IDLE: Final = GateState.IDLE
CHECKING: Final = GateState.CHECKING
UNCLEAN: Final = GateState.UNCLEAN
TAINTED: Final = GateState.TAINTED
OPEN_CLEAN_OR_UNCLEAN: Final = frozenset({CHECKING, UNCLEAN})

ACTIONS = Actions(states=GateState)

# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------


def _add_recipe(config: GateConfig, recipes: tuple[str, ...], recipe: str) -> tuple[str, ...]:
    """Add ``recipe`` keeping catalog order, so equal sets are equal tuples (state dedup)."""
    if recipe in recipes:
        return recipes
    wanted = set(recipes) | {recipe}
    return tuple(r for r in config.recipe_ids if r in wanted)


def _add_replay(config: GateConfig, replays: tuple[Replay, ...], replay: Replay) -> tuple[Replay, ...]:
    if replay in replays:
        return replays
    order = {recipe: position for position, recipe in enumerate(config.recipe_ids)}
    return tuple(sorted((*replays, replay), key=lambda r: (r.step, order[r.recipe])))


def _persisted(old: GateContext, new: GateContext, effects: Iterable[GateEffect]) -> EffectOutcome:
    """Self-loop rows: persist exactly when the context changed (GATE-9)."""
    listed = tuple(effects)
    if new == old:
        return old, listed  # the same object: a driver (and GATE-9's run-time check) sees no change
    return new, (Persist(), *listed)


def _retrust(
    context: GateContext, changes: dict[CheckpointId, tuple[Trust, str, Certificate | None, CycleRecord | None]]
) -> tuple[tuple[CheckpointEntry, ...], tuple[TrustChange, ...]]:
    """Apply trust changes to the checkpoint list; returns the new list and one TrustChange per
    changed entry, in capture order."""
    entries: list[CheckpointEntry] = []
    effects: list[TrustChange] = []
    for entry in context.checkpoints:
        change = changes.get(entry.id)
        if change is None:
            entries.append(entry)
            continue
        trust, reason, certificate, before = change
        entries.append(CheckpointEntry(entry.id, trust, reason, before, certificate, entry.artifact))
        effects.append(TrustChange(entry.id, entry.trust, trust, reason, certificate))
    return tuple(entries), tuple(effects)


def _groups_with(event: RecipeVerdicts, outcomes: frozenset[Outcome]) -> tuple[str, ...]:
    return tuple(verdict.group for verdict in event.verdicts if verdict.outcome in outcomes)


_UNCHECKED_OUTCOMES: Final = frozenset({Outcome.INCONCLUSIVE, Outcome.MISSING})
_ATTRIBUTED: Final = frozenset({Outcome.ATTRIBUTED})


def _unchecked_report(event: RecipeVerdicts) -> GateReport:
    parts = []
    for verdict in event.verdicts:
        if verdict.outcome is Outcome.INCONCLUSIVE:
            parts.append(f"group {verdict.group} inconclusive ({verdict.reason or 'no reason given'})")
        elif verdict.outcome is Outcome.MISSING:
            parts.append(f"group {verdict.group} gave no verdict")
    detail = (
        f"recipe {event.recipe!r} at step {event.step} (cycle {event.cycle}) could not be checked: "
        f"{'; '.join(parts)}. This is not SDC; cycle {event.cycle} cannot promote a checkpoint."
    )
    return GateReport(
        GateReportKind.UNCHECKED, event.cycle, event.step, (event.recipe,), _groups_with(event, _UNCHECKED_OUTCOMES), detail
    )


def _sdc_record(event: RecipeVerdicts) -> SdcRecord:
    return SdcRecord(event.recipe, event.cycle, event.step, _groups_with(event, _ATTRIBUTED))


def _sdc_report(event: RecipeVerdicts, quarantined: tuple[TrustChange, ...]) -> GateReport:
    outliers = "; ".join(
        f"group {v.group} peers {list(v.outliers)}" for v in event.verdicts if v.outcome is Outcome.ATTRIBUTED
    )
    names = ", ".join(str(change.checkpoint) for change in quarantined) or "none"
    detail = (
        f"SDC: recipe {event.recipe!r} at step {event.step} (cycle {event.cycle}) attributed outliers "
        f"({outliers}); quarantined job-wide: {names}. Restore a RECOVERY_VERIFIED checkpoint."
    )
    return GateReport(GateReportKind.SDC, event.cycle, event.step, (event.recipe,), _groups_with(event, _ATTRIBUTED), detail)


def _open_next_cycle(context: GateContext, step: int, previous_clean: CycleRecord | None) -> GateContext:
    return context.replace(
        cycle=context.cycle + 1,
        cycle_start_step=step,
        covered=(),
        unchecked=(),
        replays=(),
        previous_clean=previous_clean,
        last_step=max(context.last_step, step),
    )


# ------------------------------------------------------------------------------------------
# Guards
# ------------------------------------------------------------------------------------------


@ACTIONS.guard
def sdc_attributed(context: GateContext, event: RecipeVerdicts) -> bool:
    """Some peer group attributed an outlier (exact mode): SDC."""
    return event.result_class is ResultClass.SDC


@ACTIONS.guard
def unchecked(context: GateContext, event: RecipeVerdicts) -> bool:
    """No group attributed, but some group was Inconclusive or gave no verdict."""
    return event.result_class is ResultClass.UNCHECKED


@ACTIONS.guard
def clean(context: GateContext, event: RecipeVerdicts) -> bool:
    """Every applicable peer group agreed."""
    return event.result_class is ResultClass.CLEAN


@ACTIONS.guard
def cycle_complete(context: GateContext, event: CycleBoundary) -> bool:
    """Every recipe in the catalog has an accepted result since the cycle began."""
    return context.cycle_complete


# ------------------------------------------------------------------------------------------
# Effects: results
# ------------------------------------------------------------------------------------------


@ACTIONS.effect
def record_clean_replay(context: GateContext, event: RecipeVerdicts) -> EffectOutcome:
    new = context.replace(
        covered=_add_recipe(context.config, context.covered, event.recipe),
        replays=_add_replay(context.config, context.replays, Replay(event.recipe, event.step, event.verdicts)),
        last_step=max(context.last_step, event.step),
    )
    return _persisted(context, new, ())


@ACTIONS.effect
def mark_unchecked(context: GateContext, event: RecipeVerdicts) -> EffectOutcome:
    # GATE-5: the cycle can no longer certify, so its replay list is dropped; nothing else moves.
    new = context.replace(
        covered=_add_recipe(context.config, context.covered, event.recipe),
        unchecked=_add_recipe(context.config, context.unchecked, event.recipe),
        replays=(),
        last_step=max(context.last_step, event.step),
    )
    return new, (Persist(), _unchecked_report(event))


@ACTIONS.effect
def record_coverage(context: GateContext, event: RecipeVerdicts) -> EffectOutcome:
    report: tuple[GateReport, ...] = ()
    unchecked_recipes = context.unchecked
    if event.result_class is ResultClass.UNCHECKED:
        report = (_unchecked_report(event),)
        unchecked_recipes = _add_recipe(context.config, unchecked_recipes, event.recipe)
    new = context.replace(
        covered=_add_recipe(context.config, context.covered, event.recipe),
        unchecked=unchecked_recipes,
        last_step=max(context.last_step, event.step),
    )
    return _persisted(context, new, report)


@ACTIONS.effect
def quarantine_job_wide(context: GateContext, event: RecipeVerdicts) -> EffectOutcome:
    # GATE-4: any unverified restorable checkpoint may hold the corrupted state -- and after the
    # gradient all-reduce the corruption may sit in every replica, where no vote can see it.
    sdc = _sdc_record(event)
    reason = f"quarantined: {sdc.describe()}"
    changes: dict[CheckpointId, tuple[Trust, str, Certificate | None, CycleRecord | None]] = {
        entry.id: (Trust.QUARANTINED, reason, None, None)
        for entry in context.checkpoints
        if entry.trust in UNVERIFIED_RESTORABLE
    }
    entries, trust_changes = _retrust(context, changes)
    new = context.replace(
        checkpoints=entries,
        covered=_add_recipe(context.config, context.covered, event.recipe),
        replays=(),
        previous_clean=None,
        last_step=max(context.last_step, event.step),
        sdc=sdc,
    )
    return new, (Persist(), *trust_changes, _sdc_report(event, trust_changes))


@ACTIONS.effect
def report_after_sdc(context: GateContext, event: RecipeVerdicts) -> EffectOutcome:
    # Already TAINTED: nothing restorable is unverified, but every SDC and every unchecked
    # replay is still reported, each under its own kind (GATE-4, GATE-5).
    report: tuple[GateReport, ...] = ()
    if event.result_class is ResultClass.SDC:
        report = (_sdc_report(event, ()),)
    elif event.result_class is ResultClass.UNCHECKED:
        report = (_unchecked_report(event),)
    new = context.replace( last_step=max(context.last_step, event.step))
    return _persisted(context, new, report)


# ------------------------------------------------------------------------------------------
# Effects: captures
# ------------------------------------------------------------------------------------------


@ACTIONS.effect
def record_capture(context: GateContext, event: CheckpointCaptured) -> EffectOutcome:
    checkpoint = CheckpointId(context.timeline, event.step)
    before = context.previous_clean
    if before is not None and context.cycle_start_step == event.step:
        # GATE-6: the complete clean cycle before the capture is on record.
        trust = Trust.CANDIDATE
        reason = (
            f"candidate: captured at the end of complete clean cycle {before.cycle}; verified if "
            f"cycle {before.cycle + 1} completes clean"
        )
    else:
        trust, before = Trust.CAPTURED, None
        if context.cycle_start_step is None:
            reason = "captured while no replay cycle was open"
        elif context.cycle_start_step == event.step:
            reason = f"captured at the start of cycle {context.cycle}; the cycle before was not complete and clean"
        else:
            reason = f"captured inside cycle {context.cycle}, not at a cycle boundary"
    new = context.replace(
        checkpoints=(*context.checkpoints, CheckpointEntry(checkpoint, trust, reason, before, None, event.artifact)),
        last_step=max(context.last_step, event.step),
        last_capture_step=event.step,
    )
    return new, (Persist(), TrustChange(checkpoint, None, trust, reason))


@ACTIONS.effect
def quarantine_capture(context: GateContext, event: CheckpointCaptured) -> EffectOutcome:
    checkpoint = CheckpointId(context.timeline, event.step)
    sdc = context.sdc
    cause = sdc.describe() if sdc is not None else "an SDC"
    reason = f"quarantined at capture: taken after {cause}, before any restart"
    new = context.replace(
        checkpoints=(*context.checkpoints, CheckpointEntry(checkpoint, Trust.QUARANTINED, reason, None, None,
                                                           event.artifact)),
        last_step=max(context.last_step, event.step),
        last_capture_step=event.step,
    )
    return new, (Persist(), TrustChange(checkpoint, None, Trust.QUARANTINED, reason))


# ------------------------------------------------------------------------------------------
# Effects: cycle boundaries
# ------------------------------------------------------------------------------------------


@ACTIONS.effect
def open_cycle(context: GateContext, event: CycleBoundary) -> EffectOutcome:
    # After start or restart there is no cycle before this one, so nothing can become candidate.
    return _open_next_cycle(context, event.step, None), (Persist(),)


@ACTIONS.effect
def close_clean_cycle(context: GateContext, event: CycleBoundary) -> EffectOutcome:
    assert context.cycle_start_step is not None
    closing = CycleRecord(context.cycle, context.cycle_start_step, event.step, context.replays)
    changes: dict[CheckpointId, tuple[Trust, str, Certificate | None, CycleRecord | None]] = {}
    candidate = context.candidate
    if candidate is not None and candidate.before is not None:
        # GATE-1, GATE-10: the cycle before the capture and this one, both complete and clean.
        certificate = Certificate(
            candidate.id,
            context.config.recipe_ids,
            context.config.groups,
            candidate.before,
            closing,
            event.step,
        )
        reason = (
            f"recovery-verified at step {event.step}: cycles {candidate.before.cycle} and "
            f"{closing.cycle} complete and clean"
        )
        changes[candidate.id] = (Trust.RECOVERY_VERIFIED, reason, certificate, None)
    at_boundary = context.entry(CheckpointId(context.timeline, event.step))
    if at_boundary is not None and at_boundary.trust is Trust.CAPTURED:
        # Captured at this step just before the boundary was announced: it is the boundary's.
        reason = (
            f"candidate: captured at the end of complete clean cycle {closing.cycle}; verified if "
            f"cycle {closing.cycle + 1} completes clean"
        )
        changes[at_boundary.id] = (Trust.CANDIDATE, reason, None, closing)
    entries, trust_changes = _retrust(context, changes)
    new = _open_next_cycle(context.replace( checkpoints=entries), event.step, closing)
    return new, (Persist(), *trust_changes)


@ACTIONS.effect
def close_unclean_cycle(context: GateContext, event: CycleBoundary) -> EffectOutcome:
    missing = tuple(r for r in context.config.recipe_ids if r not in context.covered)
    problems = []
    if missing:
        problems.append(f"no result for {', '.join(missing)}")
    if context.unchecked:
        problems.append(f"unchecked results for {', '.join(context.unchecked)}")
    summary = "; ".join(problems)
    changes: dict[CheckpointId, tuple[Trust, str, Certificate | None, CycleRecord | None]] = {}
    candidate = context.candidate
    if candidate is not None:
        changes[candidate.id] = (
            Trust.CAPTURED,
            f"not verified: cycle {context.cycle} after its capture was not complete and clean ({summary})",
            None,
            None,
        )
    entries, trust_changes = _retrust(context, changes)
    reports: tuple[GateReport, ...] = ()
    if missing:
        reports = (
            GateReport(
                GateReportKind.UNCHECKED,
                context.cycle,
                event.step,
                missing,
                (),
                f"cycle {context.cycle} closed at step {event.step} without results for recipe(s) "
                f"{', '.join(missing)}: unchecked, not SDC; no checkpoint is promoted",
            ),
        )
    new = _open_next_cycle(context.replace( checkpoints=entries), event.step, None)
    return new, (Persist(), *trust_changes, *reports)


@ACTIONS.effect
def advance_tainted_cycle(context: GateContext, event: CycleBoundary) -> EffectOutcome:
    # TAINTED until a restart: cycles keep their numbers, nothing is nominated or promoted.
    return _open_next_cycle(context, event.step, None), (Persist(),)


# ------------------------------------------------------------------------------------------
# Effects: restart
# ------------------------------------------------------------------------------------------


@ACTIONS.effect
def restart(context: GateContext, event: Restart) -> EffectOutcome:
    restored = event.step
    changes: dict[CheckpointId, tuple[Trust, str, Certificate | None, CycleRecord | None]] = {}
    where = "initialization" if restored is None else f"step {restored}"
    for entry in context.checkpoints:
        if entry.trust not in UNVERIFIED_RESTORABLE:
            continue
        if restored is None or entry.id.step > restored:
            changes[entry.id] = (
                Trust.SUPERSEDED,
                f"superseded: the job restarted from {where} (timeline {context.timeline + 1}); this "
                "state belongs to the abandoned run",
                None,
                None,
            )
        elif entry.trust is Trust.CANDIDATE:
            changes[entry.id] = (
                Trust.CAPTURED,
                f"not verified: the cycle after its capture was interrupted by a restart from {where}",
                None,
                None,
            )
    entries, trust_changes = _retrust(context, changes)
    new = context.replace(
        checkpoints=entries,
        timeline=context.timeline + 1,
        cycle_start_step=None,
        covered=(),
        unchecked=(),
        replays=(),
        previous_clean=None,
        last_step=0 if restored is None else restored,
        last_capture_step=restored,
        sdc=None,
        restart_cause=event.cause,
    )
    return new, (Persist(), *trust_changes)


# ------------------------------------------------------------------------------------------
# Effects: a lost checkpoint
# ------------------------------------------------------------------------------------------


@ACTIONS.effect
def mark_lost(context: GateContext, event: CheckpointLost) -> EffectOutcome:
    # GATE-42: the files are gone, so the checkpoint leaves what a restart may name. It drops its
    # certificate (GATE-8: only verified entries carry one; the trust log keeps the promotion),
    # and nothing else moves: the open cycle, the taint and the other entries are as they were.
    entry = context.entry(event.checkpoint)
    assert entry is not None
    reason = (f"lost: {event.detail or 'no complete checkpoint where it was saved'} (was {entry.trust.value}); "
              "never restored")
    entries, trust_changes = _retrust(context, {entry.id: (Trust.LOST, reason, None, None)})
    return context.replace(checkpoints=entries), (Persist(), *trust_changes)


# ------------------------------------------------------------------------------------------
# Invariant predicates (spec/gate.toml [[invariant]])
# ------------------------------------------------------------------------------------------


def _trust_changes(effects: tuple[object, ...]) -> list[TrustChange]:
    return [effect for effect in effects if isinstance(effect, TrustChange)]


def _reports(effects: tuple[object, ...], kind: GateReportKind) -> list[GateReport]:
    return [effect for effect in effects if isinstance(effect, GateReport) and effect.kind is kind]


def _trust_by_id(state: GateMachineState) -> dict[CheckpointId, Trust]:
    return {entry.id: entry.trust for entry in state.context.checkpoints}


@ACTIONS.predicate
def promotion_needs_two_clean_cycles(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-1."""
    before_trust = _trust_by_id(previous)
    promoted = {c.checkpoint for c in _trust_changes(effects) if c.after is Trust.RECOVERY_VERIFIED}
    for entry in state.context.checkpoints:
        newly = entry.trust is Trust.RECOVERY_VERIFIED and before_trust.get(entry.id) is not Trust.RECOVERY_VERIFIED
        if newly and entry.id not in promoted:
            return False  # verified without a promotion effect
    if not promoted:
        return True
    context = previous.context
    if not (
        isinstance(event, CycleBoundary)
        and previous.control is CHECKING
        and context.cycle_complete
        and not context.unchecked
        and context.sdc is None
        and context.cycle_start_step is not None
    ):
        return False
    after = CycleRecord(context.cycle, context.cycle_start_step, event.step, context.replays)
    if not is_complete_and_clean(context.config, after):
        return False
    for change in _trust_changes(effects):
        if change.after is not Trust.RECOVERY_VERIFIED:
            continue
        old = context.entry(change.checkpoint)
        certificate = change.certificate
        if old is None or old.trust is not Trust.CANDIDATE or old.before is None or certificate is None:
            return False
        if change.checkpoint != CheckpointId(context.timeline, context.cycle_start_step):
            return False
        if certificate.after != after or certificate.before != old.before:
            return False
        if old.before.end_step != change.checkpoint.step or old.before.cycle != after.cycle - 1:
            return False
        if not is_complete_and_clean(context.config, old.before):
            return False
    return True


@ACTIONS.predicate
def quarantine_is_absorbing(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-2 (QUARANTINED, SUPERSEDED and LOST are terminal; entries are never forgotten)."""
    now = _trust_by_id(state)
    for checkpoint, trust in _trust_by_id(previous).items():
        if checkpoint not in now:
            return False
        if trust in ABSORBING and now[checkpoint] is not trust:
            return False
    return all(c.before not in ABSORBING for c in _trust_changes(effects))


@ACTIONS.predicate
def verified_steps_only_increase(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-3 (and a certificate, once issued, never changes); a lose event (GATE-42) is the one
    way out of RECOVERY_VERIFIED, for the checkpoint it names."""
    now = {entry.id: entry for entry in state.context.checkpoints}
    lost = event.checkpoint if isinstance(event, CheckpointLost) else None
    for entry in previous.context.checkpoints:
        if entry.trust is not Trust.RECOVERY_VERIFIED:
            continue
        later = now.get(entry.id)
        if later is not None and entry.id == lost and later.trust is Trust.LOST:
            continue
        if later is None or later.trust is not Trust.RECOVERY_VERIFIED or later.certificate != entry.certificate:
            return False
    old_step = previous.context.verified_step
    new_step = state.context.verified_step
    decreased = old_step is not None and (new_step is None or new_step < old_step)
    if decreased and (lost is None or lost.step != old_step):
        return False
    return all(
        old_step is None or c.checkpoint.step > old_step
        for c in _trust_changes(effects)
        if c.after is Trust.RECOVERY_VERIFIED
    )


@ACTIONS.predicate
def sdc_quarantines_job_wide(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-4."""
    quarantines = [c for c in _trust_changes(effects) if c.after is Trust.QUARANTINED]
    is_sdc = isinstance(event, RecipeVerdicts) and event.result_class is ResultClass.SDC
    if not is_sdc:
        # Only an SDC, or a capture while TAINTED, quarantines.
        capture_while_tainted = isinstance(event, CheckpointCaptured) and previous.control is TAINTED
        return not quarantines or (capture_while_tainted and len(quarantines) == 1)
    assert isinstance(event, RecipeVerdicts)
    if state.control is not TAINTED or state.context.sdc is None:
        return False
    if any(entry.trust in UNVERIFIED_RESTORABLE for entry in state.context.checkpoints):
        return False
    expected = {e.id for e in previous.context.checkpoints if e.trust in UNVERIFIED_RESTORABLE}
    if {c.checkpoint for c in quarantines} != expected:
        return False
    sdc_reports = _reports(effects, GateReportKind.SDC)
    attributing = tuple(v.group for v in event.verdicts if v.outcome is Outcome.ATTRIBUTED)
    return len(sdc_reports) == 1 and sdc_reports[0].groups == attributing and not _reports(effects, GateReportKind.UNCHECKED)


@ACTIONS.predicate
def unchecked_is_not_sdc(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-5."""
    if not (isinstance(event, RecipeVerdicts) and event.result_class is ResultClass.UNCHECKED):
        # No other event reports SDC.
        return not _reports(effects, GateReportKind.SDC) or (
            isinstance(event, RecipeVerdicts) and event.result_class is ResultClass.SDC
        )
    if _trust_changes(effects) or _reports(effects, GateReportKind.SDC):
        return False
    if state.control is TAINTED and previous.control is not TAINTED:
        return False
    if state.context.replays:
        return False  # the cycle keeps no certifiable replay list once unchecked
    reports = _reports(effects, GateReportKind.UNCHECKED)
    silent = tuple(v.group for v in event.verdicts if v.outcome in _UNCHECKED_OUTCOMES)
    return len(reports) == 1 and reports[0].groups == silent


@ACTIONS.predicate
def one_candidate_with_clean_cycle_before(state: GateMachineState) -> bool:
    """GATE-6."""
    context = state.context
    candidates = [entry for entry in context.checkpoints if entry.trust is Trust.CANDIDATE]
    if not candidates:
        return True
    if len(candidates) > 1 or state.control not in OPEN_CLEAN_OR_UNCLEAN:
        return False
    candidate = candidates[0]
    before = candidate.before
    return (
        candidate.id.timeline == context.timeline
        and context.cycle_start_step == candidate.id.step
        and before is not None
        and before == context.previous_clean
        and before.end_step == candidate.id.step
        and before.cycle == context.cycle - 1
        and is_complete_and_clean(context.config, before)
        and candidate.certificate is None
    )


@ACTIONS.predicate
def tainted_leaves_only_verified_restorable(state: GateMachineState) -> bool:
    """GATE-7."""
    if (state.control is TAINTED) != (state.context.sdc is not None):
        return False
    if state.control is not TAINTED:
        return True
    return not any(entry.trust in UNVERIFIED_RESTORABLE for entry in state.context.checkpoints)


@ACTIONS.predicate
def certificates_claim_only_clean_complete_cycles(state: GateMachineState) -> bool:
    """GATE-8."""
    config = state.context.config
    for entry in state.context.checkpoints:
        certificate = entry.certificate
        if entry.trust is not Trust.RECOVERY_VERIFIED:
            if certificate is not None:
                return False
            continue
        if certificate is None or certificate.checkpoint != entry.id:
            return False
        before, after = certificate.before, certificate.after
        if not (
            is_complete_and_clean(config, before)
            and is_complete_and_clean(config, after)
            and before.end_step == entry.id.step == after.start_step
            and after.cycle == before.cycle + 1
            and certificate.promoted_at_step == after.end_step
            and certificate.recipes == config.recipe_ids
            and certificate.groups == config.groups
        ):
            return False
    return True


@ACTIONS.predicate
def state_changes_are_persisted_first(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-9."""
    persists = sum(isinstance(effect, Persist) for effect in effects)
    if previous == state:
        return persists == 0
    return persists == 1 and isinstance(effects[0], Persist)


@ACTIONS.predicate
def clean_cycles_promote(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-10: progress, the liveness half of the gate."""
    context = previous.context
    if not (isinstance(event, CycleBoundary) and previous.control is CHECKING and context.cycle_complete):
        return True
    now = _trust_by_id(state)
    candidate = context.candidate
    if candidate is not None and now.get(candidate.id) is not Trust.RECOVERY_VERIFIED:
        return False
    at_boundary = context.entry(CheckpointId(context.timeline, event.step))
    return at_boundary is None or at_boundary.trust is not Trust.CAPTURED or now[at_boundary.id] is Trust.CANDIDATE


@ACTIONS.predicate
def promotion_happens(previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]) -> bool:
    """GATE-11 (witness)."""
    return any(c.after is Trust.RECOVERY_VERIFIED for c in _trust_changes(effects))


@ACTIONS.predicate
def sdc_quarantines_a_candidate(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-12 (witness)."""
    return any(c.before is Trust.CANDIDATE and c.after is Trust.QUARANTINED for c in _trust_changes(effects))


@ACTIONS.predicate
def unchecked_cycle_blocks_promotion(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-13 (witness)."""
    return (
        isinstance(event, CycleBoundary)
        and previous.control is UNCLEAN
        and any(c.before is Trust.CANDIDATE and c.after is Trust.CAPTURED for c in _trust_changes(effects))
    )


@ACTIONS.predicate
def restart_abandons_newer_checkpoints(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-14 (witness): something superseded, and only checkpoints newer than the one restored."""
    if not isinstance(event, Restart):
        return False
    superseded = [c.checkpoint.step for c in _trust_changes(effects) if c.after is Trust.SUPERSEDED]
    return bool(superseded) and (event.step is None or all(step > event.step for step in superseded))


@ACTIONS.predicate
def verified_checkpoint_survives_sdc(state: GateMachineState) -> bool:
    """GATE-15 (witness): after an SDC a verified checkpoint is still there to restore."""
    return state.control is TAINTED and any(e.trust is Trust.RECOVERY_VERIFIED for e in state.context.checkpoints)


@ACTIONS.predicate
def capture_is_classified_at_once(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-17 (and GATE-1's "a capture at the boundary's step, after the boundary event,
    belongs to that boundary")."""
    if not isinstance(event, CheckpointCaptured):
        return True
    before, after = previous.context, state.context
    if len(after.checkpoints) != len(before.checkpoints) + 1 or after.checkpoints[:-1] != before.checkpoints:
        return False
    entry = after.checkpoints[-1]
    if entry.id != CheckpointId(before.timeline, event.step) or entry.certificate is not None:
        return False
    if entry.artifact != event.artifact:  # FRAME-6: the entry names the framework's checkpoint
        return False
    if previous.control is TAINTED:
        return entry.trust is Trust.QUARANTINED and entry.before is None
    if before.previous_clean is not None and before.cycle_start_step == event.step:
        return entry.trust is Trust.CANDIDATE and entry.before == before.previous_clean
    return entry.trust is Trust.CAPTURED and entry.before is None


@ACTIONS.predicate
def restart_supersedes_only_newer_unverified(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-18: the restart rule of spec/gate.md, entry by entry."""
    if not isinstance(event, Restart):
        return True
    before, after = previous.context, state.context
    if not (
        state.control is IDLE
        and after.timeline == before.timeline + 1
        and after.sdc is None
        and after.previous_clean is None
        and after.cycle_start_step is None
    ):
        return False
    if [entry.id for entry in after.checkpoints] != [entry.id for entry in before.checkpoints]:
        return False
    for old, new in zip(before.checkpoints, after.checkpoints, strict=True):
        if old.trust in UNVERIFIED_RESTORABLE and (event.step is None or old.id.step > event.step):
            expected = Trust.SUPERSEDED
        elif old.trust is Trust.CANDIDATE:
            expected = Trust.CAPTURED
        else:
            expected = old.trust
        if new.trust is not expected:
            return False
        if expected is old.trust and new != old:
            return False  # an untouched entry keeps its record and certificate too
    return True


@ACTIONS.predicate
def missing_recipes_are_reported_at_the_boundary(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-19 (GATE-5: "a cycle that closes without a result for some recipe is reported
    unchecked with the missing recipes")."""
    if not (isinstance(event, CycleBoundary) and previous.control in OPEN_CLEAN_OR_UNCLEAN):
        return True
    context = previous.context
    missing = tuple(recipe for recipe in context.config.recipe_ids if recipe not in context.covered)
    if _reports(effects, GateReportKind.SDC):
        return False
    reports = _reports(effects, GateReportKind.UNCHECKED)
    if not missing:
        return not reports
    return (
        len(reports) == 1
        and reports[0].recipes == missing
        and reports[0].groups == ()
        and reports[0].cycle == context.cycle
        and reports[0].step == event.step
    )


@ACTIONS.predicate
def every_trust_transition_is_announced(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-20: the TrustChange effects are exactly the trust-transition log of the step."""
    old_trust = _trust_by_id(previous)
    expected = [
        (entry.id, old_trust.get(entry.id), entry.trust, entry.certificate)
        for entry in state.context.checkpoints
        if old_trust.get(entry.id) is not entry.trust
    ]
    announced = [(c.checkpoint, c.before, c.after, c.certificate) for c in _trust_changes(effects)]
    return announced == expected


@ACTIONS.predicate
def only_a_restart_clears_the_taint(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-21."""
    return previous.control is not TAINTED or state.control is TAINTED or isinstance(event, Restart)


def restorable(context: GateContext) -> tuple[CheckpointEntry, ...]:
    """Entries a restart may name, oldest first."""
    return tuple(entry for entry in context.checkpoints if entry.trust in RESTORABLE)


@ACTIONS.predicate
def common_mode_result_taints(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-40: a result whose every group verdict is ATTRIBUTED (common mode, CANARY-5)
    leaves the gate TAINTED and promotes nothing."""
    if not isinstance(event, RecipeVerdicts) or not event.verdicts:
        return True
    if any(verdict.outcome is not Outcome.ATTRIBUTED for verdict in event.verdicts):
        return True
    if previous.control is not TAINTED and state.control is not TAINTED:
        return False
    return not any(c.after is Trust.RECOVERY_VERIFIED for c in _trust_changes(effects))


@ACTIONS.predicate
def a_loss_takes_only_the_lost_checkpoint(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-42."""
    changes = _trust_changes(effects)
    if not isinstance(event, CheckpointLost):
        return all(change.after is not Trust.LOST for change in changes)
    if state.control is not previous.control or len(changes) != 1 or len(effects) != 2:
        return False
    change = changes[0]
    old = previous.context.entry(event.checkpoint)
    if old is None or change.checkpoint != event.checkpoint or change.before is not old.trust:
        return False
    if change.after is not Trust.LOST or change.certificate is not None:
        return False
    expected = tuple(
        CheckpointEntry(entry.id, Trust.LOST, change.reason, None, None, entry.artifact)
        if entry.id == event.checkpoint else entry
        for entry in previous.context.checkpoints
    )
    return state.context == previous.context.replace(checkpoints=expected)


@ACTIONS.predicate
def a_verified_checkpoint_is_lost(
    previous: GateMachineState, event: object, state: GateMachineState, effects: tuple[object, ...]
) -> bool:
    """GATE-43 (witness): the newest verified checkpoint is lost."""
    old_step = previous.context.verified_step
    return isinstance(event, CheckpointLost) and old_step is not None and event.checkpoint.step == old_step
