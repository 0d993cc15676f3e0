"""Values of the straggler confirmation machine: per-peer context, round events, reports.

Table (normative): ``spec/straggler.toml``; prose, generated table and diagram:
``spec/straggler.md``. One machine per peer of a replay group: it reads one event per timing
round -- the peer was named slow in a decided round, or not named in a decided round, or the
round was undecided (Inconclusive) -- and confirms the peer a straggler after
``rounds_required`` consecutive slow decided rounds (STRAG-2). :mod:`scout.core.straggler`
composes one machine per peer into the group's confirmation state.

Pure: no clock, no I/O. The context is a frozen attrs class, so the explorer deduplicates states.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Final, TypeAlias

import attrs

from scout.core.machine import MachineState

__all__ = [
    "CLEAN_ROUND",
    "CLEAR",
    "CONFIRMED",
    "CleanRound",
    "Confirmed",
    "PeerContext",
    "PeerEvent",
    "PeerOutcome",
    "PeerState",
    "StragglerState",
    "Recovered",
    "SLOW_ROUND",
    "SUSPECT",
    "SlowRound",
    "UNDECIDED_ROUND",
    "UndecidedRound",
]

class StragglerState(str, enum.Enum):
    """Control states of spec/straggler.toml (the loader checks both name the same states)."""

    CLEAR = "CLEAR"
    SUSPECT = "SUSPECT"
    CONFIRMED = "CONFIRMED"


CLEAR: Final = StragglerState.CLEAR
SUSPECT: Final = StragglerState.SUSPECT
CONFIRMED: Final = StragglerState.CONFIRMED


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
