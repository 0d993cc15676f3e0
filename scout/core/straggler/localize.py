"""Cross-process-group localization of communication stragglers (spec/replay.md STRAG-5,
STRAG-6). Pure.

Communication stragglers show up as slow collectives of whole groups, not of one rank.
Independently slow groups (different member sets) that all contain one rank, with no healthy
group containing it, name that rank -- and its host.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

__all__ = ["GroupObservation", "Localization", "LocalizationStatus", "localize"]


# --------------------------------------------------------------------------------------------
# Cross-process-group localization (STRAG-5, STRAG-6)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class GroupObservation:
    """One process group's collective timing: ``slow`` None when it could not be judged."""

    members: frozenset[int]
    slow: bool | None
    name: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.members:
            raise ValueError(f"group {self.name!r} has no members")


class LocalizationStatus(enum.Enum):
    NORMAL = "normal"  # no slow group
    LOCALIZED = "localized"  # exactly one rank explains every slow group
    AMBIGUOUS = "ambiguous"  # several ranks would; candidates listed, nobody named
    INCONCLUSIVE = "inconclusive"  # too little evidence, or no single rank explains it


@attrs.frozen
class Localization:
    status: LocalizationStatus
    rank: int | None = None
    host: str | None = None
    host_ranks: tuple[int, ...] = ()  # every rank on the named host (the replacement scope)
    candidates: tuple[int, ...] = ()
    reason: str | None = None


def localize(
    observations: Sequence[GroupObservation], hosts: Mapping[int, str] | None = None
) -> Localization:
    """STRAG-5: name the one rank common to every slow group and to no healthy group.

    Needs at least two slow groups with different member sets: one slow group cannot be
    narrowed below itself. Groups that could not be judged (``slow is None``) are ignored.
    """
    slow = [o for o in observations if o.slow is True]
    healthy = [o for o in observations if o.slow is False]
    if not slow:
        return Localization(LocalizationStatus.NORMAL)
    if len({o.members for o in slow}) < 2:
        return Localization(
            LocalizationStatus.INCONCLUSIVE,
            candidates=tuple(sorted(slow[0].members)),
            reason="one slow group: a slow collective cannot be narrowed below its group",
        )
    common = frozenset.intersection(*(o.members for o in slow))
    cleared = frozenset().union(*(o.members for o in healthy)) if healthy else frozenset()
    candidates = tuple(sorted(common - cleared))
    if len(candidates) == 1:
        (rank,) = candidates
        host = hosts.get(rank) if hosts is not None else None
        host_ranks = (
            tuple(sorted(r for r, h in hosts.items() if h == host))
            if hosts is not None and host is not None
            else ()
        )
        return Localization(LocalizationStatus.LOCALIZED, rank, host, host_ranks, candidates)
    if candidates:
        return Localization(
            LocalizationStatus.AMBIGUOUS,
            candidates=candidates,
            reason="several ranks are common to every slow group and to no healthy group",
        )
    reason = (
        "the ranks common to every slow group also sit in healthy groups"
        if common
        else "no rank is common to every slow group (more than one fault?)"
    )
    return Localization(
        LocalizationStatus.INCONCLUSIVE, candidates=tuple(sorted(common)), reason=reason
    )
