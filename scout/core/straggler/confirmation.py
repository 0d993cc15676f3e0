"""Straggler confirmation over rounds (spec/replay.md STRAG-1..STRAG-4; the machine's own
invariants STRAG-7..STRAG-15 are in spec/straggler.md). Pure: no torch, no clock, no I/O
(beyond reading the packaged machine table once).

*Temporal confirmation.* One timing verdict (``classify_timing`` over the peers' replay compute
times, or over their own time inside replay collectives) is a *round*. A single slow round is
noise as often as not; a peer is confirmed a straggler when it is named slow in
``rounds_required`` consecutive *decided* rounds. Each peer runs the machine of
``spec/straggler.toml`` (actions: :mod:`scout.core.straggler.machine`); this module turns a
round into one event per peer -- ``slow_round``, ``clean_round`` or ``undecided_round`` -- and
steps every peer's machine. No transition exists only in code: the table is the machine.

"""

from __future__ import annotations

import attrs

from scout.core.machine import Machine, MachineState, packaged_machine
from scout.core.straggler.model import (
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
    "ConfirmationState",
    "Round",
    "confirmation_start",
    "confirmation_step",
    "round_from_verdict",
    "straggler_machine",
]

def straggler_machine() -> Machine[PeerContext]:
    """The per-peer confirmation machine of ``spec/straggler.toml`` (its packaged copy)."""
    machine: Machine[PeerContext] = packaged_machine("straggler")
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
        return frozenset(p for p, peer in enumerate(self.peers) if peer.control is CONFIRMED)


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
