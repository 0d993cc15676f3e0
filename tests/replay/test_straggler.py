"""Straggler confirmation and cross-PG localization (spec/replay.md STRAG-1..STRAG-6, the
machine's invariants STRAG-7..STRAG-15 in spec/straggler.toml).

The temporal machine is the table ``spec/straggler.toml``: it is model-checked with the
explorer over the real step (one peer; one peer beside a window of its last decided rounds, for
the naive history rule; whole groups of 3 to 5 peers), and compared with a naive re-computation
from the whole history for every sequence of rounds up to a bound. The localizer is checked
exhaustively on small meshes under the fault model "a group is slow iff it contains a faulty
rank"."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import attrs
import pytest

from scout.core.machine import (
    Actions,
    Firing,
    MachineState,
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
    LocalizationStatus,
    Recovered,
    Round,
    confirmation_start,
    confirmation_step,
    localize,
    round_from_verdict,
    straggler_machine,
)
from scout.core.straggler.model import (
    CLEAN_ROUND,
    CONFIRMED,
    SLOW_ROUND,
    UNDECIDED_ROUND,
    PeerContext,
    PeerEvent,
    StragglerState,
)
from scout.core.verdict import classify_timing
from tests import processes

REPO = Path(__file__).resolve().parents[2]
PEER_EVENTS: tuple[PeerEvent, ...] = (SLOW_ROUND, CLEAN_ROUND, UNDECIDED_ROUND)
TABLE_INVARIANTS = {f"STRAG-{n}" for n in range(7, 16)}


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


def test_STRAG_7_to_STRAG_15_hold_for_one_peer_exhaustively() -> None:
    """Every event in every state, rounds_required 1..4: every always-invariant of the table
    in every state and step, every sometimes-invariant witnessed, every row fired."""
    machine = straggler_machine()
    initial = [machine.initial_state(PeerContext(0, k)) for k in range(1, 5)]
    result = explore(
        machine,
        initial,
        lambda state: PEER_EVENTS,
        depth_max=12,
        states_max=1000,
        require_exhaustive=True,
    )
    assert set(result.witnesses) == {"STRAG-12", "STRAG-13", "STRAG-14", "STRAG-15"}
    assert result.labels_unfired == ()
    assert result.states_count == sum(k + 1 for k in range(1, 5))  # count 0..K per K


# --- one peer beside the window of its last K decided rounds (the naive history rule) ------


@attrs.frozen
class _Windowed:
    peer: MachineState[PeerContext]
    window: tuple[bool, ...]  # the last <= K decided rounds, True = named slow; oldest first


class _WindowedPeer:
    """The real machine plus a record of the last K decided rounds, so that the naive rule
    "confirmed iff the last K decided rounds all named it slow" can be checked in every state.
    The window is bounded, so the composed state space is finite and explored exhaustively."""

    properties: tuple[Property, ...] = ()

    def __init__(self) -> None:
        self.machine = straggler_machine()
        self.labels = self.machine.labels

    def fire(self, state: _Windowed, event: PeerEvent) -> Firing[_Windowed]:
        firing = self.machine.fire(state.peer, event)
        window = state.window
        if event is not UNDECIDED_ROUND:
            required = state.peer.context.rounds_required
            window = (*window, event is SLOW_ROUND)[-required:]
        return Firing(_Windowed(firing.state, window), firing.effects, firing.labels)


def _naive_window_rule(state: _Windowed) -> bool:
    required = state.peer.context.rounds_required
    naive = len(state.window) == required and all(state.window)
    return (state.peer.control == CONFIRMED) == naive


def _confirmed_exactly_when_window_fills(
    previous: _Windowed, event: object, state: _Windowed, effects: tuple[object, ...]
) -> bool:
    def full(s: _Windowed) -> bool:
        return len(s.window) == s.peer.context.rounds_required and all(s.window)

    confirmed = [e for e in effects if isinstance(e, Confirmed)]
    return len(confirmed) == (1 if full(state) and not full(previous) else 0)


def test_STRAG_2_confirmed_exactly_after_K_consecutive_slow_decided_rounds() -> None:
    system = _WindowedPeer()
    initial = [_Windowed(system.machine.initial_state(PeerContext(0, k)), ()) for k in range(1, 5)]
    result = explore(
        system,
        initial,
        lambda state: PEER_EVENTS,
        depth_max=20,
        states_max=10_000,
        extra_properties=(
            Property.always(
                "STRAG-2", "confirmed iff the last K decided rounds were slow", _naive_window_rule
            ),
            Property.always(
                "STRAG-2/report",
                "Confirmed exactly when the window fills",
                _confirmed_exactly_when_window_fills,
                scope="step",
            ),
        ),
        require_exhaustive=True,
    )
    assert result.labels_unfired == ()


# --- whole groups: every round a timing verdict can produce -------------------------------


@attrs.frozen
class _Group:
    confirmation: ConfirmationState
    window: tuple[frozenset[int], ...]  # slow sets of the last <= K decided rounds


def _rounds(peers: int) -> tuple[Round, ...]:
    """Undecided, or decided naming any strict minority (VERDICT-25: timing verdicts
    attribute only while the others still form a strict majority)."""
    minorities = [
        frozenset(c)
        for size in range(0, (peers - 1) // 2 + 1)
        for c in itertools.combinations(range(peers), size)
    ]
    return (Round(False), *(Round(True, m) for m in minorities))


class _GroupSystem:
    properties: tuple[Property, ...] = ()
    labels: tuple[str, ...] = ()

    def fire(self, state: _Group, event: Round) -> Firing[_Group]:
        confirmation, effects = confirmation_step(state.confirmation, event)
        window = state.window
        if event.decided:
            window = (*window, event.slow)[-confirmation.rounds_required :]
        return Firing(_Group(confirmation, window), effects, ())


def _group_naive_rule(state: _Group) -> bool:
    c = state.confirmation
    full = len(state.window) == c.rounds_required
    naive = frozenset(p for p in range(c.peer_count) if full and all(p in s for s in state.window))
    return c.confirmed == naive


def _group_reports_match(
    previous: _Group, event: object, state: _Group, effects: tuple[object, ...]
) -> bool:
    before, after = previous.confirmation.confirmed, state.confirmation.confirmed
    newly = sorted(e.peer for e in effects if isinstance(e, Confirmed))
    gone = sorted(e.peer for e in effects if isinstance(e, Recovered))
    return newly == sorted(after - before) and gone == sorted(before - after)


def _explore_group(peers: int, required: int) -> int:
    start = _Group(confirmation_start(peers, required), ())
    rounds = _rounds(peers)
    result = explore(
        _GroupSystem(),
        [start],
        lambda state: rounds,
        depth_max=4 * required + 4,
        states_max=200_000,
        extra_properties=(
            Property.always("STRAG-2", "confirmed set = naive rule per peer", _group_naive_rule),
            Property.always(
                "STRAG-2/minority",
                "confirmed peers are a strict minority of the group",
                lambda s: 2 * len(s.confirmation.confirmed) < peers,
            ),
            Property.always("STRAG-4", "one report per change", _group_reports_match, scope="step"),
            Property.sometimes(
                "STRAG-12/group",
                "a straggler is confirmed",
                lambda s: bool(s.confirmation.confirmed),
            ),
        ),
        require_exhaustive=True,
    )
    return result.states_count


@pytest.mark.parametrize(
    ("peers", "required"),
    [(3, 1), (3, 2), (3, 3), (4, 1), (4, 2), (4, 3), (5, 1), (5, 2), (5, 3)],
)
def test_STRAG_2_STRAG_4_groups_follow_the_naive_rule_exhaustively(
    peers: int, required: int
) -> None:
    assert _explore_group(peers, required) > 1


def test_STRAG_9_a_machine_that_forgets_to_reset_is_caught_with_a_shortest_trace() -> None:
    """Non-vacuity: the same table bound to a planted bug (a clean round in SUSPECT keeps the
    count) fails STRAG-9 after the shortest trace: K = 2, slow, clean."""
    machine = straggler_machine()
    buggy = Actions(states=StragglerState)
    for guard in machine.actions.guards.values():
        buggy.guard(guard)
    for name, effect in machine.actions.effects.items():
        if name != "reset_count":
            buggy.effect(effect)
    for predicate in machine.actions.predicates.values():
        buggy.predicate(predicate)

    def reset_count(context: PeerContext, event: object) -> tuple[PeerContext, tuple[object, ...]]:
        return context, ()

    buggy.effect(reset_count)
    mutant = build_machine(machine.table, buggy)
    with pytest.raises(ModelCheckFailure) as failure:
        explore(
            mutant,
            [mutant.initial_state(PeerContext(0, 2))],
            lambda state: PEER_EVENTS,
            depth_max=10,
            states_max=100,
        )
    assert failure.value.trace is not None
    assert failure.value.property_id in {"STRAG-7", "STRAG-9"}
    assert failure.value.trace.events == (SLOW_ROUND, CLEAN_ROUND)


def _naive_confirmed(history: list[Round], peers: int, required: int) -> frozenset[int]:
    decided = [r for r in history if r.decided]
    if len(decided) < required:
        return frozenset()
    last = decided[-required:]
    return frozenset(p for p in range(peers) if all(p in r.slow for r in last))


def _alphabet(peers: int) -> list[Round]:
    # Timing verdicts name a strict minority: at most one slow peer among 3 or 4.
    return [Round(False), Round(True)] + [Round(True, frozenset({p})) for p in range(peers)]


@pytest.mark.parametrize("peers", [3, 4])
@pytest.mark.parametrize("required", [1, 2, 3])
def test_STRAG_2_STRAG_4_machine_equals_naive_history_rule_exhaustively(
    peers: int, required: int
) -> None:
    witnessed_confirm = witnessed_recover = witnessed_undecided_hold = False
    length = 5 if peers == 3 else 4
    for sequence in itertools.product(_alphabet(peers), repeat=length):
        state = confirmation_start(peers, required)
        history: list[Round] = []
        confirmed_before = frozenset[int]()
        for observed in sequence:
            state, effects = confirmation_step(state, observed)
            history.append(observed)
            expected = _naive_confirmed(history, peers, required)
            assert state.confirmed == expected, (sequence, history)
            assert all(0 <= c <= required for c in state.consecutive)  # bounded state
            newly = [e.peer for e in effects if isinstance(e, Confirmed)]
            gone = [e.peer for e in effects if isinstance(e, Recovered)]
            assert newly == sorted(expected - confirmed_before)  # one report per confirmation
            assert gone == sorted(confirmed_before - expected)
            if not observed.decided:
                assert not effects
                witnessed_undecided_hold |= bool(confirmed_before)
            witnessed_confirm |= bool(newly)
            witnessed_recover |= bool(gone)
            confirmed_before = expected
    # sometimes-properties: the checks above were not vacuous
    assert witnessed_confirm and witnessed_recover and witnessed_undecided_hold


def test_STRAG_3_rounds_come_from_timing_verdicts() -> None:
    slow = round_from_verdict(classify_timing([10.0, 10.2, 30.0, 10.1]))
    assert slow == Round(True, frozenset({2}))
    assert round_from_verdict(classify_timing([10.0, 10.2, 10.1, 10.1])) == Round(True)
    group_wide = round_from_verdict(classify_timing([30.0, 30.2, 10.0, 30.1]))
    assert group_wide == Round(False)
    with pytest.raises(ValueError, match="names no slow peers"):
        Round(False, frozenset({1}))
    with pytest.raises(ValueError, match=r"slow peers \[7\] outside a group of 4"):
        confirmation_step(confirmation_start(4, 2), Round(True, frozenset({7})))
    with pytest.raises(ValueError, match="rounds_required must be >= 1, got 0"):
        confirmation_start(4, 0)


def _mesh_groups(shape: tuple[int, ...]) -> tuple[list[frozenset[int]], list[int]]:
    """Every 1-D slice of an n-D mesh of ranks (rows, columns, ...)."""
    ranks = list(range(int(__import__("math").prod(shape))))
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
