"""Values of the straggler confirmation machine: per-peer context, check events, reports.

Table (normative): ``spec/straggler.toml``; prose, generated table and diagram:
``spec/straggler.md``. One machine per peer of a group: it reads one event per check -- the
peer's log time ratio to the group's centre (STRAG-2), or no evidence (STRAG-3) -- and runs a
two-sided sequential test on it: a CUSUM score that confirms the peer a straggler when the
evidence against it reaches a bound, and, once confirmed, a second CUSUM that recovers it when
the evidence for it reaches another bound (STRAG-4). :mod:`scout.core.straggler.confirmation`
composes one machine per peer into a group's state and computes the evidence.

Evidence is an integer number of *milli-nepers* (1/1000 of a natural-log unit: a ratio of
1.1 is 95, 1.5 is 405, 2 is 693), so the machine's state is integers and the explorer can
enumerate it. Pure: no clock, no I/O. The context is a frozen attrs class.
"""

from __future__ import annotations

import enum
import math
from typing import ClassVar, Final, TypeAlias

import attrs

from scout.core.guards import whole_number
from scout.core.machine import MachineState

__all__ = [
    "CLEAR",
    "CONFIRMED",
    "NO_EVIDENCE",
    "SUSPECT",
    "UNITS_PER_NEPER",
    "Check",
    "Confirmed",
    "NoEvidence",
    "PeerContext",
    "PeerEvent",
    "PeerOutcome",
    "PeerState",
    "Recovered",
    "StragglerState",
    "TestBounds",
]

#: Evidence unit: a log ratio of 1 (a ratio of e) is 1000 units.
UNITS_PER_NEPER: Final = 1000


class StragglerState(str, enum.Enum):
    """Control states of spec/straggler.toml (the loader checks both name the same states)."""

    CLEAR = "CLEAR"
    SUSPECT = "SUSPECT"
    CONFIRMED = "CONFIRMED"


CLEAR: Final = StragglerState.CLEAR
SUSPECT: Final = StragglerState.SUSPECT
CONFIRMED: Final = StragglerState.CONFIRMED


@attrs.frozen
class TestBounds:
    """The sequential test in integer milli-nepers (STRAG-2, STRAG-4).

    * ``slow_clip``, ``fast_clip``: one check's log ratio is clipped to
      ``[-fast_clip, slow_clip]`` -- one wild check moves a score by a bounded amount, and
      running faster than the centre counts no more than ``fast_clip`` towards recovery.
    * ``allowance`` (k) and ``confirm_bound`` (h): the confirmation score is
      ``S <- min(h, max(0, S + x - k))``; the peer is confirmed when ``S`` reaches ``h``.
    * ``recovery_allowance`` (k_r) and ``recovery_bound`` (h_r): once confirmed, the recovery
      score is ``R <- min(h_r, max(0, R + k_r - x))``; the peer recovers when ``R`` reaches
      ``h_r``.
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    allowance: int
    confirm_bound: int
    recovery_allowance: int
    recovery_bound: int
    slow_clip: int
    fast_clip: int

    def __attrs_post_init__(self) -> None:
        for name, value in attrs.asdict(self).items():
            least = 1 if name in ("confirm_bound", "recovery_bound", "slow_clip") else 0
            if not whole_number(value) or value < least:
                raise ValueError(
                    f"TestBounds.{name} must be an int >= {least} (milli-nepers), got {value!r}"
                )
        if self.slow_clip <= self.allowance:
            raise ValueError(
                f"TestBounds.slow_clip ({self.slow_clip}) must exceed the allowance "
                f"({self.allowance}): otherwise no evidence can ever confirm"
            )
        if self.recovery_allowance + self.fast_clip < 1:
            raise ValueError(
                "TestBounds.recovery_allowance + fast_clip must be >= 1: otherwise a confirmed "
                "straggler can never recover"
            )

    def clipped(self, units: int) -> int:
        return max(-self.fast_clip, min(self.slow_clip, units))

    @property
    def checks_to_confirm_min(self) -> int:
        """STRAG-12: the fewest checks with evidence that can confirm (from a score of 0)."""
        return math.ceil(self.confirm_bound / (self.slow_clip - self.allowance))

    @property
    def checks_to_recover_min(self) -> int:
        """STRAG-13: the fewest checks with evidence that can recover a confirmed peer."""
        return math.ceil(self.recovery_bound / (self.recovery_allowance + self.fast_clip))

    @property
    def checks_cap(self) -> int:
        """The check counter stops here: enough to state both bounds, and the state stays
        finite."""
        return max(self.checks_to_confirm_min, self.checks_to_recover_min)


@attrs.frozen
class PeerContext:
    """One peer's extended state: who it is, the test, the confirmation score, the recovery
    score (0 unless CONFIRMED), and the checks with evidence since its last report (capped at
    ``bounds.checks_cap``)."""

    peer: int
    bounds: TestBounds
    score: int = 0
    recovery: int = 0
    checks: int = 0

    def __attrs_post_init__(self) -> None:
        if self.peer < 0:
            raise ValueError(f"peer must be a position >= 0, got {self.peer}")
        if not 0 <= self.score <= self.bounds.confirm_bound:
            raise ValueError(
                f"score must lie in 0..confirm_bound={self.bounds.confirm_bound}, got {self.score}"
            )
        if not 0 <= self.recovery < self.bounds.recovery_bound:
            raise ValueError(
                f"recovery must lie in 0..recovery_bound-1={self.bounds.recovery_bound - 1}, "
                f"got {self.recovery}"
            )
        if not 0 <= self.checks <= self.bounds.checks_cap:
            raise ValueError(f"checks must lie in 0..{self.bounds.checks_cap}, got {self.checks}")


# Events (spec/straggler.toml [events]) -------------------------------------------------------


@attrs.frozen
class Check:
    """One check with evidence about this peer: its log time ratio to the group's centre in
    milli-nepers (positive = slower), and ``room``: whether confirming it would keep the
    confirmed peers of the group a strict minority (STRAG-14)."""

    trigger: ClassVar[str] = "check"
    units: int
    room: bool = True


@attrs.frozen
class NoEvidence:
    """A check that says nothing about this peer (every timing verdict Inconclusive, or its
    times missing or invalid)."""

    trigger: ClassVar[str] = "no_evidence"


NO_EVIDENCE: Final = NoEvidence()
PeerEvent: TypeAlias = Check | NoEvidence


# Effects (values a driver reports) -----------------------------------------------------------


@attrs.frozen
class Confirmed:
    """STRAG-11: emitted once, when a peer becomes a confirmed straggler. ``score`` is the
    evidence held (the confirmation bound), ``checks`` the checks with evidence since the
    peer's previous report (capped)."""

    peer: int
    score: int
    checks: int


@attrs.frozen
class Recovered:
    """STRAG-11: emitted once, when a confirmed straggler's recovery evidence reaches its
    bound; ``checks`` as in :class:`Confirmed`."""

    peer: int
    checks: int


PeerState: TypeAlias = MachineState[PeerContext]
PeerOutcome: TypeAlias = tuple[PeerContext, tuple[object, ...]]
