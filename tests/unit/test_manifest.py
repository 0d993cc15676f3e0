"""The durable manifest (scout/gate/manifest.py): torn and bit-flipped files are detected and the
last good generation is used (GATE-M2, GATE-M3); another job's or a newer format's manifest is an
error naming the value (GATE-M4); one writer; resume. Crash safety with real processes is in
test_manifest_crash.py."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest

from scout.gate.manifest import (
    FORMAT_VERSION,
    ManifestBusy,
    ManifestDamaged,
    ManifestFailClosedWarning,
    ManifestFallbackWarning,
    ManifestFormatTooNew,
    ManifestJobMismatch,
    ManifestWriter,
    _Damaged,
    decode_manifest,
    encode_manifest,
    generation_path,
    load_manifest,
    read_manifest_set,
)
from scout.gate.recorder import GateConfigMismatch, GateRecorder, read_gate
from scout.gate.step import initial_state, step
from tests.gate_story import CONFIG, story, story_payloads

JOB = CONFIG.job_id


def write_generations(directory: Path, count: int) -> list[dict]:
    payloads = story_payloads()[:count]
    with ManifestWriter(directory, JOB) as writer:
        for payload in payloads:
            writer.commit(payload)
    return payloads


def test_GATE_M1_commit_and_load_round_trip(tmp_path: Path) -> None:
    payloads = write_generations(tmp_path, 5)
    loaded = load_manifest(tmp_path, JOB)
    assert loaded is not None
    assert (loaded.generation, loaded.payload, loaded.skipped) == (5, payloads[4], ())
    # Only the newest generations_kept (3) stay; no temporary file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".writer")) == [
        "manifest.000000000003.json",
        "manifest.000000000004.json",
        "manifest.000000000005.json",
        "manifest.head",
    ]


def test_empty_directory_has_no_manifest(tmp_path: Path) -> None:
    assert load_manifest(tmp_path, JOB) is None
    assert load_manifest(tmp_path / "absent", JOB) is None


def test_GATE_M2_every_single_bit_flip_is_detected() -> None:
    payload = {"gate": {"control": "IDLE", "n": 1}, "transitions": []}
    data = encode_manifest(JOB, 7, payload)
    path = Path("manifest.000000000007.json")
    assert decode_manifest(data, path, JOB).payload == payload
    for index in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[index] ^= 1 << bit
            with pytest.raises(_Damaged):
                decode_manifest(bytes(flipped), path, JOB)


def test_GATE_M2_every_truncation_is_detected() -> None:
    data = encode_manifest(JOB, 3, {"gate": {"k": "v" * 50}})
    path = Path("manifest.000000000003.json")
    for length in range(len(data)):
        with pytest.raises(_Damaged):
            decode_manifest(data[:length], path, JOB)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_GATE_M3_damaged_newest_falls_back_to_last_good_with_a_warning_naming_it(tmp_path: Path, damage: str) -> None:
    payloads = write_generations(tmp_path, 4)
    newest = generation_path(tmp_path, 4)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        flipped = bytearray(data)
        flipped[len(data) - 10] ^= 0x04
        newest.write_bytes(bytes(flipped))
    elif damage == "garbage":
        newest.write_bytes(b"\x00" * 4096)
    else:
        newest.write_bytes(b"")
    # The newest generation is lost: the last good one is named, and the gate's reader fails
    # closed (GATE-31, test_manifest_damage.py).
    with pytest.warns(ManifestFailClosedWarning, match=r"manifest\.000000000004\.json") as caught:
        loaded = load_manifest(tmp_path, JOB)
    assert loaded is not None and (loaded.generation, loaded.payload) == (3, payloads[2])
    assert "generation 3" in str(caught[0].message)
    assert [s.path for s in loaded.skipped] == [newest]


def test_GATE_32_writer_sets_damaged_generations_aside_and_never_reuses_their_number(tmp_path: Path) -> None:
    write_generations(tmp_path, 4)
    newest = generation_path(tmp_path, 4)
    newest.write_bytes(newest.read_bytes()[:-5])
    with pytest.warns(ManifestFallbackWarning, match="set aside"), ManifestWriter(tmp_path, JOB) as writer:
        assert writer.resumed is not None and writer.resumed.generation == 3
        assert writer.generation == 4  # named by the damaged file: the next number is 5
        assert [lost.generation for lost in writer.reading.lost] == [4]
        # Until a newer generation is committed, the set-aside file still witnesses the loss.
        assert [lost.generation for lost in read_manifest_set(tmp_path, JOB).lost] == [4]
        assert writer.commit({"next": True}) == 5
    assert (tmp_path / "manifest.000000000004.json.damaged").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_manifest(tmp_path, JOB)
    assert loaded is not None and (loaded.generation, loaded.payload) == (5, {"next": True})


def test_no_good_generation_is_an_error_listing_the_files(tmp_path: Path) -> None:
    write_generations(tmp_path, 2)
    for generation in (1, 2):
        generation_path(tmp_path, generation).write_bytes(b"torn")
    with pytest.raises(ManifestDamaged, match=r"manifest\.000000000002\.json: first line.*manifest\.000000000001\.json"):
        load_manifest(tmp_path, JOB)


def test_GATE_M4_another_jobs_manifest_is_an_error_naming_both_ids(tmp_path: Path) -> None:
    write_generations(tmp_path, 2)
    with pytest.raises(ManifestJobMismatch, match="belongs to job_id 'story-job', not 'other-job'"):
        load_manifest(tmp_path, "other-job")
    with pytest.raises(ManifestJobMismatch, match="other-job"):
        ManifestWriter(tmp_path, "other-job")


def test_GATE_M4_a_newer_format_is_an_error_naming_the_version(tmp_path: Path) -> None:
    document = {"format_version": FORMAT_VERSION + 1, "job_id": JOB, "generation": 1, "payload": {}}
    body = (json.dumps(document, sort_keys=True, indent=1) + "\n").encode()
    header = f"scout-gate-manifest sha256={hashlib.sha256(body).hexdigest()} bytes={len(body)}\n".encode()
    generation_path(tmp_path, 1).write_bytes(header + body)
    with pytest.raises(ManifestFormatTooNew, match=f"format_version {FORMAT_VERSION + 1} is newer than this scout reads"):
        load_manifest(tmp_path, JOB)


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB), pytest.raises(ManifestBusy, match="another manifest writer"):
        ManifestWriter(tmp_path, JOB)
    with ManifestWriter(tmp_path, JOB) as writer:  # the lock went with the first writer
        writer.commit({})


def test_gate_resumes_from_the_manifest(tmp_path: Path) -> None:
    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    with recorder:
        assert state == initial_state(CONFIG)
        for event in story()[:12]:
            state, effects = step(state, event)
            recorder.record(state, effects)
        written = recorder.writer.generation
    resumed_recorder, resumed = GateRecorder.open(tmp_path, CONFIG)
    with resumed_recorder:
        assert resumed == state
        assert resumed_recorder.writer.generation == written
        assert [t["after"] for t in resumed_recorder.transitions] == ["CANDIDATE", "CAPTURED", "RECOVERY_VERIFIED", "CANDIDATE"]
    assert read_gate(tmp_path, CONFIG) == state


def test_gate_refuses_a_manifest_written_for_another_catalog(tmp_path: Path) -> None:
    GateRecorder.open(tmp_path, CONFIG)[0].close()
    changed = type(CONFIG)(CONFIG.job_id, ("embedding", "hidden"), CONFIG.groups)
    with pytest.raises(GateConfigMismatch, match="keeps its catalog"):
        GateRecorder.open(tmp_path, changed)


def test_bad_arguments_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generations_kept must be an int >= 2, got 1"):
        ManifestWriter(tmp_path, JOB, generations_kept=1)
    with pytest.raises(ValueError, match="not plain JSON"):
        encode_manifest(JOB, 1, {"x": float("nan")})
