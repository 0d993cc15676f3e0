"""The framework's checkpoints on disk and in the manifest (spec/frameworks.md FRAME-6, FRAME-7,
FRAME-9): the content digest, the quarantine mark, and the artifact through the gate and codec."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from scout.gate.artifact import MARK_NAME, content_digest, mark_path, mark_quarantined, remove_mark
from scout.gate.codec import state_from_json, state_to_json
from scout.gate.model import Artifact, CheckpointCaptured, CycleBoundary, GateConfig, Trust
from scout.gate.step import initial_state, step


def test_FRAME_7_the_digest_is_the_specified_hash_of_every_file_and_ignores_scouts_marks(tmp_path: Path) -> None:
    root = tmp_path / "checkpoint-3"
    (root / "sub").mkdir(parents=True)
    (root / "b.bin").write_bytes(b"\x00\x01")
    (root / "sub" / "a.pt").write_bytes(b"weights")
    expected = hashlib.blake2b(digest_size=32)
    for relative, data in (("b.bin", b"\x00\x01"), ("sub/a.pt", b"weights")):
        expected.update(relative.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    assert content_digest(root) == "blake2b-256:" + expected.hexdigest()
    (root / MARK_NAME).write_text("{}")
    assert content_digest(root) == "blake2b-256:" + expected.hexdigest(), "scout's mark is not content"
    (root / "sub" / "a.pt").write_bytes(b"weightz")
    assert content_digest(root) != "blake2b-256:" + expected.hexdigest()
    changed = content_digest(root)
    (root / "sub" / "a.pt").rename(root / "sub" / "c.pt")
    assert content_digest(root) != changed, "a renamed file changes it"
    one = tmp_path / "step=3.ckpt"
    one.write_bytes(b"abc")
    single = hashlib.blake2b(b"step=3.ckpt\0" + (3).to_bytes(8, "big") + b"abc", digest_size=32)
    assert content_digest(one) == "blake2b-256:" + single.hexdigest()


def test_FRAME_9_the_mark_is_inside_a_directory_and_beside_a_file_and_a_new_save_removes_it(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-9"
    folder.mkdir()
    one = tmp_path / "step=9.ckpt"
    one.write_bytes(b"x")
    assert mark_path(folder) == folder / "SCOUT_QUARANTINED"
    assert mark_path(one) == tmp_path / "step=9.ckpt.SCOUT_QUARANTINED"
    for path in (folder, one):
        mark = mark_quarantined(path, {"checkpoint": "t0/s9"})
        assert mark is not None and json.loads(mark.read_text())["checkpoint"] == "t0/s9"
        assert remove_mark(path) and not mark.exists() and not remove_mark(path)
    assert mark_quarantined(tmp_path / "gone", {}) is None, "a rotated-away checkpoint is not marked"


def test_FRAME_6_GATE_17_the_capture_carries_the_artifact_into_the_entry_and_the_manifest() -> None:
    config = GateConfig("job", ["hidden.0"], ["dp"])
    state = initial_state(config)
    artifact = Artifact("huggingface", "/out/checkpoint-4", "blake2b-256:00")
    state, _ = step(state, CycleBoundary(2))
    state, _ = step(state, CheckpointCaptured(4, artifact))
    (entry,) = state.context.checkpoints
    assert (entry.trust, entry.artifact) == (Trust.CAPTURED, artifact)
    again = state_from_json(json.loads(json.dumps(state_to_json(state))))
    assert again.context.checkpoints == state.context.checkpoints
