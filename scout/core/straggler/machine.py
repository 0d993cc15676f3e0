"""Guards, effects and invariant predicates of the straggler confirmation machine.

Table (normative): ``spec/straggler.toml``; prose, generated table and diagram:
``spec/straggler.md``; values: :mod:`scout.core.straggler.model`. Pure: no clock, no I/O.

The arithmetic of the sequential test lives in :func:`next_score` and :func:`next_recovery`;
guards, effects and the composition over a group (``room``, STRAG-14) all use these two, so
the test is written once.
"""

from __future__ import annotations

import attrs

from scout.core.machine import Actions
from scout.core.straggler.model import (
    CLEAR,
    CONFIRMED,
    SUSPECT,
    Check,
    Confirmed,
    NoEvidence,
    PeerContext,
    PeerOutcome,
    PeerState,
    Recovered,
    StragglerState,
)

__all__ = ["ACTIONS", "next_recovery", "next_score", "reaches_bound"]

ACTIONS = Actions(states=StragglerState)


def next_score(context: PeerContext, units: int) -> int:
    """STRAG-8: the confirmation CUSUM, ``min(h, max(0, S + clip(x) - k))``."""
    bounds = context.bounds
    moved = context.score + bounds.clipped(units) - bounds.allowance
    return min(bounds.confirm_bound, max(0, moved))


def next_recovery(context: PeerContext, units: int) -> int:
    """STRAG-9: the recovery CUSUM, ``max(0, R + k_r - clip(x))`` (not capped: reaching
    ``h_r`` recovers)."""
    bounds = context.bounds
    return max(0, context.recovery + bounds.recovery_allowance - bounds.clipped(units))


def reaches_bound(context: PeerContext, units: int) -> bool:
    """This check would bring the confirmation score to its bound (room aside)."""
    return next_score(context, units) >= context.bounds.confirm_bound


def _counted(context: PeerContext) -> int:
    return min(context.bounds.checks_cap, context.checks + 1)


# Guards --------------------------------------------------------------------------------------


@ACTIONS.guard
def confirms(context: PeerContext, event: Check) -> bool:
    """The score reaches its bound and the group has room for one more straggler."""
    return event.room and reaches_bound(context, event.units)


@ACTIONS.guard
def suspects(context: PeerContext, event: Check) -> bool:
    """Evidence is held after this check, and it does not confirm."""
    return next_score(context, event.units) > 0 and not confirms(context, event)


@ACTIONS.guard
def clears(context: PeerContext, event: Check) -> bool:
    """No evidence is held after this check."""
    return next_score(context, event.units) == 0


@ACTIONS.guard
def recovers(context: PeerContext, event: Check) -> bool:
    return next_recovery(context, event.units) >= context.bounds.recovery_bound


# Effects -------------------------------------------------------------------------------------


@ACTIONS.effect
def accumulate(context: PeerContext, event: Check) -> PeerOutcome:
    score = next_score(context, event.units)
    return attrs.evolve(context, score=score, checks=_counted(context)), ()


@ACTIONS.effect
def confirm(context: PeerContext, event: Check) -> PeerOutcome:
    bound = context.bounds.confirm_bound
    confirmed = attrs.evolve(context, score=bound, recovery=0, checks=0)
    return confirmed, (Confirmed(context.peer, bound, _counted(context)),)


@ACTIONS.effect
def accumulate_recovery(context: PeerContext, event: Check) -> PeerOutcome:
    recovery = next_recovery(context, event.units)
    return attrs.evolve(context, recovery=recovery, checks=_counted(context)), ()


@ACTIONS.effect
def recover(context: PeerContext, event: Check) -> PeerOutcome:
    cleared = attrs.evolve(context, score=0, recovery=0, checks=0)
    return cleared, (Recovered(context.peer, _counted(context)),)


# Invariant predicates (spec/straggler.toml [[invariant]]) ------------------------------------


@ACTIONS.predicate
def score_matches_control(state: PeerState) -> bool:
    """STRAG-7."""
    context = state.context
    score, recovery, bound = context.score, context.recovery, context.bounds.confirm_bound
    if not (0 <= score <= bound and 0 <= context.checks <= context.bounds.checks_cap):
        return False
    if state.control is CLEAR:
        return score == 0 and recovery == 0
    if state.control is SUSPECT:
        return 0 < score <= bound and recovery == 0
    return (
        state.control is CONFIRMED
        and score == bound
        and 0 <= recovery < context.bounds.recovery_bound
    )


@ACTIONS.predicate
def confirmation_is_a_cusum(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-8, restated from the bounds rather than through :func:`next_score`."""
    if not isinstance(event, Check) or previous.control is CONFIRMED:
        return True
    bounds = previous.context.bounds
    x = max(-bounds.fast_clip, min(bounds.slow_clip, event.units))
    expected = min(bounds.confirm_bound, max(0, previous.context.score + x - bounds.allowance))
    return state.context.score == expected


@ACTIONS.predicate
def recovery_is_a_cusum(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-9, restated from the bounds."""
    if not isinstance(event, Check) or previous.control is not CONFIRMED:
        return True
    bounds = previous.context.bounds
    x = max(-bounds.fast_clip, min(bounds.slow_clip, event.units))
    moved = max(0, previous.context.recovery + bounds.recovery_allowance - x)
    if moved >= bounds.recovery_bound:
        return state.control is CLEAR
    return state.control is CONFIRMED and state.context.recovery == moved


@ACTIONS.predicate
def no_evidence_changes_nothing(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-10."""
    if not isinstance(event, NoEvidence):
        return True
    return state == previous and effects == ()


@ACTIONS.predicate
def one_report_per_change(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-11."""
    entered = previous.control is not CONFIRMED and state.control is CONFIRMED
    left = previous.control is CONFIRMED and state.control is not CONFIRMED
    kinds = [type(effect) for effect in effects]
    if entered:
        return kinds == [Confirmed] and effects[0].peer == previous.context.peer  # type: ignore[attr-defined]
    if left:
        return kinds == [Recovered] and effects[0].peer == previous.context.peer  # type: ignore[attr-defined]
    return effects == ()


@ACTIONS.predicate
def evidence_bound(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-12: a confirmation needs at least ``checks_to_confirm_min`` checks with evidence
    since the peer's last report, and a score at the bound."""
    if not any(isinstance(effect, Confirmed) for effect in effects):
        return True
    bounds = previous.context.bounds
    return (
        previous.context.checks + 1 >= bounds.checks_to_confirm_min
        and state.context.score == bounds.confirm_bound
    )


@ACTIONS.predicate
def recovery_bound(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-13: no flapping faster than the recovery bound -- a recovery needs at least
    ``checks_to_recover_min`` checks with evidence since the confirmation."""
    if not any(isinstance(effect, Recovered) for effect in effects):
        return True
    return previous.context.checks + 1 >= previous.context.bounds.checks_to_recover_min


@ACTIONS.predicate
def no_room_no_confirmation(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-14."""
    if isinstance(event, Check) and not event.room and previous.control is not CONFIRMED:
        return state.control is not CONFIRMED
    return True


@ACTIONS.predicate
def straggler_confirmed(state: PeerState) -> bool:
    """STRAG-15 (witness)."""
    return state.control is CONFIRMED


@ACTIONS.predicate
def confirmed_straggler_recovers(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-16 (witness)."""
    return previous.control is CONFIRMED and state.control is CLEAR


@ACTIONS.predicate
def confirmation_held_without_evidence(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-17 (witness)."""
    return previous.control is CONFIRMED and isinstance(event, NoEvidence)


@ACTIONS.predicate
def suspicion_dropped(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-18 (witness)."""
    return previous.control is SUSPECT and state.control is CLEAR


@ACTIONS.predicate
def held_at_bound_without_room(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-19 (witness)."""
    return (
        isinstance(event, Check)
        and not event.room
        and state.control is SUSPECT
        and state.context.score == state.context.bounds.confirm_bound
    )
