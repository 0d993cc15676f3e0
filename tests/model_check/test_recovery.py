"""The recovery decision (spec/recovery.toml, scout/gate/recovery.py), over its whole finite
domain: 7 failure classes x SDC since restart x verified x latest x 3 emergency-replay outcomes
= 168 situations. The decision is checked against a naive first-match reading of the TOML itself
(not the generated module), for totality, for rows that can never decide, and for the safety
rules RECOVERY-1..4; and on real gate states, the checkpoint it names is one the gate accepts a
restart from."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import tomllib

from scout.gate.model import Restart
from scout.gate.recovery import (
    RULES,
    Choice,
    EmergencyReplay,
    FailureClass,
    Situation,
    decide,
    every_situation,
    recover,
)
from scout.gate.recovery_spec import parse_decision_table, render_python
from scout.gate.step import check_event
from tests.gate_story import run_story
from tests.model_check.gate_harness import (
    CheckedGate,
    checked_environment,
    class_vectors,
    initial,
    make_config,
)

REPO = Path(__file__).resolve().parents[2]
TABLE_PATH = REPO / "spec" / "recovery.toml"
RAW = tomllib.loads(TABLE_PATH.read_text(encoding="utf-8"))
SILENT_CORRUPTERS = {FailureClass.HANG, FailureClass.INACCESSIBLE, FailureClass.UNCERTAIN}
NOT_NUMERICAL = {FailureClass.STRAGGLER, FailureClass.DATA_STALL, FailureClass.CHECKPOINT_STALL}


def naive_decision(situation: Situation) -> tuple[str, str]:
    """First matching [[rule]] of the TOML, read literally."""
    facts = {
        "sdc_since_restart": situation.sdc_since_restart,
        "verified": situation.verified,
        "latest": situation.latest,
        "emergency_replay": situation.emergency_replay.value,
    }
    for rule in RAW["rule"]:
        if "failures" in rule and situation.failure.value not in rule["failures"]:
            continue
        if all(rule[key] == value for key, value in facts.items() if key in rule):
            return rule["choose"], rule["reason"]
    raise AssertionError(f"no rule for {situation}")


def test_the_domain_has_168_situations_and_every_one_is_decided_as_the_table_says() -> None:
    situations = every_situation()
    assert len(situations) == len(set(situations)) == 7 * 2 * 2 * 2 * 3
    for situation in situations:
        decision = decide(situation)
        assert (decision.choice.value, decision.reason) == naive_decision(situation), situation


def test_every_rule_decides_some_situation() -> None:
    """No dead row: a row that never wins is a row nobody reviewed the consequences of."""
    winners = {decide(situation).rule for situation in every_situation()}
    assert winners == {rule.number for rule in RULES}


def test_RECOVERY_feasible_never_chooses_what_is_not_there_and_never_discards_verified() -> None:
    for situation in every_situation():
        choice = decide(situation).choice
        if choice is Choice.VERIFIED:
            assert situation.verified
        if choice is Choice.LATEST:
            assert situation.latest
        if situation.verified:
            assert choice is not Choice.NONE, situation


def test_RECOVERY_1_and_2_observed_corruption_rules_out_everything_unverified() -> None:
    for situation in every_situation():
        if situation.failure is FailureClass.SDC or situation.sdc_since_restart:
            assert decide(situation).choice is (Choice.VERIFIED if situation.verified else Choice.NONE)


def test_RECOVERY_3_silent_corrupters_restore_latest_only_after_a_clean_full_replay() -> None:
    for situation in every_situation():
        if situation.failure in SILENT_CORRUPTERS and not situation.sdc_since_restart:
            latest = situation.latest and situation.emergency_replay is EmergencyReplay.CLEAN
            expected = Choice.LATEST if latest else (Choice.VERIFIED if situation.verified else Choice.NONE)
            assert decide(situation).choice is expected, situation


def test_RECOVERY_4_slowness_and_stalls_keep_the_most_work() -> None:
    for situation in every_situation():
        if situation.failure in NOT_NUMERICAL and not situation.sdc_since_restart:
            expected = Choice.LATEST if situation.latest else (Choice.VERIFIED if situation.verified else Choice.NONE)
            assert decide(situation).choice is expected, situation


def test_generated_module_matches_the_table() -> None:
    table = parse_decision_table(RAW, str(TABLE_PATH))
    assert (REPO / table.python_path).read_text(encoding="utf-8") == render_python(table)


@functools.cache
def _gate_states() -> tuple[Any, ...]:
    """The story's states and every state a 2-recipe catalog reaches with up to 2 captures
    (2,701 states, about 9 s; cached: test_recovery_restores.py walks them too)."""
    states = [state for _event, state, _effects in run_story()]
    system = CheckedGate()
    environment = checked_environment(class_vectors, captures_max=2)
    frontier = [initial(make_config(2, 1))]
    seen = set(frontier)
    while frontier:
        node = frontier.pop()
        states.append(node.raw[0])
        for event in environment(node):
            successor = system.fire(node, event).state
            if successor not in seen:
                seen.add(successor)
                frontier.append(successor)
    return tuple(states)


def test_RECOVERY_the_chosen_checkpoint_is_one_the_gate_restarts_from() -> None:
    checked = 0
    for state in _gate_states():
        for failure in FailureClass:
            for replay in EmergencyReplay:
                decision = recover(state, failure, replay)
                assert (decision.checkpoint is None) == (decision.choice is Choice.NONE)
                if decision.checkpoint is not None:
                    check_event(state, Restart(decision.checkpoint.step))
                    assert decision.checkpoint.timeline <= state.context.timeline
                checked += 1
    assert checked > 10_000


def test_recovery_decision_json_is_plain() -> None:
    state = [s for e, s, _ in run_story() if isinstance(e, Restart)][0]
    decision = recover(state, FailureClass.STRAGGLER)
    assert decision.to_json()["choice"] == "verified"
    assert decision.to_json()["checkpoint"] == {"timeline": 0, "step": 100}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"choose": "newest"}, "choose = 'newest' must be one of"),
        ({"failures": ["meteor"]}, "unknown failure 'meteor'"),
        ({"verified": "yes"}, "verified = 'yes' must be true or false"),
        ({"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_a_malformed_table_is_refused_naming_row_and_value(patch, message) -> None:
    raw = {**RAW, "rule": [dict(RAW["rule"][0], **patch), *RAW["rule"][1:]]}
    with pytest.raises(ValueError, match=message):
        parse_decision_table(raw, str(TABLE_PATH))


def test_scout_spec_generates_and_checks_the_decision_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scout.cli import main

    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "recovery.toml").write_text(TABLE_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "scout" / "gate").mkdir(parents=True)
    assert main(["spec", "--check", "--spec-dir", str(spec_dir)]) == 1
    assert "recovery.md is missing" in capsys.readouterr().err
    assert main(["spec", "--spec-dir", str(spec_dir)]) == 0
    generated = (tmp_path / "scout" / "gate" / "recovery_table.py").read_text(encoding="utf-8")
    assert generated == (REPO / "scout" / "gate" / "recovery_table.py").read_text(encoding="utf-8")
    document = (spec_dir / "recovery.md").read_text(encoding="utf-8")
    (spec_dir / "recovery.md").write_text("# Prose kept\n\n" + document.split("\n\n", 2)[2], encoding="utf-8")
    assert main(["spec", "--check", "--spec-dir", str(spec_dir)]) == 0
    stale = (spec_dir / "recovery.toml").read_text(encoding="utf-8").replace('reason = "nothing-to-restore"', 'reason = "nothing-at-all"')
    (spec_dir / "recovery.toml").write_text(stale, encoding="utf-8")
    capsys.readouterr()
    assert main(["spec", "--check", "--spec-dir", str(spec_dir)]) == 1
    err = capsys.readouterr().err
    assert "recovery.md is stale" in err and "recovery_table.py is stale" in err
