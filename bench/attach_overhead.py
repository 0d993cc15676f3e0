"""End-to-end overhead of ``scout.attach`` on a GPT trained with DDP, measured in interleaved
A/B runs of one training script (this file, under ``torchrun --nproc-per-node 2``, gloo on CPU).

An *arm* is one way to run the same model, data and steps: without scout (``off``), with scout
at its defaults, at another replay cadence, or with one part of scout switched off -- the
``observer`` and ``replay`` settings, or a private benchmark switch (scout/job/bench_switches.py:
``instrumentation``, ``ddp_hook``, ``loop_timer``, ``gate``).

Arms are compared in **pairs that take turns step by step** (:func:`paired`, :func:`pair_run`):
the reference arm and the measured arm run as two torchrun jobs at once; a turn is one step of
every rank of one job, and while one job has its turn the other is frozen (SIGSTOP to its whole
process tree: agent, trainers with every thread, observers). The two alternate A, B, A, B, ...,
so every step of one arm has a step of the other beside it in time, and drift on a shared
machine -- a slow minute, a noisy neighbour -- falls on both arms alike, which whole runs one
after the other cannot give: on this 2-core box, five separate runs of the same job without
scout ranged from 5.28 to 6.31 s a step (the rounds design this replaced, 2026-12-02), a
spread twenty times the 1 % goal. Freezing, not just waiting, matters: a waiting scout job's
threads and processes would still run (gloo's loop threads wake 100 times a second, scout's
completion watcher 10 times, its observer twice) and take their CPU from the other job's
steps, making scout look cheaper. A *round* is one pair run; which arm steps first alternates
from round to round. A run's figure is its **mean** step time over its measured steps -- a
replay check every few steps is part of the cost, so a median would hide it -- and the arm's
overhead in a round is its mean over the reference's mean, minus one; the result is the median
over rounds, with the range. Each run also reports the CPU its processes spent outside its own
turns (``background_cpu_s``, about zero when the freezing works).

Both jobs of a pair allocate alike: by default (``--allocator heap``, :data:`ALLOCATORS`) glibc
keeps its heap, so a step reuses memory instead of mapping and faulting in its large tensors
afresh; ``--allocator stock`` measures with glibc's defaults, where that churn is 7 % of a step on
this box and moves more between runs than the goal allows.

Each run also reports, from inside the measured window: scout's own accounting of
``job.step()`` (``job.costs``: replay, its compute and collectives, gate and reports, cycle
ends), the CPU time of rank 0's trainer process (every thread) and of its observer process.

This file is three things: the benchmark of the overhead at defaults (``./dev py
bench/attach_overhead.py``; goal <= 1.0 % on a CPU box, <= 0.5 % on a GPU, TARGETS.md), the
library bench/evaluate.py measures cadences and parts with (:func:`paired`), and the
torchrun worker (``--worker``).

    ./dev py bench/attach_overhead.py [--rounds 5] [--steps 24] [--batch 8] [--size large] [--allocator heap]

On a GPU host (tests/gpu/run.py runs it so): ``--device cuda --nproc N``, one rank per GPU over
NCCL (ranks beyond the GPUs share them over gloo), every step ending in a
``torch.cuda.synchronize`` in both arms so that a step's time is the GPU's; the result goes to
bench/results/attach_overhead_gpu.json unless ``--output`` says where.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from scout.scenarios import launcher

REPO = Path(__file__).resolve().parents[1]
GOAL_CPU = 0.010  # TARGETS.md: <= 1.0 % on this 2-core box
GOAL_GPU = 0.005  # TARGETS.md: <= 0.5 % on a GPU
#: Model sizes (examples/train_gpt.py's GPT). ``large`` is the goal's >= 50M model.
SIZES: dict[str, dict[str, int]] = {
    "large": dict(vocab=16384, width=512, layers=12, heads=8),  # 54.6M parameters
    "small": dict(vocab=2048, width=256, layers=4, heads=4),  # 4.2M parameters
    "tiny": dict(vocab=256, width=64, layers=4, heads=4),  # quick mode; the fixed per-step cost (bench/fixed_cost.py)
    "tiny3": dict(vocab=256, width=64, layers=3, heads=4),  # issue 38's tiny GPT: 4 ranks, ~80 ms steps
}
SEQUENCE = 128  # tokens per row, unless a run says otherwise (``sequence``)
WARMUP_STEPS = 2  # unmeasured steps at a run's start, unless a run says otherwise (``warmup``)


def warmup_for(layers: int) -> int:
    """The warm-up that covers scout's calibration window at the defaults (spec/budget.md
    BUDGET-5, BUDGET-12: one layer every 2 steps until 8 steps free of replay were measured) and
    two steps beyond it, so that the measured steps run at the cadence the overhead budget chose."""
    from scout.core.budget import calibration_window_steps

    return calibration_window_steps(layers) + WARMUP_STEPS
#: Parts that are settings of scout.attach; the other parts are scout/job/bench_switches.py's.
SETTING_PARTS = ("observer", "replay")
RUN_TIMEOUT_S = 3600.0
#: How the trainers' glibc malloc is set up, the same for both arms of a pair. ``heap``: every
#: block comes from the process's heap, which is kept (no mmap per large block, no trim) -- how a
#: CPU training host is set up for speed (PyTorch's CPU guides preload jemalloc or tcmalloc for the
#: same reason). ``stock``: glibc's defaults, under which every tensor over its mmap threshold is
#: mapped afresh and page-faulted in at every step: on this box about 110,000 faults and 0.3 s of
#: system time in a 4 s step of the 54.6M GPT, a count that moves by +-10 % between two runs of one
#: job with its allocation history -- more than the 1 % goal. On a GPU the caching allocator keeps
#: its blocks and this does not arise.
ALLOCATORS: dict[str, dict[str, str]] = {
    "heap": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 << 30), "MALLOC_TOP_PAD_": str(256 << 20)},
    "stock": {},
}
DEFAULT_ALLOCATOR = "heap"


@attrs.frozen
class Arm:
    """One way to run the job: ``scout`` off, or on with ``cadence`` (replay_interval_steps;
    None: the default), the parts in ``off`` switched off and other attach ``settings``."""

    name: str
    scout: bool = True
    cadence: int | None = None
    off: tuple[str, ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "scout": self.scout, "cadence": self.cadence, "off": list(self.off),
                "settings": [list(item) for item in self.settings]}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Arm:
        return cls(value["name"], value["scout"], value["cadence"], tuple(value["off"]),
                   tuple((str(k), v) for k, v in value.get("settings", ())))


OFF = Arm("off", scout=False)
DEFAULTS = Arm("defaults")


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", REPO / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``, every thread, to the nanosecond (/proc/PID/task/*/schedstat;
    /proc/PID/stat counts 10 ms ticks, too coarse for an observer that should barely run)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total_ns / 1e9


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _time_on_this_thread(job: Any) -> None:
    """Add to ``job.costs`` the CPU time this thread spends in ``job.step()`` and in the dense
    replay (``step_cpu_s``, ``replay_cpu_s``), and their wall times (``step_wall_s``,
    ``replay_wall_s``): unlike their wall times the CPU times they leave out waiting for
    a slower peer in scout's collectives -- a wait the job would otherwise spend in its own next
    all-reduce -- and they hardly move with the machine's load. Wrapped here, in the benchmark,
    so that the product carries no second clock."""
    def timed(function: Callable[[], Any], name: str) -> Callable[[], Any]:
        def wrapper() -> Any:
            started, started_wall = time.thread_time(), time.perf_counter()
            try:
                return function()
            finally:
                job.costs[name] = job.costs.get(name, 0.0) + time.thread_time() - started
                wall = name.replace("_cpu_s", "_wall_s")
                job.costs[wall] = job.costs.get(wall, 0.0) + time.perf_counter() - started_wall

        return wrapper

    for check in job.pipeline.checks:
        if check.name == "replay":  # scout/job/checks.py ReplayCheck: its runner steps the replay
            check.runner.step = timed(check.runner.step, "replay_cpu_s")
    job.step = timed(job.step, "step_cpu_s")
    # The live path's self-check (SELF-1) re-executes at the optimizer's pre-step hook (SELF-9),
    # where job.costs does not look.
    from scout.replay import capture

    check_live_call = capture.check_live_call

    def self_check(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return check_live_call(*args, **kwargs)
        finally:
            job.costs["self_check_cpu_s"] = job.costs.get("self_check_cpu_s", 0.0) + time.thread_time() - started

    capture.check_live_call = self_check  # type: ignore[assignment]


def _thread_cpu_s(name: str) -> float:
    """CPU seconds of this process's Python threads called ``name`` (their schedstat, to the ns)."""
    total_ns = 0
    for thread in threading.enumerate():
        if thread.name != name or thread.native_id is None:
            continue
        try:
            total_ns += int(Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # it just ended
    return total_ns / 1e9


def _division_pass_s(ddp: Any, world: int, repeats: int = 5) -> float:
    """What one pass dividing every gradient by the world size costs a thread: DDP without a
    communication hook fuses the division into its copy into the bucket, while under scout's
    hook the averaging all-reduce (or the division before a sum) makes it a pass of its own.
    Timed here, in the same process, on buffers of the model's size."""
    import torch

    buffers = [torch.ones(p.numel(), dtype=p.dtype) for p in ddp.parameters() if p.requires_grad]
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        for buffer in buffers:
            buffer.div_(world)
        best = min(best, time.thread_time() - started)
    return best


class Baton:
    """One rank's turns in a pair (:func:`pair_run`): ``wait`` blocks until the driver gives this
    rank a turn, ``give`` tells the driver this rank has finished it. The rank's own FIFO and
    its side's done FIFO are opened read-write, so that no open blocks and no read sees end of
    file; every wait is bounded by ``timeout_s``."""

    def __init__(self, directory: Path, side: int, rank: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.turns = os.open(go_path(directory, side, rank), os.O_RDWR)
        self.done = os.open(done_path(directory, side), os.O_RDWR)
        self.waited_s = 0.0  # the wall time spent waiting for turns (the other job's, frozen or not)

    def wait(self) -> None:
        started = time.perf_counter()
        try:
            ready, _, _ = select.select([self.turns], [], [], self.timeout_s)
            if not ready:
                raise TimeoutError(f"the pair's driver gave no turn within {self.timeout_s:g} s")
            os.read(self.turns, 1)
        finally:
            self.waited_s += time.perf_counter() - started

    def clock(self) -> float:
        """The wall clock less the time spent waiting for turns: a job's own time."""
        return time.perf_counter() - self.waited_s

    def give(self) -> None:
        os.write(self.done, b"d")


def go_path(directory: Path, side: int, rank: int) -> Path:
    return directory / f"go-side{side}-rank{rank}"


def done_path(directory: Path, side: int) -> Path:
    return directory / f"done-side{side}"


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    arm = Arm.from_json(json.loads(args.arm))
    sequence = args.sequence
    size = SIZES[args.size]
    torch.set_num_threads(1)
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # replay is deterministic
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        one_gpu_each = int(os.environ["WORLD_SIZE"]) <= torch.cuda.device_count()
        dist.init_process_group("nccl" if one_gpu_each else "gloo")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    example = _example()
    example.SEQUENCE = sequence  # the attention mask's size (examples/train_gpt.py builds it from this global)
    torch.manual_seed(0)
    model = example.GPT(**size).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    job = None
    if arm.scout:
        import scout

        keywords: dict[str, Any] = {part: False for part in arm.off if part in SETTING_PARTS}
        if arm.cadence is not None:
            keywords["replay_interval_steps"] = arm.cadence
        keywords.update(dict(arm.settings))
        job = scout.attach(ddp, optimizer, run_dir=args.run_dir, **keywords)
        job.restore()
        _time_on_this_thread(job)
    times: list[float] = []
    scout_times: list[float] = []  # the wall time of each measured step's job.step()
    hook_times: list[float] = []  # scout's hooks' own time in each measured step (spec/budget.md BUDGET-10)
    replayed: list[bool] = []  # whether each measured step ran a replay check (its job.step() did)
    step_cpu: list[float] = []  # the training thread's CPU time of each measured step, job.step() included
    turn_cpu: list[float] = []  # this trainer's (every thread) and its observer's CPU time of each measured step
    own: list[float] = []  # each measured step's wall time less the training thread's run-queue delay (STRAG-1)
    from scout.replay.collectives import RunQueueDelay
    from scout.reports.hook_time import HOOK_TIME  # once here, not in the measured steps

    run_queue_delay_s = RunQueueDelay()
    train_cpu: list[float] = []  # this thread's CPU time of forward, backward and the optimizer
    window: dict[str, Any] = {}
    baton = Baton(Path(args.baton), args.side, rank, RUN_TIMEOUT_S) if args.baton else None
    if baton is not None and job is not None and job.parts.calibration is not None:
        # The overhead budget's step period (spec/budget.md BUDGET-3: from one job.step()'s end to
        # the next's) would hold the other job's turn, which this job waits for between two of its
        # steps: T would read about twice the job's own step, and the budget would choose the cadence
        # (and space the loop check and the agreement) for a job twice as slow as this one. Its clock
        # here stops while the job waits for a turn, so it decides as for this job alone.
        job.parts.calibration.clock = baton.clock
    in_turns_cpu_s = 0.0  # this job's processes' CPU inside its own turns (the measured steps)

    def processes_cpu_s() -> float:
        """CPU seconds of this trainer (every thread) and its observer."""
        total = _own_cpu_s()
        if job is not None and job.observer is not None:
            total += _process_cpu_s(job.observer.pid)
        return total

    def snapshot() -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        taken: dict[str, Any] = {"cpu_s": _own_cpu_s(), "wall_s": time.perf_counter(),
                                 "processes_cpu_s": processes_cpu_s(),
                                 "usage": {"user_s": usage.ru_utime, "system_s": usage.ru_stime,
                                           "minor_faults": usage.ru_minflt, "voluntary_switches": usage.ru_nvcsw,
                                           "involuntary_switches": usage.ru_nivcsw}}
        if job is not None:
            taken["costs_s"] = dict(job.costs)
            taken["costs_s"]["completion_watcher_cpu_s"] = _thread_cpu_s("scout-completion")
            if job.observer is not None:
                taken["observer_cpu_s"] = _process_cpu_s(job.observer.pid)
        return taken

    warmup = args.warmup
    for step in range(1, warmup + args.steps + 1):
        if baton is not None:
            baton.wait()
        if step == warmup + 1:
            window["start"] = snapshot()
        turn_cpu_s = processes_cpu_s() if step > warmup else 0.0
        generator = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, size["vocab"], (args.batch, sequence + 1), generator=generator).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started, started_cpu, started_delay = time.perf_counter(), time.thread_time(), run_queue_delay_s()
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, size["vocab"]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trained_cpu = time.thread_time() - started_cpu
        in_scout_s = 0.0
        replayed_now = False
        hooks_s = 0.0
        if job is not None:
            hooks_s = HOOK_TIME.spent_ns / 1e9  # since the last job.step() took it (BUDGET-10)
            replay_before_s = job.costs.get("replay_s", 0.0)
            before = time.perf_counter()
            job.step()
            in_scout_s = time.perf_counter() - before
            replayed_now = job.costs.get("replay_s", 0.0) > replay_before_s  # a replay check ran at this step
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's time is the GPU's, in both arms
        if step > warmup:
            times.append(time.perf_counter() - started)
            own.append(times[-1] - (run_queue_delay_s() - started_delay))
            step_cpu.append(time.thread_time() - started_cpu)
            scout_times.append(in_scout_s)
            hook_times.append(hooks_s)
            replayed.append(replayed_now)
            train_cpu.append(trained_cpu)
            turn_cpu.append(processes_cpu_s() - turn_cpu_s)
            in_turns_cpu_s += turn_cpu[-1]
        if step == warmup + args.steps:
            window["end"] = snapshot()  # before the last turn is handed over
        if baton is not None:
            baton.give()
    if baton is not None:
        baton.wait()  # the release: nothing of this job runs beside the other job's last step
    end = window["end"]
    start = window["start"]
    result: dict[str, Any] = {
        "rank": rank, "parameters": parameters, "layers": size["layers"], "batch": args.batch, "step_s": times,
        "job_step_s": scout_times, "hook_s": hook_times, "replayed": replayed, "step_cpu_s": step_cpu, "turn_cpu_s": turn_cpu,
        "step_own_s": own, "sequence": sequence,
        "train_cpu_s": train_cpu,
        "trainer_cpu_s": end["cpu_s"] - start["cpu_s"], "window_wall_s": end["wall_s"] - start["wall_s"],
        # The trainer's user and system time, page faults and context switches over the window.
        "trainer_usage": {name: end["usage"][name] - start["usage"][name] for name in end["usage"]},
        # What this job's processes spent while the other job of a pair stepped (its turns).
        "background_cpu_s": end["processes_cpu_s"] - start["processes_cpu_s"] - in_turns_cpu_s,
    }
    if job is not None:
        result["costs_s"] = {name: seconds - start["costs_s"].get(name, 0.0) for name, seconds in end["costs_s"].items()}
        if "observer_cpu_s" in end:
            result["observer_cpu_s"] = end["observer_cpu_s"] - start["observer_cpu_s"]
        calibration = job.parts.calibration  # the cadence in effect: the budget's or the user's
        result["replay_interval_steps"] = (calibration.cadence.interval_steps if calibration is not None
                                           else job.config.replay_interval_steps)
        result["replay_lanes"] = calibration.cadence.lanes if calibration is not None else 1
        result["loop_check_steps"] = calibration.loop_check_steps if calibration is not None else None  # BUDGET-11
        result["cycle_steps"] = job.pipeline.cycle_steps
        result["cadence_decisions"] = [] if calibration is None else [
            {"interval_steps": d.cadence.interval_steps if d.cadence else None, "cycle_steps": d.cycle_steps,
             "share": d.share, "status": d.status.value, "reason": d.reason} for d in calibration.decisions]
        result["replay_rows"] = job.config.replay_rows
        job.close()
        if rank == 0:  # the reporter rank: what its run directory says of the cadence chosen
            result["replay_share"] = replay_share(Path(args.run_dir))
        if device.type == "cpu" and "ddp_hook" not in arm.off:
            result["costs_s"]["ddp_hook_division_cpu_s"] = len(times) * _division_pass_s(ddp, dist.get_world_size())
    if rank == 0:
        Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


def replay_share(run_dir: Path) -> float | None:
    """Replay's share of a step at the cadence the run's last ``cadence`` report chose, by scout's
    own measurement in it (spec/budget.md BUDGET-3, BUDGET-4): the worst rank's ``C / (N T)`` --
    its replay work over a cycle, spread over the cycle's ``N`` steps of ``T`` each. None where the
    run directory holds no such report (replay off, or no decision yet)."""
    from scout.reports import read_records

    path = run_dir / "reports.jsonl"
    cadences = [r for r in read_records(path) if r.get("kind") == "cadence"] if path.exists() else []
    if not cadences:
        return None
    evidence = cadences[-1].get("evidence") or {}
    cycle = evidence.get("cycle_steps") or 0
    measured = [m for m in evidence.get("measured") or () if m and m.get("step_s")]
    if cycle <= 0 or not measured:
        return None
    return max(m["cycle_s"] / (cycle * m["step_s"]) for m in measured)


def _command(arm: Arm, *, size: str, steps: int, batch: int, nproc: int, device: str, work: Path,
             out: Path, baton: Path | None = None, side: int = 0, sequence: int = SEQUENCE,
             warmup: int = WARMUP_STEPS) -> list[str]:
    command = launcher.torchrun_command(__file__, nproc, [
        "--worker", "--arm", json.dumps(arm.to_json()), "--size", size, "--steps", steps, "--batch", batch,
        "--sequence", sequence, "--warmup", warmup, "--device", device, "--out", out, "--run-dir", work / f"run-{out.stem}"])
    if baton is not None:
        command += ["--baton", str(baton), "--side", str(side)]
    return command


def check_allocator(allocator: str) -> str:
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {sorted(ALLOCATORS)}, got {allocator!r}")
    return allocator


def _environment(arm: Arm, allocator: str = DEFAULT_ALLOCATOR) -> dict[str, str]:
    # The allocator is the run's choice, not the shell's; so is the bench's own switch.
    dropped = {"SCOUT_BENCH_OFF", *(name for settings in ALLOCATORS.values() for name in settings)}
    env = launcher.torchrun_env(base={key: value for key, value in os.environ.items() if key not in dropped})
    env.update(ALLOCATORS[check_allocator(allocator)])
    private = [part for part in arm.off if part not in SETTING_PARTS]
    if private:
        env["SCOUT_BENCH_OFF"] = ",".join(private)
    return env


def _outcome(arm: Arm, process: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    _, stderr = process.communicate()
    if process.returncode != 0 or not out.exists():
        raise RuntimeError(f"the {arm.name} run failed (exit {process.returncode}): {stderr[-3000:]}")
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def one_run(arm: Arm, *, size: str, steps: int, batch: int, nproc: int, device: str, work: Path,
            allocator: str = DEFAULT_ALLOCATOR, sequence: int = SEQUENCE, warmup: int = WARMUP_STEPS) -> dict[str, Any]:
    """One torchrun job of ``arm`` on its own; rank 0's measurements."""
    out = work / f"{arm.name}-{time.monotonic_ns()}.json"
    job = launcher.launch(_command(arm, size=size, steps=steps, batch=batch, nproc=nproc, device=device, work=work,
                                   out=out, sequence=sequence, warmup=warmup),
                          _environment(arm, allocator), timeout_s=RUN_TIMEOUT_S)  # killed whole at the timeout
    if job.returncode != 0 or not out.exists():
        raise RuntimeError(f"the {arm.name} run failed (exit {job.returncode}): {job.stderr[-3000:]}")
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def _process_tree(root: int) -> list[int]:
    """``root`` and every process below it (the torchrun agent, its trainers, their observers),
    from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that just ended
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, frontier = [root], [root]
    while frontier:
        frontier = [child for pid in frontier for child in children.get(pid, ())]
        tree += frontier
    return tree


def _signal_tree(root: int, signum: int) -> None:
    for pid in _process_tree(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """SIGTERM raises SystemExit in the main thread while inside, so that a driver ended by
    ``kill`` (not only by Ctrl-C) runs its ``finally``: a pair freezes one job's whole process
    tree at every turn, and a driver that died without thawing and killing it left that tree
    stopped for good (trainers, observers, multiprocessing's resource trackers). Elsewhere than
    the main thread nothing changes (signal handlers belong to it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def pair_run(reference: Arm, arm: Arm, *, first: int, size: str, steps: int, batch: int, nproc: int,
             device: str, work: Path, allocator: str = DEFAULT_ALLOCATOR,
             sequence: int = SEQUENCE, warmup: int = WARMUP_STEPS) -> dict[str, dict[str, Any]]:
    """The two jobs of a pair at once, taking turns step by step: side 0 is ``reference``, side
    1 ``arm``, side ``first`` steps first. A turn is one step of every rank of one job; the
    driver gives it (:class:`Baton`), waits until every rank has finished it, then **freezes**
    that job -- SIGSTOP to its whole process tree: the torchrun agent, the trainers and every
    thread in them (gloo's loops, scout's completion watcher), their observers -- and lets the
    other job continue. Nothing of a job runs while the other steps, so each job's step times
    carry its own costs and only those. Both jobs start at once and meet at their first turn
    (the warm-up steps absorb the start-up); after both have run every step they are released
    to finish. A job that fails ends the other. Rank 0's measurements of each, by arm name."""
    total_turns = warmup + steps
    stack = contextlib.ExitStack()
    baton = Path(tempfile.mkdtemp(prefix="pair-", dir=work))
    for side in (0, 1):
        os.mkfifo(done_path(baton, side))
        for rank in range(nproc):
            os.mkfifo(go_path(baton, side, rank))
    fds = {path: os.open(path, os.O_RDWR) for path in sorted(baton.iterdir())}
    arms = (reference, arm)
    outs = [work / f"{a.name}-{time.monotonic_ns()}-side{side}.json" for side, a in enumerate(arms)]
    processes = [subprocess.Popen(_command(a, size=size, steps=steps, batch=batch, nproc=nproc, device=device,
                                           work=work, out=outs[side], baton=baton, side=side, sequence=sequence,
                                           warmup=warmup),
                                  env=_environment(a, allocator), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for side, a in enumerate(arms)]
    errors: list[list[str]] = [[], []]
    # Read stderr as it comes, so a chatty job never fills its pipe and stalls.
    readers = [threading.Thread(target=errors[side].extend, args=(process.stderr,), daemon=True)
               for side, process in enumerate(processes)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + RUN_TIMEOUT_S

    def give(side: int) -> None:
        for rank in range(nproc):
            os.write(fds[go_path(baton, side, rank)], b"g")

    def finished(side: int) -> bool:
        """Wait (bounded) until every rank of ``side`` has finished its turn; False if a job
        failed or the deadline passed."""
        got = 0
        done = fds[done_path(baton, side)]
        while got < nproc:
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in processes):
                return False
            ready, _, _ = select.select([done], [], [], 0.5)
            if ready:
                got += len(os.read(done, nproc - got))
        return True

    ok = True
    try:
        stack.enter_context(terminate_raises())
        side = first
        give(side)
        turns = [0, 0]
        while ok and min(turns) < total_turns:
            ok = finished(side)
            turns[side] += 1
            other = 1 - side
            if ok and turns[other] < total_turns:
                _signal_tree(processes[side].pid, signal.SIGSTOP)
                _signal_tree(processes[other].pid, signal.SIGCONT)
                give(other)
                side = other
            elif ok and turns[side] < total_turns:
                give(side)  # the other job has run all its turns (and waits for its release)
        for side in (0, 1):
            _signal_tree(processes[side].pid, signal.SIGCONT)
            give(side)  # the release
        while ok and any(p.poll() is None for p in processes):
            ok = time.monotonic() < deadline and all(p.poll() in (None, 0) for p in processes)
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.poll() is None:
                _signal_tree(process.pid, signal.SIGCONT)
                _signal_tree(process.pid, signal.SIGKILL)
            process.wait()
        for reader in readers:
            reader.join(timeout=10)
        for fd in fds.values():
            os.close(fd)
        shutil.rmtree(baton, ignore_errors=True)
        stack.close()
    runs: dict[str, dict[str, Any]] = {}
    # A job that failed on its own is reported first, not the one this driver then killed.
    killed = -signal.SIGKILL
    order = sorted(range(2), key=lambda s: processes[s].returncode in (0, killed))
    for side in order:
        a, process = arms[side], processes[side]
        if process.returncode != 0 or not outs[side].exists():
            raise RuntimeError(f"the {a.name} run of the pair {reference.name}/{arm.name} failed (exit "
                               f"{process.returncode}): {''.join(errors[side])[-3000:]}")
        runs[a.name] = json.loads(outs[side].read_text())
    return runs


def mean_step_s(run: dict[str, Any]) -> float:
    return float(statistics.fmean(run["step_s"]))


def paired(
    pairs: Sequence[tuple[Arm, Arm]], *, rounds: int, size: str, steps: int, batch: int, nproc: int = 2,
    device: str = "cpu", log: Callable[[str], None] = print, allocator: str = DEFAULT_ALLOCATOR,
    sequence: int = SEQUENCE, warmup: int = WARMUP_STEPS,
) -> list[dict[str, Any]]:
    """``rounds`` rounds; in each, every (reference, arm) of ``pairs`` runs as a pair
    (:func:`pair_run`), the side that steps first alternating by round. Per round: the runs (the
    arm's under its name, its reference's under ``"<reference>@<arm>"``), each arm's overhead
    over its reference, and the load average around the round. Arm names must differ. Both
    jobs of every pair run with the glibc malloc setup ``allocator`` (:data:`ALLOCATORS`)."""
    check_allocator(allocator)
    names = [arm.name for _, arm in pairs]
    if not pairs or len(set(names)) != len(names) or any(r.name == a.name for r, a in pairs):
        raise ValueError(f"paired needs distinct arms, each with another reference, got "
                         f"{[(r.name, a.name) for r, a in pairs]}")
    work = Path(tempfile.mkdtemp(prefix="scout-overhead-"))
    results: list[dict[str, Any]] = []
    try:
        for index in range(rounds):
            load_before = list(os.getloadavg())
            runs: dict[str, dict[str, Any]] = {}
            overheads: dict[str, float] = {}
            for reference, arm in pairs:
                pair = pair_run(reference, arm, first=index % 2, size=size, steps=steps, batch=batch, nproc=nproc,
                                device=device, work=work, allocator=allocator, sequence=sequence, warmup=warmup)
                runs[arm.name] = pair[arm.name]
                runs[f"{reference.name}@{arm.name}"] = pair[reference.name]
                overheads[arm.name] = mean_step_s(pair[arm.name]) / mean_step_s(pair[reference.name]) - 1
                log(f"  round {index + 1}/{rounds} ({size}): {arm.name} against {reference.name} "
                    f"{100 * overheads[arm.name]:+.2f} %, {reference.name} {mean_step_s(pair[reference.name]):.3f} "
                    f"s/step")
            results.append({"round": index, "first": "reference" if index % 2 == 0 else "arm",
                            "references": {arm.name: reference.name for reference, arm in pairs}, "runs": runs,
                            "overhead": overheads, "load_before": load_before, "load_after": list(os.getloadavg())})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def round_figures(run: dict[str, Any]) -> dict[str, Any]:
    """What one run's steps say, per step: its mean wall time, the training thread's CPU time in
    forward, backward and the optimizer, the wall time beside it (waiting for the other rank,
    off a CPU, scout's own calls), and the trainer's system time and page faults."""
    steps = len(run["step_s"])
    usage = run.get("trainer_usage", {})
    figures = {"step_s": mean_step_s(run), "train_cpu_s": statistics.fmean(run["train_cpu_s"])}
    figures["beside_training_s"] = figures["step_s"] - figures["train_cpu_s"]
    figures.update({f"{name}_per_step": value / steps for name, value in usage.items()})
    figures.update({f"{name}_per_step": value / steps for name, value in run.get("costs_s", {}).items()})
    return figures


def summary(results: list[dict[str, Any]], arm: str) -> dict[str, float]:
    """An arm's overhead over rounds: median, min, max, n (fractions)."""
    values = [r["overhead"][arm] for r in results]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def driver(args: argparse.Namespace) -> int:
    results = paired([(OFF, DEFAULTS)], rounds=args.rounds, size=args.size, steps=args.steps, batch=args.batch,
                     nproc=args.nproc, device=args.device, allocator=args.allocator, sequence=args.sequence,
                     warmup=args.warmup)
    overhead = summary(results, "defaults")
    goal = GOAL_CPU if args.device == "cpu" else GOAL_GPU
    on_runs = [r["runs"]["defaults"] for r in results]
    off_means = [mean_step_s(r["runs"]["off@defaults"]) for r in results]
    breakdown: dict[str, float] = {}
    for run, reference in zip(on_runs, off_means, strict=True):
        window_s = reference * len(run["step_s"])
        parts = dict(run.get("costs_s", {}))
        parts["observer_cpu_s"] = run.get("observer_cpu_s", 0.0)
        parts["background_cpu_s"] = run["background_cpu_s"]
        for name, seconds in parts.items():
            breakdown[name] = breakdown.get(name, 0.0) + seconds / window_s / len(on_runs)
    result = {
        "model_parameters": on_runs[0]["parameters"], "size": args.size,
        "ranks": args.nproc, "device": args.device, "batch": args.batch, "sequence": args.sequence,
        "steps_per_run": args.steps, "rounds": args.rounds, "allocator": args.allocator,
        "design": "pairs taking turns step by step, the waiting job frozen",
        "off_step_s": off_means, "on_step_s": [mean_step_s(run) for run in on_runs],
        "overhead_median": overhead["median"], "overhead_min": overhead["min"], "overhead_max": overhead["max"],
        "breakdown_fraction_of_step": breakdown,
        "goal": goal, "met": overhead["median"] <= goal,
        "load_average": [r["load_after"] for r in results],
        # Per round, both runs' figures per step (round_figures): where a round's overhead went.
        "rounds_detail": [{"overhead": r["overhead"]["defaults"], "first": r["first"],
                           "off": round_figures(r["runs"]["off@defaults"]),
                           "defaults": round_figures(r["runs"]["defaults"])} for r in results],
        "warmup_steps": args.warmup,
        "cadence": [{"replay_interval_steps": run.get("replay_interval_steps"), "lanes": run.get("replay_lanes"),
                     "cycle_steps": run.get("cycle_steps")} for run in on_runs],
        "note": "mean step time over the measured steps, the two arms taking turns step by step (the waiting job "
                "frozen); at the defaults the replay cadence is the overhead budget's (spec/budget.md), chosen at "
                "the end of the calibration window (one hidden layer every 2 steps until 8 steps free of replay were "
                "measured, BUDGET-12), which "
                "the warm-up covers; 1 row of the batch (CAP-8)",
    }
    sys.path.insert(0, str(REPO / "bench"))
    from _goals import at_most, print_goals, write_results

    goals = [at_most("attach overhead at defaults (>= 50M GPT)", 100 * result["overhead_median"], 100 * goal, "%",
                     f"median over {args.rounds} rounds of paired runs; min {100 * overhead['min']:.2f} %, "
                     f"max {100 * overhead['max']:.2f} %")]
    name = "attach_overhead" if args.device == "cpu" else "attach_overhead_gpu"
    write_results(name, result, goals, Path(args.output) if args.output else None)
    print(json.dumps({k: v for k, v in result.items() if k not in ("off_step_s", "on_step_s")}, indent=2))
    print_goals(goals)
    return 0 if result["met"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--arm", default=json.dumps(DEFAULTS.to_json()), help="the worker's arm (JSON)")
    parser.add_argument("--size", choices=sorted(SIZES), default="large")
    parser.add_argument("--steps", type=int, default=24, help="measured steps per run (24: one cycle at defaults)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=SEQUENCE, help="tokens per row (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured steps at a run's start (default: the "
                        "calibration window of the overhead budget and 2 steps, warmup_for(layers))")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per run (default 2)")
    parser.add_argument("--allocator", choices=sorted(ALLOCATORS), default=DEFAULT_ALLOCATOR,
                        help="the trainers' glibc malloc setup, both arms alike (default: heap)")
    parser.add_argument("--output", default="", help="where the result JSON goes")
    parser.add_argument("--out", default="")
    parser.add_argument("--run-dir", default="")
    parser.add_argument("--baton", default="", help="the worker's pair directory (FIFOs; paired runs)")
    parser.add_argument("--side", type=int, choices=(0, 1), default=0, help="the worker's side of its pair")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = warmup_for(SIZES[args.size]["layers"])
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
