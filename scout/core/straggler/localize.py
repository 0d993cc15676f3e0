"""Cross-process-group localization of slow links and hosts (spec/replay.md STRAG-5, STRAG-6,
STRAG-20). Pure.

Communication stragglers show up as slow collectives of whole groups, not of one rank.
Independently slow groups (different member sets) that all contain one rank, with no healthy
group containing it, name that rank -- and its host. Live (STRAG-20): each group's centre of
replay compute or communication time is compared with the other groups of its family by the
one verdict rule; the slow groups are localized to a rank, or, when the groups partition the
ranks, to the one host they share.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from scout.core.verdict import DEFAULT_TIMING_CONFIG, MISSING, Status, TimingConfig, classify_timing

__all__ = [
    "GroupObservation",
    "GroupTiming",
    "Localization",
    "LocalizationStatus",
    "family_observations",
    "localize",
    "localize_hosts",
    "localize_live",
]


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


# --------------------------------------------------------------------------------------------
# Live timings of every group (STRAG-20)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class GroupTiming:
    """One group's live timing of one kind (replay compute, or communication) at one check.

    ``family``: groups that do the same work on the same shapes -- the replay groups of one
    mesh dimension -- so their centres can be compared; ``centre_ms``: the group's own centre
    (the median of its members' times), None when it was not measured."""

    members: frozenset[int]
    family: str
    centre_ms: float | None
    name: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.members:
            raise ValueError(f"group {self.name!r} has no members")


def family_observations(
    timings: Sequence[GroupTiming], config: TimingConfig = DEFAULT_TIMING_CONFIG
) -> tuple[GroupObservation, ...]:
    """STRAG-20: within each family, ``classify_timing`` over the groups' centres decides
    which groups are slow -- a slow link or host slows every peer of its groups alike, which
    no vote inside a group can see (COMM-3), but its groups stand out among their family.
    ATTRIBUTED: the outlier groups are slow and the others healthy; AGREE: all healthy;
    INCONCLUSIVE (fewer than three groups, a majority slow, missing centres): none judged."""
    families: dict[str, list[GroupTiming]] = {}
    for timing in timings:
        families.setdefault(timing.family, []).append(timing)
    observations: list[GroupObservation] = []
    for family in sorted(families):
        groups = families[family]
        verdict = classify_timing(
            [MISSING if g.centre_ms is None else g.centre_ms for g in groups], config
        )
        judged = verdict.status is not Status.INCONCLUSIVE
        for position, group in enumerate(groups):
            slow = position in verdict.outliers if judged else None
            observations.append(GroupObservation(group.members, slow, group.name))
    return tuple(observations)


def localize_hosts(
    observations: Sequence[GroupObservation], hosts: Mapping[int, str]
) -> Localization:
    """STRAG-20: STRAG-5 with hosts in place of ranks -- the one host with ranks in every
    slow group and none in a healthy group. Groups that partition the ranks never share a
    rank, but the groups a slow host's ranks sit in share that host. ``candidates`` lists the
    ranks on the candidate hosts."""
    missing = sorted({r for o in observations for r in o.members} - set(hosts))
    if missing:
        raise ValueError(f"ranks {missing} have no host: give every rank's host")
    host_sets = [frozenset(hosts[r] for r in o.members) for o in observations]
    slow = [h for h, o in zip(host_sets, observations, strict=True) if o.slow is True]
    healthy = [h for h, o in zip(host_sets, observations, strict=True) if o.slow is False]

    def ranks_on(names: frozenset[str]) -> tuple[int, ...]:
        return tuple(sorted(r for r, h in hosts.items() if h in names))

    if not slow:
        return Localization(LocalizationStatus.NORMAL)
    common = frozenset.intersection(*slow)
    cleared = frozenset().union(*healthy) if healthy else frozenset()
    candidates = common - cleared
    if len(candidates) == 1:
        (host,) = candidates
        return Localization(
            LocalizationStatus.LOCALIZED,
            host=host,
            host_ranks=ranks_on(candidates),
            candidates=ranks_on(candidates),
        )
    if candidates:
        return Localization(
            LocalizationStatus.AMBIGUOUS,
            candidates=ranks_on(candidates),
            reason="several hosts have ranks in every slow group and none in a healthy group",
        )
    return Localization(
        LocalizationStatus.INCONCLUSIVE,
        candidates=ranks_on(common),
        reason="no host has ranks in every slow group and none in a healthy group",
    )


def localize_live(
    timings: Sequence[GroupTiming],
    hosts: Mapping[int, str] | None = None,
    config: TimingConfig = DEFAULT_TIMING_CONFIG,
) -> Localization:
    """STRAG-20: the live timings of every group, judged per family, localized to one rank
    (STRAG-5) -- or, when no single rank explains the slow groups and hosts are known, to one
    host."""
    observations = family_observations(timings, config)
    found = localize(observations, hosts)
    if found.status is LocalizationStatus.LOCALIZED or hosts is None:
        return found
    by_host = localize_hosts(observations, hosts)
    return by_host if by_host.status is LocalizationStatus.LOCALIZED else found
