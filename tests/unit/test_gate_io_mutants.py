"""Tests written from the gate-io mutation run's survivors (tests/mutation/survivors.md, "Gate
I/O"): the decoders' exact errors (every field of a valid encoding broken one at a time), the
fail-closed reading of a manifest directory (GATE-30..GATE-35) and certificate_holds (GATE-8)."""

from __future__ import annotations

import copy
import json
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from scout.core.failure import FailureClass
from scout.gate.codec import (
    CodecError,
    _verdict_from,
    certificate_from_json,
    certificate_to_json,
    config_from_json,
    config_to_json,
    state_from_json,
    state_to_json,
    transition_from_json,
)
from scout.gate.fold import certificate_holds
from scout.gate.manifest import (
    HEAD_NAME,
    LOG_NAME,
    ManifestDamaged,
    ManifestError,
    ManifestFailClosedWarning,
    ManifestJobMismatch,
    ManifestRepairWarning,
    ManifestUnreadable,
    ManifestWriter,
    _kind,
    generation_path,
    load_manifest,
    read_manifest_file,
    read_manifest_set,
)
from scout.gate.model import CheckpointId, GateConfig, GroupVerdict, Outcome, Recipe, Trust
from scout.gate.recorder import (
    GateConfigMismatch,
    GateWriter,
    _log_record,
    inspect_gate,
    read_gate,
    read_gate_reading,
)
from scout.gate.step import initial_state, step
from tests.gate_story import CONFIG, run_story, story, story_payloads

# ------------------------------------------------------------------------------------------
# Codec: every field of a valid encoding broken one at a time
# ------------------------------------------------------------------------------------------

ENUM_KEYS = {"trust": Trust, "outcome": Outcome, "before": Trust, "after": Trust, "restart_cause": FailureClass}
#: Fields the decoders do not read (the certificate's job id and claim are for people).
UNREAD = {"job_id", "claim"}


def _states() -> list[Any]:
    """Story states that together hold every optional part: an SDC record, a checkpoint with
    its before-record, a certificate, verdicts with outliers and with reasons."""
    states = [state for _event, state, _effects in run_story()]
    chosen = [
        next(s for s in states if s.context.sdc is not None),
        next(s for s in states if any(e.before is not None for e in s.context.checkpoints)),
        states[-1],
    ]
    # A verdict with a reason, in the open cycle's replays.
    sdc = next(s for s in states if s.context.replays)
    replay = sdc.context.replays[0]
    reasoned = (GroupVerdict(replay.verdicts[0].group, Outcome.INCONCLUSIVE, (), "no-majority"), *replay.verdicts[1:])
    replays = (attrs.evolve(replay, verdicts=reasoned), *sdc.context.replays[1:])
    chosen.append(attrs.evolve(sdc, context=attrs.evolve(sdc.context, replays=replays)))
    return chosen


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _slots(value: Any, path: str) -> Iterator[tuple[Any, str | int, str]]:
    """(container, key, path of the value) for every value below ``value``."""
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        if key in UNREAD:
            continue
        child_path = _join(path, key)
        yield value, key, child_path
        yield from _slots(child, child_path)


def _broken(value: Any, path: str, key: str | int, enum_path: bool) -> list[tuple[Any, str]]:
    """(bad value, the exact error) for the value at ``path``."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [(None, f"{path}: expected an int, got None"), (True, f"{path}: expected an int, got True")]
    if isinstance(value, str):
        if key == "schema":
            return [(7, f"{path}: 7 is not 'scout.certificate/1'")]
        if key == "control":
            return []
        if enum_path:
            enum_type = ENUM_KEYS[str(key)]
            allowed = ", ".join(member.value for member in enum_type)
            return [("bogus", f"{path}: 'bogus' is not one of {allowed}")]
        return [(7, f"{path}: expected a string, got 7")]
    if isinstance(value, list):
        return [("x", f"{path}: expected a list, got str")]
    if isinstance(value, dict):
        return [([], f"{path}: expected an object, got list")]
    return []


def _cases(encoded: Any, top: str, optional: set[str]) -> Iterator[tuple[Any, str]]:
    for container, key, path in _slots(encoded, top):
        if isinstance(key, str) and key not in optional:
            copied = copy.deepcopy(encoded)
            target = _follow(copied, path, top)
            del target[key]
            yield copied, f"{path}: missing"
        if path in {"cycle_start_step", "last_capture_step"}:
            continue
        is_enum = isinstance(key, str) and key in ENUM_KEYS  # a str there is an enum value
        for bad, message in _broken(container[key], path, key, is_enum):
            copied = copy.deepcopy(encoded)
            _follow(copied, path, top)[key] = bad
            yield copied, message


def _follow(encoded: Any, path: str, top: str) -> Any:
    """The container of the value at ``path`` in ``encoded``."""
    for container, _key, child_path in _slots(encoded, top):
        if child_path == path:
            return container
    raise AssertionError(path)


def _refuses(decode: Any, value: Any, message: str) -> None:
    with pytest.raises(CodecError) as caught:
        decode(value)
    assert str(caught.value) == message


def test_GATE_M4_state_decoder_names_every_broken_field_exactly() -> None:
    checked = 0
    for state in _states():
        encoded = json.loads(json.dumps(state_to_json(state)))
        assert state_from_json(encoded) == state
        # GATE-36: a manifest written before the restart cause was kept has none, and reads so.
        # FRAME-7: a checkpoint entry written before framework checkpoints has no artifact.
        for broken, message in _cases(encoded, "", optional={"restart_cause", "artifact"}):
            _refuses(state_from_json, broken, message)
            checked += 1
        older = {key: value for key, value in encoded.items() if key != "restart_cause"}
        assert state_from_json(older) == attrs.evolve(state, context=state.context.replace(restart_cause=None))
    assert checked > 500


def _promotion_record() -> dict[str, Any]:
    """A trust-log record of a promotion: a before trust and a certificate."""
    final = [state for _event, state, _effects in run_story()][-1]
    entry = next(e for e in final.context.checkpoints if e.certificate is not None)
    transitions = story_payloads()[-1]["transitions"]
    transition = next(t for t in transitions if t["before"] is not None and t["checkpoint"] == {
        "timeline": entry.id.timeline, "step": entry.id.step} and t["after"] == entry.trust.value)
    return json.loads(json.dumps(_log_record(transition, entry.certificate, CONFIG.job_id)))


def test_GATE_20_trust_log_record_round_trips_with_its_certificate_and_reason() -> None:
    record = _promotion_record()
    sequence, change = transition_from_json(record)
    assert sequence == record["sequence"]
    assert change.before is Trust(record["before"]) and change.after is Trust(record["after"])
    assert change.reason == record["reason"] and change.reason
    assert change.certificate is not None
    assert certificate_to_json(change.certificate, CONFIG.job_id) == record["certificate"]
    # A transition-log entry has no certificate key at all, and a fresh checkpoint no before.
    plain = {k: v for k, v in record.items() if k != "certificate"} | {"before": None}
    _sequence, change = transition_from_json(plain)
    assert change.certificate is None and change.before is None


def test_GATE_20_trust_log_decoder_names_every_broken_field_exactly() -> None:
    record = _promotion_record()
    checked = 0
    for broken, message in _cases(record, "transition", optional={"certificate"}):
        _refuses(transition_from_json, broken, message)
        checked += 1
    assert checked > 100
    _refuses(transition_from_json, record | {"sequence": 0}, "transition.sequence: expected an int >= 1, got 0")
    _refuses(transition_from_json, [], "transition: expected an object, got list")
    # The default path of a certificate decoded on its own.
    _refuses(certificate_from_json, {}, "certificate.schema: missing")
    _refuses(certificate_from_json, record["certificate"] | {"schema": "scout.certificate/2"},
             "certificate.schema: 'scout.certificate/2' is not 'scout.certificate/1'")
    _refuses(certificate_from_json, record["certificate"] | {"before": None}, "certificate.before: missing cycle record")
    _refuses(certificate_from_json, record["certificate"] | {"after": None}, "certificate.after: missing cycle record")


def test_GATE_M4_values_the_model_refuses_are_codec_errors_naming_the_path() -> None:
    encoded = state_to_json([state for _event, state, _effects in run_story()][-1])
    bad_step = copy.deepcopy(encoded)
    bad_step["checkpoints"][0]["checkpoint"]["step"] = -1
    with pytest.raises(CodecError) as caught:
        state_from_json(bad_step)
    assert str(caught.value).startswith("checkpoints[0].checkpoint: ") and "-1" in str(caught.value)
    bad_verdict = copy.deepcopy(encoded)
    bad_verdict["previous_clean"]["replays"][0]["verdicts"][0]["outliers"] = [3]
    with pytest.raises(CodecError) as caught:
        state_from_json(bad_verdict)
    assert str(caught.value).startswith("previous_clean.replays[0].verdicts[0]: ")


def test_GATE_M4_recipe_groups_round_trip() -> None:
    config = GateConfig("job", (Recipe("a", ("g0",)), Recipe("b")), ("g0", "g1"))
    assert config_from_json(config_to_json(config)) == config
    assert config_from_json(config_to_json(config)).recipes[0].groups == ("g0",)


# ------------------------------------------------------------------------------------------
# GATE-8: certificate_holds
# ------------------------------------------------------------------------------------------


def test_GATE_8_certificate_holds_exactly_when_every_part_matches() -> None:
    final = [state for _event, state, _effects in run_story()][-1]
    entry = next(e for e in final.context.checkpoints if e.certificate is not None)
    certificate, checkpoint = entry.certificate, entry.id
    assert certificate is not None
    assert certificate_holds(certificate, checkpoint, CONFIG)
    dirty = attrs.evolve(certificate.before, replays=certificate.before.replays[1:])
    other_timeline = CheckpointId(checkpoint.timeline + 1, checkpoint.step)
    assert not certificate_holds(certificate, other_timeline, CONFIG)
    assert not certificate_holds(attrs.evolve(certificate, recipes=certificate.recipes[::-1]), checkpoint, CONFIG)
    assert not certificate_holds(attrs.evolve(certificate, groups=certificate.groups[::-1]), checkpoint, CONFIG)
    assert not certificate_holds(attrs.evolve(certificate, before=dirty), checkpoint, CONFIG)
    dirty_after = attrs.evolve(certificate.after, replays=certificate.after.replays[1:])
    assert not certificate_holds(attrs.evolve(certificate, after=dirty_after), checkpoint, CONFIG)


# ------------------------------------------------------------------------------------------
# Manifest files: fail-closed reading (GATE-30..GATE-35)
# ------------------------------------------------------------------------------------------

PAYLOAD = {"gate": {"n": 1}, "transitions": []}


def _write(directory: Path, count: int) -> None:
    with ManifestWriter(directory, "job") as writer:
        for n in range(count):
            writer.commit({"gate": {"n": n + 1}, "transitions": []})


def test_GATE_35_kind_names_each_file_type() -> None:
    assert _kind(stat.S_IFDIR | 0o755) == "a directory"
    assert _kind(stat.S_IFIFO | 0o644) == "a FIFO"
    assert _kind(stat.S_IFCHR) == "a character device"
    assert _kind(stat.S_IFBLK) == "a block device"
    assert _kind(stat.S_IFSOCK) == "a socket"
    assert _kind(stat.S_IFLNK) == "not a regular file"


def test_GATE_33_read_manifest_file_reads_one_generation_and_names_a_bad_one(tmp_path: Path) -> None:
    _write(tmp_path, 2)
    path = generation_path(tmp_path, 2)
    loaded = read_manifest_file(path, "job")
    assert (loaded.generation, loaded.job_id, loaded.payload["gate"]) == (2, "job", {"n": 2})
    assert loaded.path == path
    assert read_manifest_file(str(path), None).payload == loaded.payload
    with pytest.raises(ManifestUnreadable, match="over the 16-byte limit"):
        read_manifest_file(path, "job", 16)
    data = bytearray(path.read_bytes())
    data[-2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestDamaged) as caught:
        read_manifest_file(path, "job")
    assert str(caught.value).startswith(f"{path}: not a good manifest generation: ")
    assert len(str(caught.value)) > len(f"{path}: not a good manifest generation: ")


def test_GATE_30_load_manifest_returns_the_newest_generation_as_read(tmp_path: Path) -> None:
    _write(tmp_path, 3)
    loaded = load_manifest(tmp_path, "job")
    assert loaded is not None
    alone = read_manifest_file(generation_path(tmp_path, 3), "job")
    assert (loaded.path, loaded.generation, loaded.job_id, loaded.format_version, loaded.payload, loaded.sha256) == (
        alone.path, alone.generation, alone.job_id, alone.format_version, alone.payload, alone.sha256)
    assert loaded.skipped == ()
    with pytest.raises(ManifestDamaged):
        load_manifest(tmp_path, "job", max_bytes=16)


def _at_caller(caught: warnings.WarningMessage) -> bool:
    """The warning points past scout's reader (stacklevel); mutmut's trampoline adds a frame,
    so only "not in manifest.py" is checked, not the exact caller."""
    return not caught.filename.endswith("manifest.py")


def _caught(directory: Path) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_manifest(directory, "job")
    return list(caught)


def test_GATE_31_a_lost_newest_generation_warns_at_the_caller(tmp_path: Path) -> None:
    _write(tmp_path, 3)
    generation_path(tmp_path, 3).unlink()
    caught = [w for w in _caught(tmp_path) if issubclass(w.category, ManifestFailClosedWarning)]
    assert len(caught) == 1 and _at_caller(caught[0])
    assert f"the last good one is {generation_path(tmp_path, 2)} (generation 2)" in str(caught[0].message)


def test_GATE_32_a_repaired_problem_warns_at_the_caller_naming_it(tmp_path: Path) -> None:
    _write(tmp_path, 2)
    (tmp_path / HEAD_NAME).write_bytes(b"garbage\n")
    problems = read_manifest_set(tmp_path, "job").problems
    assert problems
    caught = [w for w in _caught(tmp_path) if w.category is ManifestRepairWarning]
    assert [str(w.message) for w in caught] == list(problems)
    assert all(_at_caller(w) for w in caught)


def _no_good_message(directory: Path) -> str:
    with pytest.raises(ManifestDamaged) as caught:
        load_manifest(directory, "job")
    return str(caught.value)


SUFFIX = "; restore a copy of the directory or start the gate afresh with a new job id"


def test_GATE_31_no_good_generation_lists_every_damaged_file(tmp_path: Path) -> None:
    _write(tmp_path, 2)
    (tmp_path / HEAD_NAME).unlink()
    (tmp_path / LOG_NAME).unlink(missing_ok=True)
    for generation in (1, 2):
        generation_path(tmp_path, generation).write_bytes(b"not a manifest\n")
    skipped = read_manifest_set(tmp_path, "job").skipped
    assert len(skipped) == 2
    listed = "; ".join(f"{item.path}: {item.why}" for item in skipped)
    assert _no_good_message(tmp_path) == f"{tmp_path}: no manifest generation verifies ({listed}){SUFFIX}"


def test_GATE_31_no_good_generation_says_why_the_newest_is_lost(tmp_path: Path) -> None:
    _write(tmp_path, 2)
    for generation in (1, 2):
        generation_path(tmp_path, generation).unlink()
    found = read_manifest_set(tmp_path, "job")
    assert found.skipped == () and found.lost_reason
    assert _no_good_message(tmp_path) == f"{tmp_path}: no manifest generation verifies ({found.lost_reason}){SUFFIX}"


def test_GATE_31_no_good_generation_with_nothing_listed(tmp_path: Path) -> None:
    (tmp_path / LOG_NAME).write_bytes(b"")
    found = read_manifest_set(tmp_path, "job")
    assert found.skipped == () and found.lost_reason is None and found.named_anything
    assert _no_good_message(tmp_path) == f"{tmp_path}: no manifest generation verifies (no generation file is left){SUFFIX}"


# ------------------------------------------------------------------------------------------
# Recorder: the writer, the inspection reading and its warnings
# ------------------------------------------------------------------------------------------


def _run_writer(directory: Path, stages: list[str] | None = None) -> Any:
    """The story through GateWriter; the writer's final state."""
    hook = None if stages is None else (lambda stage, _generation: stages.append(stage))
    expected = initial_state(CONFIG)
    with GateWriter.open(directory, CONFIG, hook=hook) as writer:
        assert writer.state == expected
        for event in story():
            want_state, want_effects = step(expected, event)
            assert writer.apply(event) == want_effects
            assert writer.state == want_state
            expected = want_state
    return expected


def test_GATE_9_writer_commits_every_change_and_inspection_reads_it_back(tmp_path: Path) -> None:
    stages: list[str] = []
    final = _run_writer(tmp_path, stages)
    assert "renamed" in stages and "head-written" in stages
    found = read_manifest_set(tmp_path, CONFIG.job_id)
    assert found.newest is not None
    reading = inspect_gate(tmp_path)
    assert reading is not None and reading.fail_closed is None
    assert reading.state == final and reading.generation == found.newest.generation
    assert reading.path == found.newest.path
    assert inspect_gate(tmp_path, CONFIG.job_id) == reading
    assert read_gate_reading(tmp_path, CONFIG) == reading
    assert inspect_gate(tmp_path / "none") is None
    with pytest.raises(ManifestError):
        inspect_gate(tmp_path, "another-job")
    with pytest.raises(ManifestDamaged):
        inspect_gate(tmp_path, max_bytes=16)
    with pytest.raises(ManifestDamaged):
        read_gate_reading(tmp_path, CONFIG, max_bytes=16)
    # Every promotion's trust-log record carries its certificate; no other record does.
    certificates = {str(e.id): e.certificate for e in final.context.checkpoints if e.certificate is not None}
    promotions = 0
    for record in found.log:
        checkpoint = str(CheckpointId(record["checkpoint"]["timeline"], record["checkpoint"]["step"]))
        if record["after"] == Trust.RECOVERY_VERIFIED.value and checkpoint in certificates:
            assert record["certificate"] == certificate_to_json(certificates[checkpoint], CONFIG.job_id)
            promotions += 1
        else:
            assert record["certificate"] is None
    assert promotions == len(certificates) >= 2


def test_GATE_31_read_gate_warns_at_its_caller_with_every_note_and_the_fail_closed_reason(tmp_path: Path) -> None:
    _run_writer(tmp_path)
    newest = read_manifest_set(tmp_path, CONFIG.job_id).newest
    assert newest is not None
    newest.path.unlink()
    (tmp_path / HEAD_NAME).write_bytes(b"garbage\n")  # a note; the trust log still shows the loss
    reading = read_gate_reading(tmp_path, CONFIG)
    assert reading is not None and reading.fail_closed is not None and reading.notes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_gate(tmp_path, CONFIG) == reading.state
    repairs = [w for w in caught if w.category is ManifestRepairWarning]
    assert [str(w.message) for w in repairs] == list(reading.notes)
    closed = [w for w in caught if w.category is ManifestFailClosedWarning]
    assert [str(w.message) for w in closed] == [
        f"{tmp_path}: reading fails closed from generation {reading.generation}: {reading.fail_closed}; "
        "only RECOVERY_VERIFIED checkpoints are restorable (GATE-31)"]


def test_GATE_M4_recipe_groups_and_outliers_are_decoded_item_by_item() -> None:
    config = config_to_json(GateConfig("job", (Recipe("a", ("g0",)),), ("g0",)))
    config["recipes"][0]["groups"] = [7]
    _refuses(config_from_json, config, "config.recipes[0].groups[0]: expected a string, got 7")
    encoded = {"group": "dp0", "outcome": "ATTRIBUTED", "outliers": [3, 5], "reason": ""}
    assert _verdict_from(encoded, "v") == GroupVerdict("dp0", Outcome.ATTRIBUTED, (3, 5))


def test_GATE_M4_read_manifest_file_refuses_another_jobs_file(tmp_path: Path) -> None:
    _write(tmp_path, 1)
    with pytest.raises(ManifestJobMismatch):
        read_manifest_file(generation_path(tmp_path, 1), "another-job")


def test_GATE_31_a_newest_generation_that_does_not_decode_fails_closed_naming_the_field(tmp_path: Path) -> None:
    _run_writer(tmp_path)
    good = read_manifest_set(tmp_path, CONFIG.job_id).newest
    assert good is not None
    gate = good.payload["gate"]
    for transitions, why in (("x", "payload.transitions: expected a list"),
                             ([{"sequence": 1}], "transitions[0].before: missing")):
        with ManifestWriter(tmp_path, CONFIG.job_id) as writer:
            generation = writer.commit({"gate": gate, "transitions": transitions})
        reading = read_gate_reading(tmp_path, CONFIG)
        assert reading is not None and reading.fail_closed is not None
        assert f"manifest.{generation:012d}.json verifies but does not decode ({why})" in reading.fail_closed


def test_GATE_20_an_undecodable_trust_log_record_is_skipped_with_a_note(tmp_path: Path) -> None:
    _run_writer(tmp_path)
    good = read_manifest_set(tmp_path, CONFIG.job_id).newest
    assert good is not None
    record = dict(good.payload["transitions"][-1])
    bad = record | {"sequence": 99, "after": "bogus"}
    with ManifestWriter(tmp_path, CONFIG.job_id) as writer:
        writer.commit(good.payload, log_records=[bad])
    reading = inspect_gate(tmp_path)
    assert reading is not None
    allowed = ", ".join(t.value for t in Trust)
    assert f"trust-log record 99 skipped: record.after: 'bogus' is not one of {allowed}" in reading.notes


def test_GATE_M4_read_gate_reading_checks_the_job_and_the_config(tmp_path: Path) -> None:
    assert read_gate_reading(tmp_path, CONFIG) is None
    _run_writer(tmp_path)
    with pytest.raises(ManifestJobMismatch):
        read_gate_reading(tmp_path, attrs.evolve(CONFIG, job_id="another-job"))
    with pytest.raises(GateConfigMismatch):
        read_gate_reading(tmp_path, attrs.evolve(CONFIG, groups=("dp0",)))
