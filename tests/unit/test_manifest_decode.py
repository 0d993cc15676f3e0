"""A manifest file whose checksum verifies but whose body this reader cannot hold is damage, and
the reader fails closed (spec/gate.md GATE-38); recording an already committed state again is a
no-op (GATE-39). Real files, the real reader and writer."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from scout.gate.manifest import (
    FORMAT_VERSION,
    LOG_NAME,
    MAGIC,
    NESTING_MAX,
    generation_path,
    log_line,
    read_manifest_set,
)
from scout.gate.model import Persist, Trust, TrustChange
from scout.gate.recorder import GateRecorder, read_gate_reading
from scout.gate.step import step
from tests.gate_story import CONFIG, story


def _framed(body: bytes) -> bytes:
    return f"{MAGIC} sha256={hashlib.sha256(body).hexdigest()} bytes={len(body)}\n".encode("ascii") + body


def _document(generation: int, payload_text: str) -> bytes:
    return (f'{{"format_version": {FORMAT_VERSION}, "generation": {generation}, "job_id": '
            f'{json.dumps(CONFIG.job_id)}, "payload": {payload_text}}}\n').encode("ascii")


def _recorded_run(directory: Path, events: int) -> int:
    """A real gate run of ``events`` story events; returns the newest generation."""
    recorder, state = GateRecorder.open(directory, CONFIG)
    with recorder:
        for event in story()[:events]:
            state, effects = step(state, event)
            recorder.record(state, effects)
        return recorder.writer.generation


HOSTILE_PAYLOADS = {
    "a 5000-digit integer": '{"x": ' + "9" * 5000 + "}",
    "nesting one level too deep": "[" * NESTING_MAX + "]" * NESTING_MAX,
    "nesting 100000 levels deep": "[" * 100_000 + "]" * 100_000,
    "not JSON": "{nope",
    "a payload that is not an object": "[1, 2]",
}


@pytest.mark.parametrize("hostile", sorted(HOSTILE_PAYLOADS))
def test_GATE_38_a_verified_newest_generation_that_does_not_decode_fails_closed(tmp_path: Path, hostile: str) -> None:
    newest = _recorded_run(tmp_path, 14)
    generation_path(tmp_path, newest + 1).write_bytes(_framed(_document(newest + 1, HOSTILE_PAYLOADS[hostile])))
    found = read_manifest_set(tmp_path, CONFIG.job_id)
    reading = read_gate_reading(tmp_path, CONFIG)
    assert found.lost_reason is not None and f"generation {newest + 1}" in found.lost_reason
    assert reading is not None and reading.fail_closed is not None
    # Fail closed: nothing unverified is restorable.
    trusts = {entry.trust for entry in reading.state.context.checkpoints}
    assert trusts <= {Trust.QUARANTINED, Trust.SUPERSEDED, Trust.RECOVERY_VERIFIED}


def test_GATE_38_deep_nesting_in_strings_is_not_nesting(tmp_path: Path) -> None:
    """Brackets inside JSON strings do not count towards the nesting bound."""
    newest = _recorded_run(tmp_path, 3)
    payload = json.dumps({"note": "[" * 1000 + '\\"{' * 500})
    generation_path(tmp_path, newest + 1).write_bytes(_framed(_document(newest + 1, payload)))
    found = read_manifest_set(tmp_path, CONFIG.job_id)
    assert newest + 1 not in {lost.generation for lost in found.lost}
    assert found.newest is not None and found.newest.generation == newest + 1


@pytest.mark.parametrize("line", ['{"sequence": ' + "7" * 5000 + "}", '{"a": ' + "[" * 5000 + "]" * 5000 + "}",
                                  '{"a": ' + "[" * 100 + "]" * 100 + "}", '{"a": 1,}'],
                         ids=["long-integer", "nesting-5000", "nesting-100", "not-json"])
def test_GATE_38_a_verified_log_line_that_does_not_decode_is_skipped_with_a_note(tmp_path: Path, line: str) -> None:
    _recorded_run(tmp_path, 14)
    body = line.encode("ascii")
    good = log_line({"sequence": 1, "generation": 1, "job_id": CONFIG.job_id})
    magic = good.split(b" ", 1)[0].decode("ascii")
    with open(tmp_path / LOG_NAME, "ab") as log:
        log.write(f"{magic} sha256={hashlib.sha256(body).hexdigest()} ".encode("ascii") + body + b"\n")
    found = read_manifest_set(tmp_path, CONFIG.job_id)  # no ValueError, no RecursionError
    assert any("not JSON scout can read" in problem for problem in found.problems), found.problems


def test_GATE_39_recording_a_committed_state_again_writes_nothing(tmp_path: Path) -> None:
    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    with recorder:
        committed = []
        for event in story():
            state, effects = step(state, event)
            generation = recorder.record(state, effects)
            if generation is None:
                continue
            files = sorted(os.listdir(tmp_path))
            log = (tmp_path / LOG_NAME).read_bytes() if (tmp_path / LOG_NAME).exists() else b""
            # The caller cannot tell whether its commit landed, and calls again.
            assert recorder.record(state, effects) == generation
            assert sorted(os.listdir(tmp_path)) == files
            assert ((tmp_path / LOG_NAME).read_bytes() if (tmp_path / LOG_NAME).exists() else b"") == log
            committed += [e for e in effects if isinstance(e, TrustChange)]
        assert committed, "the story must change trust, or this test proves nothing"
    found = read_manifest_set(tmp_path, CONFIG.job_id)
    sequences = [record["sequence"] for record in found.log]
    assert sequences == list(range(1, len(committed) + 1))


def test_GATE_39_the_same_state_after_another_commit_is_committed_again(tmp_path: Path) -> None:
    """Only a repeat of the *last* commit is a no-op: an older state recorded again is new."""
    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    with recorder:
        events = story()
        first, first_effects = step(state, events[0])
        assert any(isinstance(e, Persist) for e in first_effects)
        one = recorder.record(first, first_effects)
        second, second_effects = step(first, events[1])
        two = recorder.record(second, [*second_effects, Persist()] if not any(
            isinstance(e, Persist) for e in second_effects) else second_effects)
        again = recorder.record(first, first_effects)
    assert one is not None and two is not None and again is not None and again > two > one
