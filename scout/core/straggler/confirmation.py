"""Straggler evidence and its confirmation over a group (spec/replay.md STRAG-2..STRAG-4; the
machine's own invariants STRAG-7..STRAG-19 are in spec/straggler.md). Pure: no torch, no
clock, no I/O (beyond reading the packaged machine table once).

*Evidence per check (STRAG-2).* Each single comparison -- one recipe's replay times across
the group, or the group's own communication times, or its loop times -- is decided by the one
verdict rule, ``classify_timing``. An Inconclusive verdict (a group-wide slowdown, missing or
invalid times, no strict majority) is no evidence (STRAG-3). A decided verdict gives its
centre; a peer's evidence for the check is the log ratio of its time to the centre, with the
comparison's absolute floor added to both (so times at or below the floor carry almost no
evidence, as VERDICT-24 never attributes them) and the recipes of one check summed before the
ratio (so a costly recipe weighs more than a cheap one, and recipes of any cost combine).

*Sequential test (STRAG-4).* Each peer runs the machine of ``spec/straggler.toml``: a CUSUM
on its per-check log ratios that confirms it after enough evidence, and a second CUSUM that
recovers it after enough evidence the other way. Separate allowances and bounds give the
hysteresis; a group confirms at most a strict minority of its peers (STRAG-14, VERDICT-25).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import attrs

from scout.core import invariants
from scout.core.finite import finite_number
from scout.core.guards import whole_number
from scout.core.machine import Machine, MachineState, packaged_machine
from scout.core.straggler.machine import reaches_bound
from scout.core.straggler.model import (
    CONFIRMED,
    NO_EVIDENCE,
    UNITS_PER_NEPER,
    Check,
    Confirmed,
    PeerContext,
    PeerEvent,
    PeerState,
    Recovered,
    TestBounds,
)
from scout.core.verdict import MISSING, Status, Verdict

__all__ = [
    "DEFAULT_SEQUENTIAL_CONFIG",
    "ConfirmationState",
    "SequentialConfig",
    "check_evidence",
    "confirmation_start",
    "confirmation_step",
    "evidence_spread",
    "log_ratio",
    "straggler_machine",
]


def straggler_machine() -> Machine[PeerContext]:
    """The per-peer confirmation machine of ``spec/straggler.toml`` (its packaged copy)."""
    machine: Machine[PeerContext] = packaged_machine("straggler")
    return machine


def _ratio_units(name: str, value: float) -> int:
    # Finite in milli-nepers: an evidence bound near the float maximum overflows when scaled.
    if not (_number(value) and math.isfinite(value * UNITS_PER_NEPER)):
        raise ValueError(
            f"SequentialConfig.{name} must be finite in milli-nepers (x {UNITS_PER_NEPER}), "
            f"got {value!r}"
        )
    return round(value * UNITS_PER_NEPER)


@attrs.frozen
class SequentialConfig:
    """The sequential test (STRAG-4), as time ratios and sums of log ratios.

    * ``slow_ratio``: the allowance -- a peer up to this many times the centre adds nothing to
      its confirmation score (healthy jitter and the lower-median centre's bias stay below it).
    * ``confirm_evidence``: the score that confirms, in nepers (the sum over checks of
      ``ln(ratio) - ln(slow_ratio)``). At the defaults a 1.5x straggler needs 4 checks with
      evidence and a 1.2x one about 12.
    * ``clip_ratio``: one check counts as at most this slow, and as at most ``1 / fast_ratio``
      fast: one wild check moves a score by a bounded amount, so no confirmation comes from
      fewer than 4 checks and no recovery from fewer than 4 at the defaults (STRAG-12,
      STRAG-13).
    * ``recovery_ratio`` and ``recovery_evidence``: once confirmed, each check adds
      ``ln(recovery_ratio) - ln(ratio)`` to the recovery score; the peer recovers at
      ``recovery_evidence`` (about 7 checks at the centre).
    * ``noise_spread`` (STRAG-2, the noise guard): when the noise of a peer's clipped log
      ratios over its last ``noise_checks`` checks (:func:`evidence_spread`) exceeds this, its
      evidence is scaled down by ``noise_spread / spread`` -- a noisy peer needs more checks,
      so noise cannot convict; None turns the guard off.
    """

    slow_ratio: float = 1.1
    confirm_evidence: float = 1.0
    clip_ratio: float = 1.5
    fast_ratio: float = 1.1
    recovery_ratio: float = 1.1
    recovery_evidence: float = 0.6
    noise_spread: float | None = 0.05
    noise_checks: int = 16

    def __attrs_post_init__(self) -> None:
        for name in ("slow_ratio", "recovery_ratio", "clip_ratio", "fast_ratio"):
            value = getattr(self, name)
            if not (finite_number(value) and value >= 1):
                raise ValueError(
                    f"SequentialConfig.{name} must be a finite ratio >= 1, got {value!r}"
                )
        for name in ("confirm_evidence", "recovery_evidence"):
            value = getattr(self, name)
            if not (finite_number(value) and value > 0):
                raise ValueError(
                    f"SequentialConfig.{name} must be a finite number > 0, got {value!r}"
                )
        spread = self.noise_spread
        if spread is not None and not (finite_number(spread) and spread > 0):
            raise ValueError(
                f"SequentialConfig.noise_spread must be a number > 0 or None, got {spread!r}"
            )
        checks = self.noise_checks
        if not whole_number(checks) or checks < 1:
            raise ValueError(f"SequentialConfig.noise_checks must be an int >= 1, got {checks!r}")
        self.bounds()  # TestBounds refuses a test that can never confirm or recover

    def bounds(self) -> TestBounds:
        """The machine's integer bounds (milli-nepers)."""
        return TestBounds(
            allowance=_ratio_units("slow_ratio", math.log(self.slow_ratio)),
            confirm_bound=max(1, _ratio_units("confirm_evidence", self.confirm_evidence)),
            recovery_allowance=_ratio_units("recovery_ratio", math.log(self.recovery_ratio)),
            recovery_bound=max(1, _ratio_units("recovery_evidence", self.recovery_evidence)),
            slow_clip=_ratio_units("clip_ratio", math.log(self.clip_ratio)),
            fast_clip=_ratio_units("fast_ratio", math.log(self.fast_ratio)),
        )


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DEFAULT_SEQUENTIAL_CONFIG = SequentialConfig()


# --------------------------------------------------------------------------------------------
# Evidence of one check (STRAG-2, STRAG-3)
# --------------------------------------------------------------------------------------------


def log_ratio(time_ms: float, centre_ms: float, floor_ms: float) -> float:
    """STRAG-2: ``ln((time + floor) / (centre + floor))``: a time at or below the floor
    carries almost no evidence, one far above it its plain log ratio."""
    return math.log((time_ms + floor_ms) / (centre_ms + floor_ms))


def _valid(value: object) -> bool:
    return (
        value is not MISSING
        and finite_number(value)
        and value >= 0
    )


def check_evidence(
    times_ms: Mapping[str, Sequence[object]],
    verdicts: Mapping[str, Verdict],
    floor_ms: float,
    peer_count: int,
) -> tuple[float | None, ...]:
    """STRAG-2: each peer's log ratio for one check, or None where the check says nothing
    about it (STRAG-3).

    ``times_ms`` maps each comparison of the check (a recipe, or one kind of timing) to every
    peer's time, by position; ``verdicts`` maps it to ``classify_timing`` over those times.
    Only decided comparisons (AGREE, ATTRIBUTED) count. A peer's evidence is
    ``log_ratio(sum of its times, sum of the centres, floor_ms)`` over the decided comparisons;
    a peer without a valid time in one of them has no evidence this check.
    """
    if not (finite_number(floor_ms) and floor_ms >= 0):
        raise ValueError(f"floor_ms must be a finite number >= 0, got {floor_ms!r}")
    wrong = sorted(name for name, values in times_ms.items() if len(values) != peer_count)
    if wrong:
        raise ValueError(
            f"comparisons {wrong} do not have one time per peer of a group of {peer_count}"
        )
    if set(verdicts) - set(times_ms):
        raise ValueError(
            f"verdicts for comparisons without times: {sorted(set(verdicts) - set(times_ms))}"
        )
    decided = [
        name
        for name in sorted(verdicts)
        if verdicts[name].status is not Status.INCONCLUSIVE
        and isinstance(verdicts[name].healthy_value, (int, float))
    ]
    if not decided:
        return (None,) * peer_count
    centre_ms = sum(float(verdicts[name].healthy_value) for name in decided)
    evidence: list[float | None] = []
    for position in range(peer_count):
        values = [times_ms[name][position] for name in decided]
        valid = [float(v) for v in values if _valid(v)]  # type: ignore[arg-type]
        if len(valid) < len(values):
            evidence.append(None)
            continue
        evidence.append(log_ratio(sum(valid), centre_ms, floor_ms))
    return tuple(evidence)


# --------------------------------------------------------------------------------------------
# Sequential test over a group (STRAG-4; machine invariants STRAG-7..STRAG-19)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class ConfirmationState:
    """One machine state per peer position of the group, in position order; the test's
    configuration (None: bare bounds, no noise guard) and, per peer, the clipped evidence of
    its last ``noise_checks`` checks with evidence (milli-nepers), for the noise guard."""

    peers: tuple[PeerState, ...]
    config: SequentialConfig | None = None
    recent: tuple[tuple[int, ...], ...] = ()

    @property
    def peer_count(self) -> int:
        return len(self.peers)

    @property
    def bounds(self) -> TestBounds:
        return self.peers[0].context.bounds

    @property
    def scores(self) -> tuple[int, ...]:
        """Per peer: the confirmation score held (milli-nepers)."""
        return tuple(peer.context.score for peer in self.peers)

    @property
    def confirmed(self) -> frozenset[int]:
        return frozenset(p for p, peer in enumerate(self.peers) if peer.control is CONFIRMED)

    def noise_scales(self) -> tuple[float, ...]:
        """STRAG-2: per peer, the factor its evidence is multiplied by (1: quiet enough)."""
        config = self.config
        if config is None or config.noise_spread is None or not self.recent:
            return (1.0,) * self.peer_count
        reference = config.noise_spread
        scales = []
        for values in self.recent:
            spread = evidence_spread(values)
            scales.append(1.0 if spread is None or spread <= reference else reference / spread)
        return tuple(scales)


def evidence_spread(values_mnp: Sequence[int]) -> float | None:
    """The noise of one peer's evidence in nepers: 1.4826 x the median absolute difference
    between consecutive checks, over sqrt(2) -- a robust standard deviation that a change of
    level (a straggler starting or stopping) moves by one difference only; None with fewer
    than 3 values."""
    if len(values_mnp) < 3:
        return None
    differences = [abs(b - a) for a, b in zip(values_mnp, values_mnp[1:], strict=False)]
    return 1.4826 * statistics.median(differences) / math.sqrt(2) / UNITS_PER_NEPER


def confirmation_start(
    peer_count: int, config: SequentialConfig | TestBounds = DEFAULT_SEQUENTIAL_CONFIG
) -> ConfirmationState:
    """The group's initial state. With bare ``TestBounds`` there is no noise guard (the
    model checks explore the machines alone)."""
    if peer_count < 1:
        raise ValueError(f"peer_count must be >= 1, got {peer_count}")
    if isinstance(config, SequentialConfig):
        bounds, sequential = config.bounds(), config
    else:
        bounds, sequential = config, None
    machine = straggler_machine()
    return ConfirmationState(
        tuple(machine.initial_state(PeerContext(peer, bounds)) for peer in range(peer_count)),
        sequential,
    )


def _units(value: float) -> int:
    if not math.isfinite(value):
        raise ValueError(f"a log ratio must be finite, got {value!r}")
    return round(value * UNITS_PER_NEPER)


def confirmation_step(
    state: ConfirmationState, evidence: Sequence[float | None]
) -> tuple[ConfirmationState, tuple[Confirmed | Recovered, ...]]:
    """Step every peer's machine with its evidence of one check; effects in peer order.

    ``evidence[p]`` is peer ``p``'s log ratio in nepers, or None for no evidence. It is
    rounded to milli-nepers (the machine's unit) and clipped; the noise guard adds it to the
    peer's recent evidence and scales it by the peer's ``noise_scales``.

    STRAG-14: the peers this check would confirm, with those already confirmed, must stay a
    strict minority of the group; otherwise the check confirms none of them (they are held at
    the bound), whatever their order.
    """
    if len(evidence) != state.peer_count:
        raise ValueError(
            f"evidence for {len(evidence)} peers in a group of {state.peer_count}: one entry "
            "(None for no evidence) per peer"
        )
    clipped = state.bounds.clipped
    raw = [None if e is None else clipped(_units(e)) for e in evidence]
    guarded = state
    if state.config is not None:
        window = state.config.noise_checks
        recent = state.recent or ((),) * state.peer_count
        guarded = attrs.evolve(
            state,
            recent=tuple(
                values if u is None else (*values, u)[-window:]
                for values, u in zip(recent, raw, strict=True)
            ),
        )
    # The clip comes before the scale, so for a noisy peer even the wildest check moves its
    # score by less (the machine clips again, which then changes nothing).
    units = [
        None if u is None else round(u * scale)
        for u, scale in zip(raw, guarded.noise_scales(), strict=True)
    ]
    reaching = [
        p
        for p, (peer, u) in enumerate(zip(state.peers, units, strict=True))
        if u is not None and peer.control is not CONFIRMED and reaches_bound(peer.context, u)
    ]
    room = 2 * (len(state.confirmed) + len(reaching)) < state.peer_count
    machine = straggler_machine()
    peers: list[MachineState[PeerContext]] = []
    effects: list[Confirmed | Recovered] = []
    for peer, u in zip(state.peers, units, strict=True):
        event: PeerEvent = NO_EVIDENCE if u is None else Check(u, room)
        after, emitted = machine.step(peer, event)
        peers.append(after)
        effects += [e for e in emitted if isinstance(e, (Confirmed, Recovered))]
    new = attrs.evolve(guarded, peers=tuple(peers))
    if invariants.ENABLED:
        _check_confirmation(new)
    return new, tuple(effects)


def _check_confirmation(state: ConfirmationState) -> None:
    """STRAG-14 at run time (scout.core.invariants); PeerContext checks each score's bounds."""
    confirmed = state.confirmed
    if confirmed and not 2 * len(confirmed) < state.peer_count:
        raise invariants.violated("STRAG-14/minority", f"peers {sorted(confirmed)} of {state.peer_count} confirmed")
