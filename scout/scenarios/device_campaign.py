"""The device-semantics part of the fault campaign (``scout campaign --part device``; :mod:`.campaign`).

The real-process part runs on gloo, where a collective blocks its caller until it is done. This
part runs the same kind of job on the emulated NCCL backend (:mod:`scout.transport.nccl.emulated`):
collectives return at enqueue, every host blocks at one sync point per step, and faults happen
on the device side. One ``torchrun`` job of 4 ranks (:mod:`scout.scenarios.device_job`, with
``scout.attach``: observers, replay, gate) runs the whole matrix, one fault at a time, each
released after ``HOLD_S``; every fault is one case, and the stretches between them are the
healthy run:

==================  ========================================================  ==============
kind                injected                                                  scout must name
==================  ========================================================  ==============
gpu-hang            a kernel that never ends before the gradient all-reduce   ``hang``, rank
                    (rank 0; full: also a middle rank and the last rank)
launch-withheld     the all-reduce's kernel is never launched                 ``hang``, rank
host-sleep          the training thread sleeps before it enqueues             ``hang``, rank
thread-sleep        the communication thread (FSDP2's backward issues from    ``hang``, rank
                    autograd threads) sleeps before it enqueues
desync              the all-reduce enqueued with another shape                ``desync``, rank
loop-slow           the rank's host loop 0.15 s slower for 24 steps (its      ``straggler``
                    peers wait for it at the all-reduce, which returns at     ``loop-slow``,
                    enqueue: timed at completion, LOOP-5)                     rank
healthy             every step between the faults                             nothing
==================  ========================================================  ==============

A hang-type fault is localized when exactly the injected rank is named, at the fault's step,
with the expected kind, decided on completion evidence (spec/observer.md COMPLETION-1..8): the
host coordinates alone would see every rank waiting at one sync point (a group stall, nobody
named). The loop straggler is localized when the rank is confirmed ``loop-slow`` while it is
slow, and nobody else is named (its recovery afterwards is part of the case). Everything is bounded: the job is killed (its whole session: ranks and observers) at
``JOB_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.reports.kinds import ReportKind, Source, StragglerReason
from scout.scenarios.campaign import CaseResult, Outcome, classify
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

__all__ = ["DEVICE_KINDS", "DeviceCase", "device_cases", "run_device_part"]

WORLD: Final = 4
#: Thresholds of the job's observers: a loaded 2-core machine keeps a healthy step (~50 ms) well
#: under STALL_THRESHOLD_S; a fault is held until its rank is named at its step, at most HOLD_S
#: (the job's wake.py release): measured here, the quick matrix's job took 28.6 s (44 s with
#: fixed 5.5 s holds and a 3 s threshold).
STALL_THRESHOLD_S: Final = 2.0
HOLD_S: Final = 5.5
FIRST_FAULT_STEP: Final = 8
STEPS_BETWEEN_FAULTS: Final = 8
TAIL_STEPS: Final = 8
#: The loop straggler: slow this long per step for this many steps, checked every
#: LOOP_CHECK_STEPS; the tail after it lets the rank recover.
LOOP_SLOW_STEPS: Final = 24
LOOP_SLOW_S: Final = 0.15
LOOP_CHECK_STEPS: Final = 2
LOOP_TAIL_STEPS: Final = 12
JOB_TIMEOUT_S: Final = 420.0
#: fault kind -> the report kind that names it
DEVICE_KINDS: Final = {
    "gpu-hang": ReportKind.HANG,
    "launch-withheld": ReportKind.HANG,
    "host-sleep": ReportKind.HANG,
    "thread-sleep": ReportKind.HANG,
    "desync": ReportKind.DESYNC,
    "loop-slow": ReportKind.STRAGGLER,
}
HEALTHY_KIND: Final = "healthy (between the faults)"
#: The observers' findings about ranks (every observer kind that names a failure).
OBSERVER_KINDS: Final = frozenset(kind for kind in ReportKind if kind.source is Source.OBSERVER and kind.failure)


@attrs.frozen
class DeviceCase:
    kind: str
    rank: int
    step: int

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.rank}:{self.step}"


def device_cases(*, quick: bool, seed: int) -> list[DeviceCase]:
    """The GPU-side hang on rank 0 (quick: the rank that reports and hosts the store, the hardest
    place for a culprit to be) or on rank 0, a middle rank and the last rank (full); every other
    kind once on a rank drawn from the seed (quick) or on every rank (full); one fault per step,
    spaced so the observers see healthy steps in between."""
    rng = random.Random(f"device:{seed}")
    middle = rng.choice((1, 2))  # drawn in both sizes, so that a seed draws the same ranks below
    picks: list[tuple[str, int]] = [("gpu-hang", 0)] if quick else [("gpu-hang", 0), ("gpu-hang", middle),
                                                                    ("gpu-hang", WORLD - 1)]
    for kind in ("launch-withheld", "host-sleep", "thread-sleep", "desync"):
        ranks = [rng.randrange(WORLD)] if quick else list(range(WORLD))
        picks += [(kind, rank) for rank in ranks]
    cases = [DeviceCase(kind, rank, FIRST_FAULT_STEP + index * STEPS_BETWEEN_FAULTS)
             for index, (kind, rank) in enumerate(picks)]
    # The loop straggler last: its slow stretch and the recovery after it overlap no other fault.
    cases.append(DeviceCase("loop-slow", rng.randrange(WORLD), FIRST_FAULT_STEP + len(picks) * STEPS_BETWEEN_FAULTS))
    return cases


def _steps(cases: Sequence[DeviceCase]) -> int:
    ends = [case.step + (LOOP_SLOW_STEPS + LOOP_TAIL_STEPS if case.kind == "loop-slow" else TAIL_STEPS)
            for case in cases]
    return max(ends, default=FIRST_FAULT_STEP + TAIL_STEPS)


def _command(cases: Sequence[DeviceCase], run_dir: Path) -> list[str]:
    return torchrun_command("scout.scenarios.device_job", WORLD, [
        "--run-dir", run_dir, "--steps", _steps(cases), "--plan", ",".join(case.spec for case in cases),
        "--hold-s", HOLD_S, "--loop-slow-steps", LOOP_SLOW_STEPS, "--loop-slow-s", LOOP_SLOW_S], module=True)


def _environment() -> dict[str, str]:
    return torchrun_env({"stall_threshold_s": STALL_THRESHOLD_S, "recheck_interval_s": 1, "round_deadline_s": 0.5,
                         "loop_check_steps": LOOP_CHECK_STEPS}, pythonpath=[Path(__file__).resolve().parents[2]])


def _run_job(cases: Sequence[DeviceCase], directory: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run the job in its own session; killed whole at ``timeout_s``. Returns (exit code or None
    when killed, the output's tail)."""
    job = launch(_command(cases, directory / "run"), _environment(), cwd=directory, timeout_s=timeout_s,
                 merge_stderr=True)
    return job.returncode, job.stdout[-4000:]


def _reports(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "reports.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _named(records: Sequence[dict[str, Any]]) -> tuple[int, ...]:
    return tuple(sorted({rank for r in records for rank in r.get("ranks", [])}))


def _straggler(record: dict[str, Any]) -> bool:
    return record.get("kind") == ReportKind.STRAGGLER


def host_only_finding(record: dict[str, Any]) -> str:
    """What the host coordinates alone (rows 1-6 of spec/observer.md, no completion evidence)
    make of a report's peers: the control that shows what completion tracking adds."""
    from scout.core.observer import Evidence, ObserverConfig, Stage, assess

    peers = record.get("evidence", {}).get("peers", [])
    evidence = [
        None if peer.get("missing") else Evidence(int(peer["step"]), int(peer["op"]), int(peer["fingerprint"], 16),
                                                  Stage[str(peer["stage"]).upper()], float(peer["idle_s"]))
        for peer in peers
    ]
    if len(evidence) < 2:
        return "n/a"
    found = assess(evidence, ObserverConfig(0, len(evidence), stall_threshold_s=STALL_THRESHOLD_S,
                                            settle_idle_s=1e-3))
    ranks = [peers[p]["rank"] for p in found.attributed]
    return f"{found.outcome.value}{' ' + str(ranks) if ranks else ''}"


def classify_job(cases: Sequence[DeviceCase], records: Sequence[dict[str, Any]], *, exit_code: int | None,
                 tail: str, wall_s: float, seed: int) -> list[CaseResult]:
    """One result per fault, and one for the healthy stretches. A hang-type fault's reports are
    the observer's at its step; the loop straggler's are the straggler reports from its first
    slow step to the end of the job. Every other observer or straggler report is the healthy
    run's."""
    observed = [r for r in records if r.get("source") == "observer" and r.get("kind") in OBSERVER_KINDS]
    stragglers = [r for r in records if _straggler(r)]
    reproduce = "reproduce with: scout campaign --part device --seed " + str(seed)
    results = []
    claimed: list[dict[str, Any]] = []
    for case in cases:
        if case.kind == "loop-slow":
            mine = [r for r in stragglers if (r.get("step") or 0) >= case.step]
            confirmed = [r for r in mine if r.get("reason") == StragglerReason.LOOP_SLOW]
            ok = (len(confirmed) == 1 and confirmed[0]["ranks"] == [case.rank]
                  and confirmed[0]["step"] <= case.step + LOOP_SLOW_STEPS and _named(mine) == (case.rank,))
        else:
            mine = [r for r in observed if r.get("step") == case.step]
            expected = DEVICE_KINDS[case.kind]
            ok = (len(mine) == 1 and mine[0]["kind"] == expected and mine[0]["ranks"] == [case.rank]
                  and mine[0]["evidence"].get("basis") == "completion")
        claimed += mine
        named = _named(mine)
        detail = "; ".join(f"{r['kind']} {r['ranks']} {r['reason']} at step {r.get('step')}"
                           + (f" basis={r['evidence'].get('basis')}, host progress alone: {host_only_finding(r)}"
                              if r in observed else "") for r in mine)
        if not mine and exit_code != 0:
            detail = f"job exit {exit_code}: {tail[-600:]}"
        results.append(CaseResult("device", case.kind, WORLD, seed, classify((case.rank,), named, ok, bool(mine), False),
                                  (case.rank,), named, detail or "nothing reported", reproduce, wall_s / max(1, len(cases))))
    stray = [r for r in (*observed, *stragglers) if not any(r is c for c in claimed)]
    named = _named(stray)
    detail = "; ".join(f"{r['kind']} {r['ranks']} {r['reason']} at step {r.get('step')}" for r in stray)
    if exit_code != 0:
        detail = f"job exit {exit_code}; " + (detail or tail[-600:])
    outcome = classify((), named, exit_code == 0 and not stray, bool(stray) or exit_code != 0, True)
    results.append(CaseResult("device", HEALTHY_KIND, WORLD, seed, outcome, (), named, detail or "nothing reported",
                              reproduce, wall_s, healthy=True))
    return results


def run_device_part(cases: Sequence[DeviceCase], log: Callable[[str], None] | None = None, *, seed: int = 0,
                    timeout_s: float = JOB_TIMEOUT_S) -> list[CaseResult]:
    """Run the matrix as one torchrun job and classify every case."""
    say = log or (lambda line: None)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scout-device-") as directory:
        exit_code, tail = _run_job(cases, Path(directory), timeout_s)
        records = _reports(Path(directory) / "run")
    wall_s = time.monotonic() - started
    results = classify_job(cases, records, exit_code=exit_code, tail=tail, wall_s=wall_s, seed=seed)
    for result in results:
        say(f"  device {result.kind} on {list(result.injected) or 'no rank'}: {result.outcome.value}")
    say(f"  device-semantics part: one {WORLD}-rank torchrun job, {len(cases)} faults, {wall_s:.0f} s")
    return results


def run_healthy_job(seed: int, log: Callable[[str], None] | None = None) -> list[CaseResult]:
    """The full campaign's extra healthy run: the same job with no fault."""
    return run_device_part([], log, seed=seed)


if __name__ == "__main__":  # pragma: no cover - a manual entry point
    outcome = run_device_part(device_cases(quick=True, seed=0), print)
    sys.exit(0 if all(r.outcome in (Outcome.LOCALIZED, Outcome.CLEAN) for r in outcome) else 1)
