"""The checkpoint gate's entry point: validate an event, then step the machine of ``spec/gate.toml``.

``step(state, event) -> (state, effects)`` is pure. Bad input -- an unknown recipe, a result for
a cycle that has ended or not begun, a second capture for one step, steps going backwards, a
restart to a checkpoint that is not restorable -- raises :class:`GateInputError` naming the value
and what to do; the caller's state is untouched because states are immutable (GATE-16).

:class:`scout.gate.recorder.GateWriter` is the driver's holder: it keeps the state and replaces it
only when a step succeeds and its state is committed.
"""

from __future__ import annotations

from scout.core import invariants
from scout.core.failure import FailureClass
from scout.core.machine import Machine, MachineState, packaged_machine
from scout.gate.model import (
    ABSORBING,
    RESTORABLE,
    STEP_MAX,
    CheckpointCaptured,
    CheckpointId,
    CheckpointLost,
    CycleBoundary,
    GateConfig,
    GateContext,
    GateEffect,
    GateEvent,
    GateReport,
    GroupVerdict,
    Outcome,
    Persist,
    RecipeVerdicts,
    Restart,
    Trust,
    TrustChange,
    is_counter,
)

__all__ = ["GateInputError", "check_event", "gate_effects", "gate_machine", "initial_state", "step"]

GateMachineState = MachineState[GateContext]


class GateInputError(ValueError):
    """An event the gate must refuse; the state is unchanged (GATE-16)."""


def gate_machine() -> Machine[GateContext]:
    """The machine of ``spec/gate.toml`` (its packaged copy, built once per process)."""
    machine: Machine[GateContext] = packaged_machine("gate")
    return machine


def initial_state(config: GateConfig) -> GateMachineState:
    return gate_machine().initial_state(GateContext(config))


def _check_result(state: GateMachineState, event: RecipeVerdicts) -> None:
    context = state.context
    config = context.config
    if not isinstance(event.recipe, str) or event.recipe not in config.recipe_ids:
        raise GateInputError(
            f"unknown recipe id {event.recipe!r}: the catalog of job {config.job_id!r} is "
            f"{list(config.recipe_ids)}; check the scheduler's catalog against the gate's"
        )
    if not is_counter(event.step) or not is_counter(event.cycle):
        raise GateInputError(f"result for recipe {event.recipe!r}: step {event.step!r} and cycle {event.cycle!r} "
                             f"must be ints in 0..{STEP_MAX} (GATE-35)")
    if context.cycle_start_step is None:
        raise GateInputError(
            f"result for recipe {event.recipe!r} in cycle {event.cycle}: no cycle is open (the gate is "
            f"{state.control} in timeline {context.timeline}; the last cycle, {context.cycle}, has ended). "
            "Results from before a restart are void; send a cycle boundary first"
        )
    if event.cycle < context.cycle:
        raise GateInputError(
            f"result for recipe {event.recipe!r} in cycle {event.cycle}, which has ended: the open cycle is "
            f"{context.cycle} (started at step {context.cycle_start_step}); late results cannot change a closed cycle"
        )
    if event.cycle > context.cycle:
        raise GateInputError(
            f"result for recipe {event.recipe!r} in cycle {event.cycle}, which has not begun: the open cycle "
            f"is {context.cycle}; send its boundary first"
        )
    if event.step < context.cycle_start_step:
        raise GateInputError(
            f"result for recipe {event.recipe!r} at step {event.step}, before the open cycle {context.cycle} "
            f"began (step {context.cycle_start_step})"
        )
    if not isinstance(event.verdicts, tuple) or not all(isinstance(v, GroupVerdict) for v in event.verdicts):
        raise GateInputError(f"result for recipe {event.recipe!r}: verdicts must be a tuple of GroupVerdict")
    for verdict in event.verdicts:
        if not isinstance(verdict.outcome, Outcome):
            raise GateInputError(f"result for recipe {event.recipe!r}: group {verdict.group!r} has outcome "
                                 f"{verdict.outcome!r}; outcomes are scout.gate.model.Outcome members (GATE-35)")
    given = tuple(verdict.group for verdict in event.verdicts)
    wanted = config.groups_of(event.recipe)
    if given != wanted:
        raise GateInputError(
            f"result for recipe {event.recipe!r} carries verdicts for groups {list(given)}; it applies to "
            f"{list(wanted)}: give exactly one verdict per applicable group, in this order, with "
            "outcome MISSING for a group whose verdict did not arrive"
        )


def _check_capture(state: GateMachineState, event: CheckpointCaptured) -> None:
    context = state.context
    if not is_counter(event.step):
        raise GateInputError(f"capture step must be an int in 0..{STEP_MAX}, got {event.step!r} (GATE-35)")
    if context.last_capture_step is not None and event.step == context.last_capture_step:
        raise GateInputError(
            f"second capture for step {event.step} in timeline {context.timeline}: a step has one "
            "checkpoint; drop the duplicate capture event"
        )
    if context.last_capture_step is not None and event.step < context.last_capture_step:
        raise GateInputError(
            f"capture at step {event.step} is older than the last capture (step {context.last_capture_step}) "
            f"in timeline {context.timeline}; captures arrive in step order"
        )
    if event.step < context.last_step:
        raise GateInputError(
            f"capture at step {event.step} is behind step {context.last_step}, already seen in timeline "
            f"{context.timeline}; deliver events in step order"
        )


def _check_boundary(state: GateMachineState, event: CycleBoundary) -> None:
    context = state.context
    if not is_counter(event.step):
        raise GateInputError(f"boundary step must be an int in 0..{STEP_MAX}, got {event.step!r} (GATE-35)")
    if event.step < context.last_step:
        raise GateInputError(
            f"cycle boundary at step {event.step} is behind step {context.last_step}, already seen in "
            f"timeline {context.timeline}; deliver events in step order"
        )
    if context.cycle_start_step is not None and event.step <= context.cycle_start_step:
        raise GateInputError(
            f"cycle boundary at step {event.step} would close cycle {context.cycle}, which started at step "
            f"{context.cycle_start_step}, with no steps in it"
        )


def _check_restart(state: GateMachineState, event: Restart) -> None:
    context = state.context
    if not isinstance(event.cause, FailureClass):
        raise GateInputError(f"restart cause must be a scout.core.failure.FailureClass member, got {event.cause!r} "
                             "(GATE-35, GATE-36)")
    verified = context.verified
    if event.step is None:
        if verified is not None:
            raise GateInputError(
                f"restart from initialization would discard RECOVERY_VERIFIED checkpoint {verified.id}; "
                "restart from it, or start a new job id to begin afresh"
            )
        return
    if not is_counter(event.step):
        raise GateInputError(f"restart step must be an int in 0..{STEP_MAX} or None, got {event.step!r} (GATE-35)")
    matches = [entry for entry in context.checkpoints if entry.id.step == event.step]
    usable = [entry for entry in matches if entry.trust in RESTORABLE]
    if not usable:
        known = ", ".join(f"{e.id} {e.trust.value}" for e in matches) or "none at that step"
        restorable = ", ".join(str(e.id) for e in context.checkpoints if e.trust in RESTORABLE) or "none"
        raise GateInputError(
            f"restart from step {event.step}: no restorable checkpoint there ({known}); restorable "
            f"checkpoints: {restorable}. QUARANTINED, SUPERSEDED and LOST checkpoints are never restored"
        )
    if verified is not None and event.step < verified.id.step:
        raise GateInputError(
            f"restart from step {event.step} is older than RECOVERY_VERIFIED checkpoint {verified.id}; "
            "verified steps only increase (GATE-3): restart from the verified checkpoint or a newer one"
        )


def _check_lost(state: GateMachineState, event: CheckpointLost) -> None:
    context = state.context
    checkpoint = event.checkpoint
    if not isinstance(checkpoint, CheckpointId):
        raise GateInputError(f"a lost checkpoint is named by a CheckpointId, got {checkpoint!r} (GATE-35)")
    entry = context.entry(checkpoint)
    if entry is None:
        known = ", ".join(str(e.id) for e in context.checkpoints) or "none"
        raise GateInputError(f"checkpoint {checkpoint} cannot be lost: the gate does not know it (its checkpoints: "
                             f"{known}); name a checkpoint the manifest records")
    if entry.trust not in RESTORABLE:
        raise GateInputError(f"checkpoint {checkpoint} is {entry.trust.value}, never restored, so it cannot be lost: "
                             "only a restorable checkpoint is marked LOST (GATE-42)")


def check_event(state: GateMachineState, event: object) -> None:
    """Raise :class:`GateInputError` if the gate must refuse ``event`` in ``state``."""
    if isinstance(event, RecipeVerdicts):
        _check_result(state, event)
    elif isinstance(event, CheckpointCaptured):
        _check_capture(state, event)
    elif isinstance(event, CycleBoundary):
        _check_boundary(state, event)
    elif isinstance(event, Restart):
        _check_restart(state, event)
    elif isinstance(event, CheckpointLost):
        _check_lost(state, event)
    else:
        raise GateInputError(
            f"not a gate event: {event!r}; send RecipeVerdicts, CheckpointCaptured, CycleBoundary, Restart or "
            "CheckpointLost"
        )


def step(state: GateMachineState, event: GateEvent) -> tuple[GateMachineState, tuple[GateEffect, ...]]:
    """Validate ``event`` and step the gate. Pure; raises :class:`GateInputError` on bad input."""
    check_event(state, event)
    new, effects = gate_machine().step(state, event)
    checked = gate_effects(effects)
    if invariants.ENABLED:
        _check_step(state, event, new, checked)
    return new, checked


def _check_step(old: GateMachineState, event: GateEvent, new: GateMachineState,
                effects: tuple[GateEffect, ...]) -> None:
    """GATE-9, GATE-2 and GATE-3 at run time (scout.core.invariants): one pass over the effects,
    and the old verified step only when the step promoted. A step that persists nothing must keep
    the state itself (the machine returns the same context object when nothing changed). Only a
    loss (GATE-42) takes a checkpoint out of RECOVERY_VERIFIED, and only into LOST."""
    persisted = bool(effects) and type(effects[0]) is Persist
    if not persisted and (new.control != old.control or new.context is not old.context):
        raise invariants.violated("GATE-9/persist", f"{old.control} -> {new.control} without Persist")
    promoted = None
    lost = type(event) is CheckpointLost
    for effect in effects[1:]:
        if isinstance(effect, Persist):
            raise invariants.violated("GATE-9/persist", f"a second Persist in {[type(e).__name__ for e in effects]}")
        if isinstance(effect, TrustChange):
            if effect.before in ABSORBING:
                raise invariants.violated("GATE-2/absorbing", f"{effect.checkpoint}: {effect.before} -> {effect.after}")
            if effect.before is Trust.RECOVERY_VERIFIED and not (effect.after is Trust.LOST and lost):
                raise invariants.violated("GATE-3/monotone", f"{effect.checkpoint} left RECOVERY_VERIFIED for "
                                          f"{effect.after}")
            if effect.after is Trust.RECOVERY_VERIFIED:
                promoted = effect.checkpoint.step
    if promoted is not None:
        verified = old.context.verified_step
        if verified is not None and promoted <= verified:
            raise invariants.violated("GATE-3/monotone", f"promoted step {promoted}, verified already {verified}")


def gate_effects(effects: tuple[object, ...]) -> tuple[GateEffect, ...]:
    """GATE-37 at run time: the effects are members of the closed union, or the step is a bug."""
    checked: list[GateEffect] = []
    for effect in effects:
        if not isinstance(effect, (Persist, TrustChange, GateReport)):
            raise TypeError(f"the gate emitted {effect!r}, which is not a GateEffect (Persist, TrustChange, "
                            "GateReport; spec/gate.md GATE-37)")
        checked.append(effect)
    return tuple(checked)
