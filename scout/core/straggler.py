"""Straggler confirmation over rounds, and cross-process-group localization (spec/replay.md
STRAG-1..STRAG-6; the machine's own invariants STRAG-7..STRAG-15 are in spec/straggler.md).
Pure: no torch, no clock, no I/O (beyond reading the machine table once).

*Temporal confirmation.* One timing verdict (``classify_timing`` over the peers' replay compute
times, or over their own time inside replay collectives) is a *round*. A single slow round is
noise as often as not; a peer is confirmed a straggler when it is named slow in
``rounds_required`` consecutive *decided* rounds. Each peer runs the machine of
``spec/straggler.toml`` (bindings: :mod:`scout.core.straggler_bindings`); this module turns a
round into one event per peer -- ``slow_round``, ``clean_round`` or ``undecided_round`` -- and
steps every peer's machine. No transition exists only in code: the table is the machine.

*Cross-PG localization.* Communication stragglers show up as slow collectives of whole
groups, not of one rank. Independently slow groups (different member sets) that all contain
one rank, with no healthy group containing it, name that rank -- and its host.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from scout.core.machine import Machine, MachineState, load_machine
from scout.core.straggler_bindings import (
    CLEAN_ROUND,
    CONFIRMED,
    SLOW_ROUND,
    UNDECIDED_ROUND,
    Confirmed,
    PeerContext,
    PeerEvent,
    PeerState,
    Recovered,
)
from scout.core.verdict import Status, Verdict

__all__ = [
    "STRAGGLER_TABLE_PATH",
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
    "straggler_machine",
]

#: The normative table, read from the repository's spec/ like the gate's.
STRAGGLER_TABLE_PATH: Final = Path(__file__).resolve().parents[2] / "spec" / "straggler.toml"


@functools.cache
def straggler_machine() -> Machine[PeerContext]:
    """The per-peer confirmation machine built from ``spec/straggler.toml`` (loaded once)."""
    machine: Machine[PeerContext] = load_machine(STRAGGLER_TABLE_PATH)
    return machine


# --------------------------------------------------------------------------------------------
# Temporal confirmation (STRAG-2..STRAG-4; machine invariants STRAG-7..STRAG-15)
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
    """One machine state per peer position of the group, in position order."""

    peers: tuple[PeerState, ...]

    @property
    def peer_count(self) -> int:
        return len(self.peers)

    @property
    def rounds_required(self) -> int:
        return self.peers[0].context.rounds_required

    @property
    def consecutive(self) -> tuple[int, ...]:
        """Per peer: decided rounds in a row it was named slow, capped at rounds_required."""
        return tuple(peer.context.slow_rounds for peer in self.peers)

    @property
    def confirmed(self) -> frozenset[int]:
        return frozenset(p for p, peer in enumerate(self.peers) if peer.control == CONFIRMED)


def confirmation_start(peer_count: int, rounds_required: int) -> ConfirmationState:
    if peer_count < 1:
        raise ValueError(f"peer_count must be >= 1, got {peer_count}")
    if rounds_required < 1:
        raise ValueError(f"rounds_required must be >= 1, got {rounds_required}")
    machine = straggler_machine()
    return ConfirmationState(
        tuple(
            machine.initial_state(PeerContext(peer, rounds_required)) for peer in range(peer_count)
        )
    )


def confirmation_step(
    state: ConfirmationState, observed: Round
) -> tuple[ConfirmationState, tuple[Confirmed | Recovered, ...]]:
    """Step every peer's machine with its event of this round; effects in peer order.

    An undecided round is ``undecided_round`` for every peer; in a decided round the peers
    named slow get ``slow_round`` and every other peer ``clean_round``.
    """
    bad = [p for p in observed.slow if not 0 <= p < state.peer_count]
    if bad:
        raise ValueError(f"slow peers {sorted(bad)} outside a group of {state.peer_count}")
    machine = straggler_machine()
    peers: list[MachineState[PeerContext]] = []
    effects: list[Confirmed | Recovered] = []
    for position, peer in enumerate(state.peers):
        if not observed.decided:
            event: PeerEvent = UNDECIDED_ROUND
        elif position in observed.slow:
            event = SLOW_ROUND
        else:
            event = CLEAN_ROUND
        after, emitted = machine.step(peer, event)
        peers.append(after)
        effects += [e for e in emitted if isinstance(e, (Confirmed, Recovered))]
    return ConfirmationState(tuple(peers)), tuple(effects)


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
