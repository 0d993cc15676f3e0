"""``scout certificate MANIFEST [STEP]``: readable and JSON certificates (docs/gate.md), and
clear exits for a checkpoint without one and for a manifest that cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scout.cli import main
from scout.gate.manifest import generation_path
from scout.gate.recorder import GateRecorder
from scout.gate.step import step
from tests.gate_story import CONFIG, story


@pytest.fixture
def manifest_dir(tmp_path: Path) -> Path:
    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    with recorder:
        for event in story():
            state, effects = step(state, event)
            recorder.record(state, effects)
    return tmp_path


def test_GATE_8_certificate_prints_both_cycles_readably(manifest_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certificate", str(manifest_dir), "100"]) == 0
    out = capsys.readouterr().out
    assert "Coverage certificate: checkpoint t0/s100 (RECOVERY_VERIFIED), job story-job" in out
    assert "cycle 1 (before capture, steps 0..100): 3 replay(s)" in out
    assert "cycle 2 (after capture, steps 100..200): 3 replay(s)" in out
    assert "  hidden      120  AGREE         AGREE" in out
    assert "Nothing else is claimed" in out


def test_certificate_defaults_to_the_newest_verified(manifest_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certificate", str(manifest_dir)]) == 0
    assert "checkpoint t1/s200" in capsys.readouterr().out


def test_certificate_json_follows_the_documented_schema(manifest_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certificate", str(manifest_dir), "100", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {
        "schema", "job_id", "checkpoint", "promoted_at_step", "catalog", "peer_groups", "before", "after", "claim", "manifest",
    }
    assert document["schema"] == "scout.certificate/1"
    assert document["checkpoint"] == {"timeline": 0, "step": 100}
    assert document["before"]["replays"][0] == {
        "recipe": "embedding",
        "step": 0,
        "verdicts": [
            {"group": "dp0", "outcome": "AGREE", "outliers": [], "reason": ""},
            {"group": "dp1", "outcome": "AGREE", "outliers": [], "reason": ""},
        ],
    }


def test_a_checkpoint_without_certificate_says_why(manifest_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certificate", str(manifest_dir), "400"]) == 1
    err = capsys.readouterr().err
    assert "t0/s400 is QUARANTINED: quarantined: SDC attributed by group(s) dp0" in err
    assert "verified steps: 100, 200" in err


def test_list_shows_every_checkpoint(manifest_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certificate", str(manifest_dir), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7 and lines[0].startswith("t0/s100") and "RECOVERY_VERIFIED" in lines[0]


def test_unreadable_manifest_exits_2_naming_the_file(manifest_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newest = sorted(manifest_dir.glob("manifest.*.json"))[-1]
    assert main(["certificate", str(newest), "--job-id", "other"]) == 2
    assert "belongs to job_id 'story-job', not 'other'" in capsys.readouterr().err
    generation_path(manifest_dir, 999).write_bytes(b"torn")
    assert main(["certificate", str(generation_path(manifest_dir, 999))]) == 2
    assert "manifest.000000000999.json" in capsys.readouterr().err
    # A damaged newest generation in a directory: warned about, the last good one is used.
    assert main(["certificate", str(manifest_dir)]) == 0
    assert "warning" in capsys.readouterr().err


def test_SELF_7_a_self_checked_replay_is_shown_and_kept_in_the_manifest(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A verdict whose live path was self-checked is ``AGREE+live`` in the certificate, counted per
    cycle, and ``"self_checked": true`` in its JSON; manifests written before the self-check
    (no such key) read as not self-checked, and a key of the wrong type is damage."""
    import attrs

    from scout.gate.codec import CodecError, state_from_json, state_to_json
    from scout.gate.model import GroupVerdict, Outcome, RecipeVerdicts

    def live(event: object) -> object:
        if isinstance(event, RecipeVerdicts) and event.recipe == "hidden":
            return attrs.evolve(event, verdicts=tuple(attrs.evolve(v, self_checked=v.outcome is Outcome.AGREE)
                                                      for v in event.verdicts))
        return event

    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    with recorder:
        for event in story():
            state, effects = step(state, live(event))
            recorder.record(state, effects)
    assert main(["certificate", str(tmp_path), "100"]) == 0
    out = capsys.readouterr().out
    assert "cycle 1 (before capture, steps 0..100): 3 replay(s), live path self-checked in 1" in out
    assert "  hidden       10  AGREE+live    AGREE+live" in out
    assert main(["certificate", str(tmp_path), "100", "--json"]) == 0
    replays = json.loads(capsys.readouterr().out)["before"]["replays"]
    assert [v.get("self_checked") for r in replays for v in r["verdicts"]] == [None, None, True, True, None, None]
    encoded = state_to_json(state)
    assert state_from_json(encoded) == state
    text = json.dumps(encoded)
    older = state_from_json(json.loads(text.replace(', "self_checked": true', '')))  # written before SELF-7
    assert '"self_checked": true' in text and '"self_checked":' not in json.dumps(state_to_json(older))
    with pytest.raises(CodecError, match="self_checked: expected true or false, got 1"):
        state_from_json(json.loads(text.replace('"self_checked": true', '"self_checked": 1')))
    with pytest.raises(ValueError, match="self_checked must be a bool, true only with AGREE"):
        GroupVerdict("dp0", Outcome.INCONCLUSIVE, (), "no-majority", self_checked=True)
