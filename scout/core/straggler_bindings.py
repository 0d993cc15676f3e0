"""Guards, effects and invariant predicates of the straggler confirmation machine.

Table (normative): ``spec/straggler.toml``; prose, generated table and diagram:
``spec/straggler.md``. One machine per peer of a replay group: it reads one event per timing
round -- the peer was named slow in a decided round, or not named in a decided round, or the
round was undecided (Inconclusive) -- and confirms the peer a straggler after
``rounds_required`` consecutive slow decided rounds (STRAG-2). :mod:`scout.core.straggler`
composes one machine per peer into the group's confirmation state.

Pure: no clock, no I/O. The context is a frozen attrs class, so the explorer deduplicates states.
"""

from __future__ import annotations

from typing import ClassVar, Final, TypeAlias

import attrs

from scout.core.machine import Bindings, MachineState

__all__ = [
    "BINDINGS",
    "CLEAN_ROUND",
    "CLEAR",
    "CONFIRMED",
    "CleanRound",
    "Confirmed",
    "PeerContext",
    "PeerEvent",
    "PeerState",
    "Recovered",
    "SLOW_ROUND",
    "SUSPECT",
    "SlowRound",
    "UNDECIDED_ROUND",
    "UndecidedRound",
]

# Control states of spec/straggler.toml.
CLEAR: Final = "CLEAR"
SUSPECT: Final = "SUSPECT"
CONFIRMED: Final = "CONFIRMED"


@attrs.frozen
class PeerContext:
    """One peer's extended state: who it is, the confirmation threshold, and how many decided
    rounds in a row named it slow (capped at ``rounds_required``: the state stays bounded)."""

    peer: int
    rounds_required: int
    slow_rounds: int = 0

    def __attrs_post_init__(self) -> None:
        if self.peer < 0:
            raise ValueError(f"peer must be a position >= 0, got {self.peer}")
        if self.rounds_required < 1:
            raise ValueError(f"rounds_required must be >= 1, got {self.rounds_required}")
        if not 0 <= self.slow_rounds <= self.rounds_required:
            raise ValueError(
                f"slow_rounds must lie in 0..rounds_required={self.rounds_required}, "
                f"got {self.slow_rounds}"
            )


# Events (spec/straggler.toml [events]) -------------------------------------------------------


@attrs.frozen
class SlowRound:
    """A decided timing round (Agree or Attributed) that names this peer slow."""

    trigger: ClassVar[str] = "slow_round"


@attrs.frozen
class CleanRound:
    """A decided timing round that does not name this peer."""

    trigger: ClassVar[str] = "clean_round"


@attrs.frozen
class UndecidedRound:
    """An Inconclusive timing round (group-wide slowdown, missing or invalid times)."""

    trigger: ClassVar[str] = "undecided_round"


SLOW_ROUND: Final = SlowRound()
CLEAN_ROUND: Final = CleanRound()
UNDECIDED_ROUND: Final = UndecidedRound()
PeerEvent: TypeAlias = SlowRound | CleanRound | UndecidedRound


# Effects (values a driver reports) -----------------------------------------------------------


@attrs.frozen
class Confirmed:
    """STRAG-11: emitted once, when a peer becomes a confirmed straggler."""

    peer: int
    rounds: int


@attrs.frozen
class Recovered:
    """STRAG-11: emitted once, when a confirmed straggler has a decided round not slow."""

    peer: int


PeerState: TypeAlias = MachineState[PeerContext]
PeerOutcome: TypeAlias = tuple[PeerContext, tuple[object, ...]]

BINDINGS = Bindings()


# Guards --------------------------------------------------------------------------------------


@BINDINGS.guard
def reaches_confirmation(context: PeerContext, event: SlowRound) -> bool:
    """This slow round is the ``rounds_required``-th in a row."""
    return context.slow_rounds + 1 >= context.rounds_required


# Effects -------------------------------------------------------------------------------------


@BINDINGS.effect
def count_slow_round(context: PeerContext, event: SlowRound) -> PeerOutcome:
    return attrs.evolve(context, slow_rounds=context.slow_rounds + 1), ()


@BINDINGS.effect
def confirm(context: PeerContext, event: SlowRound) -> PeerOutcome:
    confirmed = attrs.evolve(context, slow_rounds=context.rounds_required)
    return confirmed, (Confirmed(context.peer, context.rounds_required),)


@BINDINGS.effect
def reset_count(context: PeerContext, event: CleanRound) -> PeerOutcome:
    return attrs.evolve(context, slow_rounds=0), ()


@BINDINGS.effect
def recover(context: PeerContext, event: CleanRound) -> PeerOutcome:
    return attrs.evolve(context, slow_rounds=0), (Recovered(context.peer),)


# Invariant predicates (spec/straggler.toml [[invariant]]) ------------------------------------


@BINDINGS.predicate
def count_matches_control(state: PeerState) -> bool:
    """STRAG-7."""
    count, required = state.context.slow_rounds, state.context.rounds_required
    if not 0 <= count <= required:
        return False
    if state.control == CLEAR:
        return count == 0
    if state.control == SUSPECT:
        return 0 < count < required
    return state.control == CONFIRMED and count == required


@BINDINGS.predicate
def slow_round_counts_up(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-8."""
    if not isinstance(event, SlowRound):
        return True
    before, required = previous.context.slow_rounds, previous.context.rounds_required
    return state.context.slow_rounds == min(before + 1, required)


@BINDINGS.predicate
def clean_round_resets(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-9."""
    if not isinstance(event, CleanRound):
        return True
    return state.control == CLEAR and state.context.slow_rounds == 0


@BINDINGS.predicate
def undecided_round_changes_nothing(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-10."""
    if not isinstance(event, UndecidedRound):
        return True
    return state == previous and effects == ()


@BINDINGS.predicate
def one_report_per_change(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-11."""
    peer, required = previous.context.peer, previous.context.rounds_required
    entered = previous.control != CONFIRMED and state.control == CONFIRMED
    left = previous.control == CONFIRMED and state.control != CONFIRMED
    expected: tuple[object, ...] = ()
    if entered:
        expected = (Confirmed(peer, required),)
    elif left:
        expected = (Recovered(peer),)
    return effects == expected


@BINDINGS.predicate
def straggler_confirmed(state: PeerState) -> bool:
    """STRAG-12 (witness)."""
    return state.control == CONFIRMED


@BINDINGS.predicate
def confirmed_straggler_recovers(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-13 (witness)."""
    return previous.control == CONFIRMED and state.control == CLEAR


@BINDINGS.predicate
def confirmation_held_through_undecided(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-14 (witness)."""
    return previous.control == CONFIRMED and isinstance(event, UndecidedRound)


@BINDINGS.predicate
def suspicion_reset_by_clean_round(
    previous: PeerState, event: object, state: PeerState, effects: tuple[object, ...]
) -> bool:
    """STRAG-15 (witness)."""
    return previous.control == SUSPECT and isinstance(event, CleanRound)
