"""Guards, effects and invariant predicates of the straggler confirmation machine.

Table (normative): ``spec/straggler.toml``; prose, generated table and diagram:
``spec/straggler.md``; values: :mod:`scout.core.straggler.model`. Pure: no clock, no I/O.
"""

from __future__ import annotations

import attrs

from scout.core.machine import Actions
from scout.core.straggler.model import (
    CLEAR,
    CONFIRMED,
    SUSPECT,
    CleanRound,
    Confirmed,
    PeerContext,
    PeerOutcome,
    PeerState,
    Recovered,
    SlowRound,
    StragglerState,
    UndecidedRound,
)

__all__ = ["ACTIONS"]

ACTIONS = Actions(states=StragglerState)


# Guards --------------------------------------------------------------------------------------


@ACTIONS.guard
def reaches_confirmation(context: PeerContext, event: SlowRound) -> bool:
    """This slow round is the ``rounds_required``-th in a row."""
    return context.slow_rounds + 1 >= context.rounds_required


# Effects -------------------------------------------------------------------------------------


@ACTIONS.effect
def count_slow_round(context: PeerContext, event: SlowRound) -> PeerOutcome:
    return attrs.evolve(context, slow_rounds=context.slow_rounds + 1), ()


@ACTIONS.effect
def confirm(context: PeerContext, event: SlowRound) -> PeerOutcome:
    confirmed = attrs.evolve(context, slow_rounds=context.rounds_required)
    return confirmed, (Confirmed(context.peer, context.rounds_required),)


@ACTIONS.effect
def reset_count(context: PeerContext, event: CleanRound) -> PeerOutcome:
    return attrs.evolve(context, slow_rounds=0), ()


@ACTIONS.effect
def recover(context: PeerContext, event: CleanRound) -> PeerOutcome:
    return attrs.evolve(context, slow_rounds=0), (Recovered(context.peer),)


# Invariant predicates (spec/straggler.toml [[invariant]]) ------------------------------------


@ACTIONS.predicate
def count_matches_control(state: PeerState) -> bool:
    """STRAG-7."""
    count, required = state.context.slow_rounds, state.context.rounds_required
    if not 0 <= count <= required:
        return False
    if state.control is CLEAR:
        return count == 0
    if state.control is SUSPECT:
        return 0 < count < required
    return state.control is CONFIRMED and count == required


@ACTIONS.predicate
def slow_round_counts_up(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-8."""
    if not isinstance(event, SlowRound):
        return True
    before, required = previous.context.slow_rounds, previous.context.rounds_required
    return state.context.slow_rounds == min(before + 1, required)


@ACTIONS.predicate
def clean_round_resets(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-9."""
    if not isinstance(event, CleanRound):
        return True
    return state.control is CLEAR and state.context.slow_rounds == 0


@ACTIONS.predicate
def undecided_round_changes_nothing(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-10."""
    if not isinstance(event, UndecidedRound):
        return True
    return state == previous and effects == ()


@ACTIONS.predicate
def one_report_per_change(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-11."""
    peer, required = previous.context.peer, previous.context.rounds_required
    entered = previous.control is not CONFIRMED and state.control is CONFIRMED
    left = previous.control is CONFIRMED and state.control is not CONFIRMED
    expected: tuple[object, ...] = ()
    if entered:
        expected = (Confirmed(peer, required),)
    elif left:
        expected = (Recovered(peer),)
    return effects == expected


@ACTIONS.predicate
def straggler_confirmed(state: PeerState) -> bool:
    """STRAG-12 (witness)."""
    return state.control is CONFIRMED


@ACTIONS.predicate
def confirmed_straggler_recovers(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-13 (witness)."""
    return previous.control is CONFIRMED and state.control is CLEAR


@ACTIONS.predicate
def confirmation_held_through_undecided(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-14 (witness)."""
    return previous.control is CONFIRMED and isinstance(event, UndecidedRound)


@ACTIONS.predicate
def suspicion_reset_by_clean_round(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-15 (witness)."""
    return previous.control is SUSPECT and isinstance(event, CleanRound)
