"""The recovery decision's edges that the whole-domain checks of tests/model_check/test_recovery.py
do not pin (found by `./dev mutate gate-recovery`, tests/mutation/survivors.md): every error of a
malformed decision table names its row and value, the rendered block is the committed one byte
for byte, the decision's JSON has exactly its fields, the situation is derived from the gate
state as spec/recovery.md defines it, and a replay result becomes the group verdict GATE-4/5
expect. All in-process and fast (they belong to the gate-recovery mutation target)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import pytest
import tomllib

from scout.core.machine import SpecError
from scout.core.recipes import RecipeId, RecipeResult
from scout.core.verdict import MISSING, Status
from scout.gate import recovery
from scout.gate.model import GateState, Outcome, Trust
from scout.gate.recovery import (
    RULES,
    Choice,
    EmergencyReplay,
    FailureClass,
    RecoveryDecision,
    Situation,
    decide,
    every_situation,
    recover,
    situation_of,
)
from scout.gate.recovery_spec import (
    DecisionRow,
    DecisionTable,
    DecisionTableError,
    generated_files,
    parse_decision_table,
    render_markdown_block,
)
from scout.gate.results import group_verdict
from scout.gate.step import initial_state
from tests.gate_story import CONFIG, run_story

REPO = Path(__file__).resolve().parents[2]
TABLE_PATH = REPO / "spec" / "recovery.toml"
RAW: dict[str, Any] = tomllib.loads(TABLE_PATH.read_text(encoding="utf-8"))
SOURCE = "spec/recovery.toml"
DECLARED = "checkpoint-stall, data-stall, hang, inaccessible, sdc, straggler, uncertain"


def problems_of(raw: dict[str, Any]) -> list[str]:
    """The problems a malformed table is refused with, checking the message's frame."""
    with pytest.raises(DecisionTableError) as refused:
        parse_decision_table(raw, SOURCE)
    header, *lines = str(refused.value).split("\n")
    assert header == f"{SOURCE}: invalid decision table ({len(lines)} problem(s)):"
    assert all(line.startswith("  - ") for line in lines), lines
    return [line[len("  - ") :] for line in lines]


def rule(**fields: Any) -> dict[str, Any]:
    return {"failures": ["sdc"], "choose": "none", "why": "because", **fields}


# ------------------------------------------------------------------------------------------
# Parsing spec/recovery.toml
# ------------------------------------------------------------------------------------------


def test_RECOVERY_table_every_problem_is_listed_at_once_naming_its_row_and_value() -> None:
    raw = copy.deepcopy(RAW)
    raw["colour"] = {}
    raw["decision"].update(name="gate", python="scout/gate/recovery_table.txt", extra=1)
    raw["failures"]["meteor"] = "  "
    raw["inputs"] = {}
    raw["rule"] = [
        5,
        rule(failures="sdc", reason="a"),
        rule(failures=[1], reason="b"),
        rule(
            colour="red",
            failures=["hang", "nope"],
            verified="yes",
            emergency_replay="dirty",
            choose="newest",
            reason=" padded",
            why="  ",
        ),
        rule(reason=""),
        rule(reason="dup"),
        rule(reason="dup"),
    ]
    assert problems_of(raw) == [
        "unknown top-level table [colour]; allowed: decision, failures, inputs, rule",
        "[decision] unknown key 'extra'",
        "[decision] name = 'gate' must equal the file's stem 'recovery'",
        "[decision] python = 'scout/gate/recovery_table.txt' must name the generated .py file",
        "[failures] meteor needs a one-line meaning, got '  '",
        '[inputs] must be a non-empty table of NAME = "meaning"',
        "rule 1: not a table",
        "rule 2: failures = 'sdc' must be a list of failure ids",
        "rule 3: failures = [1] must be a list of failure ids",
        "rule 4: unknown key 'colour'; allowed: choose, emergency_replay, failures, latest, reason, "
        "sdc_since_restart, verified, why",
        "rule 4: unknown failure 'nope'; declared: checkpoint-stall, data-stall, hang, inaccessible, meteor, "
        "sdc, straggler, uncertain",
        "rule 4: verified = 'yes' must be true or false (or left out)",
        "rule 4: emergency_replay = 'dirty' must be one of clean, unclean, not-run",
        "rule 4: choose = 'newest' must be one of verified, latest, none",
        "rule 4: reason must be a non-empty code, got ' padded'",
        "rule 4: why must say why, got '  '",
        "rule 5: reason must be a non-empty code, got ''",
        "reason code 'dup' is used by more than one rule; codes must name one rule",
    ]


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        (None, "no [[rule]] rows"),
        ([], "no [[rule]] rows"),
        ("rows", "no [[rule]] rows"),
        ([rule(reason="a", failures=["meteor"])], f"rule 1: unknown failure 'meteor'; declared: {DECLARED}"),
        ([rule(reason="a", latest=1)], "rule 1: latest = 1 must be true or false (or left out)"),
        ([rule(reason="a", why=7)], "rule 1: why must say why, got 7"),
        ([rule(reason=7)], "rule 1: reason must be a non-empty code, got 7"),
    ],
)
def test_RECOVERY_table_a_bad_rule_list_or_row_is_refused_with_one_clear_problem(rules: Any, problem: str) -> None:
    raw = {key: value for key, value in RAW.items() if key != "rule"}
    if rules is not None:
        raw["rule"] = rules
    assert problems_of(raw) == [problem]


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("failures", {"sdc": 5}, "[failures] sdc needs a one-line meaning, got 5"),
        ("failures", ["sdc"], '[failures] must be a non-empty table of NAME = "meaning"'),
        ("inputs", None, '[inputs] must be a non-empty table of NAME = "meaning"'),
    ],
)
def test_RECOVERY_table_failures_and_inputs_need_meanings(key: str, value: Any, problem: str) -> None:
    raw = copy.deepcopy(RAW)
    raw[key] = value
    found = problems_of(raw)
    assert found[0] == problem
    # Rows naming failures that are no longer declared are reported too, after the tables.
    assert all(line.startswith("rule ") for line in found[1:]), found


def test_RECOVERY_table_without_a_decision_table_is_refused_naming_the_file() -> None:
    raw = {key: value for key, value in RAW.items() if key != "decision"}
    with pytest.raises(DecisionTableError) as refused:
        parse_decision_table(raw, SOURCE)
    assert str(refused.value) == f"{SOURCE}: missing [decision] table"


def test_RECOVERY_the_committed_table_parses_to_its_name_module_and_rows() -> None:
    table = parse_decision_table(RAW, str(TABLE_PATH))
    assert (table.name, table.source, table.python_path) == ("recovery", str(TABLE_PATH), "scout/gate/recovery_table.py")
    assert [failure for failure, _ in table.failures] == [f.value for f in FailureClass]
    assert dict(table.inputs) == RAW["inputs"] and dict(table.failures) == RAW["failures"]
    assert [row.reason for row in table.rows] == [r["reason"] for r in RAW["rule"]]
    assert [row.why for row in table.rows] == [r["why"] for r in RAW["rule"]]


# ------------------------------------------------------------------------------------------
# Rendering spec/recovery.md
# ------------------------------------------------------------------------------------------


def committed_block() -> str:
    document = (REPO / "spec" / "recovery.md").read_text(encoding="utf-8")
    begin = document.index("<!-- BEGIN GENERATED: recovery -->")
    end_marker = "<!-- END GENERATED: recovery -->"
    end = document.index(end_marker) + len(end_marker) + 1
    return document[begin:end]


def test_RECOVERY_the_rendered_block_is_the_committed_one_byte_for_byte() -> None:
    assert render_markdown_block(parse_decision_table(RAW, str(TABLE_PATH))) == committed_block()


def test_RECOVERY_cells_say_yes_no_any_and_a_pipe_in_why_stays_in_its_cell() -> None:
    row = DecisionRow(1, (), False, True, None, "clean", "latest", "r", "a | b")
    table = DecisionTable("toy", "spec/toy.toml", "toy.py", (("sdc", "m"),), (("failure", "f"),), (row,))
    lines = render_markdown_block(table).splitlines()
    assert lines[-3] == "| 1 | any | no | yes | any | `clean` | **latest** | `r` | a \\| b |"
    assert lines[1] == "<!-- Generated from toy.toml by `scout spec`: edit the table, then run `scout spec`. -->"


def test_RECOVERY_generated_files_name_the_document_and_module_and_write_a_new_document(tmp_path: Path) -> None:
    table_path = tmp_path / "spec" / "recovery.toml"
    (document, markdown), (module, python) = generated_files(RAW, table_path)
    assert (document, module) == (tmp_path / "spec" / "recovery.md", tmp_path / "scout" / "gate" / "recovery_table.py")
    assert markdown(None) == (
        "# Decision table `recovery`\n\nThe normative table is `recovery.toml`; the block below is generated "
        "from it. Write the prose outside the block.\n\n" + committed_block()
    )
    assert markdown("# Prose\n\n" + committed_block()) == "# Prose\n\n" + committed_block()
    assert python(None) == (REPO / "scout" / "gate" / "recovery_table.py").read_text(encoding="utf-8")
    with pytest.raises(SpecError) as refused:
        markdown("<!-- BEGIN GENERATED: recovery -->\nno end marker\n")
    assert str(refused.value).startswith(f"{document}: expected one line")


# ------------------------------------------------------------------------------------------
# The decision
# ------------------------------------------------------------------------------------------


def test_RECOVERY_every_decision_carries_its_rule_reason_and_why() -> None:
    by_number = {rule.number: rule for rule in RULES}
    for situation in every_situation():
        decision = decide(situation)
        chosen = by_number[decision.rule]
        assert (decision.choice, decision.reason, decision.why) == (chosen.choose, chosen.reason, chosen.why)
        assert decision.why == RAW["rule"][decision.rule - 1]["why"]


def test_RECOVERY_a_table_that_is_not_total_is_an_error_naming_the_situation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "RULES", ())
    situation = Situation(FailureClass.HANG, False, True, False)
    with pytest.raises(AssertionError) as refused:
        decide(situation)
    assert str(refused.value) == f"spec/recovery.toml has no rule for {situation!r}; the table must be total"


def expected_situation(state: Any, failure: FailureClass, replay: EmergencyReplay) -> Situation:
    """spec/recovery.md's inputs, read literally: TAINTED; a RECOVERY_VERIFIED checkpoint; a
    CAPTURED or CANDIDATE checkpoint newer than every verified one."""
    entries = state.context.checkpoints
    verified = [e.id.step for e in entries if e.trust is Trust.RECOVERY_VERIFIED]
    newer = [
        e for e in entries
        if e.trust in (Trust.CAPTURED, Trust.CANDIDATE) and all(e.id.step > step for step in verified)
    ]
    return Situation(failure, state.control is GateState.TAINTED, bool(verified), bool(newer), replay)


def test_RECOVERY_the_situation_is_read_from_the_gate_state_as_the_table_defines_it() -> None:
    states = [state for _event, state, _effects in run_story()]
    kinds = set()
    for state in states:
        for failure in FailureClass:
            for replay in EmergencyReplay:
                expected = expected_situation(state, failure, replay)
                assert situation_of(state, failure, replay) == expected, (state.control, failure, replay)
                assert recover(state, failure, replay).situation == expected
        kinds.add((expected.sdc_since_restart, expected.verified, expected.latest))
    # The story reaches: nothing, only latest, both, tainted with verified, verified newest.
    assert kinds >= {(False, False, False), (False, False, True), (False, True, True), (True, True, False), (False, True, False)}
    assert situation_of(states[0], FailureClass.SDC) == Situation(FailureClass.SDC, False, False, False, EmergencyReplay.NOT_RUN)


def test_RECOVERY_3_a_clean_emergency_replay_reaches_the_decision() -> None:
    """RECOVERY-3: after a hang with an unverified newer checkpoint, a clean full replay restores it."""
    state = next(s for s in (s for _e, s, _ in run_story()) if expected_situation(s, FailureClass.HANG, EmergencyReplay.CLEAN).latest)
    decision = recover(state, FailureClass.HANG, EmergencyReplay.CLEAN)
    assert decision.choice is Choice.LATEST and decision.reason == "emergency-replay-clean"
    assert decision.checkpoint == state.context.latest.id


def test_RECOVERY_decision_json_has_exactly_its_fields() -> None:
    state = [s for e, s, _ in run_story()][-1]
    decision = attrs.evolve(recover(state, FailureClass.STRAGGLER), notes=("read from generation 3",))
    assert decision.to_json() == {
        "failure": "straggler",
        "sdc_since_restart": False,
        "verified_available": True,
        "latest_available": False,
        "emergency_replay": "not-run",
        "choice": "verified",
        "reason": "newest-restorable-is-verified",
        "why": RAW["rule"][8]["why"],
        "rule": 9,
        "checkpoint": {"timeline": 1, "step": 200},
        "notes": ["read from generation 3"],
    }
    nothing = recover(initial_state(CONFIG), FailureClass.HANG, EmergencyReplay.UNCLEAN)
    assert nothing.to_json() == {
        "failure": "hang",
        "sdc_since_restart": False,
        "verified_available": False,
        "latest_available": False,
        "emergency_replay": "unclean",
        "choice": "none",
        "reason": "corruption-not-excluded-nothing-verified",
        "why": RAW["rule"][6]["why"],
        "rule": 7,
        "checkpoint": None,
        "notes": [],
    }


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (Choice.VERIFIED, "a rule chose 'verified' without a verified checkpoint"),
        (Choice.LATEST, "a rule chose 'latest' without one"),
    ],
)
def test_RECOVERY_feasible_a_rule_choosing_a_missing_checkpoint_is_an_error(
    monkeypatch: pytest.MonkeyPatch, choice: Choice, message: str
) -> None:
    """The table never does this (test_RECOVERY_feasible_...); if an edit made it, recover says so."""
    situation = Situation(FailureClass.HANG, False, False, False)
    monkeypatch.setattr(recovery, "decide", lambda s: RecoveryDecision(s, choice, "r", "w", 1))
    with pytest.raises(AssertionError) as refused:
        recover(initial_state(CONFIG), situation.failure)
    assert str(refused.value) == message


# ------------------------------------------------------------------------------------------
# Replay results as group verdicts (spec/gate.md GATE-4, GATE-5)
# ------------------------------------------------------------------------------------------


def test_GATE_5_a_missing_or_reasonless_inconclusive_result_is_reported_with_a_reason_code() -> None:
    assert (group_verdict("g", MISSING).outcome, group_verdict("g", MISSING).reason) == (Outcome.MISSING, "no-result")
    reasonless = RecipeResult(RecipeId.parse("hidden.0"), 5, Status.INCONCLUSIVE)
    verdict = group_verdict("g", reasonless)
    assert (verdict.outcome, verdict.outliers, verdict.reason) == (Outcome.INCONCLUSIVE, (), "inconclusive")


def test_GATE_35_a_result_that_is_not_a_recipe_result_is_refused_naming_group_type_and_value() -> None:
    with pytest.raises(TypeError) as refused:
        group_verdict("g", 5)  # type: ignore[arg-type]
    assert str(refused.value) == "group 'g': expected a scout.core.recipes.RecipeResult or MISSING, got int 5"
    bogus = RecipeResult(RecipeId.parse("hidden.0"), 5, "agree")  # type: ignore[arg-type]
    with pytest.raises(TypeError) as refused:
        group_verdict("g", bogus)
    assert str(refused.value) == "group 'g': result status 'agree' is not a scout.core.verdict.Status"

