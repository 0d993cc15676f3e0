"""Exact fields, boundary values and error messages of scout.core.straggler (spec/straggler.md,
spec/replay.md STRAG-2..STRAG-6, STRAG-20): the behaviour the survivors of the core-straggler
mutation run showed no test pinned down (tests/mutation/survivors.md, "Stragglers").

The machine's invariant predicates are also checked on their own, on steps the real machine
never takes: a weakened predicate passes every reachable step, so only a step that violates
the clause shows that the predicate states it."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout.core.machine import MachineState
from scout.core.straggler import (
    Confirmed,
    GroupObservation,
    GroupTiming,
    Localization,
    LocalizationStatus,
    Recovered,
    SequentialConfig,
    TestBounds,
    check_evidence,
    confirmation_start,
    confirmation_step,
    family_observations,
    localize,
    localize_hosts,
    localize_live,
    straggler_machine,
)
from scout.core.straggler import machine as actions
from scout.core.straggler.confirmation import evidence_spread
from scout.core.straggler.model import (
    CLEAR,
    CONFIRMED,
    NO_EVIDENCE,
    SUSPECT,
    Check,
    PeerContext,
    PeerEvent,
)
from scout.core.verdict import MISSING, TimingConfig, classify_timing

#: checks_to_confirm_min = 2, checks_to_recover_min = 2 (cap 2).
SMALL = TestBounds(allowance=1, confirm_bound=4, recovery_allowance=1, recovery_bound=3, slow_clip=3, fast_clip=1)
#: One check of 10 confirms (checks_to_confirm_min = 1), recovery needs 10 checks: the check
#: counter runs up to 10, so its exact value shows in every report.
WIDE = TestBounds(allowance=0, confirm_bound=10, recovery_allowance=1, recovery_bound=10, slow_clip=10, fast_clip=0)


def _message(text: str) -> str:
    return "^" + re.escape(text) + "$"


# --- TestBounds and PeerContext: every bad value is refused, naming it (STRAG-4, STRAG-7) -----


@pytest.mark.parametrize(
    ("field", "value", "least"),
    [
        ("allowance", -1, 0),
        ("confirm_bound", 0, 1),
        ("recovery_allowance", -1, 0),
        ("recovery_bound", 0, 1),
        ("slow_clip", 0, 1),
        ("fast_clip", -1, 0),
        ("allowance", 1.5, 0),
        ("fast_clip", True, 0),
        ("confirm_bound", "4", 1),
    ],
)
def test_STRAG_4_test_bounds_refuse_a_bad_field_naming_it(field: str, value: object, least: int) -> None:
    fields: dict[str, object] = {
        "allowance": 0, "confirm_bound": 4, "recovery_allowance": 1,
        "recovery_bound": 3, "slow_clip": 3, "fast_clip": 1,
    }  # fmt: skip
    fields[field] = value
    with pytest.raises(ValueError, match=_message(f"TestBounds.{field} must be an int >= {least} (milli-nepers), got {value!r}")):
        TestBounds(**fields)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    allowance=st.integers(0, 50),
    confirm_bound=st.integers(1, 50),
    recovery_allowance=st.integers(0, 50),
    recovery_bound=st.integers(1, 50),
    excess=st.integers(1, 50),
    fast_clip=st.integers(0, 50),
)
def test_STRAG_4_test_bounds_accept_every_value_at_their_least(
    allowance: int, confirm_bound: int, recovery_allowance: int, recovery_bound: int, excess: int, fast_clip: int
) -> None:
    """Every valid combination is accepted, down to bounds of 1 and a clip one above the
    allowance."""
    if recovery_allowance + fast_clip < 1:
        fast_clip = 1
    bounds = TestBounds(allowance, confirm_bound, recovery_allowance, recovery_bound, allowance + excess, fast_clip)
    assert bounds.checks_to_confirm_min == math.ceil(confirm_bound / excess)
    assert bounds.checks_to_recover_min == math.ceil(recovery_bound / (recovery_allowance + fast_clip))


def test_STRAG_4_test_bounds_least_values_exactly() -> None:
    """Bounds of 1, a clip one above the allowance, a recovery step of exactly 1 (from the
    recovery allowance or from the fast clip alone)."""
    assert TestBounds(0, 1, 0, 1, 1, 1).checks_to_recover_min == 1
    assert TestBounds(0, 1, 1, 1, 1, 0).checks_to_confirm_min == 1
    assert TestBounds(5, 1, 1, 2, 6, 0).checks_to_recover_min == 2


def test_STRAG_4_test_bounds_a_recovery_step_below_one_is_refused_naming_why() -> None:
    with pytest.raises(ValueError) as refused:
        TestBounds(allowance=0, confirm_bound=1, recovery_allowance=0, recovery_bound=1, slow_clip=1, fast_clip=0)
    assert str(refused.value) == (
        "TestBounds.recovery_allowance + fast_clip must be >= 1: otherwise a confirmed "
        "straggler can never recover"
    )


def test_STRAG_7_peer_context_refuses_values_outside_its_ranges_naming_them() -> None:
    with pytest.raises(ValueError, match=_message("peer must be a position >= 0, got -1")):
        PeerContext(-1, SMALL)
    with pytest.raises(ValueError, match=_message("score must lie in 0..confirm_bound=4, got 5")):
        PeerContext(0, SMALL, score=5)
    with pytest.raises(ValueError, match=_message("recovery must lie in 0..recovery_bound-1=2, got 3")):
        PeerContext(0, SMALL, recovery=3)
    with pytest.raises(ValueError, match=_message("checks must lie in 0..2, got 3")):
        PeerContext(0, SMALL, checks=3)
    edge = PeerContext(0, SMALL, score=4, recovery=2, checks=2)
    assert (edge.score, edge.recovery, edge.checks) == (4, 2, 2)


# --- SequentialConfig (STRAG-4) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("slow_ratio", True, "SequentialConfig.slow_ratio must be a finite ratio >= 1, got True"),
        ("clip_ratio", "1.5", "SequentialConfig.clip_ratio must be a finite ratio >= 1, got '1.5'"),
        ("noise_checks", 0, "SequentialConfig.noise_checks must be an int >= 1, got 0"),
        ("noise_checks", 2.5, "SequentialConfig.noise_checks must be an int >= 1, got 2.5"),
        ("noise_checks", "16", "SequentialConfig.noise_checks must be an int >= 1, got '16'"),
        ("noise_checks", True, "SequentialConfig.noise_checks must be an int >= 1, got True"),
        ("confirm_evidence", 1e306, "SequentialConfig.confirm_evidence must be finite in milli-nepers (x 1000), got 1e+306"),
        ("recovery_evidence", 1e306, "SequentialConfig.recovery_evidence must be finite in milli-nepers (x 1000), got 1e+306"),
        # An int too large for a float is refused by name, not an OverflowError from math.isfinite.
        ("slow_ratio", 10**400, f"SequentialConfig.slow_ratio must be a finite ratio >= 1, got {10**400!r}"),
        ("confirm_evidence", 10**400, f"SequentialConfig.confirm_evidence must be a finite number > 0, got {10**400!r}"),
        ("noise_spread", 10**400, f"SequentialConfig.noise_spread must be a number > 0 or None, got {10**400!r}"),
    ],
)
def test_STRAG_4_configuration_errors_name_the_field_and_the_value(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=_message(message)):
        SequentialConfig(**{field: value})  # type: ignore[arg-type]


def test_STRAG_4_configuration_least_values_are_allowed() -> None:
    """Ratios of exactly 1, one noise check, evidence bounds that round to 0 milli-nepers (a
    bound is then 1, not more)."""
    config = SequentialConfig(slow_ratio=1.0, fast_ratio=1.0, recovery_ratio=1.0 + 1e-3, noise_checks=1)
    assert config.bounds() == TestBounds(
        allowance=0, confirm_bound=1000, recovery_allowance=1, recovery_bound=600, slow_clip=405, fast_clip=0
    )
    tiny = SequentialConfig(confirm_evidence=1e-4, recovery_evidence=1e-4).bounds()
    assert (tiny.confirm_bound, tiny.recovery_bound) == (1, 1)
    state = confirmation_start(3, config)
    for check in range(3):
        state, _ = confirmation_step(state, [0.0, 0.1 * check, None])
    assert state.recent == ((0,), (200,), ())  # a window of one check


# --- evidence of one check (STRAG-2, STRAG-3) -------------------------------------------------


def test_STRAG_2_STRAG_3_evidence_fields_exactly() -> None:
    verdicts = {"hidden.0": classify_timing([10.0, 10.0, 10.0, 10.0, 10.0])}
    # A time of 0 is valid; a non-number time, or a missing one, is no evidence for that peer
    # only, and the peers after it still get theirs.
    times = {"hidden.0": (10.0, "10", 0.0, MISSING, 20.0)}
    evidence = check_evidence(times, verdicts, 1.0, 5)
    assert evidence == (0.0, None, math.log(1.0 / 11.0), None, math.log(21.0 / 11.0))
    # A floor of 0 is allowed: the plain log ratio.
    plain = {"hidden.0": (10.0, 20.0, 10.0, 10.0, 5.0)}
    assert check_evidence(plain, verdicts, 0.0, 5) == (0.0, math.log(2.0), 0.0, 0.0, math.log(0.5))
    with pytest.raises(ValueError, match=_message("verdicts for comparisons without times: ['output']")):
        check_evidence(times, {**verdicts, "output": verdicts["hidden.0"]}, 1.0, 5)
    with pytest.raises(ValueError, match=_message("floor_ms must be a finite number >= 0, got -0.5")):
        check_evidence(times, verdicts, -0.5, 5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-2000, 2000), min_size=3, max_size=20))
def test_STRAG_2_the_spread_needs_three_values_and_is_the_scaled_median_difference(values: list[int]) -> None:
    differences = sorted(abs(b - a) for a, b in zip(values, values[1:], strict=False))
    middle = len(differences) // 2
    median = differences[middle] if len(differences) % 2 else (differences[middle - 1] + differences[middle]) / 2
    assert evidence_spread(values) == pytest.approx(1.4826 * median / math.sqrt(2) / 1000)
    assert evidence_spread(values[:2]) is None


def test_STRAG_2_three_values_have_a_spread_two_do_not() -> None:
    assert evidence_spread([0, 100, 0]) == pytest.approx(1.4826 * 0.1 / math.sqrt(2))
    assert evidence_spread([0, 100]) is None and evidence_spread([]) is None


# --- the group's sequential test (STRAG-4, STRAG-10, STRAG-14) --------------------------------


def test_STRAG_4_a_group_of_one_peer_and_exact_errors() -> None:
    state = confirmation_start(1, TestBounds(0, 1, 1, 1, 1, 0))
    assert state.peer_count == 1
    # One peer of one is never a strict minority: held at the bound, never confirmed.
    state, effects = confirmation_step(state, [1.0])
    assert effects == () and state.peers[0].control is SUSPECT and state.scores == (1,)
    with pytest.raises(ValueError, match=_message("peer_count must be >= 1, got 0")):
        confirmation_start(0)
    with pytest.raises(ValueError) as refused:
        confirmation_step(confirmation_start(3), [0.0, 0.0])
    assert str(refused.value) == (
        "evidence for 2 peers in a group of 3: one entry (None for no evidence) per peer"
    )
    with pytest.raises(ValueError, match=_message("a log ratio must be finite, got inf")):
        confirmation_step(confirmation_start(3), [0.0, math.inf, 0.0])


def test_STRAG_10_a_check_without_evidence_adds_nothing_to_the_recent_evidence() -> None:
    state = confirmation_start(3, SequentialConfig(noise_checks=3))
    for evidence in ([0.1, None, 0.0], [0.2, None, None], [None, 0.05, 0.0], [0.4, None, 0.0], [0.3, None, 0.0]):
        state, _ = confirmation_step(state, evidence)
    assert state.recent == ((200, 400, 300), (50,), (0, 0, 0))


# --- the machine's effects: the check counter in every report (STRAG-11..STRAG-13) ------------


def _run(bounds: TestBounds, checks: list[PeerEvent]) -> tuple[MachineState[PeerContext], list[object]]:
    machine = straggler_machine()
    state = machine.initial_state(PeerContext(0, bounds))
    reports: list[object] = []
    for event in checks:
        state, effects = machine.step(state, event)
        reports += effects
    return state, reports


def test_STRAG_11_reports_count_the_checks_since_the_last_report_exactly() -> None:
    # Two checks of 5 confirm (the first suspects; no evidence is not counted): counted 2. A
    # confirmation starts the count again: ten checks recover, counted 10; the count starts
    # again from the recovery, so the next confirmation, two checks later, is counted 2.
    events: list[PeerEvent] = [Check(5), NO_EVIDENCE, Check(5)]
    state, reports = _run(WIDE, events)
    assert reports == [Confirmed(0, 10, 2)]
    assert state.control is CONFIRMED and (state.context.score, state.context.recovery, state.context.checks) == (10, 0, 0)
    events += [Check(-5)] * 9  # recovery +1 each (fast_clip 0): recovers at the 10th
    state, reports = _run(WIDE, events)
    assert reports == [Confirmed(0, 10, 2)] and state.context.checks == 9 and state.context.recovery == 9
    events += [Check(0), Check(3), Check(10)]
    state, reports = _run(WIDE, events)
    assert reports == [Confirmed(0, 10, 2), Recovered(0, 10), Confirmed(0, 10, 2)]
    assert state.context.checks == 0


# --- the invariant predicates state their clauses (spec/straggler.md invariants) --------------


def _state(control: str, score: int = 0, recovery: int = 0, checks: int = 0, bounds: TestBounds = SMALL) -> MachineState[PeerContext]:
    return MachineState(control, PeerContext(0, bounds, score=score, recovery=recovery, checks=checks))


def test_STRAG_7_score_matches_control_refuses_each_mismatch() -> None:
    ok = actions.score_matches_control
    assert ok(_state(CLEAR)) and ok(_state(SUSPECT, 1)) and ok(_state(SUSPECT, 4))
    assert ok(_state(CONFIRMED, 4, recovery=2))
    assert not ok(_state(CLEAR, score=3)) and not ok(_state(CLEAR, recovery=1))
    assert not ok(_state(SUSPECT, 0)) and not ok(_state(SUSPECT, 2, recovery=1))
    assert not ok(_state(CONFIRMED, 3)) and not ok(_state(CONFIRMED, 0, recovery=1))


def test_STRAG_8_to_STRAG_14_each_step_predicate_refuses_a_step_that_breaks_its_clause() -> None:
    clear, suspect, at_bound = _state(CLEAR), _state(SUSPECT, 2, checks=1), _state(SUSPECT, 4, checks=1)
    confirmed = _state(CONFIRMED, 4)
    # STRAG-9: a CONFIRMED state with the wrong recovery score.
    assert actions.recovery_is_a_cusum(confirmed, Check(0), _state(CONFIRMED, 4, recovery=1), ())
    assert not actions.recovery_is_a_cusum(confirmed, Check(0), _state(CONFIRMED, 4, recovery=2), ())
    # STRAG-10: no evidence that moves the state, even without a report.
    assert not actions.no_evidence_changes_nothing(suspect, NO_EVIDENCE, clear, ())
    assert actions.no_evidence_changes_nothing(suspect, NO_EVIDENCE, suspect, ())
    # STRAG-11: the wrong kind of report for the change, even naming the right peer.
    assert not actions.one_report_per_change(suspect, Check(3), confirmed, (Recovered(0, 2),))
    assert not actions.one_report_per_change(confirmed, Check(-1), clear, (Confirmed(0, 4, 2),))
    assert actions.one_report_per_change(suspect, Check(3), confirmed, (Confirmed(0, 4, 2),))
    # STRAG-12: a confirmation at the bound after too few checks (needs 2: this is the 1st).
    assert not actions.evidence_bound(clear, Check(3), confirmed, (Confirmed(0, 4, 1),))
    assert actions.evidence_bound(_state(SUSPECT, 2, checks=1), Check(3), confirmed, (Confirmed(0, 4, 2),))
    # STRAG-13: a recovery after too few checks.
    assert not actions.recovery_bound(confirmed, Check(-1), clear, (Recovered(0, 1),))
    assert actions.recovery_bound(_state(CONFIRMED, 4, 1, checks=1), Check(-1), clear, (Recovered(0, 2),))
    # STRAG-19 (witness): only a check without room that leaves the peer SUSPECT at the bound.
    held = actions.held_at_bound_without_room
    assert held(suspect, Check(3, room=False), at_bound, ())
    assert not held(suspect, Check(3, room=True), at_bound, ())
    assert not held(suspect, Check(3, room=False), suspect, ())
    assert not held(suspect, Check(3, room=True), confirmed, ())
    assert not held(suspect, Check(3, room=False), confirmed, ())
    assert not held(suspect, Check(-1, room=True), clear, ())
    assert not held(at_bound, NO_EVIDENCE, at_bound, ())


def test_STRAG_15_to_STRAG_18_each_witness_is_exactly_its_step() -> None:
    clear, suspect, confirmed = _state(CLEAR), _state(SUSPECT, 2), _state(CONFIRMED, 4)
    assert actions.straggler_confirmed(confirmed) and not actions.straggler_confirmed(clear)
    recovers = actions.confirmed_straggler_recovers
    assert recovers(confirmed, Check(-1), clear, ())
    assert not recovers(clear, Check(0), clear, ())
    assert not recovers(confirmed, Check(3), confirmed, ())
    assert not recovers(suspect, Check(-1), clear, ())
    held = actions.confirmation_held_without_evidence
    assert held(confirmed, NO_EVIDENCE, confirmed, ())
    assert not held(confirmed, Check(3), confirmed, ())
    assert not held(clear, NO_EVIDENCE, clear, ())
    dropped = actions.suspicion_dropped
    assert dropped(suspect, Check(-1), clear, ())
    assert not dropped(clear, Check(0), clear, ())
    assert not dropped(suspect, Check(3), suspect, ())
    assert not dropped(confirmed, Check(-1), clear, ())


# --- localization (STRAG-5, STRAG-6, STRAG-20): every field of every answer -------------------


def test_STRAG_5_every_answer_of_localize_exactly() -> None:
    a, b, c = frozenset({0, 1}), frozenset({0, 2}), frozenset({1, 2, 3})
    hosts = {0: "n0", 1: "n0", 2: "n1", 3: "n1"}
    assert localize([GroupObservation(a, True), GroupObservation(c, False)]) == Localization(
        LocalizationStatus.INCONCLUSIVE,
        candidates=(0, 1),
        reason="one slow group: a slow collective cannot be narrowed below its group",
    )
    assert localize([GroupObservation(a, True), GroupObservation(b, True)], hosts) == Localization(
        LocalizationStatus.LOCALIZED, 0, "n0", (0, 1), (0,)
    )
    # A rank without a host on record: named, with no host.
    assert localize([GroupObservation(a, True), GroupObservation(b, True)], {1: "n0"}) == Localization(
        LocalizationStatus.LOCALIZED, 0, None, (), (0,)
    )
    ab = frozenset({0, 1, 2})
    assert localize([GroupObservation(ab, True), GroupObservation(frozenset({0, 1, 3}), True)]) == Localization(
        LocalizationStatus.AMBIGUOUS,
        candidates=(0, 1),
        reason="several ranks are common to every slow group and to no healthy group",
    )
    assert localize(
        [GroupObservation(a, True), GroupObservation(b, True), GroupObservation(frozenset({0, 3}), False)]
    ) == Localization(
        LocalizationStatus.INCONCLUSIVE,
        candidates=(0,),
        reason="the ranks common to every slow group also sit in healthy groups",
    )
    assert localize([GroupObservation(a, True), GroupObservation(frozenset({2, 3}), True)]) == Localization(
        LocalizationStatus.INCONCLUSIVE,
        candidates=(),
        reason="no rank is common to every slow group (more than one fault?)",
    )
    assert localize([GroupObservation(a, False), GroupObservation(b, None)]) == Localization(LocalizationStatus.NORMAL)


def test_STRAG_20_every_answer_of_localize_hosts_exactly() -> None:
    hosts = {0: "A", 1: "A", 2: "B", 3: "B", 4: "C", 5: "D"}
    g = GroupObservation
    # Both slow groups hold hosts A and B; a healthy group clears B: A, with its ranks.
    slow_ab = [g(frozenset({0, 2}), True), g(frozenset({1, 3}), True)]
    assert localize_hosts([*slow_ab, g(frozenset({3, 4}), False)], hosts) == Localization(
        LocalizationStatus.LOCALIZED, host="A", host_ranks=(0, 1), candidates=(0, 1)
    )
    assert localize_hosts(slow_ab, hosts) == Localization(
        LocalizationStatus.AMBIGUOUS,
        candidates=(0, 1, 2, 3),
        reason="several hosts have ranks in every slow group and none in a healthy group",
    )
    assert localize_hosts([*slow_ab, g(frozenset({1, 2}), False)], hosts) == Localization(
        LocalizationStatus.INCONCLUSIVE,
        candidates=(0, 1, 2, 3),
        reason="no host has ranks in every slow group and none in a healthy group",
    )
    assert localize_hosts([g(frozenset({0, 1}), False), g(frozenset({4}), None)], hosts) == Localization(
        LocalizationStatus.NORMAL
    )
    with pytest.raises(ValueError, match=_message("ranks [6, 7] have no host: give every rank's host")):
        localize_hosts([g(frozenset({0, 6}), True), g(frozenset({7}), False)], hosts)


def test_STRAG_20_families_are_judged_apart_with_the_given_config_and_keep_their_names() -> None:
    timings = [
        GroupTiming(frozenset({0}), "tp", 10.0, "tp0"),
        GroupTiming(frozenset({1}), "tp", 10.0, "tp1"),
        GroupTiming(frozenset({2}), "tp", 11.5, "tp2"),
        GroupTiming(frozenset({3}), "dp", 100.0, "dp0"),
        GroupTiming(frozenset({4}), "dp", 100.0, "dp1"),
        GroupTiming(frozenset({5}), "dp", None, "dp2"),
        GroupTiming(frozenset({6}), "dp", 100.0, "dp3"),
    ]
    observations = family_observations(timings)
    assert observations == (
        GroupObservation(frozenset({3}), None, "dp0"),
        GroupObservation(frozenset({4}), None, "dp1"),
        GroupObservation(frozenset({5}), None, "dp2"),
        GroupObservation(frozenset({6}), None, "dp3"),
        GroupObservation(frozenset({0}), False, "tp0"),
        GroupObservation(frozenset({1}), False, "tp1"),
        GroupObservation(frozenset({2}), True, "tp2"),
    )
    lenient = TimingConfig(relative_floor=0.2)
    assert [o.slow for o in family_observations(timings, lenient)] == [None] * 4 + [False] * 3
    with pytest.raises(ValueError, match=_message("group 'tp9' has no members")):
        GroupTiming(frozenset(), "tp", 1.0, "tp9")


def test_STRAG_20_live_localization_uses_its_config_and_prefers_the_rank_answer() -> None:
    # Rows {0,1},{2,3},{4,5} and columns {0,2,4},{1,3,5}: rank 0 slows its row and column 1.15x.
    rows = [frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5})]
    columns = [frozenset({0, 2, 4}), frozenset({1, 3, 5}), frozenset({6, 7, 8})]
    timings = [GroupTiming(m, "rows", 11.5 if 0 in m else 10.0) for m in rows]
    timings += [GroupTiming(m, "columns", 11.5 if 0 in m else 10.0) for m in columns]
    assert localize_live(timings).rank == 0
    assert localize_live(timings, config=TimingConfig(relative_floor=0.2)) == Localization(LocalizationStatus.NORMAL)
    # No rank and no host explains two slow rows of five: the rank answer (its reason) stands.
    five = [frozenset({2 * j, 2 * j + 1}) for j in range(5)]
    two = [GroupTiming(m, "rows", 11.5 if m & {0, 2} else 10.0) for m in five]
    hosts = {r: f"h{r}" for r in range(10)}
    found = localize_live(two, hosts)
    assert found == localize(family_observations(two), hosts)
    assert found.reason == "no rank is common to every slow group (more than one fault?)"
