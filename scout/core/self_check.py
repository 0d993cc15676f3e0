"""The live path's self-check, pure part (spec/replay.md SELF-1..SELF-9): decide one recipe's
self-check from every peer's code. No torch, no clock, no I/O.

Replay votes peers against each other on identical inputs, so it sees faults that recur while
replaying. A transient fault in the live computation of one rank reaches every replica through
the gradient all-reduce and is never seen by a later vote. So when a module call is captured,
each rank also replays that call on itself, outside the live forward and backward -- the same
inputs, parameters and kernels (``scout.replay.self_check``, SELF-9) -- and answers one code:
its live output was reproduced (MATCH), was not (DIFFER), or the rank could not check it
(UNCHECKED). The codes travel in the
evidence row replay already exchanges (evidence group ``live``) and are voted here by the one
verdict rule, :func:`scout.core.verdict.classify_exact`; this module only says what the
majority's value means (SELF-4).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from scout.core.guards import whole_number
from scout.core.verdict import MISSING, MissingType, Status, Verdict, classify_exact

__all__ = ["LiveCheck", "SelfCheckOutcome", "SelfCheckVerdict", "decide_self_check"]


class LiveCheck(enum.IntEnum):
    """One rank's answer for one captured call (SELF-3); travels as an int in the evidence row.
    0 is also what a slot holds when its executor has no self-check (experts, optimizer)."""

    UNCHECKED = 0  # not reproducible by construction here, or the self-check is off: no part
    MATCH = 1  # the live output's checked rows equal the rank's own replay of the call
    DIFFER = 2  # the exact replay (same shapes, kernels, inputs, parameters) gave other bits


class SelfCheckOutcome(enum.Enum):
    """SELF-4: what the peers' codes say about one recipe."""

    NOT_CHECKED = "not-checked"  # every peer UNCHECKED: the self-check took no part
    AGREE = "agree"  # every peer MATCH: the live path reproduced on every peer
    ATTRIBUTED = "attributed"  # a strict majority MATCH: the DIFFER peers are at fault
    INCONCLUSIVE = "inconclusive"  # anything else: could not check, never a fault


@attrs.frozen
class SelfCheckVerdict:
    outcome: SelfCheckOutcome
    outliers: tuple[int, ...] = ()  # peer positions (ATTRIBUTED only)
    reason: str | None = None  # INCONCLUSIVE only: a machine-readable code
    verdict: Verdict | None = None  # the one classify_exact verdict (None when NOT_CHECKED)

    @property
    def status(self) -> Status | None:
        """The exact-verdict status this outcome contributes to the recipe (EVID-4); None: none."""
        return {SelfCheckOutcome.AGREE: Status.AGREE, SelfCheckOutcome.ATTRIBUTED: Status.ATTRIBUTED,
                SelfCheckOutcome.INCONCLUSIVE: Status.INCONCLUSIVE}.get(self.outcome)


def _code(position: int, value: object) -> LiveCheck | MissingType:
    if value is MISSING:
        return MISSING
    if not whole_number(value):
        allowed = ", ".join(f"{c.value} ({c.name})" for c in LiveCheck)
        raise TypeError(f"peer {position}: a self-check code is an int ({allowed}), got {type(value).__name__} "
                        f"{value!r}")
    # A code this version does not know (a row from a peer of another version, a damaged row)
    # can neither name that peer nor vouch for it: it takes no part, like UNCHECKED.
    return LiveCheck(value) if value in LiveCheck._value2member_map_ else LiveCheck.UNCHECKED


def decide_self_check(codes: Sequence[int | MissingType | object]) -> SelfCheckVerdict:
    """SELF-4: one recipe's self-check from every peer's code (``MISSING``: the peer gave none).

    UNCHECKED peers -- and codes outside :class:`LiveCheck` -- take no part: they are given to
    the vote as MISSING, so a silent peer can never be named and never makes a majority. A DIFFER peer is named only when a strict
    majority of the whole group MATCHed -- the live path of that code and those shapes is then
    reproducible on this group's hardware, so the DIFFER peer computed something its own
    identical recomputation did not. A majority that DIFFERs says the live path does not
    reproduce here (nondeterminism, a hook that changes the output): never a fault.
    """
    if not codes:
        raise ValueError("no peers: a self-check needs at least one code (VERDICT-3)")
    values = [_code(position, value) for position, value in enumerate(codes)]
    if all(value is MISSING or value is LiveCheck.UNCHECKED for value in values):
        return SelfCheckVerdict(SelfCheckOutcome.NOT_CHECKED)
    voted = [MISSING if value is LiveCheck.UNCHECKED else value for value in values]
    verdict = classify_exact([value if value is MISSING else int(value) for value in voted])
    if verdict.healthy_value == LiveCheck.MATCH:
        if verdict.status is Status.AGREE:
            return SelfCheckVerdict(SelfCheckOutcome.AGREE, verdict=verdict)
        if verdict.status is Status.ATTRIBUTED:
            return SelfCheckVerdict(SelfCheckOutcome.ATTRIBUTED, verdict.outliers, verdict=verdict)
    if verdict.healthy_value == LiveCheck.DIFFER:
        reason = "not-reproducible"  # the majority's live path differs from its own replay
    else:
        assert verdict.reason is not None
        reason = verdict.reason.value
    return SelfCheckVerdict(SelfCheckOutcome.INCONCLUSIVE, reason=reason, verdict=verdict)
