"""The observer's real-process scenarios (OBS-*): CPU, gloo, a tiny training loop per rank, instrumented
torch.distributed, one spawned observer per rank. Ranks are forked from a server that imported
torch once (OMP_NUM_THREADS=1); every wait is bounded. Rank programs:
tests/observer/runtime_ranks.py (``gloo_rank``).

gloo note: an all-reduce whose shape differs on one rank does not hang under gloo -- it fails
within a second ("Received data size doesn't match") -- so the desync that *hangs* is checked
with rank 1 entering a barrier where the others all-reduce (same coordinate, other fingerprint).
The different-shape desync is covered by the fingerprint tests and the model checks."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.observer import flat

pytest.importorskip("torch")

from scout.observer.progress import record_name  # noqa: E402
from tests.observer import runtime_ranks, torch_ranks  # noqa: E402
from tests.observer.test_observer_runtime import (  # noqa: E402
    FAST,
    gather,
    process_gone,
    reports_in,
    stats,
    wait_for,
)

pytestmark = [pytest.mark.torchdist, pytest.mark.light]
WAIT_S = 90.0


@contextmanager
def gloo_job(tmp_path: Path, scenario: str, world: int = 4, **options: Any) -> Iterator[tuple[Any, list[Any], dict[str, Any]]]:
    context = torch_ranks.forkserver_context()
    opts: dict[str, Any] = dict(
        scenario=scenario, secret=secrets.token_bytes(32), rendezvous_dir=str(tmp_path / "rendezvous"),
        report_path=str(tmp_path / "reports.jsonl"), directory=str(tmp_path), config=FAST, hold_s=4.0,
        init_file=str(tmp_path / "init"), collective_timeout_s=30.0,
    )
    opts.update(options)
    control = context.Queue(maxsize=256)
    job_id = f"gloo-{os.getpid()}-{time.monotonic_ns()}"
    processes = [context.Process(target=runtime_ranks.gloo_rank, args=(r, world, job_id, opts, control))
                 for r in range(world)]
    for process in processes:
        process.start()
    try:
        yield control, processes, opts
    finally:
        for process in processes:
            process.join(WAIT_S if scenario in ("behind", "healthy") else 1.0)
            if process.is_alive():
                process.kill()
                process.join(WAIT_S)
        # A trainer killed on purpose leaves its record behind; a later writer for the same rank
        # would reclaim it, but this job id is never reused, so remove the job's records here.
        for rank in range(world):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join("/dev/shm", record_name(job_id, 0, rank)))


def ready_of(control: Any, world: int) -> dict[int, tuple[Any, ...]]:
    return {m[1]: m for m in gather(control, lambda ms: sum(m[0] == "ready" for m in ms) == world, WAIT_S)}


def first_report(control: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    messages = gather(control, lambda ms: any(m[0] == "report" for m in ms), timeout_s)
    record: dict[str, Any] = flat(next(m[2] for m in messages if m[0] == "report"))
    return record


def kill_all(ready: dict[int, tuple[Any, ...]]) -> None:
    for message in ready.values():
        os.kill(message[2], signal.SIGKILL)


def test_OBS_gloo_rank_2_sleeping_before_the_all_reduce_is_attributed_as_behind(tmp_path: Path) -> None:
    with gloo_job(tmp_path, "behind") as (control, processes, opts):
        ready = ready_of(control, 4)
        report = first_report(control)
        started = time.monotonic()
        gather(control, lambda ms: sum(m[0] == "done" for m in ms) == 4, WAIT_S)
    assert (report["kind"], report["scope"], report["outcome"], report["attributed_ranks"]) == ("hang", "rank", "behind", [2])
    assert report["reporter_rank"] == 0 and len(ready) == 4
    # Detected about one threshold after the stall began, well before rank 2 woke up (4 s).
    assert FAST["stall_threshold_s"] <= report["evidence"]["idle_s"] < FAST["stall_threshold_s"] + 1.0
    assert time.monotonic() - started < WAIT_S
    assert len(reports_in(opts["report_path"])) == 1


def test_OBS_gloo_rank_1_in_another_collective_is_a_desync(tmp_path: Path) -> None:
    with gloo_job(tmp_path, "desync") as (control, processes, opts):
        ready = ready_of(control, 4)
        report = first_report(control)
        kill_all(ready)
    assert (report["kind"], report["outcome"], report["attributed_ranks"], report["reporter_rank"]) == (
        "desync", "desync", [1], 0)


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as file:
        stat = file.read()
    return stat[stat.rindex(")") + 2]


def test_OBS_gloo_rank_3_frozen_with_sigstop_is_attributed(tmp_path: Path) -> None:
    """Rank 3 is frozen by SIGSTOP in the compute of step 3 (it stops itself there, so the place
    is always the same); its observer process keeps running and its peers name it behind."""
    with gloo_job(tmp_path, "sigstop", steps=400, step_s=0.02) as (control, processes, opts):
        ready = ready_of(control, 4)
        try:
            report = first_report(control)
            state = process_state(ready[3][2])
        finally:
            os.kill(ready[3][2], signal.SIGCONT)
            kill_all(ready)
    assert state == "T", f"rank 3 is not stopped (state {state})"
    assert (report["kind"], report["outcome"], report["attributed_ranks"], report["reporter_rank"]) == (
        "hang", "behind", [3], 0)
    assert report["evidence"]["stuck_position"]["step"] == 3


def test_OBS_gloo_all_observed_ranks_blocked_in_one_collective_is_group_scoped(tmp_path: Path) -> None:
    with gloo_job(tmp_path, "group", world=5, group=(0, 1, 2, 3), hold_s=6.0) as (control, processes, opts):
        ready = ready_of(control, 5)
        report = first_report(control)
        kill_all(ready)
    assert (report["kind"], report["scope"], report["outcome"], report["attributed_ranks"]) == (
        "group_stall", "group", "group_stall", [])
    assert {e["stage"] for e in report["evidence"]["peers"]} == {"collective"}


def test_OBS_gloo_killed_trainer_its_observer_exits_within_2_s_and_peers_name_it(tmp_path: Path) -> None:
    with gloo_job(tmp_path, "killed", steps=400, step_s=0.02) as (control, processes, opts):
        ready = ready_of(control, 4)
        time.sleep(0.5)
        os.kill(ready[1][2], signal.SIGKILL)
        exit_s = wait_for(lambda: process_gone(ready[1][3]), timeout_s=2.0)
        report = first_report(control)
        kill_all({r: m for r, m in ready.items() if r != 1})
    assert exit_s < 2.0
    # gloo fails fast on a dead peer for some survivors (they leave the all-reduce with an
    # error) and not for others (still inside it), so the survivors' coordinates may differ:
    # "unresponsive" when they agree, "inconclusive" when they do not. Either way the report
    # names rank 1 as missing, from a surviving peer. (With every survivor blocked, as under
    # NCCL, it is "unresponsive": test_observer_runtime.py.)
    assert report["outcome"] in ("unresponsive", "inconclusive"), report
    assert (report["missing_ranks"], report["reporter_rank"]) == ([1], 0), report


def test_OBS_1_gloo_healthy_run_no_report_and_no_observer_message(tmp_path: Path) -> None:
    """Slow steps stay under the threshold: the observers send nothing at all."""
    config = {**FAST, "stall_threshold_s": 1.5}
    with gloo_job(tmp_path, "healthy", steps=10, step_s=0.5, config=config) as (control, processes, opts):
        gather(control, lambda ms: sum(m[0] == "done" for m in ms) == 4, WAIT_S)
    assert reports_in(opts["report_path"]) == []
    for rank in range(4):
        counters = stats(opts, rank)
        assert (counters["messages_sent"], counters["messages_received"], counters["reports"]) == (0, 0, 0)


@pytest.mark.slow
def test_OBS_1_gloo_healthy_60_second_run_slow(tmp_path: Path) -> None:
    config = {**FAST, "stall_threshold_s": 1.5}
    with gloo_job(tmp_path, "healthy", steps=100, step_s=0.6, config=config) as (control, processes, opts):
        gather(control, lambda ms: sum(m[0] == "done" for m in ms) == 4, 180.0)
    assert reports_in(opts["report_path"]) == []
    assert all(stats(opts, rank)["messages_sent"] == 0 for rank in range(4))
