"""Recipe catalog, schedule, readiness decision, evidence combination and coverage
(spec/replay.md REC-*, READY-*, EVID-*). Pure: these run without torch."""

from __future__ import annotations

import itertools
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout.core.recipes import (
    Catalog,
    DueRecipe,
    EvidenceKind,
    Intervals,
    ReadinessDecision,
    RecipeClass,
    RecipeId,
    RecipeResult,
    ReplayStatus,
    Schedule,
    Segment,
    combine_evidence,
    coverage,
    decide_readiness,
    optimizer_window,
)
from scout.core.verdict import MISSING, Status, classify_exact

HIDDEN = RecipeClass.HIDDEN


def test_REC_1_catalog_lists_recipes_in_slot_order() -> None:
    catalog = Catalog(hidden_layer_count=3, optimizer_slice_count=2)
    assert [str(r) for r in catalog.recipes()] == [
        "embedding",
        "hidden.0",
        "hidden.1",
        "hidden.2",
        "output",
        "optimizer.0",
        "optimizer.1",
    ]
    assert sorted(catalog.recipes()) == list(catalog.recipes())
    for recipe in catalog.recipes():
        assert RecipeId.parse(str(recipe)) == recipe


@pytest.mark.parametrize("text", ["hidden", "hidden.x", "embedding.1", "decoder.0", ""])
def test_REC_1_bad_recipe_names_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match="recipe"):
        RecipeId.parse(text)


@pytest.mark.parametrize(
    "field", ["embedding_steps", "hidden_steps", "output_steps", "optimizer_steps"]
)
@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_REC_2_intervals_are_validated_and_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field} must be an int >= 0, got {value!r}"):
        Intervals(**{field: value})  # type: ignore[arg-type]


def test_REC_3_due_is_a_function_of_the_step() -> None:
    schedule = Schedule(
        Catalog(hidden_layer_count=3, optimizer_slice_count=2),
        Intervals(embedding_steps=4, hidden_steps=2, output_steps=0, optimizer_steps=3),
    )
    due = {s: [str(d.recipe) for d in schedule.due(s)] for s in range(1, 13)}
    assert due == {
        1: [],
        2: ["hidden.0"],
        3: ["optimizer.0"],
        4: ["embedding", "hidden.1"],
        5: [],
        6: ["hidden.2", "optimizer.1"],
        7: [],
        8: ["embedding", "hidden.0"],
        9: ["optimizer.0"],
        10: ["hidden.1"],
        11: [],
        12: ["embedding", "hidden.2", "optimizer.1"],
    }
    with pytest.raises(ValueError, match="numbered from 1, got 0"):
        schedule.due(0)


@settings(max_examples=100, deadline=None)
@given(asked=st.lists(st.integers(1, 30), max_size=40), origin=st.integers(0, 3))
def test_REC_3_REPLAY_10_a_step_asked_again_gets_the_answer_of_a_fresh_schedule(asked: list[int], origin: int) -> None:
    """REPLAY-10: the schedule keeps its last answer; in any order of asking, every answer is the
    one a schedule never asked before gives, and asking the same step again returns it whole."""
    catalog = Catalog(hidden_layer_count=3, optimizer_slice_count=2)
    intervals = Intervals(embedding_steps=4, hidden_steps=2, output_steps=0, optimizer_steps=3)
    schedule = Schedule(catalog, intervals, origin_step=origin)
    for step in asked:
        if step <= origin:
            with pytest.raises(ValueError, match="not after this schedule's origin"):
                schedule.due(step)
            continue
        answer = schedule.due(step)
        assert answer == Schedule(catalog, intervals, origin_step=origin).due(step)
        assert schedule.due(step) is answer
    with pytest.raises(ValueError, match="numbered from 1, got 0"):
        schedule.due(0)


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(0, 5),
    slices=st.integers(0, 3),
    embedding=st.booleans(),
    output=st.booleans(),
    intervals=st.tuples(*[st.integers(0, 4)] * 4),
    start=st.integers(1, 40),
)
def test_REC_3_REC_4_every_window_of_a_cycle_covers_every_scheduled_recipe(
    layers: int, slices: int, embedding: bool, output: bool, intervals: tuple[int, ...], start: int
) -> None:
    catalog = Catalog(layers, embedding, output, slices)
    schedule = Schedule(catalog, Intervals(*intervals))
    length = schedule.cycle_length_steps()
    seen = set()
    for step in range(start, start + length):
        due = schedule.due(step)
        classes = [d.recipe.recipe_class for d in due]
        assert len(classes) == len(set(classes))  # at most one recipe per class
        seen.update(d.recipe for d in due)
    assert seen == set(catalog.recipes()) - set(schedule.uncovered())
    # and the bound is tight: a shorter window misses something whenever a class has > 0 recipes
    if length > 1:
        shorter = {d.recipe for s in range(1, length) for d in schedule.due(s)}
        assert shorter != seen


def test_REC_5_not_applicable_is_not_pending_and_not_ready_is_inconclusive() -> None:
    stage = Catalog(hidden_layer_count=2, has_embedding=False, has_output=False)
    assert stage.not_applicable() == (RecipeClass.EMBEDDING, RecipeClass.OUTPUT, RecipeClass.EXPERT)
    schedule = Schedule(stage, Intervals(embedding_steps=1, hidden_steps=1, output_steps=1))
    assert all(
        d.recipe.recipe_class not in (RecipeClass.EMBEDDING, RecipeClass.OUTPUT)
        for s in range(1, 20)
        for d in schedule.due(s)
    )
    results = [
        RecipeResult(RecipeId(HIDDEN, 0), 1, Status.AGREE),
        RecipeResult(RecipeId(HIDDEN, 1), 2, Status.INCONCLUSIVE, reason="not-ready: 1:not_ready"),
        RecipeResult(RecipeId(RecipeClass.OPTIMIZER, 0), 2, Status.AGREE),
    ]
    view = coverage(stage, results, since_step=0)
    assert view.pending == (RecipeId(HIDDEN, 1),)
    assert view.not_applicable == (RecipeClass.EMBEDDING, RecipeClass.OUTPUT, RecipeClass.EXPERT)
    assert not view.complete and not view.clean
    assert view.inconclusive == (results[1],) and view.attributed == ()
    with pytest.raises(ValueError, match="embedding at step 3: not in this rank's catalog"):
        coverage(stage, [RecipeResult(RecipeId(RecipeClass.EMBEDDING), 3, Status.AGREE)], 0)


def test_REC_4_coverage_complete_and_clean_since_a_boundary() -> None:
    catalog = Catalog(
        hidden_layer_count=2, has_embedding=False, has_output=False, optimizer_slice_count=0
    )
    results = [
        RecipeResult(RecipeId(HIDDEN, 0), 1, Status.ATTRIBUTED, (2,), ("output",)),
        RecipeResult(RecipeId(HIDDEN, 1), 2, Status.AGREE),
        RecipeResult(RecipeId(HIDDEN, 0), 3, Status.AGREE),
        RecipeResult(RecipeId(HIDDEN, 1), 4, Status.AGREE),
    ]
    everything = coverage(catalog, results, 0)
    assert everything.complete and not everything.clean
    assert everything.accepted == ((RecipeId(HIDDEN, 0), 3), (RecipeId(HIDDEN, 1), 4))
    after_first = coverage(catalog, results, 1)
    assert after_first.complete and after_first.clean
    assert not coverage(catalog, results, 3).complete


def _brute_window(check_index: int, numels: list[int], slice_numel: int) -> list[tuple[int, int]]:
    """(parameter, element) pairs of the window, by walking the flat space one element at a time."""
    flat = [(p, e) for p, n in enumerate(numels) for e in range(n)]
    if not flat:
        return []
    start = (check_index * slice_numel) % len(flat)
    return [flat[(start + j) % len(flat)] for j in range(min(slice_numel, len(flat)))]


def test_REC_6_optimizer_window_exhaustive_on_small_layouts() -> None:
    layouts = [[], [0], [5], [3, 0, 4], [1, 1, 1], [7, 2], [0, 6, 0, 1]]
    for numels, slice_numel, check_index in itertools.product(layouts, range(1, 9), range(0, 12)):
        segments = optimizer_window(check_index, numels, slice_numel)
        got = [(s.parameter_index, e) for s in segments for e in range(s.start, s.stop)]
        assert got == _brute_window(check_index, numels, slice_numel), (
            numels,
            slice_numel,
            check_index,
        )
        assert all(s.start < s.stop for s in segments)


def test_REC_6_every_element_is_replayed_after_enough_checks() -> None:
    numels = [10, 3, 0, 7]
    slice_numel = 6
    covered = set()
    for check in range(math.ceil(sum(numels) / slice_numel)):
        for s in optimizer_window(check, numels, slice_numel):
            covered.update((s.parameter_index, e) for e in range(s.start, s.stop))
    assert len(covered) == sum(numels)
    assert optimizer_window(0, [4], 10) == (Segment(0, 0, 4),)
    with pytest.raises(ValueError, match="slice_numel must be >= 1, got 0"):
        optimizer_window(0, [4], 0)


def test_REC_7_uncovered_lists_recipes_of_disabled_classes() -> None:
    schedule = Schedule(Catalog(hidden_layer_count=1), Intervals(embedding_steps=0))
    assert schedule.uncovered() == (RecipeId(RecipeClass.EMBEDDING),)


OK = ReplayStatus.OK


def test_READY_2_proceed_only_when_all_ready_and_digests_agree() -> None:
    assert decide_readiness([7, 7, 7, 7], [OK] * 4).proceed
    mismatch = decide_readiness([7, 7, 8, 7], [OK] * 4)
    assert (
        not mismatch.proceed
        and mismatch.reason == "readiness-mismatch: peers [2] describe other work"
    )
    split = decide_readiness([7, 7, 8, 8], [OK] * 4)
    assert not split.proceed and split.reason == "readiness-no-majority"
    silent = decide_readiness([7, MISSING, 7, 7], [OK, MISSING, OK, OK])
    assert not silent.proceed and silent.reason == "not-ready: 1:missing"
    too_large = decide_readiness([7, 9, 7, 7], [OK, ReplayStatus.CAPTURE_TOO_LARGE, OK, OK])
    assert too_large.reason == "not-ready: 1:capture_too_large" and too_large.not_ready == (1,)
    assert not decide_readiness([7], [OK]).proceed  # a singleton compares nothing (VERDICT-4)


@settings(max_examples=300, deadline=None)
@given(
    digests=st.lists(st.sampled_from([1, 2, 3, MISSING]), min_size=1, max_size=7),
    data=st.data(),
)
def test_READY_2_READY_5_decision_is_symmetric_and_never_attributes(digests, data) -> None:
    statuses = data.draw(
        st.lists(
            st.sampled_from([OK, ReplayStatus.NOT_READY]),
            min_size=len(digests),
            max_size=len(digests),
        )
    )
    decision = decide_readiness(digests, statuses)
    # proceed exactly when everyone is ready with one digest and more than one peer
    expected = (
        len(digests) > 1
        and all(s == OK for s in statuses)
        and MISSING not in digests
        and len(set(digests)) == 1
    )
    assert decision.proceed == expected
    assert decision.proceed or decision.reason
    # every peer seeing the same rows in another order decides the same (the decision depends on
    # the multiset of rows only)
    order = data.draw(st.permutations(range(len(digests))))
    again = decide_readiness([digests[i] for i in order], [statuses[i] for i in order])
    assert again.proceed == decision.proceed


R = RecipeId(HIDDEN, 1)


def test_EVID_2_any_non_ok_status_is_inconclusive_not_attributed() -> None:
    evidence = {EvidenceKind.OUTPUT: [5, 5, 6, 5]}
    result = combine_evidence(R, 3, [OK, OK, ReplayStatus.NONDETERMINISTIC, OK], evidence)
    assert result.status is Status.INCONCLUSIVE and result.outliers == ()
    assert result.reason == "replay-status 2:nondeterministic"
    missing = combine_evidence(R, 3, [OK, MISSING, OK], {EvidenceKind.OUTPUT: [1, 1, 1]})
    assert missing.status is Status.INCONCLUSIVE and missing.reason == "replay-status 1:missing"


def test_EVID_3_EVID_4_groups_voted_separately_and_attributions_united() -> None:
    evidence = {
        EvidenceKind.PARAMETERS: [1, 1, 1, 1],
        EvidenceKind.OUTPUT: [5, 5, 6, 5],
        EvidenceKind.INPUT_GRADIENT: [8, 9, 8, 8],
        EvidenceKind.PARAMETER_GRADIENT: [3, 3, 3, 3],
    }
    result = combine_evidence(R, 3, [OK] * 4, evidence)
    assert result.status is Status.ATTRIBUTED
    assert result.outliers == (1, 2)
    assert result.sources == ("output", "input_gradient")
    healthy = combine_evidence(R, 3, [OK] * 4, {k: [4] * 4 for k in evidence})
    assert healthy.status is Status.AGREE and healthy.accepted
    split = combine_evidence(R, 3, [OK] * 4, {EvidenceKind.OUTPUT: [1, 1, 2, 2]})
    assert split.status is Status.INCONCLUSIVE and split.reason == "output:no-majority"
    both = combine_evidence(
        R, 3, [OK] * 4, {EvidenceKind.OUTPUT: [1, 1, 2, 2], EvidenceKind.RNG: [1, 1, 1, 2]}
    )
    assert both.status is Status.ATTRIBUTED and both.outliers == (3,) and both.sources == ("rng",)
    with pytest.raises(ValueError, match="evidence output has 3 values for 4 peers"):
        combine_evidence(R, 3, [OK] * 4, {EvidenceKind.OUTPUT: [1, 1, 1]})


def test_SELF_4_the_live_group_holds_codes_voted_by_decide_self_check() -> None:
    signed = {EvidenceKind.OUTPUT: [4] * 4}
    match, differ, unchecked = 1, 2, 0
    checked = combine_evidence(R, 3, [OK] * 4, {**signed, EvidenceKind.LIVE: [match] * 4})
    assert checked.status is Status.AGREE and checked.self_checked
    # A transient fault in rank 2's live call: named by the live group alone.
    live = combine_evidence(R, 3, [OK] * 4, {**signed, EvidenceKind.LIVE: [match, match, differ, match]})
    assert (live.status, live.outliers, live.sources) == (Status.ATTRIBUTED, (2,), ("live",))
    # With the replay's own evidence naming another rank, both are named, each with its source.
    both = combine_evidence(R, 3, [OK] * 4, {EvidenceKind.OUTPUT: [4, 5, 4, 4],
                                              EvidenceKind.LIVE: [match, match, differ, match]})
    assert (both.outliers, both.sources) == ((1, 2), ("output", "live"))
    # Nobody took part: decided by the other evidence alone, and not self-checked.
    off = combine_evidence(R, 3, [OK] * 4, {**signed, EvidenceKind.LIVE: [unchecked] * 4})
    assert off.status is Status.AGREE and not off.self_checked
    # The majority's live path does not reproduce: could not check, never a fault.
    noisy = combine_evidence(R, 3, [OK] * 4, {**signed, EvidenceKind.LIVE: [differ, differ, differ, match]})
    assert (noisy.status, noisy.reason) == (Status.INCONCLUSIVE, "live:not-reproducible")
    # Only an AGREE result is self-checked.
    other = combine_evidence(R, 3, [OK] * 4, {EvidenceKind.OUTPUT: [4, 4, 5, 5], EvidenceKind.LIVE: [match] * 4})
    assert other.status is Status.INCONCLUSIVE and not other.self_checked


def test_EVID_5_singleton_group_is_inconclusive() -> None:
    result = combine_evidence(R, 1, [OK], {EvidenceKind.OUTPUT: [1]})
    assert result.status is Status.INCONCLUSIVE and result.reason == "singleton"


# --------------------------------------------------------------------------------------------
# Exact fields, boundaries and error messages (tests/mutation/survivors.md, "Recipes")
# --------------------------------------------------------------------------------------------

EXPERT = RecipeClass.EXPERT


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((HIDDEN, -1), "recipe index must be >= 0, got -1"),
        ((RecipeClass.EMBEDDING, 2), "embedding has one recipe; got index 2"),
        ((RecipeClass.OUTPUT, 0, 4), "only expert recipes take n_exec; output got 4"),
        ((EXPERT, 0, 0), "an expert recipe needs n_exec >= 1 rows, got 0"),
        ((EXPERT, 0, True), "an expert recipe needs n_exec >= 1 rows, got True"),
        ((EXPERT, 0, 2.5), "an expert recipe needs n_exec >= 1 rows, got 2.5"),
    ],
    ids=["negative-index", "indexed-embedding", "n_exec-on-output", "zero-rows", "bool-rows", "float-rows"],
)
def test_REC_1_MOE_1_bad_recipe_ids_are_errors_that_name_the_value(
    args: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        RecipeId(*args)  # type: ignore[arg-type]


def test_MOE_1_one_row_is_the_smallest_expert_recipe() -> None:
    recipe = RecipeId(EXPERT, 2, 1)
    assert str(recipe) == "expert.2@1" and RecipeId.parse("expert.2@1") == recipe


def test_REC_1_unknown_recipe_class_error_lists_the_classes() -> None:
    with pytest.raises(ValueError) as info:
        RecipeId.parse("decoder.0")
    assert str(info.value) == (
        "unknown recipe 'decoder.0': the classes are "
        "embedding, hidden, output, optimizer, expert, dispatch, canary"
    )


@pytest.mark.parametrize("text", ["expert", "expert.3", "expert.x@4", "expert.3@x", "expert.3@4@5"])
def test_MOE_1_malformed_expert_names_say_what_the_form_is(text: str) -> None:
    with pytest.raises(ValueError) as info:
        RecipeId.parse(text)
    assert str(info.value) == (
        f"recipe {text!r}: an expert recipe is expert.<slot>@<n_exec>, e.g. expert.0@64"
    )


def test_MOE_1_catalog_expert_keys_are_int_pairs_validated_and_never_repeated() -> None:
    assert Catalog(0, expert_keys=[[0, 4], (1, 64)]).expert_keys == ((0, 4), (1, 64))  # type: ignore[list-item]
    with pytest.raises(ValueError, match=re.escape("expert keys repeat: [(0, 4), (1, 8), (0, 4)]")):
        Catalog(0, expert_keys=((0, 4), (1, 8), (0, 4)))
    with pytest.raises(ValueError, match="n_exec >= 1 rows, got 0"):
        Catalog(0, expert_keys=((0, 4), (1, 0)))


def test_REC_2_REC_3_an_interval_of_one_checks_every_class_at_every_step() -> None:
    schedule = Schedule(Catalog(hidden_layer_count=2), Intervals(1, 1, 1, 1))
    assert schedule.due(1) == (
        DueRecipe(RecipeId(RecipeClass.EMBEDDING), 1, 0),
        DueRecipe(RecipeId(HIDDEN, 0), 1, 0),
        DueRecipe(RecipeId(RecipeClass.OUTPUT), 1, 0),
        DueRecipe(RecipeId(RecipeClass.OPTIMIZER, 0), 1, 0),
    )
    assert schedule.due(6)[1] == DueRecipe(RecipeId(HIDDEN, 1), 6, 5)  # k = 6 // 1 - 1 = 5


@pytest.mark.parametrize("step", [0, -3, True, 2.0, "4"])
def test_REC_3_steps_are_ints_numbered_from_1(step: object) -> None:
    schedule = Schedule(Catalog(hidden_layer_count=1), Intervals(1, 1, 1, 1))
    with pytest.raises(ValueError, match=f"^steps are numbered from 1, got {re.escape(repr(step))}$"):
        schedule.due(step)  # type: ignore[arg-type]


def test_REC_4_nothing_active_means_a_cycle_of_zero_steps() -> None:
    nothing = Schedule(Catalog(0, has_embedding=False, has_output=False, optimizer_slice_count=0))
    assert nothing.active_classes() == () and nothing.cycle_length_steps() == 0
    disabled = Schedule(Catalog(3), Intervals(0, 0, 0, 0, 0))
    assert disabled.cycle_length_steps() == 0 and disabled.due(50) == ()


def test_READY_1_schedule_contract_states_every_class_size_and_interval() -> None:
    catalog = Catalog(2, has_output=False, optimizer_slice_count=3, expert_keys=((0, 4), (1, 64)))
    schedule = Schedule(catalog, Intervals(embedding_steps=5, hidden_steps=7, expert_steps=9))
    assert schedule.describe() == (
        "scout-replay-schedule",
        1,
        (
            ("embedding", 1, 5),
            ("hidden", 2, 7),
            ("output", 0, 50),
            ("optimizer", 3, 50),
            ("expert", 2, 9),
            ("dispatch", 0, 0),  # job-level checks: never scheduled by a rank (interval 0)
            ("canary", 0, 0),
        ),
        ((0, 4), (1, 64)),
    )
    assert Schedule(catalog, Intervals(hidden_steps=8)).describe() != schedule.describe()


def test_READY_2_READY_5_decision_carries_the_verdict_and_the_not_ready_positions() -> None:
    assert decide_readiness([7, 7], [OK, OK]) == ReadinessDecision(True, classify_exact([7, 7]), None)
    not_ready = decide_readiness([7, 7, 7], [OK, ReplayStatus.NOT_READY, MISSING])
    assert not_ready == ReadinessDecision(
        False, classify_exact([7, 7, 7]), "not-ready: 1:not_ready,2:missing", (1, 2)
    )
    mismatch = decide_readiness([7, 7, 8, 7], [OK] * 4)
    assert mismatch == ReadinessDecision(
        False,
        classify_exact([7, 7, 8, 7]),
        "readiness-mismatch: peers [2] describe other work",
        (),
    )
    with pytest.raises(ValueError, match="^3 digests but 2 status codes$"):
        decide_readiness([7, 7, 7], [OK, OK])


def test_EVID_2_replay_status_reason_names_every_peer_that_is_not_ok_and_unknown_codes() -> None:
    # status codes travel as ints (EVID-1); 9 is no ReplayStatus
    result = combine_evidence(R, 7, [0, 9, 2, MISSING], {EvidenceKind.OUTPUT: [1, 1, 1, 1]})
    assert result == RecipeResult(
        R, 7, Status.INCONCLUSIVE, reason="replay-status 1:code-9,2:not_ready,3:missing"
    )
    with pytest.raises(ValueError, match="^no peers: a recipe result needs at least one status code$"):
        combine_evidence(R, 7, [], {})


@pytest.mark.parametrize(
    ("statuses", "evidence", "expected"),
    [
        pytest.param(
            [OK], {EvidenceKind.OUTPUT: [1]}, (Status.INCONCLUSIVE, (), (), "singleton"), id="singleton"
        ),
        pytest.param(
            [OK] * 3,
            {EvidenceKind.OUTPUT: [1, 1, 2]},
            (Status.ATTRIBUTED, (2,), ("output",), None),
            id="attributed",
        ),
        pytest.param(
            [OK] * 4,
            {EvidenceKind.OUTPUT: [1, 1, 2, 2], EvidenceKind.RNG: [3, 4, 3, 4]},
            (Status.INCONCLUSIVE, (), (), "rng:no-majority output:no-majority"),
            id="two-inconclusive-groups",
        ),
        pytest.param(
            [OK] * 3, {EvidenceKind.OUTPUT: [1, 1, 1]}, (Status.AGREE, (), (), None), id="agree"
        ),
        pytest.param(
            [OK] * 3, {}, (Status.INCONCLUSIVE, (), (), "no-evidence-groups"), id="no-evidence-groups"
        ),
    ],
)
def test_EVID_4_EVID_5_every_result_names_its_recipe_step_and_exact_fields(
    statuses: list[object], evidence: dict[EvidenceKind, list[object]], expected: tuple[object, ...]
) -> None:
    """A recipe with no evidence group compared is not accepted: nothing was checked."""
    status, outliers, sources, reason = expected
    assert combine_evidence(R, 7, statuses, evidence) == RecipeResult(
        R, 7, status, outliers, sources, reason  # type: ignore[arg-type]
    )


def test_REC_4_coverage_keeps_the_latest_accepted_step_in_any_order_and_states_its_boundary() -> None:
    catalog = Catalog(1, has_embedding=False, has_output=False, optimizer_slice_count=0)
    hidden = RecipeId(HIDDEN, 0)
    bad = RecipeResult(hidden, 4, Status.ATTRIBUTED, (1,), ("output",))
    results = [RecipeResult(hidden, 5, Status.AGREE), bad, RecipeResult(hidden, 3, Status.AGREE)]
    view = coverage(catalog, results, since_step=2)
    assert view.since_step == 2
    assert view.accepted == ((hidden, 5),)
    assert view.attributed == (bad,) and view.inconclusive == () and view.pending == ()


def test_REC_6_bad_optimizer_window_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="^check_index must be >= 0, got -1$"):
        optimizer_window(-1, [4], 2)
    with pytest.raises(ValueError, match=re.escape("parameter sizes must be >= 0, got [3, -1]")):
        optimizer_window(0, [3, -1], 2)


@settings(max_examples=300, deadline=None)
@given(
    layers=st.integers(0, 5),
    experts=st.integers(0, 13),
    intervals=st.tuples(*[st.integers(0, 4)] * 5),
    per_check=st.integers(1, 6),
    start=st.integers(1, 40),
)
def test_REC_3_REC_4_MOE_10_lanes_replay_several_experts_a_check_and_a_window_of_a_cycle_covers_them(
    layers: int, experts: int, intervals: tuple[int, ...], per_check: int, start: int
) -> None:
    """REC-3 with ``m_e`` expert recipes a check: the ``k``-th expert check replays recipes
    ``(k m_e + j) mod n_e``, ``j < min(m_e, n_e)`` -- no recipe twice -- and any window of the
    cycle (``ceil(n_e / m_e) i_e`` for the experts) covers every scheduled recipe. The lanes
    (REPLAY-9) split a check into rounds with one recipe per class each, lane 0 first."""
    from scout.core.replay_round import lanes

    catalog = Catalog(layers, True, True, 1, expert_keys=[(slot, 4) for slot in range(experts)])
    schedule = Schedule(catalog, Intervals(*intervals, expert_recipes_per_check=per_check))
    length = schedule.cycle_length_steps()
    seen = set()
    for step in range(start, start + length):
        due = schedule.due(step)
        assert len({d.recipe for d in due}) == len(due)
        split = lanes(due)
        for index, lane in enumerate(split):  # lane j: every class's j-th due recipe, in due's order
            expected = [d for d in due if [e for e in due if e.recipe.recipe_class is d.recipe.recipe_class]
                        .index(d) == index]
            assert list(lane) == expected
        assert sum(len(lane) for lane in split) == len(due)
        experts_due = [d for d in due if d.recipe.recipe_class is RecipeClass.EXPERT]
        assert len(experts_due) in (0, min(per_check, experts))
        assert len(split) == (max(1, len(experts_due)) if due else 0)
        seen.update(d.recipe for d in due)
    assert seen == set(catalog.recipes()) - set(schedule.uncovered())
    if experts and intervals[4]:
        assert schedule.class_cycle_steps(RecipeClass.EXPERT) == math.ceil(experts / per_check) * intervals[4]


def test_REC_3_READY_1_the_recipes_a_check_is_part_of_the_schedule_contract() -> None:
    """Peers that replay a different number of expert recipes a check disagree on the schedule
    (READY-1); with one a check the contract is what it was before lanes."""
    catalog = Catalog(0, False, False, 0, expert_keys=[(slot, 4) for slot in range(6)])
    one, three = (Schedule(catalog, Intervals(expert_steps=1, expert_recipes_per_check=m)) for m in (1, 3))
    assert one.describe() == Schedule(catalog, Intervals(expert_steps=1)).describe()
    assert one.describe() != three.describe()
    with pytest.raises(ValueError, match="expert_recipes_per_check must be an int >= 1, got 0"):
        Intervals(expert_recipes_per_check=0)


@settings(max_examples=100, deadline=None)
@given(layers=st.integers(1, 9), lanes_=st.integers(1, 9), interval=st.integers(1, 5), origin=st.integers(0, 60),
       start=st.integers(1, 30))
def test_REC_3_REC_4_BUDGET_2_BUDGET_5_a_schedule_counts_from_its_origin_and_hidden_lanes_shorten_its_cycle(
    layers: int, lanes_: int, interval: int, origin: int, start: int
) -> None:
    """A cadence that starts at a cycle boundary (BUDGET-5) counts its steps from there: its
    step ``o + s`` is due what the same schedule from step 0 is due at ``s``, and any window of
    its cycle -- ``interval x ceil(L / m)`` with ``m`` hidden lanes (BUDGET-2) -- covers every
    recipe; no step at or before the origin is asked of it."""
    checks = math.ceil(layers / lanes_)
    intervals = Intervals(interval * checks, interval, interval * checks, interval * checks,
                          hidden_recipes_per_check=lanes_)
    catalog = Catalog(layers)
    shifted, plain = Schedule(catalog, intervals, origin), Schedule(catalog, intervals)
    assert shifted.cycle_length_steps() == plain.cycle_length_steps() == interval * checks
    seen = set()
    for step in range(start, start + shifted.cycle_length_steps()):
        due = shifted.due(origin + step)
        assert [(d.recipe, d.check_index) for d in due] == [(d.recipe, d.check_index) for d in plain.due(step)]
        assert all(d.step == origin + step for d in due)
        hidden = [d for d in due if d.recipe.recipe_class is RecipeClass.HIDDEN]
        assert len(hidden) in (0, min(lanes_, layers)) and len({d.recipe for d in hidden}) == len(hidden)
        seen.update(d.recipe for d in due)
    assert seen == set(catalog.recipes())
    if origin:
        with pytest.raises(ValueError, match=f"step {origin} is not after this schedule's origin, step {origin}"):
            shifted.due(origin)


def test_REC_3_READY_1_BUDGET_5_the_origin_and_the_hidden_lanes_are_part_of_the_schedule_contract() -> None:
    catalog = Catalog(4)
    plain = Schedule(catalog, Intervals(8, 2, 8, 8))
    assert plain.describe() == Schedule(catalog, Intervals(8, 2, 8, 8), 0).describe()  # unchanged without them
    assert Schedule(catalog, Intervals(8, 2, 8, 8), 16).describe() != plain.describe()
    assert Schedule(catalog, Intervals(4, 2, 4, 4, hidden_recipes_per_check=2)).describe() != plain.describe()
    with pytest.raises(ValueError, match="hidden_recipes_per_check must be an int >= 1, got 0"):
        Intervals(hidden_recipes_per_check=0)
    with pytest.raises(ValueError, match="origin_step must be an int >= 0, got -1"):
        Schedule(catalog, origin_step=-1)
