"""Invariants the pure core asserts at run time, on every call, in production: postconditions
checked where they are made, not only in the explorer. Each is cheap -- O(1) in the
group size, or O(effects) -- and has an id; :data:`INVARIANTS` lists every one with the
sentence it checks, so they can be counted. A violation is a bug in scout, never bad input:
:class:`InvariantViolation` names the invariant and the values.

The explorer and the model checks still prove the tables' invariants over every reachable
state; these catch what slips past them on a real run (a corrupted state, a driver misuse, a
refactoring). ``bench/invariants.py`` measures what they cost (``ENABLED = False`` only there).
"""

from __future__ import annotations

from typing import Final

__all__ = ["ENABLED", "INVARIANTS", "InvariantViolation", "violated"]

#: Only ``bench/invariants.py`` turns this off, to measure what the checks cost.
ENABLED = True

INVARIANTS: Final[dict[str, str]] = {
    "VERDICT-2/outliers": "a verdict's outliers are ascending, distinct positions of its group; exactly an "
                          "ATTRIBUTED verdict names any",
    "VERDICT-2/majority": "an ATTRIBUTED verdict leaves a strict majority of the whole group as non-outliers",
    "REPLAY-9/results": "a replay round gives one result per due recipe, at the round's step, naming only peers "
                        "of its group",
    "GATE-9/persist": "a gate step that changes the state emits Persist, once, as its first effect",
    "GATE-2/absorbing": "no gate step moves a checkpoint out of QUARANTINED, SUPERSEDED or LOST",
    "GATE-3/monotone": "a verified checkpoint stays verified unless lost (GATE-42), and each promotion is newer "
                       "than every verified one",
    "STRAG-14/minority": "the confirmed stragglers of a group stay a strict minority of it",
}


class InvariantViolation(AssertionError):
    """A run-time invariant of the core does not hold: a bug in scout, not in its input."""


def violated(invariant: str, detail: str) -> InvariantViolation:
    """The error for ``invariant`` (an id of :data:`INVARIANTS`) with what was seen."""
    return InvariantViolation(f"invariant {invariant} violated ({INVARIANTS[invariant]}): {detail}")
