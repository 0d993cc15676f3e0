"""The checkpoint gate on a worked run (tests/gate_story.py), its bad-input errors (GATE-16),
the bridge from verdicts, and the JSON codec."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout.core.recipes import EvidenceKind, RecipeId, RecipeResult, ReplayStatus, combine_evidence
from scout.core.verdict import MISSING, Status, classify_exact
from scout.gate.codec import CodecError, state_from_json, state_to_json
from scout.gate.model import (
    CheckpointCaptured,
    CheckpointId,
    CycleBoundary,
    GateConfig,
    GateReport,
    GateReportKind,
    GateState,
    GroupVerdict,
    Outcome,
    Recipe,
    RecipeVerdicts,
    Restart,
    Trust,
    TrustChange,
    is_complete_and_clean,
)
from scout.gate.recorder import GateWriter, MemoryRecorder
from scout.gate.results import group_verdict, recipe_verdicts
from scout.gate.step import GateInputError, check_event, initial_state, step
from tests.gate_story import CONFIG, clean_cycle, run_story, verdicts
from tests.gate_story import story as story_events


def final_state():
    return list(run_story())[-1][1]


def trust_table(state) -> dict[str, str]:
    return {str(entry.id): entry.trust.value for entry in state.context.checkpoints}


def test_GATE_1_story_promotes_only_after_two_clean_cycles() -> None:
    promotions = [
        (event.step, effect.checkpoint)
        for event, _state, effects in run_story()
        for effect in effects
        if isinstance(effect, TrustChange) and effect.after is Trust.RECOVERY_VERIFIED
    ]
    assert promotions == [(200, CheckpointId(0, 100)), (300, CheckpointId(1, 200))]
    assert trust_table(final_state()) == {
        "t0/s100": "RECOVERY_VERIFIED",
        "t0/s150": "QUARANTINED",
        "t0/s200": "QUARANTINED",
        "t0/s300": "QUARANTINED",
        "t0/s400": "QUARANTINED",
        "t0/s450": "QUARANTINED",
        "t1/s200": "RECOVERY_VERIFIED",
    }


def test_GATE_8_certificate_lists_the_two_cycles_replays() -> None:
    entry = final_state().context.entry(CheckpointId(0, 100))
    certificate = entry.certificate
    assert certificate is not None
    assert (certificate.before.cycle, certificate.before.start_step, certificate.before.end_step) == (1, 0, 100)
    assert (certificate.after.cycle, certificate.after.start_step, certificate.after.end_step) == (2, 100, 200)
    assert [(r.recipe, r.step) for r in certificate.after.replays] == [("embedding", 110), ("hidden", 120), ("head", 130)]
    assert all(v.outcome is Outcome.AGREE for r in certificate.before.replays for v in r.verdicts)
    assert is_complete_and_clean(CONFIG, certificate.before) and is_complete_and_clean(CONFIG, certificate.after)


def test_GATE_5_inconclusive_is_reported_as_unchecked_and_blocks_promotion() -> None:
    reports = [
        effect for _event, _state, effects in run_story() for effect in effects if isinstance(effect, GateReport)
    ]
    kinds = [(r.kind, r.recipes, r.groups) for r in reports]
    assert kinds == [
        (GateReportKind.UNCHECKED, ("hidden",), ("dp1",)),
        (GateReportKind.SDC, ("hidden",), ("dp0",)),
    ]
    assert "not SDC" in reports[0].detail
    assert "quarantined job-wide: t0/s150, t0/s200, t0/s300, t0/s400" in reports[1].detail


def test_GATE_4_sdc_quarantines_every_unverified_checkpoint_but_not_the_verified() -> None:
    for event, state, effects in run_story():
        if isinstance(event, RecipeVerdicts) and event.result_class.value == "sdc":
            quarantined = {e.checkpoint for e in effects if isinstance(e, TrustChange)}
            assert quarantined == {CheckpointId(0, s) for s in (150, 200, 300, 400)}
            assert state.control is GateState.TAINTED
            assert state.context.entry(CheckpointId(0, 100)).trust is Trust.RECOVERY_VERIFIED
            return
    pytest.fail("the story has an SDC")


def test_missing_recipe_result_blocks_promotion_and_is_reported_unchecked() -> None:
    state = initial_state(CONFIG)
    events = [
        CycleBoundary(0),
        *clean_cycle(1, 0),
        CycleBoundary(100),
        CheckpointCaptured(100),
        *clean_cycle(2, 100)[:2],  # "head" never reports
    ]
    for event in events:
        state, _ = step(state, event)
    state, effects = step(state, CycleBoundary(200))
    assert state.context.entry(CheckpointId(0, 100)).trust is Trust.CAPTURED
    reports = [e for e in effects if isinstance(e, GateReport)]
    assert [(r.kind, r.recipes) for r in reports] == [(GateReportKind.UNCHECKED, ("head",))]


def test_replay_results_map_onto_group_verdicts_through_one_conversion() -> None:
    """GATE-4, GATE-5: a replay's per-group result becomes the gate's group verdict."""
    recipe = RecipeId.parse("hidden.0")
    statuses = [int(ReplayStatus.OK)] * 3

    def result(signatures: list[object]) -> RecipeResult:
        return combine_evidence(recipe, 5, statuses[: len(signatures)], {EvidenceKind.OUTPUT: signatures})

    assert group_verdict("g", result([7, 7, 7])).outcome is Outcome.AGREE
    # SELF-7, GATE-4: whether every peer's live output was reproduced reaches the gate's verdict.
    for checked in (True, False):
        agreed = RecipeResult(recipe, 5, Status.AGREE, self_checked=checked)
        assert group_verdict("g", agreed) == GroupVerdict("g", Outcome.AGREE, self_checked=checked)
    attributed = group_verdict("g", result([7, 7, 9]))
    assert (attributed.outcome, attributed.outliers) == (Outcome.ATTRIBUTED, (2,))
    silent = group_verdict("g", result([7, 7, MISSING]))
    assert (silent.outcome, silent.reason) == (Outcome.INCONCLUSIVE, "output:missing-evidence")
    assert group_verdict("g", result([7])).outcome is Outcome.INCONCLUSIVE  # singleton never certifies
    assert group_verdict("g", MISSING).outcome is Outcome.MISSING
    with pytest.raises(TypeError, match="RecipeResult"):
        group_verdict("g", classify_exact([7, 7, 7]))  # type: ignore[arg-type]
    config = GateConfig("job", ("hidden.0",), ("g", "h"))
    event = recipe_verdicts(config, "hidden.0", 1, 5, {"g": result([7, 7, 9])})
    assert [(v.group, v.outcome) for v in event.verdicts] == [("g", Outcome.ATTRIBUTED), ("h", Outcome.MISSING)]
    with pytest.raises(ValueError, match="does not apply"):
        recipe_verdicts(config, "hidden.0", 1, 5, {"x": result([7, 7, 7])})


# ------------------------------------------------------------------------------------------
# GATE-16: bad input is refused with an error naming the value; the state is unchanged.
# ------------------------------------------------------------------------------------------


def _open_state():
    state = initial_state(CONFIG)
    for event in (CycleBoundary(0), *clean_cycle(1, 0), CycleBoundary(100), CheckpointCaptured(100)):
        state, _ = step(state, event)
    return state


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (RecipeVerdicts("attention", 2, 120, verdicts()), "unknown recipe id 'attention'"),
        (RecipeVerdicts("embedding", 1, 120, verdicts()), "cycle 1, which has ended"),
        (RecipeVerdicts("embedding", 3, 120, verdicts()), "cycle 3, which has not begun"),
        (RecipeVerdicts("embedding", 2, 50, verdicts()), "at step 50, before the open cycle 2"),
        (RecipeVerdicts("embedding", 2, 120, verdicts()[:1]), r"carries verdicts for groups \['dp0'\]"),
        (CheckpointCaptured(100), "second capture for step 100"),
        (CheckpointCaptured(90), "older than the last capture"),
        (CycleBoundary(100), "with no steps in it"),
        (Restart(120), "no restorable checkpoint there"),
        ("boundary", "not a gate event"),
    ],
)
def test_GATE_16_bad_input_is_refused_naming_the_value(event, message) -> None:
    gate = GateWriter(MemoryRecorder(), _open_state())
    before = gate.state
    with pytest.raises(GateInputError, match=message):
        gate.apply(event)
    assert gate.state is before


def test_GATE_16_results_after_a_restart_belong_to_an_ended_cycle() -> None:
    state, _ = step(_open_state(), Restart(100))
    with pytest.raises(GateInputError, match="no cycle is open"):
        check_event(state, RecipeVerdicts("embedding", 2, 120, verdicts()))


def test_GATE_16_restart_below_verified_and_to_quarantined_are_refused() -> None:
    state = final_state()
    with pytest.raises(GateInputError, match="older than RECOVERY_VERIFIED checkpoint t1/s200"):
        check_event(state, Restart(100))
    with pytest.raises(GateInputError, match="discard RECOVERY_VERIFIED"):
        check_event(state, Restart(None))
    tainted = [s for e, s, _ in run_story() if isinstance(e, CheckpointCaptured) and e.step == 450][0]
    with pytest.raises(GateInputError, match=r"t0/s400 QUARANTINED"):
        check_event(tainted, Restart(400))


def test_config_rejects_empty_repeated_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="catalog is empty"):
        GateConfig("j", (), ("g",))
    with pytest.raises(ValueError, match="recipe ids repeat"):
        GateConfig("j", ("a", "a"), ("g",))
    with pytest.raises(ValueError, match="must be a non-empty list"):
        GateConfig("j", (Recipe("a", ("h",)),), ("g",))


def test_a_recipe_that_does_not_apply_to_a_group_is_not_missing_there() -> None:
    """docs/prior-art.md lesson 4: 'not applicable on this stage' is configuration, not silence."""
    config = GateConfig("j", (Recipe("embedding", ("stage0",)), "hidden"), ("stage0", "stage1"))
    state = initial_state(config)
    state, _ = step(state, CycleBoundary(0))
    state, effects = step(state, RecipeVerdicts("embedding", 1, 0, (GroupVerdict("stage0", Outcome.AGREE),)))
    assert state.control is GateState.CHECKING and not [e for e in effects if isinstance(e, GateReport)]


# ------------------------------------------------------------------------------------------
# Codec
# ------------------------------------------------------------------------------------------


def test_codec_round_trips_every_state_of_the_story() -> None:
    for _event, state, _effects in run_story():
        encoded = json.loads(json.dumps(state_to_json(state)))
        assert state_from_json(encoded) == state


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("control",), "RUNNING", "control: 'RUNNING' is not one of"),
        (("checkpoints", 0, "trust"), "TRUSTED", r"checkpoints\[0\].trust: 'TRUSTED' is not one of"),
        (("checkpoints", 0, "checkpoint", "step"), "100", r"checkpoints\[0\].checkpoint.step: expected an int"),
        (("covered",), ["attention"], "unknown recipe id"),
    ],
)
def test_codec_names_the_bad_field(path, value, message) -> None:
    encoded = state_to_json(final_state())
    target = encoded
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(CodecError, match=message):
        state_from_json(encoded)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(Outcome)), st.booleans()), max_size=40))
def test_GATE_random_runs_keep_the_state_invariants(script) -> None:
    """Longer random runs than the explorer's: every accepted step keeps the state-scope
    invariants; every refused one names its problem."""
    from scout.gate.step import gate_machine

    machine = gate_machine()
    state_props = [p for p in machine.properties if p.scope == "state" and p.kind == "always"]
    step_props = [p for p in machine.properties if p.scope == "step" and p.kind == "always"]
    state = initial_state(CONFIG)
    for choice, outcome, flag in script:
        context = state.context
        now = context.last_step
        recipe = CONFIG.recipe_ids[choice % 3]
        if choice <= 2 and context.cycle_start_step is not None:
            event = RecipeVerdicts(recipe, context.cycle, now, verdicts(dp1=outcome) if flag else verdicts())
        elif choice == 3:
            event = CheckpointCaptured(now + (10 if flag else 0))
        elif choice == 4:
            event = CycleBoundary(now + 10)
        else:
            restorable = [e.id.step for e in context.checkpoints if e.trust.value in ("CAPTURED", "CANDIDATE", "RECOVERY_VERIFIED")]
            event = Restart(restorable[-1] if restorable and flag else (restorable[0] if restorable else None))
        try:
            new, effects = step(state, event)
        except GateInputError as error:
            assert str(error)
            continue
        for prop in step_props:
            assert prop.predicate(state, event, new, effects), prop.describe()
        for prop in state_props:
            assert prop.predicate(new), prop.describe()
        state = new


def test_group_verdict_validates_outliers() -> None:
    with pytest.raises(ValueError, match="exactly an ATTRIBUTED verdict names outliers"):
        GroupVerdict("g", Outcome.AGREE, (1,))


# ------------------------------------------------------------------------------------------
# The restart cause and the closed effects
# ------------------------------------------------------------------------------------------


def test_GATE_36_the_restart_cause_is_kept_in_every_generation_of_its_timeline(tmp_path) -> None:
    from scout.core.failure import FailureClass
    from scout.gate.recorder import GateWriter, read_gate

    causes = [(state.context.timeline, state.context.restart_cause) for _event, state, _effects in run_story()]
    assert {cause for timeline, cause in causes if timeline == 0} == {None}  # the first start has none
    assert {cause for timeline, cause in causes if timeline == 1} == {FailureClass.SDC}
    with GateWriter.open(tmp_path / "gate", CONFIG) as writer:
        for event in story_events():
            writer.apply(event)
            if isinstance(event, Restart):
                break
    state = read_gate(tmp_path / "gate", CONFIG)
    assert state is not None and state.context.restart_cause is FailureClass.SDC
    # A manifest written before the cause was recorded reads as "no cause", not as damage.
    encoded = state_to_json(state)
    del encoded["restart_cause"]
    assert state_from_json(encoded).context.restart_cause is None


@pytest.mark.parametrize("cause", ["sdc", None, 3])
def test_GATE_36_GATE_35_a_cause_that_is_not_a_failure_class_is_refused_naming_it(cause: object) -> None:
    with pytest.raises(TypeError, match=rf"cause must be a scout.core.failure.FailureClass member.*{cause!r}"):
        Restart(100, cause)  # type: ignore[arg-type]
    encoded = state_to_json(final_state())
    encoded["restart_cause"] = "bad-luck"
    with pytest.raises(CodecError, match="restart_cause: 'bad-luck' is not one of"):
        state_from_json(encoded)


def test_GATE_37_every_effect_is_a_gate_effect_and_a_stray_one_is_refused() -> None:
    from scout.gate.model import GateReport, Persist
    from scout.gate.step import gate_effects

    seen = {type(effect) for _event, _state, effects in run_story() for effect in effects}
    assert seen == {Persist, TrustChange, GateReport}
    with pytest.raises(TypeError, match=r"not a GateEffect .*GATE-37"):
        gate_effects((Persist(), "report this"))


# ------------------------------------------------------------------------------------------
# GATE-42: a checkpoint whose files are gone is lost (spec/recovery.md RECOVERY-7 falls back)
# ------------------------------------------------------------------------------------------


def test_GATE_42_losing_the_newest_verified_checkpoint_leaves_the_older_one_to_restart_from() -> None:
    from scout.core.failure import FailureClass
    from scout.gate.model import CheckpointLost
    from scout.gate.recovery import Choice, recover

    state = final_state()  # t0/s100 and t1/s200 verified, timeline 1, a cycle open
    assert recover(state, FailureClass.SDC).checkpoint == CheckpointId(1, 200)
    with pytest.raises(GateInputError, match="older than RECOVERY_VERIFIED checkpoint t1/s200"):
        check_event(state, Restart(100))
    lost, effects = step(state, CheckpointLost(CheckpointId(1, 200), "no complete checkpoint at /ckpt/x"))
    assert [type(e).__name__ for e in effects] == ["Persist", "TrustChange"]
    change = effects[1]
    assert (change.checkpoint, change.before, change.after, change.certificate) == (
        CheckpointId(1, 200), Trust.RECOVERY_VERIFIED, Trust.LOST, None)
    assert "no complete checkpoint at /ckpt/x" in change.reason and "never restored" in change.reason
    assert lost.control is state.control
    entry = lost.context.entry(CheckpointId(1, 200))
    assert (entry.trust, entry.certificate) == (Trust.LOST, None)
    # Everything else is as it was (GATE-42): the cycle, the timeline, the other entries.
    assert lost.context.replace(checkpoints=state.context.checkpoints) == state.context
    decision = recover(lost, FailureClass.SDC)
    assert (decision.choice, decision.checkpoint) == (Choice.VERIFIED, CheckpointId(0, 100))
    restarted, _ = step(lost, Restart(100, FailureClass.SDC))  # GATE-3 now allows the older one
    assert restarted.context.timeline == 2
    # Losing the last verified one leaves initialization (RECOVERY: none), which is then allowed.
    none_left, _ = step(lost, CheckpointLost(CheckpointId(0, 100)))
    assert recover(none_left, FailureClass.SDC).choice is Choice.NONE
    step(none_left, Restart(None, FailureClass.SDC))


def test_GATE_42_GATE_16_only_a_restorable_checkpoint_the_gate_records_can_be_lost() -> None:
    from scout.gate.model import CheckpointLost

    state = final_state()
    with pytest.raises(GateInputError, match=r"t0/s150 is QUARANTINED, never restored, so it cannot be lost"):
        check_event(state, CheckpointLost(CheckpointId(0, 150)))
    with pytest.raises(GateInputError, match=r"t7/s7 cannot be lost: the gate does not know it"):
        check_event(state, CheckpointLost(CheckpointId(7, 7)))
    lost, _ = step(state, CheckpointLost(CheckpointId(1, 200)))
    with pytest.raises(GateInputError, match=r"t1/s200 is LOST"):
        check_event(lost, CheckpointLost(CheckpointId(1, 200)))
    with pytest.raises(GateInputError, match="no restorable checkpoint there"):
        check_event(lost, Restart(200))
    with pytest.raises(TypeError, match="CheckpointId"):
        CheckpointLost("t1/s200")  # type: ignore[arg-type]


def test_GATE_42_a_loss_while_tainted_keeps_the_taint_and_the_codec_round_trips_lost() -> None:
    from scout.gate.model import CheckpointLost

    tainted = [s for e, s, _ in run_story() if isinstance(e, CheckpointCaptured) and e.step == 450][0]
    assert tainted.control is GateState.TAINTED
    lost, effects = step(tainted, CheckpointLost(CheckpointId(0, 100)))
    assert lost.control is GateState.TAINTED and lost.context.sdc == tainted.context.sdc
    assert lost.context.verified is None
    assert state_from_json(json.loads(json.dumps(state_to_json(lost)))) == lost


def test_GATE_30_GATE_42_a_lost_checkpoint_stays_lost_when_the_newest_generation_says_verified() -> None:
    from scout.gate.fold import GenerationRecord, fold
    from scout.gate.model import CheckpointLost

    state = final_state()
    lost, _ = step(state, CheckpointLost(CheckpointId(1, 200)))
    # An older record that shows the loss, a newest one that (wrongly) still shows it verified.
    folded = fold(GenerationRecord(9, state, ()), older=[GenerationRecord(8, lost, ())])
    assert folded.state.context.entry(CheckpointId(1, 200)).trust is Trust.LOST
    assert folded.state.context.verified.id == CheckpointId(0, 100)
