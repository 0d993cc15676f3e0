"""Straggler evidence, the sequential test and cross-PG localization (spec/replay.md
STRAG-1..STRAG-6, STRAG-20; the machine's invariants STRAG-7..STRAG-19 in
spec/straggler.toml).

The per-peer machine is the table ``spec/straggler.toml``: it is model-checked with the
explorer over the real step, exhaustively, for several small test bounds (every invariant in
every state and step, every witness reached, every row fired over the set of bounds); the
group composition is explored over every check a group of 3 to 5 peers can see, against a
naive re-computation of both CUSUMs from the history; a planted bug must be caught. The
evidence of a check is checked against the verdict it comes from. The localizer is checked
exhaustively on small meshes under the fault model "a group is slow iff it contains a faulty
rank"."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import attrs
import pytest

from scout.core.machine import (
    Actions,
    Firing,
    ModelCheckFailure,
    Property,
    build_machine,
    conformance_problems,
    explore,
)
from scout.core.straggler import (
    ConfirmationState,
    Confirmed,
    GroupObservation,
    GroupTiming,
    LocalizationStatus,
    Recovered,
    SequentialConfig,
    TestBounds,
    check_evidence,
    confirmation_start,
    confirmation_step,
    family_observations,
    localize,
    localize_live,
    log_ratio,
    straggler_machine,
)
from scout.core.straggler.confirmation import evidence_spread
from scout.core.straggler.model import (
    CONFIRMED,
    NO_EVIDENCE,
    Check,
    PeerContext,
    PeerEvent,
    StragglerState,
)
from scout.core.verdict import MISSING, classify_timing
from tests import processes

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]
TABLE_INVARIANTS = {f"STRAG-{n}" for n in range(7, 20)}
WITNESSES = {"STRAG-15", "STRAG-16", "STRAG-17", "STRAG-18", "STRAG-19"}

#: Small bounds (milli-nepers) the explorer can enumerate; together they make every row of the
#: table fire (one of them lets a single check confirm, one needs several; recovery likewise).
SMALL_BOUNDS = (
    TestBounds(allowance=1, confirm_bound=4, recovery_allowance=1, recovery_bound=3, slow_clip=3, fast_clip=1),
    TestBounds(allowance=1, confirm_bound=2, recovery_allowance=2, recovery_bound=2, slow_clip=3, fast_clip=0),
    TestBounds(allowance=2, confirm_bound=5, recovery_allowance=0, recovery_bound=4, slow_clip=4, fast_clip=2),
)


def _events(bounds: TestBounds) -> tuple[PeerEvent, ...]:
    """Every check value that can matter (beyond the clips it is clipped), with and without
    room, and no evidence."""
    values = range(-bounds.fast_clip - 1, bounds.slow_clip + 2)
    return (*(Check(u, room) for u in values for room in (True, False)), NO_EVIDENCE)


def test_STRAG_7_table_conforms_and_its_document_is_current() -> None:
    machine = straggler_machine()
    assert conformance_problems(machine) == []
    assert {p.id for p in machine.properties} == TABLE_INVARIANTS
    result = processes.run(
        [sys.executable, "-m", "scout.cli", "spec", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("bounds", SMALL_BOUNDS, ids=lambda b: f"h{b.confirm_bound}")
def test_STRAG_7_to_STRAG_19_hold_for_one_peer_exhaustively(bounds: TestBounds) -> None:
    """Every check value in every reachable state: every always-invariant of the table in
    every state and step, every sometimes-invariant witnessed."""
    machine = straggler_machine()
    events = _events(bounds)
    result = explore(
        machine,
        [machine.initial_state(PeerContext(0, bounds))],
        lambda state: events,
        depth_max=60,
        states_max=20_000,
        require_exhaustive=True,
    )
    assert set(result.witnesses) == WITNESSES


def test_STRAG_7_every_row_fires_over_the_small_bounds() -> None:
    machine = straggler_machine()
    unfired = set(machine.labels)
    for bounds in SMALL_BOUNDS:
        events = _events(bounds)
        result = explore(
            machine,
            [machine.initial_state(PeerContext(0, bounds))],
            lambda state, events=events: events,
            depth_max=60,
            states_max=20_000,
            require_exhaustive=True,
        )
        unfired &= set(result.labels_unfired)
    assert unfired == set()


def test_STRAG_12_STRAG_13_default_bounds() -> None:
    """At the defaults, no confirmation from fewer than 4 checks with evidence and no recovery
    from fewer than 4 (one wild check moves a score by at most clip - allowance)."""
    bounds = SequentialConfig().bounds()
    assert bounds.checks_to_confirm_min == 4 and bounds.checks_to_recover_min == 4
    assert bounds == TestBounds(
        allowance=95, confirm_bound=1000, recovery_allowance=95, recovery_bound=600,
        slow_clip=405, fast_clip=95,
    )  # fmt: skip


# --- the group: every check a group can see, against the naive CUSUMs ---------------------


@attrs.frozen
class _Group:
    confirmation: ConfirmationState
    naive: tuple[tuple[int, int, bool], ...]  # per peer: score, recovery, confirmed


def _naive_step(
    naive: tuple[tuple[int, int, bool], ...], units: tuple[int | None, ...], bounds: TestBounds
) -> tuple[tuple[int, int, bool], ...]:
    """STRAG-4 written out directly from the spec's formulas, with the group's room rule."""

    def clip(u: int) -> int:
        return max(-bounds.fast_clip, min(bounds.slow_clip, u))

    confirmed = sum(c for _, _, c in naive)
    reaching = sum(
        1
        for (score, _, c), u in zip(naive, units, strict=True)
        if u is not None and not c
        and min(bounds.confirm_bound, max(0, score + clip(u) - bounds.allowance)) >= bounds.confirm_bound
    )
    room = 2 * (confirmed + reaching) < len(naive)
    out = []
    for (score, recovery, c), u in zip(naive, units, strict=True):
        if u is None:
            out.append((score, recovery, c))
        elif not c:
            score = min(bounds.confirm_bound, max(0, score + clip(u) - bounds.allowance))
            out.append((score, 0, score >= bounds.confirm_bound and room))
        else:
            recovery = max(0, recovery + bounds.recovery_allowance - clip(u))
            out.append((0, 0, False) if recovery >= bounds.recovery_bound else (score, recovery, True))
    return tuple(out)


class _GroupSystem:
    properties: tuple[Property, ...] = ()
    labels: tuple[str, ...] = ()

    def fire(self, state: _Group, event: tuple[int | None, ...]) -> Firing[_Group]:
        evidence = [None if u is None else u / 1000 for u in event]
        confirmation, effects = confirmation_step(state.confirmation, evidence)
        naive = _naive_step(state.naive, event, confirmation.bounds)
        return Firing(_Group(confirmation, naive), effects, ())


def _matches_naive(state: _Group) -> bool:
    machines = state.confirmation.peers
    return all(
        (m.context.score, m.context.recovery, m.control is CONFIRMED) == n
        for m, n in zip(machines, state.naive, strict=True)
    )


def _reports_match(
    previous: _Group, event: object, state: _Group, effects: tuple[object, ...]
) -> bool:
    before, after = previous.confirmation.confirmed, state.confirmation.confirmed
    newly = sorted(e.peer for e in effects if isinstance(e, Confirmed))
    gone = sorted(e.peer for e in effects if isinstance(e, Recovered))
    return newly == sorted(after - before) and gone == sorted(before - after)


def _explore_group(peers: int, bounds: TestBounds, values: tuple[int | None, ...]) -> int:
    checks = list(itertools.product(values, repeat=peers))
    start = _Group(confirmation_start(peers, bounds), ((0, 0, False),) * peers)
    result = explore(
        _GroupSystem(),
        [start],
        lambda state: checks,
        depth_max=60,
        states_max=400_000,
        extra_properties=(
            Property.always("STRAG-4", "machines = naive CUSUMs", _matches_naive),
            Property.always(
                "STRAG-14",
                "confirmed peers are a strict minority of the group",
                lambda s: 2 * len(s.confirmation.confirmed) < peers,
            ),
            Property.always("STRAG-11", "one report per change", _reports_match, scope="step"),
            Property.sometimes(
                "STRAG-15/group", "a straggler is confirmed", lambda s: bool(s.confirmation.confirmed)
            ),
            Property.sometimes(
                "STRAG-16/group",
                "a straggler recovers",
                lambda p, e, s, eff: any(isinstance(x, Recovered) for x in eff),
                scope="step",
            ),
        ),
        require_exhaustive=True,
    )
    return result.states_count


#: Each peer's check is no evidence, fast, or very slow (beyond the clip).
_GROUP_VALUES: tuple[int | None, ...] = (None, -1, 3)


@pytest.mark.parametrize(
    ("peers", "bounds"),
    [
        (3, TestBounds(allowance=1, confirm_bound=3, recovery_allowance=1, recovery_bound=2, slow_clip=2, fast_clip=1)),
        (4, TestBounds(allowance=1, confirm_bound=2, recovery_allowance=1, recovery_bound=2, slow_clip=3, fast_clip=1)),
    ],
    ids=["3-peers", "4-peers"],
)
def test_STRAG_4_STRAG_14_groups_follow_the_naive_cusums_exhaustively(
    peers: int, bounds: TestBounds
) -> None:
    """Every check the group can see (each peer: no evidence, fast or very slow): the
    composed machines equal both CUSUMs recomputed naively, confirmations are always a strict
    minority, every change is reported once, and the group confirms and recovers."""
    assert _explore_group(peers, bounds, _GROUP_VALUES) > 10


@pytest.mark.slow
def test_STRAG_4_STRAG_14_five_peers_and_on_par_checks_exhaustively() -> None:
    bounds = TestBounds(allowance=1, confirm_bound=2, recovery_allowance=1, recovery_bound=2, slow_clip=3, fast_clip=1)
    assert _explore_group(5, bounds, _GROUP_VALUES) > 10
    assert _explore_group(3, bounds, (None, -1, 1, 3)) > 10


def test_STRAG_8_a_machine_that_forgets_the_allowance_is_caught_with_a_shortest_trace() -> None:
    """Non-vacuity: the same table bound to a planted bug (the confirmation score ignores the
    allowance) fails STRAG-8 after the shortest trace: one check at the allowance."""
    machine = straggler_machine()
    buggy = Actions(states=StragglerState)
    for guard in machine.actions.guards.values():
        buggy.guard(guard)
    for name, effect in machine.actions.effects.items():
        if name != "accumulate":
            buggy.effect(effect)
    for predicate in machine.actions.predicates.values():
        buggy.predicate(predicate)

    def accumulate(context: PeerContext, event: Check) -> tuple[PeerContext, tuple[object, ...]]:
        bounds = context.bounds
        score = min(bounds.confirm_bound, max(0, context.score + bounds.clipped(event.units)))
        return attrs.evolve(context, score=score, checks=min(bounds.checks_cap, context.checks + 1)), ()

    buggy.effect(accumulate)
    mutant = build_machine(machine.table, buggy)
    bounds = SMALL_BOUNDS[0]
    with pytest.raises(ModelCheckFailure) as failure:
        explore(
            mutant,
            [mutant.initial_state(PeerContext(0, bounds))],
            lambda state: (Check(1), NO_EVIDENCE),
            depth_max=10,
            states_max=100,
        )
    assert failure.value.trace is not None
    assert failure.value.property_id in {"STRAG-7", "STRAG-8"}
    assert failure.value.trace.events == (Check(1),)


def test_STRAG_12_one_wild_check_never_confirms_and_a_persistent_one_does() -> None:
    state = confirmation_start(4, SequentialConfig(noise_spread=None))
    state, effects = confirmation_step(state, [0.0, 5.0, 0.0, 0.0])  # 148x: clipped to 1.5x
    assert effects == () and state.scores[1] == 405 - 95
    for _ in range(2):
        state, effects = confirmation_step(state, [0.0, 5.0, 0.0, 0.0])
    assert effects == ()
    state, effects = confirmation_step(state, [0.0, 5.0, 0.0, 0.0])
    assert effects == (Confirmed(1, 1000, 4),)
    with pytest.raises(ValueError, match="evidence for 3 peers in a group of 4"):
        confirmation_step(state, [0.0, 0.0, 0.0])


def test_STRAG_13_a_straggler_that_stops_recovers_once_and_stays_recovered() -> None:
    state = confirmation_start(4, SequentialConfig(noise_spread=None))
    slow, on_par = [0.0, math.log(1.5), 0.0, 0.01], [0.0, 0.0, 0.01, 0.0]
    reports: list[object] = []
    for check in range(40):
        state, effects = confirmation_step(state, slow if check < 10 else on_par)
        reports += [(check, e) for e in effects]
    # 4 checks of 1.5x confirm; 7 checks on par (95 mNp each towards 600) recover, once.
    assert reports == [(3, Confirmed(1, 1000, 4)), (16, Recovered(1, 4))]  # checks capped at 4


def test_STRAG_14_a_majority_of_slow_peers_is_held_not_confirmed() -> None:
    state = confirmation_start(4, SequentialConfig(noise_spread=None))
    for _ in range(10):
        state, effects = confirmation_step(state, [0.4, 0.4, 0.0, 0.0])
        assert effects == ()
    assert state.scores[:2] == (1000, 1000) and not state.confirmed
    # Once one of them is on par again, the other is a minority: confirmed at its next check.
    state, effects = confirmation_step(state, [0.4, -0.1, 0.0, 0.0])
    assert effects == (Confirmed(0, 1000, 4),)
    two = confirmation_start(2, SequentialConfig(noise_spread=None))
    for _ in range(10):
        two, effects = confirmation_step(two, [0.0, 1.0])
        assert effects == ()  # VERDICT-25: two peers never attribute


# --- evidence of one check (STRAG-2, STRAG-3) ---------------------------------------------


def test_STRAG_2_evidence_is_the_log_ratio_of_summed_times_to_summed_centres() -> None:
    times = {"hidden.0": (10.0, 10.2, 15.0, 9.9), "embedding": (0.1, 0.1, 0.15, 0.1)}
    verdicts = {name: classify_timing(t) for name, t in times.items()}
    evidence = check_evidence(times, verdicts, 0.1, 4)
    centres = verdicts["hidden.0"].healthy_value + verdicts["embedding"].healthy_value
    assert evidence[2] == pytest.approx(math.log((15.15 + 0.1) / (centres + 0.1)))
    assert evidence[2] > math.log(1.45) and all(abs(e) < 0.03 for e in evidence[:2])  # type: ignore[arg-type]
    # A cheap recipe barely moves the evidence: the costly one dominates (cost-weighted).
    cheap_slow = {"hidden.0": (10.0, 10.0, 10.0, 10.0), "embedding": (0.1, 0.1, 0.3, 0.1)}
    verdicts = {name: classify_timing(t) for name, t in cheap_slow.items()}
    assert check_evidence(cheap_slow, verdicts, 0.1, 4)[2] == pytest.approx(math.log(10.4 / 10.2))
    assert log_ratio(0.0, 0.0, 1.0) == 0.0


def test_STRAG_3_inconclusive_verdicts_and_missing_times_give_no_evidence() -> None:
    group_wide = {"hidden.0": (30.0, 30.2, 10.0, 30.1)}
    verdicts = {"hidden.0": classify_timing(group_wide["hidden.0"])}
    assert check_evidence(group_wide, verdicts, 0.1, 4) == (None,) * 4
    # A decided comparison (peer 4 attributed) in which peer 1 has no time: no evidence for
    # peer 1 this check, evidence for everybody else.
    missing = {"hidden.0": (10.0, MISSING, 10.1, 10.0, 30.0), "output": (1.0, 1.0, 1.0, 1.0, 1.0)}
    verdicts = {name: classify_timing(t) for name, t in missing.items()}
    assert verdicts["hidden.0"].outliers == (4,)
    evidence = check_evidence(missing, verdicts, 0.1, 5)
    assert evidence[1] is None and all(e is not None for e in (evidence[0], *evidence[2:]))
    assert check_evidence({}, {}, 0.1, 3) == (None, None, None)
    with pytest.raises(ValueError, match=r"do not have one time per peer of a group of 4"):
        check_evidence({"x": (1.0, 2.0)}, {}, 0.1, 4)
    with pytest.raises(ValueError, match="floor_ms"):
        check_evidence({}, {}, -1.0, 4)


def test_STRAG_2_the_noise_guard_scales_down_the_evidence_of_a_noisy_peer() -> None:
    # The spread is robust to a change of level: a straggler starting is one difference.
    assert evidence_spread([0, 0, 0, 405, 405, 405]) == 0.0
    assert evidence_spread([0, 100]) is None
    assert evidence_spread([0, 100, 0, 100]) == pytest.approx(1.4826 * 0.1 / math.sqrt(2))
    state = confirmation_start(4, SequentialConfig(noise_spread=0.05))
    for check in range(12):  # peer 1 jitters by +-0.2 from check to check; peer 2 is slow
        jitter = 0.2 if check % 2 else -0.2
        state, effects = confirmation_step(state, [0.0, jitter, 0.45, 0.01])
        assert not any(e.peer == 1 for e in effects)
    scales = state.noise_scales()
    assert scales[1] == pytest.approx(0.05 / (1.4826 * 0.295 / math.sqrt(2)), rel=1e-3)
    assert scales[0] == scales[2] == scales[3] == 1.0
    assert state.confirmed == {2} and state.scores[1] == 0
    unguarded = confirmation_start(4, SequentialConfig(noise_spread=None))
    for check in range(12):
        jitter = 0.4 if check % 2 else 0.05  # an upward jitter, unguarded, does convict
        unguarded, _ = confirmation_step(unguarded, [0.0, jitter, 0.0, 0.01])
    assert unguarded.confirmed == {1} and unguarded.noise_scales() == (1.0,) * 4
    with pytest.raises(ValueError, match="noise_spread"):
        SequentialConfig(noise_spread=0.0)


def test_STRAG_4_configuration_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="slow_ratio must be a finite ratio >= 1"):
        SequentialConfig(slow_ratio=0.9)
    with pytest.raises(ValueError, match="confirm_evidence must be a finite number > 0"):
        SequentialConfig(confirm_evidence=0)
    with pytest.raises(ValueError, match=r"slow_clip \(95\) must exceed the allowance \(95\)"):
        SequentialConfig(clip_ratio=1.1)
    with pytest.raises(ValueError, match="can never recover"):
        TestBounds(allowance=1, confirm_bound=2, recovery_allowance=0, recovery_bound=2, slow_clip=2, fast_clip=0)
    with pytest.raises(ValueError, match="peer_count must be >= 1, got 0"):
        confirmation_start(0)


# --- cross-PG localization (STRAG-5, STRAG-6) ----------------------------------------------


def _mesh_groups(shape: tuple[int, ...]) -> tuple[list[frozenset[int]], list[int]]:
    """Every 1-D slice of an n-D mesh of ranks (rows, columns, ...)."""
    ranks = list(range(math.prod(shape)))
    coordinates = list(itertools.product(*(range(s) for s in shape)))
    groups = []
    for axis in range(len(shape)):
        slices: dict[tuple[int, ...], set[int]] = {}
        for rank, coordinate in zip(ranks, coordinates, strict=True):
            key = coordinate[:axis] + coordinate[axis + 1 :]
            slices.setdefault(key, set()).add(rank)
        groups += [frozenset(s) for s in slices.values()]
    return groups, ranks


MESHES = [(2, 2), (2, 3), (3, 3), (2, 4), (2, 2, 2)]


@pytest.mark.parametrize("shape", MESHES, ids=str)
def test_STRAG_5_a_single_slow_rank_is_localized_with_its_host_on_every_mesh(
    shape: tuple[int, ...],
) -> None:
    groups, ranks = _mesh_groups(shape)
    hosts = {r: f"node{r // 2}" for r in ranks}
    for culprit in ranks:
        observations = [GroupObservation(g, culprit in g) for g in groups]
        found = localize(observations, hosts)
        assert found.status is LocalizationStatus.LOCALIZED and found.rank == culprit
        assert found.host == hosts[culprit]
        assert found.host_ranks == tuple(r for r in ranks if hosts[r] == hosts[culprit])


@pytest.mark.parametrize("shape", MESHES, ids=str)
def test_STRAG_6_localization_never_names_a_healthy_rank_exhaustively(
    shape: tuple[int, ...],
) -> None:
    """Every set of faulty ranks, every subset of unjudged groups (small meshes): when a rank
    is named it is faulty; with no fault the answer is NORMAL."""
    groups, ranks = _mesh_groups(shape)
    unknown_sets = [()] + [(i,) for i in range(len(groups))]
    named = 0
    for size in range(0, len(ranks) + 1):
        for culprits in itertools.combinations(ranks, size):
            for unknown in unknown_sets:
                observations = [
                    GroupObservation(g, None if i in unknown else bool(g & set(culprits)))
                    for i, g in enumerate(groups)
                ]
                found = localize(observations)
                if not culprits:
                    assert found.status is LocalizationStatus.NORMAL
                if found.status is LocalizationStatus.LOCALIZED:
                    assert found.rank in culprits, (culprits, unknown)
                    named += 1
                if found.status is LocalizationStatus.AMBIGUOUS and len(culprits) == 1:
                    assert culprits[0] in found.candidates
    assert named > 0


def test_STRAG_5_one_slow_group_or_contradicted_candidates_are_inconclusive() -> None:
    row = frozenset({0, 1})
    column = frozenset({0, 2})
    one = localize([GroupObservation(row, True), GroupObservation(column, False)])
    assert one.status is LocalizationStatus.INCONCLUSIVE and "one slow group" in (one.reason or "")
    contradicted = localize(
        [
            GroupObservation(row, True),
            GroupObservation(column, True),
            GroupObservation(frozenset({0, 3}), False),
        ]
    )
    assert contradicted.status is LocalizationStatus.INCONCLUSIVE and contradicted.rank is None
    ambiguous = localize(
        [GroupObservation(frozenset({0, 1, 2}), True), GroupObservation(frozenset({0, 1, 3}), True)]
    )
    assert ambiguous.status is LocalizationStatus.AMBIGUOUS and ambiguous.candidates == (0, 1)
    with pytest.raises(ValueError, match="no members"):
        GroupObservation(frozenset(), True, name="tp0")


# --- live timings of every group (STRAG-20) -------------------------------------------------


def _timings(
    groups: list[tuple[str, frozenset[int]]], slow: set[int], factor: float = 1.5
) -> list[GroupTiming]:
    """Each group's centre: 10 ms with a little spread, times ``factor`` if it holds a slow
    rank (the fault model: a slow link or host slows every peer of its groups alike)."""
    return [
        GroupTiming(members, family, 10.0 * (1 + 0.01 * (index % 3)) * (factor if members & slow else 1.0))
        for index, (family, members) in enumerate(groups)
    ]


def _families(shape: tuple[int, ...]) -> list[tuple[str, frozenset[int]]]:
    ranks = list(range(math.prod(shape)))
    coordinates = list(itertools.product(*(range(s) for s in shape)))
    out = []
    for axis in range(len(shape)):
        slices: dict[tuple[int, ...], set[int]] = {}
        for rank, coordinate in zip(ranks, coordinates, strict=True):
            slices.setdefault(coordinate[:axis] + coordinate[axis + 1 :], set()).add(rank)
        out += [(f"axis{axis}", frozenset(s)) for s in slices.values()]
    return out


@pytest.mark.parametrize("shape", [(3, 3), (3, 4), (4, 5), (3, 3, 3)], ids=str)
def test_STRAG_20_a_slow_rank_is_localized_from_the_live_centres_of_every_group(
    shape: tuple[int, ...],
) -> None:
    groups = _families(shape)
    for culprit in range(math.prod(shape)):
        found = localize_live(_timings(groups, {culprit}))
        assert found.status is LocalizationStatus.LOCALIZED and found.rank == culprit
    assert localize_live(_timings(groups, set())).status is LocalizationStatus.NORMAL


def test_STRAG_20_a_slow_host_is_localized_when_its_groups_share_no_rank() -> None:
    """One family (the 5 replay groups of a 3 x 5 mesh, columns); host A holds ranks in
    columns 0 and 1, every other rank has a host of its own. A slow host slows both its
    groups: no rank is common to them, their host is."""
    groups = [("replicas", frozenset(range(j, 15, 5))) for j in range(5)]
    hosts = {r: f"h{r}" for r in range(15)}
    hosts[0] = hosts[6] = "A"  # ranks (0, 0) and (1, 1)
    found = localize_live(_timings(groups, {0, 6}), hosts)
    assert found.status is LocalizationStatus.LOCALIZED and found.rank is None
    assert (found.host, found.host_ranks) == ("A", (0, 6))
    two = [("replicas", frozenset({0, 1, 2})), ("replicas", frozenset({3, 4, 5}))]
    assert family_observations(_timings(two, {0}))[0].slow is None  # 2 groups never attribute


@pytest.mark.parametrize("shape", [(3, 3), (3, 4)], ids=str)
def test_STRAG_20_live_localization_never_names_a_healthy_rank_or_host(
    shape: tuple[int, ...],
) -> None:
    """Every set of up to two slow ranks, each on its own host or paired on one host: when a
    rank or host is named, it is slow."""
    groups = _families(shape)
    ranks = range(math.prod(shape))
    named = 0
    for size in (1, 2):
        for culprits in itertools.combinations(ranks, size):
            for paired in (False, True):
                hosts = {r: f"h{r}" for r in ranks}
                if paired:  # the culprits (or the culprit and its neighbour) share a host
                    first = culprits[0]
                    partner = culprits[-1] if size == 2 else (first + 1) % len(ranks)
                    hosts[partner] = hosts[first]
                slow = {r for r in ranks if hosts[r] in {hosts[c] for c in culprits}}
                found = localize_live(_timings(groups, slow), hosts)
                if found.status is LocalizationStatus.LOCALIZED:
                    named += 1
                    assert found.host_ranks and set(found.host_ranks) <= slow, (culprits, found)
                    assert found.rank is None or found.rank in slow
    assert named > 0
