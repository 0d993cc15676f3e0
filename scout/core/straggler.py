"""Straggler confirmation over rounds, and cross-process-group localization (spec/replay.md
STRAG-2..STRAG-6). Pure: no torch, no clock, no I/O.

*Temporal confirmation.* One replay timing verdict (``classify_timing`` over the peers'
replay compute times) is a *round*. A single slow round is noise as often as not; a peer is
confirmed a straggler when it is named slow in ``rounds_required`` consecutive *decided*
rounds. The machine is a pure step ``step(state, round) -> (state, effects)`` in the style of
the other core machines; an exhaustive test compares it with a naive re-computation from the
whole history.

*Cross-PG localization.* Communication stragglers show up as slow collectives of whole
groups, not of one rank. Independently slow groups (different member sets) that all contain
one rank, with no healthy group containing it, name that rank -- and its host.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from scout.core.verdict import Status, Verdict

__all__ = [
    "Confirmed",
    "ConfirmationState",
    "GroupObservation",
    "Localization",
    "LocalizationStatus",
    "Recovered",
    "Round",
    "confirmation_start",
    "confirmation_step",
    "localize",
    "round_from_verdict",
]


# --------------------------------------------------------------------------------------------
# Temporal confirmation (STRAG-2..STRAG-4)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Round:
    """One timing round: ``decided`` False when the verdict was Inconclusive (STRAG-3)."""

    decided: bool
    slow: frozenset[int] = frozenset()

    def __attrs_post_init__(self) -> None:
        if not self.decided and self.slow:
            raise ValueError(f"an undecided round names no slow peers, got {sorted(self.slow)}")


def round_from_verdict(verdict: Verdict) -> Round:
    """AGREE -> decided, nobody slow; ATTRIBUTED -> decided, the outliers slow; INCONCLUSIVE
    -> undecided (a group-wide slowdown or missing times say nothing about one peer)."""
    if verdict.status is Status.INCONCLUSIVE:
        return Round(False)
    return Round(True, frozenset(verdict.outliers))


@attrs.frozen
class ConfirmationState:
    peer_count: int
    rounds_required: int
    consecutive: tuple[int, ...]  # per peer: decided rounds in a row it was named slow, capped
    confirmed: frozenset[int]


@attrs.frozen
class Confirmed:
    """STRAG-4: emitted once when a peer becomes a confirmed straggler."""

    peer: int
    rounds: int


@attrs.frozen
class Recovered:
    """STRAG-4: emitted once when a confirmed straggler has a decided round not slow."""

    peer: int


def confirmation_start(peer_count: int, rounds_required: int) -> ConfirmationState:
    if peer_count < 1:
        raise ValueError(f"peer_count must be >= 1, got {peer_count}")
    if rounds_required < 1:
        raise ValueError(f"rounds_required must be >= 1, got {rounds_required}")
    return ConfirmationState(peer_count, rounds_required, (0,) * peer_count, frozenset())


def confirmation_step(
    state: ConfirmationState, observed: Round
) -> tuple[ConfirmationState, tuple[Confirmed | Recovered, ...]]:
    """STRAG-2..STRAG-4. Undecided rounds change nothing; in a decided round a peer named
    slow advances its count (capped at ``rounds_required``), every other peer resets to 0."""
    bad = [p for p in observed.slow if not 0 <= p < state.peer_count]
    if bad:
        raise ValueError(f"slow peers {sorted(bad)} outside a group of {state.peer_count}")
    if not observed.decided:
        return state, ()
    required = state.rounds_required
    consecutive = tuple(
        min(count + 1, required) if peer in observed.slow else 0
        for peer, count in enumerate(state.consecutive)
    )
    confirmed = frozenset(p for p, count in enumerate(consecutive) if count >= required)
    effects: list[Confirmed | Recovered] = [
        Confirmed(p, required) for p in sorted(confirmed - state.confirmed)
    ]
    effects += [Recovered(p) for p in sorted(state.confirmed - confirmed)]
    return attrs.evolve(state, consecutive=consecutive, confirmed=confirmed), tuple(effects)


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
