"""The GPU checks as one prepared script: every case a subprocess of its own with its own
timeout, the whole within a budget that ends with margin inside a 10-minute device slot,
results written after every case.

    python tests/gpu/run.py [--out DIR] [--work DIR] [--budget-s 420] [--gpus N] [--cases a,b]
    python tests/gpu/run.py --plan --gpus 1          # the plan for 1 GPU: nothing is run
    python tests/gpu/run.py --device cpu --out DIR     # the CPU plumbing mode CI runs (gloo)
    python tests/gpu/run.py --device cpu --cases healthy,sdc   # a job case that can run on CPU

It plans for the GPUs it finds (1, 2, 4, 8, ...), or for ``--gpus N``: a case that needs more
GPUs than there are is skipped with the reason, never failed (``gpu_hang`` and ``straggler``
need one GPU per rank of a 3-rank job); a case whose estimated seconds do not fit the budget
after the cases before it is planned out with the reason (run it in a slot of its own with
``--cases``). A verdict (SDC, straggler, hang) needs at least three replicas, so the job cases
run ``max(3, GPUs)`` ranks, sharing GPUs over gloo where there are fewer GPUs than ranks; the
NCCL cases use one rank per GPU (never two ranks on one GPU: NCCL refuses that).
tests/gpu/README.md lists the cases, what each checks, and the exact commands for a lent GPU
machine, which has no internet (the offline install there).

Results, under ``$OUT`` (or ``--out``): ``gpu_results.jsonl`` -- one JSON line for the plan,
then one per case the moment it ends (flushed and fsynced), then one at the end -- so a run that
is killed returns what it finished; ``gpu_summary.txt`` (the table, rewritten after every case)
and ``gpu_logs.txt`` (each case's log tail, appended) likewise; ``gpu_results.json`` (every
case: status, seconds, ranks, backend, detail, figures, the tail of its log) at the end. Runs,
checkpoints and rank files stay in ``--work`` (a temporary folder by default).

Statuses: PASS; FAIL (a check did not hold); MISS (a speed goal was missed, the checks held);
TIMEOUT (killed at its timeout, with everything it started); SKIP (with the reason: no CUDA in
the CPU mode, too few GPUs, out of budget); INTERRUPTED (the script was stopped by SIGTERM or
SIGINT while the case ran or before it started). Exit status: 0 if nothing failed, 1 if a case
FAILed, timed out or was interrupted, 3 if only speed goals were missed, 2 if the script could
not start (the reason is printed: a missing dependency says which wheel to carry).

The driver imports neither torch nor triton; the cases do, in their own processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: The cases' budget, from the first case's start: no case starts with less than MIN_CASE_S of
#: it left, and none runs past it. With the start-up before it and the teardown after it, the
#: whole command fits SLOT_PLAN_S, itself 120 s inside the device tool's 10-minute limit.
DEFAULT_BUDGET_S = 420.0
#: Estimated start-up before the first case: the offline install (README) and the probe.
STARTUP_S = 30.0
#: After the last case: its kill and wait (at most KILL_WAIT_S) and the result files.
TEARDOWN_S = 30.0
#: What the default plan must fit, start-up and teardown included.
SLOT_PLAN_S = 480.0
#: The device tool's limit on one command.
DEVICE_COMMAND_LIMIT_S = 600.0
#: The probe (imports torch, counts the GPUs) gets this long.
PROBE_TIMEOUT_S = 60.0
#: How long a killed case's process may take to be reaped.
KILL_WAIT_S = 30.0
#: A case is not started with less than this left of the budget.
MIN_CASE_S = 20.0
#: Poll interval of the driver while cases run.
POLL_S = 0.2
#: Lines of each case's log kept in the results.
LOG_TAIL_LINES = 60
#: Ranks a verdict needs: two replicas can detect a disagreement, never attribute it (VERDICT).
VERDICT_RANKS_MIN = 3
#: The CPU plumbing mode's ranks (gloo), as many as a verdict needs.
CPU_RANKS = 3
#: Conformance cases the CPU plumbing mode runs (a few: the plumbing, not the binding).
CPU_CONFORMANCE_CASES = ("exchange_everyone", "exchange_silent_peer", "collectives_everyone",
                         "torch_tensors", "torch_tensor_silent_peer")
FAULT_KINDS = {"hang", "data_stall", "checkpoint_stall", "desync", "group_stall", "unresponsive",
               "inconclusive", "observer_failure", "sdc", "straggler"}
STATUSES_FAILING = ("FAIL", "TIMEOUT", "ERROR", "INTERRUPTED")
RESULT_FILES = ("gpu_logs.txt", "gpu_results.json", "gpu_results.jsonl", "gpu_summary.txt")

assert DEFAULT_BUDGET_S + STARTUP_S + TEARDOWN_S <= SLOT_PLAN_S <= DEVICE_COMMAND_LIMIT_S - 120


@dataclass(frozen=True)
class Plan:
    """Where the cases run: ``device`` "cuda" or "cpu" (gloo, the plumbing mode), ``gpus`` used."""

    device: str
    gpus: int
    python: str
    work: Path

    @property
    def verdict_ranks(self) -> int:
        """Ranks of a job whose fault must be named: at least three replicas."""
        return max(VERDICT_RANKS_MIN, self.gpus) if self.device == "cuda" else CPU_RANKS

    @property
    def verdict_backend(self) -> str:
        """NCCL when every rank of a verdict job has a GPU of its own, else gloo."""
        return "nccl" if self.device == "cuda" and self.verdict_ranks <= self.gpus else "gloo"

    @property
    def nccl_ranks(self) -> int:
        """Ranks of an NCCL case: one per GPU."""
        return self.gpus


@dataclass(frozen=True)
class Launch:
    """One subprocess: its command, extra environment, and what it runs on."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ranks: int = 1
    backend: str = ""


@dataclass
class Outcome:
    status: str
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str
    checks: str  # one line: what a PASS means
    timeout_s: float
    alone: bool  # timing-sensitive: runs by itself, after the others
    cpu: bool  # part of the CPU plumbing mode
    needs_cuda: bool
    launch: Callable[[Plan, Path], Launch | str]  # a launch, or why it is skipped
    judge: Callable[[Plan, Path, int, str], Outcome]  # (plan, case dir, exit status, log)
    #: Seconds the case is expected to take on a GPU host (the plan's unit; not measured on a
    #: GPU yet -- from the CPU timings in tests/gpu/README.md plus CUDA start-up: the first
    #: GPU run's "seconds" column replaces them) and on the 2-core CPU box (measured).
    estimate_s: float = 60.0
    cpu_estimate_s: float = 30.0
    #: GPUs the case needs, and why; fewer: skipped with that reason.
    gpus_min: int = 1
    gpus_why: str = ""


def _torchrun(plan: Plan, ranks: int, *target: str) -> list[str]:
    return [plan.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *target]


# -- the cases -------------------------------------------------------------------------------------


def _pytest_launch(plan: Plan, work: Path) -> Launch:
    files = ["tests/replay/test_signature_gpu.py", "tests/transport/test_timing.py",
             "tests/unit/test_checkpoint_cuda_rng.py", "tests/transport/test_waits.py"]
    return Launch([plan.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *files])


def _pytest_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    summary = re.findall(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [0-9.]+s", log, re.M)
    line = summary[-1] if summary else "no pytest summary line"
    skipped = re.findall(r"SKIPPED \[\d+\] (\S+): (.*)", log)
    figures = {"summary": line, "skipped": [f"{where}: {why}" for where, why in skipped]}
    if status == 0 and plan.device == "cuda" and any("CUDA" in why for _, why in skipped):
        return Outcome("FAIL", f"{line}; a GPU test skipped itself on a GPU host", figures)
    return Outcome("PASS" if status == 0 else "FAIL", line, figures)


def _deadline_launch(plan: Plan, work: Path) -> Launch:
    return Launch(_torchrun(plan, 1, "-m", "tests.gpu.nccl_deadline_worker", str(work / "deadline.json")),
                  ranks=1, backend="nccl")


def _deadline_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    from tests.gpu import nccl_deadline_worker

    path = work / "deadline.json"
    if not path.is_file():
        return Outcome("FAIL", f"no result written (exit {status})")
    result = json.loads(path.read_text(encoding="utf-8"))
    problems = nccl_deadline_worker.check(result)
    figures = {k: v for k, v in result.items() if k.endswith("_s") or k.endswith("_refusals")}
    if problems:
        return Outcome("FAIL", "; ".join(p.splitlines()[-1] for p in problems)[:400], figures)
    return Outcome("PASS", f"deadline in {result['transport_deadline_after_s']:.2f} s, no abort, group "
                           f"usable again after {result['transport_recovered_after_s']:.1f} s", figures)


def _conformance_ranks(plan: Plan) -> int:
    return plan.nccl_ranks if plan.device == "cuda" else CPU_RANKS


def _conformance_launch(plan: Plan, work: Path) -> Launch:
    ranks = _conformance_ranks(plan)
    env = {} if plan.device == "cuda" else {"SCOUT_CASES": ",".join(CPU_CONFORMANCE_CASES)}
    return Launch(_torchrun(plan, ranks, "-m", "tests.gpu.gpu_worker", str(work)), env=env, ranks=ranks,
                  backend="nccl" if plan.device == "cuda" else "gloo")


def _conformance_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    from tests.gpu import gpu_worker

    ranks = _conformance_ranks(plan)
    missing = [r for r in range(ranks) if not (work / f"rank{r}.json").is_file()]
    if missing:
        return Outcome("FAIL", f"ranks {missing} wrote no results (exit {status})")
    results = [json.loads((work / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(ranks)]
    errors = [r["worker_error"].splitlines()[-1] for r in results if "worker_error" in r]
    if errors:
        return Outcome("FAIL", f"worker error: {errors[0]}")
    wanted = CPU_CONFORMANCE_CASES if plan.device == "cpu" else tuple(gpu_worker.ALL_CASES)
    passed, skipped, failed = [], [], []
    for name in wanted:
        case = gpu_worker.ALL_CASES[name]
        per_rank = [r.get(name, {"error": "missing"}) for r in results]
        if any("skipped" in r for r in per_rank):
            skipped.append(name)
            continue
        try:
            case.check(per_rank, ranks, "torch")
        except AssertionError as exc:
            failed.append(f"{name}: {str(exc).splitlines()[0][:200] if str(exc) else 'assertion'}")
        else:
            passed.append(name)
    figures = {"passed": passed, "skipped_for_size": skipped, "failed": failed}
    detail = f"{len(passed)} cases passed, {len(skipped)} need more ranks, {len(failed)} failed"
    return Outcome("FAIL" if failed or not passed else "PASS", detail + (f": {failed[0]}" if failed else ""),
                   figures)


def _replay_ranks(plan: Plan) -> tuple[int, str]:
    if plan.device == "cpu":
        return CPU_RANKS, "gloo"
    return plan.verdict_ranks, plan.verdict_backend


def _replay_launch(plan: Plan, work: Path) -> Launch:
    ranks, backend = _replay_ranks(plan)
    return Launch(_torchrun(plan, ranks, "-m", "tests.gpu.replay_worker", str(work)),
                  env={"SCOUT_REPLAY_BACKEND": backend}, ranks=ranks, backend=backend)


def _replay_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    from tests.gpu import replay_worker

    ranks, _ = _replay_ranks(plan)
    try:
        per_rank = replay_worker.load(work, ranks)
        replay_worker.check_results(per_rank, ranks)
    except (AssertionError, OSError, KeyError, ValueError) as exc:
        return Outcome("FAIL", f"{type(exc).__name__}: {str(exc)[:300]} (exit {status})")
    flipped = [r for r in per_rank[0]["results"] if r["status"] == "ATTRIBUTED"]
    return Outcome("PASS", f"bit flip on rank {replay_worker.faulty_rank(ranks)} attributed: "
                           f"{[(r['recipe'], r['outliers']) for r in flipped]}")


def _completion_ranks(plan: Plan) -> int:
    """One rank; two where there are two GPUs, so that a rank that never calls ``set_device`` is
    seen recording its marks on its own GPU (INSTR-10)."""
    return min(2, plan.gpus)


def _completion_launch(plan: Plan, work: Path) -> Launch:
    ranks = _completion_ranks(plan)
    # The Flight Recorder on, with starts: the worker also reads NCCL's recorder (INSTR-12).
    env = {"TORCH_FR_BUFFER_SIZE": "256", "TORCH_NCCL_ENABLE_TIMING": "1"}
    return Launch(_torchrun(plan, ranks, "-m", "tests.gpu.completion_worker", str(work)), env=env, ranks=ranks,
                  backend="nccl")


def _completion_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    from tests.gpu import completion_worker

    ranks = _completion_ranks(plan)
    try:
        per_rank = completion_worker.load(work, ranks)
    except (OSError, ValueError) as exc:
        return Outcome("FAIL", f"{type(exc).__name__}: {str(exc)[:300]} (exit {status})")
    problems = completion_worker.check(per_rank)
    figures = completion_worker.figures(per_rank)
    if problems:
        return Outcome("FAIL", "; ".join(problems)[:400], figures)
    return Outcome("PASS", completion_worker.summary(per_rank), figures)


# The example GPT (examples/train_gpt.py) under torchrun, with a fault injected.
EXAMPLE = "examples/train_gpt.py"


@dataclass(frozen=True)
class Job:
    steps: int
    fault: str  # examples/train_gpt.py --fault, with {last} for the last rank
    restarts: int = 0
    settings: tuple[tuple[str, str], ...] = ()


JOBS = {
    "healthy": Job(steps=40, fault=""),
    "sdc": Job(steps=100, fault="sdc:1:57", restarts=1, settings=(("on_sdc", "restart"),)),
    "gpu_hang": Job(steps=24, fault="gpu-hang:1:20:25",
                    settings=(("stall_threshold_s", "5"), ("recheck_interval_s", "2"))),
    "straggler": Job(steps=60, fault="slow:{last}:1.5"),
}


def _job_launch(name: str) -> Callable[[Plan, Path], Launch]:
    def launch(plan: Plan, work: Path) -> Launch:
        job = JOBS[name]
        ranks = plan.verdict_ranks
        env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               **{f"SCOUT_{key.upper()}": value for key, value in job.settings}}
        command = [plan.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                   f"--max-restarts={job.restarts}", EXAMPLE, "--device", plan.device, "--steps", str(job.steps),
                   "--run-dir", str(work / "run"), "--checkpoint-dir", str(work / "ckpt"),
                   "--fault", job.fault.format(last=ranks - 1)]
        return Launch(command, env=env, ranks=ranks, backend=plan.verdict_backend)

    return launch


def _records(work: Path) -> list[dict[str, Any]]:
    path = work / "run" / "reports.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _named(records: list[dict[str, Any]]) -> list[tuple[str, list[int], int, str]]:
    return [(r["kind"], r.get("ranks", []), r.get("step", -1), r.get("reason", "")) for r in records
            if r["kind"] in FAULT_KINDS]


def _finished_at(records: list[dict[str, Any]]) -> int | None:
    finished = [r["step"] for r in records if r["kind"] == "finished"]
    return finished[-1] if finished else None


def _job_judge(name: str) -> Callable[[Plan, Path, int, str], Outcome]:
    def judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
        job = JOBS[name]
        records = _records(work)
        faults = _named(records)
        figures: dict[str, Any] = {"reports": faults, "finished_at": _finished_at(records)}
        if status != 0:
            return Outcome("FAIL", f"torchrun exited {status}; reports {faults}", figures)
        if name == "healthy":
            ok = not faults and _finished_at(records) == job.steps
            return Outcome("PASS" if ok else "FAIL", f"fault reports {faults}, finished at {_finished_at(records)}",
                           figures)
        if name == "sdc":
            sdc = [r for r in records if r["kind"] == "sdc"]
            restored = [r for r in records if r["kind"] == "restart" and r["reason"] == "restored"]
            ok = (len(sdc) == 1 and sdc[0]["ranks"] == [1] and len(restored) == 1
                  and restored[0]["evidence"].get("choice") == "verified" and restored[0]["step"] < 57
                  and _finished_at(records) == job.steps
                  and all(ranks == [1] for _kind, ranks, _step, _reason in faults))
            figures["detected_at_step"] = sdc[0]["step"] if sdc else None
            return Outcome("PASS" if ok else "FAIL",
                           f"sdc {[(r['ranks'], r['step']) for r in sdc]}, restored from "
                           f"{[(r['step'], r['evidence'].get('choice')) for r in restored]}", figures)
        if name == "gpu_hang":
            hangs = [r for r in records if r["kind"] == "hang"]
            innocent = [f for f in faults if f[1] and f[1] != [1]]
            struck = re.findall(r"EXAMPLE-FAULT gpu-hang rank \d+ step \d+ at ([0-9.]+)", log)
            if hangs and struck:
                from datetime import datetime

                reported = datetime.fromisoformat(hangs[0]["time"].replace("Z", "+00:00")).timestamp()
                figures["report_latency_s"] = round(reported - float(struck[0]), 2)
            ok = any(r["ranks"] == [1] for r in hangs) and not innocent
            return Outcome("PASS" if ok else "FAIL", f"hang reports {[(r['ranks'], r['reason']) for r in hangs]}; "
                           f"all fault reports {faults}", figures)
        last = plan.verdict_ranks - 1
        confirmed = [r for r in records if r["kind"] == "straggler" and not r["reason"].startswith("recovered")]
        ok = any(r["ranks"] == [last] for r in confirmed) and all(r["ranks"] == [last] for r in confirmed)
        ok = ok and all(ranks in ([], [last]) for _kind, ranks, _step, _reason in faults)
        return Outcome("PASS" if ok else "FAIL",
                       f"stragglers confirmed {[(r['ranks'], r['step'], r['reason']) for r in confirmed]}", figures)

    return judge


def _signature_launch(plan: Plan, work: Path) -> Launch:
    return Launch([plan.python, "bench/signature_gpu.py", "--output", str(work / "signature_gpu.json"),
                   "--repeats", "10"])


def _signature_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    path = work / "signature_gpu.json"
    if not path.is_file():
        return Outcome("FAIL", f"no result (exit {status})")
    result = json.loads(path.read_text(encoding="utf-8"))
    if "skipped" in result:
        return Outcome("FAIL", f"the benchmark skipped itself on a GPU host: {result['skipped']}")
    goals = {g["name"]: f"{g['measured']:.2f}x (goal {g['comparison']} {g['target']})" for g in result["goals"]}
    figures = {"rows": result.get("rows", {}), "goals": goals, "checks_failed": result.get("checks_failed", [])}
    if result.get("checks_failed"):
        return Outcome("FAIL", f"checks failed: {result['checks_failed'][:2]}", figures)
    status_text = "PASS" if result.get("all_goals_met") else "MISS"
    return Outcome(status_text, "; ".join(f"{k}: {v}" for k, v in goals.items()), figures)


def _overhead_launch(plan: Plan, work: Path) -> Launch:
    ranks = plan.nccl_ranks
    return Launch([plan.python, "bench/attach_overhead.py", "--device", "cuda", "--nproc", str(ranks),
                   "--rounds", "3", "--steps", "60", "--output", str(work / "overhead.json")],
                  ranks=ranks, backend="nccl")


def _overhead_judge(plan: Plan, work: Path, status: int, log: str) -> Outcome:
    path = work / "overhead.json"
    if not path.is_file():
        return Outcome("FAIL", f"no result (exit {status})")
    result = json.loads(path.read_text(encoding="utf-8"))
    figures = {k: result[k] for k in ("model_parameters", "ranks", "overhead_median", "overhead_min",
                                      "overhead_max", "off_step_s", "on_step_s") if k in result}
    detail = (f"{result['model_parameters'] / 1e6:.1f}M parameters, {result['ranks']} rank(s): overhead "
              f"{100 * result['overhead_median']:+.2f} % (min {100 * result['overhead_min']:+.2f}, max "
              f"{100 * result['overhead_max']:+.2f}; goal <= {100 * result['goal']:.1f} %)")
    return Outcome("PASS" if result.get("met") else "MISS", detail, figures)


#: The 3-rank job cases that must name a rank need a GPU per rank: with fewer, the ranks share
#: GPUs over gloo, whose calls block the host until the collective completed.
ONE_GPU_PER_RANK = VERDICT_RANKS_MIN

CASES: tuple[Case, ...] = (
    Case("device_pytest", "the GPU tests on the device: Triton kernel == CPU signature, fallback (SIG-13), "
         "AOT compile, CUDA events never drain (TIMING-2), CUDA RNG in DCP restores dropout, waits (WAIT-*)",
         240, alone=False, cpu=False, needs_cuda=True, launch=_pytest_launch, judge=_pytest_judge,
         estimate_s=90, cpu_estimate_s=20),
    Case("nccl_deadline", "a real NCCL collective past its deadline: DeadlineExceeded, the communicator is "
         "not aborted, the group runs again once the late work completes (WAIT-1..3)",
         120, alone=False, cpu=False, needs_cuda=True, launch=_deadline_launch, judge=_deadline_judge,
         estimate_s=30),
    Case("completion_device", "completion tracking on NCCL: a collective behind a kernel that has not ended "
         "reads enqueued, then completed, by markers and by NCCL's recorder (INSTR-10..12); polls skipped "
         "during a CUDA graph capture, which stays valid (INSTR-13); marks on the rank's own GPU (INSTR-10)",
         120, alone=False, cpu=False, needs_cuda=True, launch=_completion_launch, judge=_completion_judge,
         estimate_s=40),
    Case("nccl_conformance", "the transport conformance cases with NCCL tensors, one rank per GPU "
         "(CPU mode: a few cases over gloo)", 180, alone=False, cpu=True, needs_cuda=False,
         launch=_conformance_launch, judge=_conformance_judge, estimate_s=40, cpu_estimate_s=6),
    Case("replay_sdc", "DDP + replay with a bit flip on one rank: attributed to that rank within one cycle "
         "(FAULT-1, REPLAY-6)", 180, alone=False, cpu=True, needs_cuda=False,
         launch=_replay_launch, judge=_replay_judge, estimate_s=45, cpu_estimate_s=9),
    Case("healthy", "the example GPT with scout attached, no fault: no fault report, finished",
         180, alone=False, cpu=False, needs_cuda=False, launch=_job_launch("healthy"), judge=_job_judge("healthy"),
         estimate_s=60, cpu_estimate_s=17),
    Case("gpu_hang", "a kernel that does not end on rank 1 (torch.cuda._sleep): a hang report names rank 1, "
         "no other rank named", 180, alone=False, cpu=False, needs_cuda=True, launch=_job_launch("gpu_hang"),
         judge=_job_judge("gpu_hang"), estimate_s=60, gpus_min=ONE_GPU_PER_RANK,
         gpus_why="one NCCL rank per GPU for 3 replicas: ranks sharing a GPU run over gloo, where the stalled "
                  "rank's host blocks inside the collective like its peers' and no rank can be seen not started "
                  "(a group stall, nobody named)"),
    Case("sdc", "the example GPT, SDC on rank 1 from step 57, on_sdc=restart: sdc names rank 1, restart "
         "from a verified checkpoint before 57, finished", 300, alone=False, cpu=False, needs_cuda=False,
         launch=_job_launch("sdc"), judge=_job_judge("sdc"), estimate_s=120, cpu_estimate_s=53),
    Case("straggler", "every op of the last rank 1.5x slower: confirmed straggler names it, nobody else",
         240, alone=True, cpu=False, needs_cuda=False, launch=_job_launch("straggler"),
         judge=_job_judge("straggler"), estimate_s=120, cpu_estimate_s=90, gpus_min=ONE_GPU_PER_RANK,
         gpus_why="one GPU per rank for 3 replicas: ranks sharing a GPU share its queue, so one rank's "
                  "slowness shows in its neighbours' device times"),
    Case("signature_bandwidth", "the Triton signature == CPU signature, every flip seen on the device, and its "
         "bandwidth against a device-to-device copy (goal >= 50 %)", 240, alone=True, cpu=False,
         needs_cuda=True, launch=_signature_launch, judge=_signature_judge, estimate_s=60),
    Case("attach_overhead", "scout.attach at defaults on a 54.6M-parameter GPT, 3 interleaved A/B rounds "
         "(goal <= 0.5 %)", 300, alone=True, cpu=False, needs_cuda=True,
         launch=_overhead_launch, judge=_overhead_judge, estimate_s=180),
)


# -- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One case in a plan: run it (``action`` "run", its estimated start), or why not."""

    case: Case
    action: str  # "run" or "skip"
    why: str
    ranks: int
    backend: str
    estimate_s: float
    timeout_s: float
    start_s: float | None = None  # estimated, from the first case's start


def _lanes_end(durations: Sequence[float], parallel: int) -> tuple[list[float], float]:
    """Start times and end of ``durations`` run in order on ``parallel`` lanes (each starts on the
    first lane free), as the driver runs them."""
    lanes = [0.0] * max(1, parallel)
    starts = []
    for duration in durations:
        lane = min(range(len(lanes)), key=lambda i: lanes[i])
        starts.append(lanes[lane])
        lanes[lane] += duration
    return starts, max(lanes)


def _makespan(chosen: Sequence[tuple[Case, float]], parallel: int) -> tuple[dict[str, float], float]:
    """Estimated start of each chosen case and the end of them all: the shared cases on
    ``parallel`` lanes, then the timing-sensitive ones one after another."""
    shared = [(case, seconds) for case, seconds in chosen if not case.alone]
    alone = [(case, seconds) for case, seconds in chosen if case.alone]
    starts, end = _lanes_end([seconds for _, seconds in shared], parallel)
    found = {case.name: start for (case, _), start in zip(shared, starts, strict=True)}
    for case, seconds in alone:
        found[case.name] = end
        end += seconds
    return found, end


def make_plan(plan: Plan, cases: Sequence[Case], *, budget_s: float, parallel: int, named: Sequence[str] = (),
              timeouts: dict[str, float] | None = None) -> list[Planned]:
    """Which of ``cases`` run on ``plan`` and which are skipped, with the reason: in the CPU mode
    the CUDA cases (and the GPU-only ones not asked for by name); on CUDA the cases needing more
    GPUs than ``plan.gpus``; then, in the order of ``cases``, each case whose estimated seconds
    would end the cases past ``budget_s``. Nothing is started."""
    timeouts = timeouts or {}
    cpu = plan.device != "cuda"
    chosen: list[tuple[Case, float]] = []
    verdicts: dict[str, tuple[str, str]] = {}
    for case in cases:
        estimate_s = case.cpu_estimate_s if cpu else case.estimate_s
        if cpu and (case.needs_cuda or not (case.cpu or case.name in named)):
            verdicts[case.name] = ("skip", "needs CUDA (CPU plumbing mode)")
            continue
        if not cpu and plan.gpus < case.gpus_min:
            verdicts[case.name] = ("skip", f"needs {case.gpus_min} GPUs, {plan.gpus} here: {case.gpus_why}")
            continue
        launch = case.launch(plan, plan.work / case.name)
        if isinstance(launch, str):
            verdicts[case.name] = ("skip", launch)
            continue
        _, end_s = _makespan([*chosen, (case, estimate_s)], parallel)
        if end_s > budget_s:
            verdicts[case.name] = ("skip", f"does not fit the {budget_s:.0f} s budget after the cases before it "
                                           f"(~{estimate_s:.0f} s; they end at ~{_makespan(chosen, parallel)[1]:.0f} s):"
                                           f" run it in a slot of its own with --cases {case.name}")
            continue
        chosen.append((case, estimate_s))
        verdicts[case.name] = ("run", "")
    starts, _ = _makespan(chosen, parallel)
    planned = []
    for case in cases:
        action, why = verdicts[case.name]
        launch = case.launch(plan, plan.work / case.name)
        ranks, backend = (launch.ranks, launch.backend) if isinstance(launch, Launch) else (0, "")
        planned.append(Planned(case, action, why, ranks, backend, case.cpu_estimate_s if cpu else case.estimate_s,
                               timeouts.get(case.name, case.timeout_s), starts.get(case.name)))
    return planned


def plan_end_s(planned: Sequence[Planned], parallel: int) -> float:
    """When the planned cases are estimated to end, from the first one's start."""
    return _makespan([(p.case, p.estimate_s) for p in planned if p.action == "run"], parallel)[1]


def plan_table(planned: Sequence[Planned], plan: Plan, *, budget_s: float, parallel: int) -> str:
    """The plan as text: each case, what happens to it, its estimated seconds; then the totals."""
    rows = [("case", "plan", "ranks", "backend", "est_s", "timeout_s", "start_s", "why")]
    for item in planned:
        rows.append((item.case.name, item.action, str(item.ranks or "-"), item.backend or "-",
                     f"{item.estimate_s:.0f}", f"{item.timeout_s:.0f}",
                     "-" if item.start_s is None else f"{item.start_s:.0f}", item.why))
    widths = [max(len(row[i]) for row in rows) for i in range(7)]
    where = f"{plan.gpus} GPU(s)" if plan.device == "cuda" else "CPU (plumbing mode)"
    lines = [f"scout GPU plan: {where}, {parallel} case(s) at a time, budget {budget_s:.0f} s"]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:7])) + "  " + row[7])
        if index == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 3)
    end_s = plan_end_s(planned, parallel)
    running = sum(1 for item in planned if item.action == "run")
    total_s = STARTUP_S + end_s + TEARDOWN_S
    lines.append(f"{running} of {len(planned)} cases run; estimated: cases end at {end_s:.0f} s, with start-up "
                 f"(~{STARTUP_S:.0f} s) and teardown (~{TEARDOWN_S:.0f} s) total {total_s:.0f} s; bounded: no case "
                 f"runs past {budget_s:.0f} s after the first one starts (the device tool allows "
                 f"{DEVICE_COMMAND_LIMIT_S:.0f} s for the whole command)")
    return "\n".join(lines)


# -- the driver ------------------------------------------------------------------------------------

_PROBE = r"""
import json, sys
found = {"python": sys.version.split()[0]}
missing = []
for name in ("attrs", "numpy", "transitions", "torch", "triton", "pytest"):
    try:
        module = __import__(name)
        found[name] = getattr(module, "__version__", "?")
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
try:
    import torch
    found["cuda_available"] = torch.cuda.is_available()
    found["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    found["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(found["gpus"])]
    found["torch_cuda"] = torch.version.cuda
except Exception:
    found["gpus"] = 0
print(json.dumps({"found": found, "missing": missing}))
"""
REQUIRED = ("attrs", "numpy", "transitions", "torch")


def probe(python: str, env: dict[str, str]) -> dict[str, Any]:
    """Versions and GPUs, asked in a process of its own (the driver never imports torch)."""
    try:
        completed = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                                   env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"found": {}, "missing": [f"the probe (import torch, count the GPUs) took over {PROBE_TIMEOUT_S:.0f} s"]}
    if completed.returncode != 0:
        return {"found": {}, "missing": [f"the probe failed: {completed.stderr[-500:]}"]}
    parsed: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return parsed


@dataclass
class Running:
    case: Case
    process: subprocess.Popen[bytes]
    log_path: Path
    started_s: float
    deadline_s: float
    launch: Launch


class Interrupted(Exception):
    """SIGTERM or SIGINT reached the driver: it stops, kills what runs, and writes what it has."""


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux ``/proc``; empty elsewhere), bounded."""
    found: list[int] = []
    pending = [root]
    while pending and len(found) < 10_000:
        pid = pending.pop()
        for task in _listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{task}/children", "rb") as file:
                    children = [int(item) for item in file.read().split()]
                found.extend(children)
                pending.extend(children)
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the case's process group (it was started in a session of its own) and every process
    below it: torchrun starts its ranks in sessions of their own, so killing its group alone
    leaves them running. The tree is listed before anything dies (an orphan loses its parent)."""
    below = _descendants(process.pid)
    for pid in [process.pid, *below]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the group a rank leads, if it leads one
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ResultLog:
    """The results under ``out`` as they come (a killed run returns what it finished):
    ``gpu_results.jsonl`` gets one line for the plan, one per case when it ends and one at the
    end, each flushed and fsynced; ``gpu_summary.txt`` is rewritten (atomically) after every case
    with the rows so far; ``gpu_logs.txt`` gets each case's log tail."""

    def __init__(self, out: Path, header: str, planned: Sequence[Planned]) -> None:
        self.out = out
        self.header = header
        self.order = [item.case.name for item in planned]
        self.results: dict[str, dict[str, Any]] = {}
        out.mkdir(parents=True, exist_ok=True)
        for name in RESULT_FILES:
            (out / name).unlink(missing_ok=True)

    def _append(self, name: str, text: str) -> None:
        with (self.out / name).open("a", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())

    def line(self, record: dict[str, Any]) -> None:
        self._append("gpu_results.jsonl", json.dumps(record, default=repr) + "\n")

    def case(self, name: str, result: dict[str, Any]) -> None:
        self.results[name] = result
        self.line({"kind": "case", "name": name, **result})
        self._append("gpu_logs.txt", f"===== {name}: {result['status']}\n{result['log_tail']}\n\n")
        self.write_summary()

    def write_summary(self) -> None:
        done = {name: self.results[name] for name in self.order if name in self.results}
        pending = [name for name in self.order if name not in self.results]
        text = summary_table(done, self.header) + "\n"
        if pending:
            text += f"not finished yet: {', '.join(pending)}\n"
        partial = self.out / "gpu_summary.txt.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, self.out / "gpu_summary.txt")


class Driver:
    def __init__(self, plan: Plan, planned: Sequence[Planned], budget_s: float, parallel: int, env: dict[str, str],
                 on_result: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.plan = plan
        self.planned = list(planned)
        self.began_s = time.monotonic()
        self.budget_end_s = self.began_s + budget_s
        self.parallel = parallel
        self.env = env
        self.on_result = on_result
        self.results: dict[str, dict[str, Any]] = {}

    def _record(self, case: Case, outcome: Outcome, seconds: float, launch: Launch | None, log: str) -> None:
        result = {
            "status": outcome.status, "seconds": round(seconds, 1), "checks": case.checks,
            "ranks": launch.ranks if launch else 0, "backend": launch.backend if launch else "",
            "detail": outcome.detail, "figures": outcome.figures, "log_tail": log,
        }
        self.results[case.name] = result
        print(f"[{time.monotonic() - self.began_s:6.1f} s] {case.name}: {outcome.status} ({seconds:.0f} s) "
              f"{outcome.detail}", flush=True)
        if self.on_result is not None:
            self.on_result(case.name, result)

    def _start(self, item: Planned) -> Running | None:
        case = item.case
        left_s = self.budget_end_s - time.monotonic()
        if left_s < MIN_CASE_S:
            self._record(case, Outcome("SKIP", f"out of budget ({left_s:.0f} s left)"), 0.0, None, "")
            return None
        work = self.plan.work / case.name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        launch = case.launch(self.plan, work)
        if isinstance(launch, str):
            self._record(case, Outcome("SKIP", launch), 0.0, None, "")
            return None
        timeout_s = min(item.timeout_s, left_s)
        log_path = work / "log.txt"
        with log_path.open("wb") as log:
            log.write(f"$ {' '.join(launch.command)}\n".encode())
            log.flush()
            process = subprocess.Popen(launch.command, cwd=REPO, env={**self.env, **launch.env},
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        now = time.monotonic()
        return Running(case, process, log_path, now, now + timeout_s, launch)

    def _finish(self, running: Running, timed_out: bool) -> None:
        _kill_group(running.process)  # whatever the case left running goes with it
        running.process.wait(timeout=KILL_WAIT_S)
        seconds = time.monotonic() - running.started_s
        log = _tail(running.log_path)
        work = running.log_path.parent
        if timed_out:
            outcome = Outcome("TIMEOUT", f"killed after {seconds:.0f} s (its timeout)")
        else:
            try:
                outcome = running.case.judge(self.plan, work, running.process.returncode,
                                             running.log_path.read_text(encoding="utf-8", errors="replace"))
            except Exception as exc:  # a judge that breaks is the case's failure, not the driver's
                outcome = Outcome("ERROR", f"judging failed: {type(exc).__name__}: {exc}")
        self._record(running.case, outcome, seconds, running.launch, log)

    def _run_batch(self, items: Sequence[Planned], parallel: int) -> None:
        waiting = list(items)
        running: list[Running] = []
        try:
            while waiting or running:
                while waiting and len(running) < parallel:
                    started = self._start(waiting.pop(0))
                    if started is not None:
                        running.append(started)
                time.sleep(POLL_S)
                for item in list(running):
                    done = item.process.poll() is not None
                    late = time.monotonic() >= item.deadline_s
                    if done or late:
                        running.remove(item)
                        self._finish(item, timed_out=late and not done)
        finally:
            for item in running:  # interrupted: nothing of ours outlives the driver
                _kill_group(item.process)
                item.process.wait(timeout=KILL_WAIT_S)
                seconds = time.monotonic() - item.started_s
                self._record(item.case, Outcome("INTERRUPTED", f"stopped after {seconds:.0f} s: the script was "
                                                               "interrupted"), seconds, item.launch,
                             _tail(item.log_path))

    def run(self) -> dict[str, dict[str, Any]]:
        """Every case's result, in the order of the plan (whatever order they finished in); the
        skipped ones are recorded first, as planned."""
        for item in self.planned:
            if item.action != "run":
                self._record(item.case, Outcome("SKIP", item.why), 0.0, None, "")
        try:
            self._run_batch([i for i in self.planned if i.action == "run" and not i.case.alone], self.parallel)
            self._run_batch([i for i in self.planned if i.action == "run" and i.case.alone], 1)
        finally:
            for item in self.planned:  # never started (interrupted first)
                if item.case.name not in self.results:
                    self._record(item.case, Outcome("INTERRUPTED", "not started: the script was interrupted"),
                                 0.0, None, "")
        return {item.case.name: self.results[item.case.name] for item in self.planned}


def summary_table(results: dict[str, dict[str, Any]], header: str) -> str:
    rows = [("case", "status", "s", "ranks", "backend", "detail")]
    for name, r in results.items():
        rows.append((name, r["status"], f"{r['seconds']:.0f}", str(r["ranks"] or "-"), r["backend"] or "-",
                     r["detail"][:110]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [header]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5])
        if index == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def exit_status(results: dict[str, dict[str, Any]]) -> int:
    statuses = {r["status"] for r in results.values()}
    if statuses & set(STATUSES_FAILING):
        return 1
    return 3 if "MISS" in statuses else 0


def _interrupt(signal_number: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signal_number).name)


def execute(plan: Plan, planned: Sequence[Planned], *, budget_s: float, parallel: int, env: dict[str, str],
            out: Path, header: str, environment: dict[str, Any]) -> int:
    """Run ``planned`` and write the results as they come (:class:`ResultLog`). SIGTERM and
    SIGINT stop the run: the cases running are killed and recorded INTERRUPTED, the rest too,
    and the files are complete. Returns the exit status."""
    log = ResultLog(out, header, planned)
    log.line({"kind": "plan", "plan": {"device": plan.device, "gpus": plan.gpus, "verdict_ranks": plan.verdict_ranks,
                                       "verdict_backend": plan.verdict_backend, "budget_s": budget_s,
                                       "parallel": parallel},
              "environment": environment,
              "cases": [{"name": i.case.name, "action": i.action, "why": i.why, "estimate_s": i.estimate_s,
                         "timeout_s": i.timeout_s, "start_s": i.start_s} for i in planned]})
    driver = Driver(plan, planned, budget_s, parallel, env, on_result=log.case)
    previous = {number: signal.signal(number, _interrupt) for number in (signal.SIGTERM, signal.SIGINT)}
    interrupted = ""
    try:
        driver.run()
    except Interrupted as stop:
        interrupted = str(stop)
        print(f"run.py: {interrupted}: stopped; the results so far are in {out}", file=sys.stderr, flush=True)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    results = {item.case.name: driver.results[item.case.name] for item in planned if item.case.name in driver.results}
    status = exit_status(results) if not interrupted else 1
    seconds = round(time.monotonic() - driver.began_s, 1)
    log.line({"kind": "end", "seconds": seconds, "exit_status": status, "interrupted": interrupted or None})
    table = summary_table(results, header)
    document = {"plan": {"device": plan.device, "gpus": plan.gpus, "verdict_ranks": plan.verdict_ranks,
                         "verdict_backend": plan.verdict_backend, "budget_s": budget_s, "parallel": parallel},
                "environment": environment, "seconds": seconds, "exit_status": status,
                "interrupted": interrupted or None, "cases": results}
    (out / "gpu_results.json").write_text(json.dumps(document, indent=1, default=repr), encoding="utf-8")
    print("\n" + table, flush=True)
    print(f"\nresults: {out / 'gpu_results.jsonl'}, {out / 'gpu_results.json'}  (exit {status})", flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                        help="where the result files go (default: $OUT, else the work folder)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default=os.environ.get("SCOUT_TORCHRUN_DEVICE", "cuda"),
                        help="cuda (default), or cpu: the plumbing mode, gloo ranks on CPU, a subset of cases")
    parser.add_argument("--gpus", type=int, default=None,
                        help="plan for this many GPUs (default: all found; with --plan, no probe is made)")
    parser.add_argument("--plan", action="store_true", help="print the plan (each case, its estimated seconds, "
                                                            "the total) and exit without running anything")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"the cases' budget in seconds (default {DEFAULT_BUDGET_S:.0f})")
    parser.add_argument("--parallel", type=int, default=None,
                        help="cases run side by side, except the timing-sensitive ones (default: 2 on one GPU, "
                             "4 on more; CPU 2)")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--timeout", action="append", default=[], metavar="CASE=SECONDS",
                        help="override one case's timeout")
    args = parser.parse_args(argv)

    names = [c.name for c in CASES]
    wanted = [n for n in args.cases.split(",") if n] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"run.py: unknown case(s) {unknown}; the cases are {names}", file=sys.stderr)
        return 2
    timeouts: dict[str, float] = {}
    for item in args.timeout:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds:
            print(f"run.py: --timeout wants CASE=SECONDS with a case of {names}, got {item!r}", file=sys.stderr)
            return 2
        timeouts[name] = float(seconds)
    if not 0 < args.budget_s <= 3600:
        print(f"run.py: --budget-s must be in (0, 3600], got {args.budget_s}", file=sys.stderr)
        return 2
    if args.gpus is not None and not 1 <= args.gpus <= 64:
        print(f"run.py: --gpus must be in [1, 64], got {args.gpus}", file=sys.stderr)
        return 2
    if args.parallel is not None and not 1 <= args.parallel <= 16:
        print(f"run.py: --parallel must be in [1, 16], got {args.parallel}", file=sys.stderr)
        return 2
    named = [n for n in args.cases.split(",") if n]
    cases = [c for c in CASES if c.name in wanted]

    def parallel_for(gpus: int) -> int:
        return args.parallel or (2 if args.device != "cuda" or gpus <= 1 else 4)

    if args.plan and (args.device == "cpu" or args.gpus is not None):  # a plan on paper: nothing probed
        gpus = args.gpus if args.device == "cuda" else 0
        paper = Plan(device=args.device, gpus=gpus or 0, python=sys.executable, work=Path("WORK"))
        planned = make_plan(paper, cases, budget_s=args.budget_s, parallel=parallel_for(gpus or 0), named=named,
                            timeouts=timeouts)
        print(plan_table(planned, paper, budget_s=args.budget_s, parallel=parallel_for(gpus or 0)))
        return 0

    work = args.work or Path(tempfile.mkdtemp(prefix="scout-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    out = args.out or work
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo",
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("TRITON_INTERPRET", None)
    env.pop("OUT", None)  # the cases write into their own folders, never into $OUT

    found = probe(sys.executable, env)
    missing = [m for m in found["missing"] if m.split(" ")[0] in REQUIRED]
    if missing:
        print(f"run.py: {sys.executable} cannot import {missing}. A GPU machine without a package index needs "
              "the wheels carried: tests/gpu/README.md, 'Offline install' (pip download here, then pip install "
              "--no-index --find-links there)", file=sys.stderr)
        return 2
    available = int(found["found"].get("gpus", 0))
    if args.device == "cuda" and available < 1:
        print("run.py: no CUDA GPU visible to torch here; run with --device cpu (or SCOUT_TORCHRUN_DEVICE=cpu) "
              "for the plumbing mode", file=sys.stderr)
        return 2
    gpus = min(args.gpus, available) if args.gpus else available
    plan = Plan(device=args.device, gpus=gpus if args.device == "cuda" else 0, python=sys.executable, work=work)
    parallel = parallel_for(plan.gpus)
    planned = make_plan(plan, cases, budget_s=args.budget_s, parallel=parallel, named=named, timeouts=timeouts)
    print(plan_table(planned, plan, budget_s=args.budget_s, parallel=parallel), flush=True)
    if args.plan:
        return 0
    header = (f"scout GPU checks: device {plan.device}, {plan.gpus} GPU(s) {found['found'].get('gpu_names', [])}, "
              f"verdict jobs {plan.verdict_ranks} ranks over {plan.verdict_backend}, torch "
              f"{found['found'].get('torch')}, triton {found['found'].get('triton', 'absent')}, budget "
              f"{args.budget_s:.0f} s, work {work}")
    print(header, flush=True)
    env["SCOUT_TORCHRUN_DEVICE"] = plan.device  # the rank workers read it
    return execute(plan, planned, budget_s=args.budget_s, parallel=parallel, env=env, out=out, header=header,
                   environment=found["found"])


if __name__ == "__main__":
    sys.exit(main())
