"""Storage faults against the gate's manifest (spec/gate.md GATE-30..33), on real files.

Each run (the worked story, an SDC that quarantines nothing, random runs) is recorded through
GateRecorder; the directory is snapshotted after every commit. Then, for every generation, every
file in the directory (each generation file, the head, the trust log) is deleted, truncated or
bit-flipped in a fresh copy, and both a reader and a resuming writer must keep the property of
tests/gate_storage.py: nothing the writer last committed as QUARANTINED or SUPERSEDED is ever
restorable, a lost newest generation fails closed and says why, and a resumed writer accepts only
a restart until one is committed, after which the directory reads clean with every quarantine
kept. The CI variant applies three damages to every file at every generation; the slow one eight.
Writer failures (GATE-33) are injected at every write step.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from scout.gate.manifest import (
    HEAD_NAME,
    LOG_NAME,
    WRITE_STAGES,
    ManifestFailClosedWarning,
    encode_manifest,
    generation_path,
    read_manifest_set,
)
from scout.gate.model import CycleBoundary, GateConfig, GateEvent, Persist, Restart, Trust
from scout.gate.recorder import GateRecorder, GateResumeRefused, read_gate, read_gate_reading
from scout.gate.recovery import FailureClass
from scout.gate.step import GateInputError, step
from tests.gate_storage import committed_states, runs, trust_map, violations
from tests.gate_story import CONFIG, story

Snapshot = dict[str, bytes]


def _flip(data: bytes, index: int) -> bytes:
    if not data:
        return b"\x01"
    flipped = bytearray(data)
    flipped[index % len(data)] ^= 0x10
    return bytes(flipped)


DAMAGES: dict[str, Callable[[bytes], bytes | None]] = {
    "delete": lambda data: None,
    "truncate-half": lambda data: data[: len(data) // 2],
    "flip-middle": lambda data: _flip(data, len(data) // 2),
    "empty": lambda data: b"",
    "drop-last-byte": lambda data: data[:-1],
    "flip-header": lambda data: _flip(data, 22),
    "flip-last": lambda data: _flip(data, len(data) - 2),
    "garbage": lambda data: bytes((i * 37) % 251 for i in range(len(data))),
}
CI_DAMAGES = ("delete", "truncate-half", "flip-middle")


def record_run(directory: Path, config: GateConfig, events: Sequence[GateEvent]) -> list[Snapshot]:
    """Record ``events`` through a GateRecorder; the directory's files after every commit."""

    def snapshot() -> Snapshot:
        return {p.name: p.read_bytes() for p in directory.iterdir() if p.name != ".writer.lock"}

    recorder, state = GateRecorder.open(directory, config)
    snapshots = [snapshot()]
    with recorder:
        for event in events:
            state, effects = step(state, event)
            if recorder.record(state, effects) is not None:
                snapshots.append(snapshot())
    return snapshots


def materialize(directory: Path, files: Snapshot, name: str, damage: str) -> bool:
    """Write ``files`` into ``directory`` with ``damage`` applied to ``name``; False if the
    damage changes nothing (so the case is not a fault)."""
    directory.mkdir()
    damaged = DAMAGES[damage](files[name])
    for other, data in files.items():
        if other != name:
            (directory / other).write_bytes(data)
    if damaged is not None:
        (directory / name).write_bytes(damaged)
    return damaged != files[name]


def newest_generation(files: Snapshot) -> str:
    return max(name for name in files if name.startswith("manifest.0"))


def check_reader(directory: Path, config: GateConfig, truth, newest_lost: bool, case: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reading = read_gate_reading(directory, config)
    assert reading is not None, case
    problems = violations(reading.state, truth, fail_closed=reading.fail_closed, newest_lost=newest_lost)
    assert not problems, f"{case}: {problems}"
    if reading.fail_closed is not None:
        for failure in FailureClass:
            decision = reading.decide(failure)
            assert decision.notes and "fail-closed" in decision.notes[-1], case
            if decision.checkpoint is not None:
                entry = truth.context.entry(decision.checkpoint)
                assert entry is not None and entry.trust is Trust.RECOVERY_VERIFIED, (case, failure)


def check_writer(directory: Path, config: GateConfig, truth, newest_lost: bool, case: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorder, resumed = GateRecorder.open(directory, config)
    with recorder:
        fail_closed = recorder.fail_closed
        problems = violations(resumed, truth, fail_closed=fail_closed, newest_lost=newest_lost)
        assert not problems, f"{case} (writer): {problems}"
        if fail_closed is None:
            return
        # GATE-32: nothing but a restart is committed.
        try:
            moved, effects = step(resumed, CycleBoundary(resumed.context.last_step + 1000))
        except GateInputError:
            pass
        else:
            with pytest.raises(GateResumeRefused, match="must be a restart"):
                recorder.record(moved, effects)
        decision = read_gate_reading(directory, config).decide(FailureClass.HANG)  # type: ignore[union-attr]
        restarted, effects = step(resumed, Restart(None if decision.checkpoint is None else decision.checkpoint.step))
        assert recorder.record(restarted, effects) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the directory is whole again: no warning at all
        after = read_gate_reading(directory, config)
    assert after is not None and after.fail_closed is None and after.state == restarted, case
    for name, trust in trust_map(truth).items():
        if trust in ("QUARANTINED", "SUPERSEDED"):
            assert trust_map(after.state)[name] in ("QUARANTINED", "SUPERSEDED"), (case, name)
    sequences = [t["sequence"] for t in recorder.transitions]
    assert sequences == list(range(1, len(sequences) + 1)), case


def damage_every_file(tmp_path: Path, damages: Sequence[str], writer_every: int) -> int:
    cases = 0
    for name, config, events in runs():
        snapshots = record_run(tmp_path / name, config, events)
        truths = committed_states(config, events)
        assert len(truths) == len(snapshots), name
        for index, (files, truth) in enumerate(zip(snapshots, truths, strict=True)):
            newest = newest_generation(files)
            for file_name in sorted(files):
                for damage in damages:
                    case = f"{name} generation {index + 1}: {damage} {file_name}"
                    directory = tmp_path / f"{name}-{index}-{file_name}-{damage}"
                    if not materialize(directory, files, file_name, damage):
                        continue
                    # An empty directory is no manifest at all: a job that lost every file starts
                    # afresh only with a new job id (the writer's error says so).
                    if len(files) == 1 or (index == 0 and file_name == newest):
                        continue
                    newest_lost = file_name == newest
                    check_reader(directory, config, truth, newest_lost, case)
                    if cases % writer_every == 0 or newest_lost:
                        check_writer(directory, config, truth, newest_lost, case)
                    cases += 1
    return cases


@pytest.fixture
def memory_path(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs where there is one: these tests check what is read, not durability,
    and thousands of fsyncs on a shared disk cost minutes (fsync on tmpfs returns at once)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="scout-damage-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_GATE_30_31_every_file_deleted_truncated_or_flipped_at_every_generation(memory_path: Path) -> None:
    cases = damage_every_file(memory_path, CI_DAMAGES, writer_every=3)
    print(f"{cases} damaged directories read and resumed")
    assert cases > 1000, cases


@pytest.mark.slow
def test_GATE_30_31_every_damage_of_every_file_at_every_generation_slow(memory_path: Path) -> None:
    cases = damage_every_file(memory_path, tuple(DAMAGES), writer_every=1)
    print(f"{cases} damaged directories read and resumed")
    assert cases > 3000, cases


def test_GATE_31_deleted_newest_generation_fails_closed_and_says_why(tmp_path: Path) -> None:
    """The issue's case: an SDC quarantines t0/s150..s450; the newest file is deleted."""
    events = story()[:26]  # up to the boundary after the SDC, before the restart
    snapshots = record_run(tmp_path / "run", CONFIG, events)
    files = snapshots[-1]
    directory = tmp_path / "damaged"
    materialize(directory, files, newest_generation(files), "delete")
    with pytest.warns(ManifestFailClosedWarning, match=r"manifest\.head names it"):
        state = read_gate(directory, CONFIG)
    reading = read_gate_reading(directory, CONFIG)
    assert reading is not None and reading.state == state
    assert reading.fail_closed is not None and "generation 27" in reading.fail_closed
    assert {str(e.id): e.trust.value for e in reading.state.context.checkpoints if e.trust.value != "QUARANTINED"} == {
        "t0/s100": "RECOVERY_VERIFIED"}
    decision = reading.decide(FailureClass.STRAGGLER)
    assert (decision.choice.value, str(decision.checkpoint)) == ("verified", "t0/s100")
    assert "manifest.head names it" in decision.to_json()["notes"][0]


def test_GATE_30_a_quarantine_survives_a_rewritten_newest_generation(tmp_path: Path) -> None:
    """A newest generation that verifies but says CAPTURED where older records say QUARANTINED
    (rewritten with a valid digest) does not undo the quarantine."""
    snapshots = record_run(tmp_path / "run", CONFIG, story()[:26])
    files = dict(snapshots[-1])
    newest = newest_generation(files)
    loaded_payload = json.loads(files[newest].split(b"\n", 1)[1])
    payload = loaded_payload["payload"]
    for entry in payload["gate"]["checkpoints"]:
        if entry["trust"] == "QUARANTINED":
            entry["trust"] = "CAPTURED"
    files[newest] = encode_manifest(CONFIG.job_id, loaded_payload["generation"], payload)
    del files[HEAD_NAME]  # the head's digest would give the rewrite away; test the fold alone
    directory = tmp_path / "rewritten"
    materialize(directory, files, LOG_NAME, "flip-middle")  # and one log line damaged
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reading = read_gate_reading(directory, CONFIG)
    assert reading is not None
    trust = {str(e.id): e.trust for e in reading.state.context.checkpoints}
    assert trust["t0/s150"] is Trust.QUARANTINED and trust["t0/s400"] is Trust.QUARANTINED
    assert any("absorbing trust survives storage faults" in change.reason for change in reading.changes)


# ------------------------------------------------------------------------------------------
# GATE-33: a failed write leaves the writer able to retry, the log unchanged
# ------------------------------------------------------------------------------------------


class Injected(OSError):
    pass


@pytest.mark.parametrize("stage", WRITE_STAGES[:4])
def test_GATE_33_a_failed_commit_can_be_retried_and_logs_each_change_once(tmp_path: Path, stage: str) -> None:
    events = story()
    fail_at: dict[str, int] = {}

    def hook(at: str, generation: int) -> None:
        if fail_at.get(at) == generation:
            del fail_at[at]
            raise Injected(errno.ENOSPC, f"injected at {at}")

    recorder, state = GateRecorder.open(tmp_path, CONFIG, hook=hook)
    with recorder:
        for index, event in enumerate(events):
            state, effects = step(state, event)
            if not any(isinstance(e, Persist) for e in effects):
                continue
            if index % 4 == 0:  # fail every fourth commit once, at this stage
                fail_at[stage] = recorder.writer.generation + 1
                before = list(recorder.transitions)
                with pytest.raises(Injected):
                    recorder.record(state, effects)
                assert recorder.transitions == before  # nothing appended in memory
                assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            recorder.record(state, effects)  # the retry
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reading = read_gate_reading(tmp_path, CONFIG)
    assert reading is not None and reading.fail_closed is None and reading.state == state
    found = read_manifest_set(tmp_path, CONFIG.job_id)
    sequences = [record["sequence"] for record in found.log]
    assert sequences == sorted(set(sequences)) == list(range(1, len(recorder.transitions) + 1))


def test_GATE_33_a_failed_fsync_leaves_no_temp_file_and_the_next_commit_works(tmp_path: Path, monkeypatch) -> None:
    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    real_fsync = os.fsync
    calls = {"n": 0}

    def failing_fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "injected EIO")
        real_fsync(fd)

    with recorder:
        state, effects = step(state, story()[0])
        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(OSError, match="injected EIO"):
            recorder.record(state, effects)
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert recorder.record(state, effects) == 2  # not FileExistsError
        monkeypatch.setattr(os, "fsync", real_fsync)
    assert read_gate_reading(tmp_path, CONFIG).state == state  # type: ignore[union-attr]


def test_GATE_33_a_failed_log_append_is_repaired_at_the_next_commit(tmp_path: Path, monkeypatch) -> None:
    events = story()[:13]
    recorder, state = GateRecorder.open(tmp_path, CONFIG)
    real_open = os.open

    def no_log(path, flags, *args):
        if str(path).endswith(LOG_NAME):
            raise OSError(errno.ENOSPC, "injected ENOSPC")
        return real_open(path, flags, *args)

    with recorder:
        for index, event in enumerate(events):
            state, effects = step(state, event)
            if index == 5:  # the capture at step 100: one trust change
                monkeypatch.setattr(os, "open", no_log)
                with pytest.warns(UserWarning, match="retried at the next commit"):
                    recorder.record(state, effects)
                monkeypatch.setattr(os, "open", real_open)
                assert not (tmp_path / LOG_NAME).exists()
            else:
                recorder.record(state, effects)
    found = read_manifest_set(tmp_path, CONFIG.job_id)
    assert [r["sequence"] for r in found.log] == [t["sequence"] for t in recorder.transitions]
    assert found.lost == () and found.problems == ()


def test_GATE_32_a_damaged_generation_number_is_never_reused(tmp_path: Path) -> None:
    snapshots = record_run(tmp_path / "run", CONFIG, story()[:10])
    files = snapshots[-1]
    directory = tmp_path / "damaged"
    newest = newest_generation(files)
    materialize(directory, files, newest, "flip-middle")
    number = int(newest.split(".")[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorder, _state = GateRecorder.open(directory, CONFIG)
    with recorder:
        assert recorder.writer.generation == number + 1  # the fail-closed commit took number + 1
    assert (directory / (newest + ".damaged")).exists()
    assert generation_path(directory, number + 1).exists()


def test_GATE_32_GATE_42_a_writer_closed_after_a_lost_generation_commits_a_loss_then_still_needs_a_restart(
        tmp_path: Path) -> None:
    """restore() may find the verified checkpoint's files gone in a manifest that lost its newest
    generation: the loss is committed, the writer stays closed to anything else, and the restart
    to the older verified checkpoint (or initialization) opens it."""
    from scout.gate.model import CheckpointLost
    from tests.gate_story import run_story

    directory = tmp_path / "gate"
    with GateRecorder.open(directory, CONFIG)[0] as recorder:
        for _event, state, effects in run_story():
            recorder.record(state, effects)
    newest = max(directory.glob("manifest.0*.json"))
    newest.write_bytes(newest.read_bytes()[:-20])  # the newest generation no longer verifies
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorder, resumed = GateRecorder.open(directory, CONFIG)
    with recorder:
        assert recorder.fail_closed is not None
        verified = resumed.context.verified
        assert verified is not None
        lost, effects = step(resumed, CheckpointLost(verified.id, "files gone"))
        assert recorder.record(lost, effects) is not None
        moved, effects = step(lost, CycleBoundary(lost.context.last_step + 1000))
        with pytest.raises(GateResumeRefused, match="must be a restart"):
            recorder.record(moved, effects)
        older = lost.context.verified
        restarted, effects = step(lost, Restart(None if older is None else older.id.step))
        assert recorder.record(restarted, effects) is not None
    reading = read_gate_reading(directory, CONFIG)
    assert reading is not None and reading.state.context.entry(verified.id).trust is Trust.LOST
