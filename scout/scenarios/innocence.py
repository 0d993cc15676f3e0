"""The innocence part of the fault campaign (``scout campaign --part innocence``; spec/observer.md
COMPLETION-9..12): random schedules of hosts running ahead of their devices on the emulated NCCL
backend, and the one property that matters most -- **a named rank is always the culprit**.

A schedule (:class:`Episode`) says which kind of group the stuck collectives are on (the default
group, a ``new_group``, both dimensions of a 2-D DeviceMesh, a pipeline's point-to-point sends
and receives between neighbouring stages), which
ranks drain their streams and how often (logging's ``.item()``), how many steps hosts may run
ahead of their devices, and which rank's device stalls -- or whose host sleeps -- at which step,
or nobody (healthy). Every episode of a job runs in the same processes, one after another
(:mod:`scout.scenarios.innocence_job`), each on its own range of steps, so every report is
judged against the episode whose steps it names:

=================  ==========================================================================
outcome            the episode's reports
=================  ==========================================================================
``localized``      name the stalled rank (and nobody else)
``inconclusive``   name nobody (inconclusive, a group stall, unresponsive with nobody missing)
``missed``         say nothing at all
``misattributed``  name another rank -- the failure this part exists to catch
``clean``          (healthy) nothing named
``false-attribution``  (healthy) somebody named
=================  ==========================================================================

Only ``misattributed`` and ``false-attribution`` fail the part: where the evidence cannot name
the culprit (a group of two, point-to-point pairs, a stall no source sees), saying nothing or
"inconclusive" is the sound answer. :func:`issue_episodes` is the issue's own schedule -- rank 0
drains every 10 steps, the others run two steps ahead, rank 1's stream stalls at step 19 -- on
each kind of group.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.reports.kinds import ReportKind
from scout.scenarios.campaign import CaseResult, Outcome

__all__ = ["GROUP_KINDS", "Episode", "issue_episodes", "judge", "random_episodes", "run_innocence_part", "run_job"]

#: The kinds of group a stuck collective may be on (COMPLETION-12 judges each group alone).
GROUP_KINDS: Final = ("default", "new_group", "mesh", "p2p")
FAULTS: Final = ("stream", "host")
WORLD: Final = 4
#: Episodes start this many steps apart, so that no report's stuck position falls in another's.
STEP_SPACING: Final = 1000
#: Observer settings of the jobs: a stall is acted on 2 s after it settles, and a fault is held
#: long enough for two rounds and a confirmation.
OBSERVER: Final = {"stall_threshold_s": 2.0, "settle_idle_s": 1.0, "round_deadline_s": 1.0, "recheck_interval_s": 1.5,
                   "confirm_rounds": 2, "data_stall_threshold_s": 30.0, "checkpoint_stall_threshold_s": 120.0}
HOLD_S: Final = 6.5
COMPUTE_S: Final = 0.02
BETWEEN_S: Final = 0.5
COLLECTIVE_TIMEOUT_S: Final = 60.0
#: A job's wall-clock bound: start-up, then each episode's steps and hold, with margin.
JOB_START_S: Final = 60.0
EPISODE_BOUND_S: Final = 30.0


@attrs.frozen
class Episode:
    """One schedule (see the module docstring). ``stall_rank`` -1: a healthy episode."""

    index: int
    kind: str
    steps: int
    ahead: int
    drain_ranks: tuple[int, ...]
    drain_every: int
    stall_rank: int = -1
    stall_step: int = 0
    fault: str = "stream"
    hold_s: float = HOLD_S

    def __attrs_post_init__(self) -> None:
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {self.kind!r}; known: {', '.join(GROUP_KINDS)}")
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(FAULTS)}")
        if not 1 <= self.ahead <= 8 or self.drain_every < 1 or not 1 <= self.steps < STEP_SPACING // 2:
            raise ValueError(f"episode {self.index}: ahead in 1..8, drain_every >= 1, steps in 1..{STEP_SPACING // 2 - 1}")
        if self.stall_rank >= 0 and not 1 <= self.stall_step <= self.steps:
            raise ValueError(f"episode {self.index}: stall_step {self.stall_step} outside its {self.steps} steps")

    @property
    def first_step(self) -> int:
        return (self.index + 1) * STEP_SPACING

    @property
    def healthy(self) -> bool:
        return self.stall_rank < 0

    def describe(self) -> str:
        what = "healthy" if self.healthy else f"{self.fault} stall on rank {self.stall_rank} at step {self.stall_step}"
        return (f"{self.kind}: {what}; ranks {list(self.drain_ranks)} drain every {self.drain_every}, hosts "
                f"{self.ahead} ahead")

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "steps": self.steps, "ahead": self.ahead,
                "drain_ranks": list(self.drain_ranks), "drain_every": self.drain_every, "stall_rank": self.stall_rank,
                "stall_step": self.stall_step, "fault": self.fault, "hold_s": self.hold_s,
                "first_step": self.first_step}


def issue_episodes(kinds: Sequence[str] = GROUP_KINDS, *, start: int = 0) -> list[Episode]:
    """The issue's run-ahead hang on each kind of group: rank 0 drains every 10 steps, the others
    run two steps ahead, rank 1's stream stalls at step 19."""
    return [Episode(start + i, kind, steps=24, ahead=2, drain_ranks=(0,), drain_every=10, stall_rank=1, stall_step=19)
            for i, kind in enumerate(kinds)]


def random_episodes(count: int, seed: int, *, world: int = WORLD, start: int = 0,
                    healthy_share: float = 0.2) -> list[Episode]:
    """``count`` random schedules, reproducible from ``seed``."""
    rng = random.Random(seed)
    episodes = []
    for offset in range(count):
        kind = rng.choice(GROUP_KINDS)
        steps = rng.randint(12, 40)
        drains = tuple(sorted(rng.sample(range(world), rng.randint(0, world))))
        healthy = rng.random() < healthy_share
        episodes.append(Episode(
            start + offset, kind, steps=steps, ahead=rng.randint(1, 4), drain_ranks=drains,
            drain_every=rng.randint(2, 12),
            stall_rank=-1 if healthy else rng.randrange(world), stall_step=0 if healthy else rng.randint(3, steps),
            fault="stream" if rng.random() < 0.75 else "host",
        ))
    return episodes


def job_bound_s(episodes: Sequence[Episode]) -> float:
    return JOB_START_S + sum(EPISODE_BOUND_S + (e.hold_s if not e.healthy else 0.0) for e in episodes)


def run_job(episodes: Sequence[Episode], directory: Path, *, world: int = WORLD,
            timeout_s: float | None = None) -> tuple[int | None, list[dict[str, Any]], str]:
    """Run one job of ``world`` ranks through ``episodes``; returns (exit status, the observers'
    reports, the tail of the logs). Bounded: the whole job is killed at ``timeout_s``."""
    directory.mkdir(parents=True, exist_ok=True)
    options = {
        "world": world, "directory": str(directory), "init_file": str(directory / "init"),
        "rendezvous_dir": str(directory / "rendezvous"), "job_id": f"innocence-{secrets.token_hex(4)}",
        "secret": secrets.token_hex(16), "observer": OBSERVER, "timeout_s": COLLECTIVE_TIMEOUT_S,
        "compute_s": COMPUTE_S, "between_s": BETWEEN_S, "episodes": [e.to_json() for e in episodes],
    }
    (directory / "rendezvous").mkdir(exist_ok=True)
    options_path = directory / "options.json"
    options_path.write_text(json.dumps(options), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    ranks = [subprocess.Popen([sys.executable, "-m", "scout.scenarios.innocence_job", str(rank), str(options_path)],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for rank in range(world)]
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else job_bound_s(episodes))
    status: int | None = 0
    for process in ranks:
        try:
            code = process.wait(max(0.1, deadline - time.monotonic()))
            if code != 0:
                status = code
        except subprocess.TimeoutExpired:
            status = None
            break
    for process in ranks:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    return status, _reports(directory / "reports.jsonl"), _log_tail(directory, world)


def _reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found


def _log_tail(directory: Path, world: int) -> str:
    tails = []
    for rank in range(world):
        path = directory / f"rank{rank}.log"
        if path.exists():
            tails.append(f"-- rank {rank}: " + path.read_text(encoding="utf-8", errors="replace")[-1500:])
    return "\n".join(tails)


def _named(record: dict[str, Any]) -> tuple[int, ...]:
    """The ranks a report names at fault (an unresponsive report names the silent)."""
    return tuple(sorted(int(r) for r in record.get("ranks", ())))


def judge(episode: Episode, records: Sequence[dict[str, Any]]) -> tuple[Outcome, tuple[int, ...], str]:
    """The outcome of one episode from the observers' reports whose stuck position falls in its
    steps (see the module docstring), what was named, and the reports in short."""
    mine = [r for r in records if r.get("source") == "observer" and r.get("kind") != ReportKind.OBSERVER_FAILURE
            and episode.first_step <= int(r.get("step") or 0) < episode.first_step + STEP_SPACING]
    named = tuple(sorted({rank for r in mine for rank in _named(r)}))
    said = "; ".join(f"{r['kind']} ranks={list(_named(r))} reason={r['reason']}" for r in mine) or "nothing reported"
    if episode.healthy:
        return (Outcome.FALSE_ATTRIBUTION if named else Outcome.CLEAN), named, said
    if any(rank != episode.stall_rank for rank in named):
        return Outcome.MISATTRIBUTED, named, said
    if named:
        return Outcome.LOCALIZED, named, said
    return (Outcome.INCONCLUSIVE if mine else Outcome.MISSED), named, said


def run_innocence_part(schedules: int, seed: int, log: Callable[[str], None] | None = None, *,
                       per_job: int = 12, world: int = WORLD, include_issue: bool = True) -> list[CaseResult]:
    """``schedules`` random schedules (and the issue's four first), ``per_job`` to a job; one
    :class:`CaseResult` per episode."""
    episodes = issue_episodes() if include_issue else []
    episodes += random_episodes(schedules, seed, world=world, start=len(episodes))
    results: list[CaseResult] = []
    for first in range(0, len(episodes), per_job):
        batch = episodes[first:first + per_job]
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="scout-innocence-") as scratch:
            status, records, tail = run_job(batch, Path(scratch), world=world)
        wall_s = (time.monotonic() - started) / max(1, len(batch))
        for episode in batch:
            outcome, named, said = judge(episode, records)
            detail = f"{episode.describe()} -> {said}"
            if status != 0:
                detail += f" (job exit status {status}; {tail[-600:]})"
                if outcome in (Outcome.CLEAN, Outcome.MISSED):
                    outcome = Outcome.MISSED
            results.append(CaseResult(
                "innocence", f"{episode.kind} {'healthy' if episode.healthy else episode.fault}", world, seed,
                outcome, () if episode.healthy else (episode.stall_rank,), named, detail,
                f"scout campaign --part innocence --seed {seed}", wall_s, world, episode.healthy, innocence=True))
            if log is not None:
                log(f"innocence {episode.index}: {outcome.value}: {detail[:300]}")
    return results
