"""The observer runtime with real processes (no torch): spawned observers, UDP channel,
progress records, reports. Scenario programs: tests/observer/runtime_ranks.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.observer import flat, runtime_ranks

pytestmark = [pytest.mark.processes, pytest.mark.light]

SPAWN = multiprocessing.get_context("spawn")
FAST = dict(stall_threshold_s=1.0, settle_idle_s=0.5, round_deadline_s=0.5, recheck_interval_s=1.0,
            join_deadline_s=30.0, attach_deadline_s=30.0)
WAIT_S = 60.0


@contextmanager
def plain_job(tmp_path: Path, scenario: str, world: int = 4, **options: Any) -> Iterator[tuple[Any, list[Any], dict[str, Any]]]:
    opts: dict[str, Any] = dict(
        scenario=scenario, secret=secrets.token_bytes(32), rendezvous_dir=str(tmp_path / "rendezvous"),
        report_path=str(tmp_path / "reports.jsonl"), directory=str(tmp_path), config=FAST, hold_s=4.0,
    )
    opts.update(options)
    control = SPAWN.Queue(maxsize=256)
    barrier = SPAWN.Barrier(world)
    job_id = f"rt-{os.getpid()}-{time.monotonic_ns()}"
    processes = [SPAWN.Process(target=runtime_ranks.plain_rank, args=(r, world, job_id, opts, barrier, control))
                 for r in range(world)]
    for process in processes:
        process.start()
    try:
        yield control, processes, opts
    finally:
        for process in processes:
            process.join(WAIT_S)
            if process.is_alive():
                process.kill()
                process.join(WAIT_S)


def gather(control: Any, until: Any, timeout_s: float = WAIT_S) -> list[tuple[Any, ...]]:
    """Messages from the ranks until ``until(messages)`` holds; bounded wait."""
    messages: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + timeout_s
    while not until(messages):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out; got {messages}"
        try:
            messages.append(control.get(timeout=min(remaining, 1.0)))
        except Exception:
            continue
    return messages


def done(world: int) -> Any:
    return lambda messages: sum(1 for m in messages if m[0] == "done") == world


def reports_in(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as file:
        return [flat(json.loads(line)) for line in file if line.strip()]


@pytest.mark.slow  # the gloo suite runs the same scenario in CI
def test_OBS_runtime_rank_behind_is_attributed_by_a_surviving_peer(tmp_path: Path) -> None:
    with plain_job(tmp_path, "behind") as (control, processes, opts):
        messages = gather(control, done(4))
    reports = reports_in(opts["report_path"])
    assert len(reports) == 1, reports
    report = reports[0]
    assert (report["kind"], report["scope"], report["outcome"], report["attributed_ranks"]) == ("hang", "rank", "behind", [2])
    assert report["reporter_rank"] == 0 and report["missing_ranks"] == []
    assert report["schema"] == "scout.report/1"
    # The callback delivered the same report to the reporter's trainer.
    callbacks = [m for m in messages if m[0] == "report"]
    assert [(m[1], flat(m[2])["attributed_ranks"]) for m in callbacks] == [(0, [2])]
    assert [p.exitcode for p in processes] == [0, 0, 0, 0]


@pytest.mark.slow  # the gloo suite runs the same scenario in CI
def test_OBS_runtime_desync_is_attributed_to_the_rank_in_another_collective(tmp_path: Path) -> None:
    with plain_job(tmp_path, "desync") as (control, processes, opts):
        gather(control, done(4))
    reports = reports_in(opts["report_path"])
    assert [(r["kind"], r["outcome"], r["attributed_ranks"], r["reporter_rank"]) for r in reports] == [
        ("desync", "desync", [1], 0)
    ]
    fingerprints = {e["rank"]: e["fingerprint"] for e in reports[0]["evidence"]["peers"]}
    assert fingerprints[1] == f"{runtime_ranks.OTHER_FINGERPRINT:#018x}"
    assert {fingerprints[r] for r in (0, 2, 3)} == {f"{runtime_ranks.COLLECTIVE_FINGERPRINT:#018x}"}


@pytest.mark.slow  # the gloo suite runs the same scenario in CI
def test_OBS_runtime_all_blocked_in_one_collective_is_group_scoped(tmp_path: Path) -> None:
    """Rank 4 is outside the observed group (e.g. another pipeline stage); it holds back, and
    every observed rank is stuck in the same collective: nobody in the group is to blame."""
    with plain_job(tmp_path, "group", world=5, group=(0, 1, 2, 3)) as (control, processes, opts):
        gather(control, done(5))
    reports = reports_in(opts["report_path"])
    assert [(r["kind"], r["scope"], r["outcome"], r["attributed_ranks"]) for r in reports] == [
        ("group_stall", "group", "group_stall", [])
    ]


def stats(opts: dict[str, Any], rank: int) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(opts["directory"], f"stats-{rank}.json").read_text())
    return loaded


@pytest.mark.slow  # the gloo suite runs the same scenario in CI
def test_OBS_1_runtime_healthy_run_sends_no_message_and_reports_nothing(tmp_path: Path) -> None:
    """Slow steps (0.6 s) stay under the threshold (1.5 s): no round, no message, no report."""
    config = {**FAST, "stall_threshold_s": 1.5}
    with plain_job(tmp_path, "healthy", steps=8, step_s=0.6, config=config) as (control, processes, opts):
        gather(control, done(4))
    assert reports_in(opts["report_path"]) == []
    for rank in range(4):
        counters = stats(opts, rank)
        assert (counters["messages_sent"], counters["messages_received"], counters["rounds"]) == (0, 0, 0)
        assert counters["stopped_reason"] == "trainer exited cleanly"


def process_gone(pid: int) -> bool:
    from scout.observer.progress import process_start_ticks

    return process_start_ticks(pid) is None


def wait_for(predicate: Any, timeout_s: float) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.mark.slow  # the gloo suite runs the same scenario in CI
def test_OBS_8_runtime_killed_trainer_its_observer_exits_and_peers_name_it(tmp_path: Path) -> None:
    import signal

    with plain_job(tmp_path, "killed", steps=400, step_s=0.05) as (control, processes, opts):
        ready = {m[1]: m for m in gather(control, lambda ms: sum(m[0] == "ready" for m in ms) == 4)}
        time.sleep(0.3)
        trainer_pid, observer_pid = ready[1][2], ready[1][3]
        os.kill(trainer_pid, signal.SIGKILL)
        exit_s = wait_for(lambda: process_gone(observer_pid), timeout_s=2.0)
        # The others wait for rank 1 forever (until the barrier's own timeout): they name it.
        messages = gather(control, lambda ms: any(m[0] == "report" for m in ms), timeout_s=20.0)
        for rank in (0, 2, 3):
            os.kill(ready[rank][2], signal.SIGKILL)
    (report,) = [flat(m[2]) for m in messages if m[0] == "report"]
    assert (report["outcome"], report["scope"], report["missing_ranks"], report["reporter_rank"]) == (
        "unresponsive", "rank", [1], 0)
    assert exit_s < 2.0


@pytest.mark.slow  # the gloo suite runs the same scenario in CI
def test_OBS_runtime_frozen_rank_sigstop_is_attributed(tmp_path: Path) -> None:
    import signal

    with plain_job(tmp_path, "sigstop", steps=200, step_s=0.05) as (control, processes, opts):
        ready = {m[1]: m for m in gather(control, lambda ms: sum(m[0] == "ready" for m in ms) == 4)}
        time.sleep(0.3)
        os.kill(ready[3][2], signal.SIGSTOP)
        try:
            messages = gather(control, lambda ms: any(m[0] == "report" for m in ms), timeout_s=20.0)
        finally:
            os.kill(ready[3][2], signal.SIGCONT)
        gather(control, done(4))
    (report,) = [flat(m[2]) for m in messages if m[0] == "report"]
    assert (report["kind"], report["outcome"], report["attributed_ranks"], report["reporter_rank"]) == (
        "hang", "behind", [3], 0)


def test_OBS_runtime_killed_observer_is_seen_by_its_trainer_and_missing_for_its_peers(tmp_path: Path) -> None:
    import signal

    # Five ranks: with rank 1's evidence missing, the three others still form a strict majority.
    with plain_job(tmp_path, "behind", world=5, steps=6, step_s=0.3) as (control, processes, opts):
        ready = {m[1]: m for m in gather(control, lambda ms: sum(m[0] == "ready" for m in ms) == 5)}
        os.kill(ready[1][3], signal.SIGKILL)  # rank 1's observer; rank 2 will hold back at step 3
        messages = gather(control, done(5))
    failures = [m for m in messages if m[0] == "report" and m[2]["kind"] == "observer_failure"]
    assert [(m[1], flat(m[2])["attributed_ranks"]) for m in failures] == [(1, [1])]  # its own trainer learned
    hangs = [r for r in reports_in(opts["report_path"]) if r["kind"] == "hang"]
    assert [(r["outcome"], r["attributed_ranks"], r["missing_ranks"]) for r in hangs] == [("behind", [2], [1])]
