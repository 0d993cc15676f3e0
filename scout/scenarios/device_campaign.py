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
                    (rank 0, a middle rank, the last rank)
launch-withheld     the all-reduce's kernel is never launched                 ``hang``, rank
host-sleep          the training thread sleeps before it enqueues             ``hang``, rank
thread-sleep        the communication thread (FSDP2's backward issues from    ``hang``, rank
                    autograd threads) sleeps before it enqueues
desync              the all-reduce enqueued with another shape                ``desync``, rank
healthy             every step between the faults                             nothing
==================  ========================================================  ==============

A fault is localized when exactly the injected rank is named, at the fault's step, with the
expected kind, decided on completion evidence (spec/observer.md COMPLETION-1..8): the host
coordinates alone would see every rank waiting at one sync point (a group stall, nobody
named). Everything is bounded: the job is killed (its whole session: ranks and observers) at
``JOB_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.scenarios.campaign import CaseResult, Outcome, classify

__all__ = ["DEVICE_KINDS", "DeviceCase", "device_cases", "run_device_part"]

WORLD: Final = 4
#: Thresholds of the job's observers: a loaded 2-core machine keeps a healthy step well under
#: STALL_THRESHOLD_S; a fault is held long enough to be found and then released.
STALL_THRESHOLD_S: Final = 3.0
HOLD_S: Final = 7.0
FIRST_FAULT_STEP: Final = 8
STEPS_BETWEEN_FAULTS: Final = 8
TAIL_STEPS: Final = 8
JOB_TIMEOUT_S: Final = 420.0
#: kind -> (report kind, how the quick matrix picks ranks)
DEVICE_KINDS: Final = {
    "gpu-hang": "hang",
    "launch-withheld": "hang",
    "host-sleep": "hang",
    "thread-sleep": "hang",
    "desync": "desync",
}
HEALTHY_KIND: Final = "healthy (between the faults)"
OBSERVER_KINDS: Final = frozenset({"hang", "data_stall", "checkpoint_stall", "desync", "group_stall", "unresponsive",
                                   "inconclusive"})


@attrs.frozen
class DeviceCase:
    kind: str
    rank: int
    step: int

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.rank}:{self.step}"


def device_cases(*, quick: bool, seed: int) -> list[DeviceCase]:
    """The GPU-side hang on rank 0, a middle rank and the last rank; every other kind once on a
    rank drawn from the seed (quick) or on every rank (full); one fault per step, spaced so the
    observers see healthy steps in between."""
    rng = random.Random(f"device:{seed}")
    picks: list[tuple[str, int]] = [("gpu-hang", 0), ("gpu-hang", rng.choice((1, 2))), ("gpu-hang", WORLD - 1)]
    for kind in ("launch-withheld", "host-sleep", "thread-sleep", "desync"):
        ranks = [rng.randrange(WORLD)] if quick else list(range(WORLD))
        picks += [(kind, rank) for rank in ranks]
    return [DeviceCase(kind, rank, FIRST_FAULT_STEP + index * STEPS_BETWEEN_FAULTS)
            for index, (kind, rank) in enumerate(picks)]


def _command(cases: Sequence[DeviceCase], run_dir: Path) -> list[str]:
    steps = (max(case.step for case in cases) if cases else FIRST_FAULT_STEP) + TAIL_STEPS
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--standalone",
            "-m", "scout.scenarios.device_job", "--run-dir", str(run_dir), "--steps", str(steps),
            "--plan", ",".join(case.spec for case in cases), "--hold-s", str(HOLD_S)]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               SCOUT_STALL_THRESHOLD_S=str(STALL_THRESHOLD_S), SCOUT_RECHECK_INTERVAL_S="1",
               SCOUT_ROUND_DEADLINE_S="0.5")
    return env


def _run_job(cases: Sequence[DeviceCase], directory: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run the job in its own session; killed whole at ``timeout_s``. Returns (exit code or None
    when killed, the output's tail)."""
    process = subprocess.Popen(_command(cases, directory / "run"), cwd=directory, env=_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output[-4000:]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=30)
        return None, output[-4000:]


def _reports(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "reports.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def classify_job(cases: Sequence[DeviceCase], records: Sequence[dict[str, Any]], *, exit_code: int | None,
                 tail: str, wall_s: float, seed: int) -> list[CaseResult]:
    """One result per fault, and one for the healthy stretches: the observer's reports of a fault
    are those at its step; every other observer report is the healthy run's."""
    observed = [r for r in records if r.get("source") == "observer" and r.get("kind") in OBSERVER_KINDS]
    reproduce = "reproduce with: scout campaign --part device --seed " + str(seed)
    results = []
    for case in cases:
        mine = [r for r in observed if r.get("step") == case.step]
        named = tuple(sorted({rank for r in mine for rank in r.get("ranks", [])}))
        expected = DEVICE_KINDS[case.kind]
        ok = (len(mine) == 1 and mine[0]["kind"] == expected and mine[0]["ranks"] == [case.rank]
              and mine[0]["evidence"].get("basis") == "completion")
        detail = "; ".join(f"{r['kind']} {r['ranks']} {r['reason']} basis={r['evidence'].get('basis')}" for r in mine)
        if not mine and exit_code != 0:
            detail = f"job exit {exit_code}: {tail[-600:]}"
        results.append(CaseResult("device", case.kind, WORLD, seed, classify((case.rank,), named, ok, bool(mine), False),
                                  (case.rank,), named, detail or "nothing reported", reproduce, wall_s / max(1, len(cases))))
    fault_steps = {case.step for case in cases}
    stray = [r for r in observed if r.get("step") not in fault_steps]
    named = tuple(sorted({rank for r in stray for rank in r.get("ranks", [])}))
    detail = "; ".join(f"{r['kind']} {r['ranks']} at step {r.get('step')}" for r in stray)
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
