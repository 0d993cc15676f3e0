"""GATE-M1: crash safety of the manifest, proven with real processes killed by SIGKILL.

A writer process (manifest_writer_child.py) commits the gate payloads of the worked run
(tests/gate_story.py) as successive generations and prints each generation it got back from
``commit``. It is killed (a) by itself, right after each write step of a generation, and (b) by
this test, at random moments while it writes. After every kill the manifest must load, hold a
generation no older than the last acknowledged one (nothing committed is lost) and no newer than
the one in flight, and hold exactly the payload written for that generation (so no verified
entry appears that the writer did not commit). A fresh writer then resumes from it.

The CI variant kills at every stage of 8 generations and at 200 random points in well under a
minute on 2 cores; the slow variant covers every generation of the run and 1000 random points.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout.gate.manifest import WRITE_STAGES, load_manifest, read_manifest_set
from scout.gate.recorder import read_gate_reading
from tests import processes
from tests.gate_story import CONFIG, story_payloads
from tests.unit import manifest_writer_child

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("manifest_writer_child.py")
JOB = CONFIG.job_id
PAYLOADS = story_payloads()
CHILD_TIMEOUT_S = 60.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def payloads_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("payloads") / "payloads.json"
    path.write_text(json.dumps(PAYLOADS), encoding="utf-8")
    return path


def expected_payload(generation: int) -> dict:
    return PAYLOADS[(generation - 1) % len(PAYLOADS)]


def run_child(directory: Path, payloads_file: Path, generations: int, kill_at: tuple[int, str] | None = None):
    command = [sys.executable, str(CHILD), str(directory), JOB, str(payloads_file), str(generations)]
    if kill_at is not None:
        command += [str(kill_at[0]), kill_at[1]]
    return processes.run(command, env=_env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)


def acknowledged(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("committed ")]


def resumed_from(stdout: str) -> int:
    return int(stdout.splitlines()[0].split()[1])


def verified_steps(payload: dict) -> set[tuple[int, int]]:
    return {
        (entry["checkpoint"]["timeline"], entry["checkpoint"]["step"])
        for entry in payload["gate"]["checkpoints"]
        if entry["trust"] == "RECOVERY_VERIFIED"
    }


def check_after_kill(directory: Path, last_acknowledged: int, in_flight: int) -> int:
    loaded = load_manifest(directory, JOB)
    if last_acknowledged == 0 and loaded is None:
        return 0
    assert loaded is not None, "the manifest must load after a kill"
    assert last_acknowledged <= loaded.generation <= in_flight, (
        f"loaded generation {loaded.generation}; acknowledged {last_acknowledged}, in flight {in_flight}"
    )
    assert loaded.payload == expected_payload(loaded.generation)
    # Implied by the line above, and the property that matters: every verified entry shown was
    # written by the writer for this generation.
    assert verified_steps(loaded.payload) == verified_steps(expected_payload(loaded.generation))
    assert not loaded.skipped
    # A crash at any point is never mistaken for a lost generation: the trust log and the head are
    # written after the generation, so they never name one that is not durable (GATE-31).
    found = read_manifest_set(directory, JOB)
    assert found.lost == (), found.lost
    if loaded.generation <= len(PAYLOADS):
        reading = read_gate_reading(directory, CONFIG)
        assert reading is not None and reading.fail_closed is None and reading.changes == ()
    return loaded.generation


def kill_at_every_stage(tmp_path: Path, payloads_file: Path, generations: list[int]) -> int:
    kills = 0
    for generation in generations:
        for stage in WRITE_STAGES:
            directory = tmp_path / f"g{generation}-{stage}"
            result = run_child(directory, payloads_file, generation, (generation, stage))
            assert result.returncode == -signal.SIGKILL, result.stderr
            done = acknowledged(result.stdout)
            assert done == list(range(1, generation)), result.stdout
            loaded = check_after_kill(directory, generation - 1, generation)
            # Before the rename nothing of the new generation is visible; after it, all of it is.
            visible = WRITE_STAGES.index(stage) >= WRITE_STAGES.index("renamed")
            assert loaded == (generation if visible else generation - 1), (stage, loaded)
            # A new writer resumes where the manifest stands and finishes the run (in this
            # process: the killed writer's lock went with it).
            lines: list[str] = []
            manifest_writer_child.write(str(directory), JOB, PAYLOADS, generation + 1, out=lines.append)
            assert resumed_from("\n".join(lines)) == loaded
            assert check_after_kill(directory, generation + 1, generation + 1) == generation + 1
            assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
            kills += 1
    return kills


def kill_at_random_points(tmp_path: Path, payloads_file: Path, kills: int, seed: int) -> dict[str, float]:
    """One directory, many lives: each writer resumes what the previous one left, and is killed
    after a random delay while it commits generation after generation."""
    rng = random.Random(seed)
    directory = tmp_path / "random"
    last_acknowledged = 0
    loaded = 0
    delays_s: list[float] = []
    target = 10**9  # the writer never runs out of work before it is killed
    for kill in range(kills):
        process = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), JOB, str(payloads_file), str(target)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Wait until the writer has resumed, so the kill lands inside the write loop.
        first = process.stdout.readline() if process.stdout else ""
        assert first.startswith("resumed "), (first, process.stderr.read() if process.stderr else "")
        assert int(first.split()[1]) == loaded, "a writer resumes from the newest good generation"
        delay_s = rng.uniform(0.0, 0.03)
        delays_s.append(delay_s)
        time.sleep(delay_s)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=CHILD_TIMEOUT_S)
        # Read through the buffered pipe objects (readline above may have read ahead), to EOF.
        assert process.stdout is not None and process.stderr is not None
        stdout, stderr = process.stdout.read(), process.stderr.read()
        process.stdout.close()
        process.stderr.close()
        assert process.returncode == -signal.SIGKILL, f"kill {kill} (seed {seed}): {stderr}"
        done = acknowledged(stdout)
        if done:
            assert done == list(range(loaded + 1, done[-1] + 1))
            last_acknowledged = done[-1]
        in_flight = last_acknowledged + 1
        loaded = check_after_kill(directory, last_acknowledged, in_flight)
        last_acknowledged = loaded
    return {"kills": kills, "generations": loaded, "delay_s_max": max(delays_s)}


def test_GATE_M1_sigkill_after_every_write_step(tmp_path: Path, payloads_file: Path) -> None:
    # The generations where trust moves: 1 the fresh gate, 7 the first candidate, 12 its
    # promotion, 15 the unchecked result, 17 the candidate withheld, 25 the SDC quarantine,
    # 28 the restart, 38 the promotion in the new timeline.
    marks = [1, 7, 12, 15, 17, 25, 28, 38]
    assert len(PAYLOADS) == 38 and PAYLOADS[11]["transitions"][-1]["after"] == "RECOVERY_VERIFIED"
    assert kill_at_every_stage(tmp_path, payloads_file, marks) == len(marks) * len(WRITE_STAGES)


def test_GATE_M1_sigkill_at_80_random_points(tmp_path: Path, payloads_file: Path) -> None:
    """80 kills in every suite (one writer process each); the 1,000-kill run is in the slow tier."""
    seed = int(os.environ.get("SCOUT_CRASH_SEED", "20260511"))
    figures = kill_at_random_points(tmp_path, payloads_file, 80, seed)
    print(f"random kills (seed {seed}): {figures}")
    # The writer got far enough for the kills to land at many different generations.
    assert figures["generations"] > 8, figures


@pytest.mark.slow
def test_GATE_M1_sigkill_after_every_write_step_of_every_generation(tmp_path: Path, payloads_file: Path) -> None:
    generations = list(range(1, len(PAYLOADS) + 1))
    assert kill_at_every_stage(tmp_path, payloads_file, generations) == len(generations) * len(WRITE_STAGES)


@pytest.mark.slow
def test_GATE_M1_sigkill_at_1000_random_points(tmp_path: Path, payloads_file: Path) -> None:
    figures = kill_at_random_points(tmp_path, payloads_file, 1000, seed=7)
    assert figures["generations"] > 100, figures
