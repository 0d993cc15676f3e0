"""The evaluation the SCOUT paper lacks (issue 23), measured on this machine and written to
bench/results/evaluation.json, then rendered into docs/evaluation.md with its plots
(bench/_evaluation_doc.py):

1. ``overhead``: scout's overhead against the replay cadence (``replay_interval_steps`` 1, 2,
   5, 10, 20) for two model sizes, interleaved A/B rounds (bench/attach_overhead.py);
2. ``parts``: at the defaults on the >= 50M GPT, the A/B table of parts -- one part of scout off
   at a time (observer, instrumentation, DDP hook, loop timer, replay, gate) -- and the goal:
   overhead <= 1.0 %, and replay's share within 1.5x of its formula;
   ``batch``: the goal's pair again at larger batches (``--batches``, default 16): scout's work
   by construction does not grow with the batch (one row replayed, one pass over the gradients);
   whether the whole overhead falls with it is measured, with what scout times of itself and the
   trainer's CPU beside it;
3. ``latency``: detection latency -- hang (seconds past the stall threshold) and SDC (steps
   after onset) in real 4-rank jobs of examples/train_gpt.py, straggler (checks to confirm at
   1.2x, 1.5x, 2x) on the simulator and in real jobs -- over seeds;
4. ``recovery``: time from fault to training resumed and steps lost, against
   ``checkpoint_every_cycles``, for SDC and hang, under ``torchrun --max-restarts 1``;
5. ``false_alarms``: healthy runs with jitter, simulated at scale and real 4-rank jobs, counted
   per fault kind, with the 95 % upper bound on the per-round false-attribution rate;
6. ``campaign``: the fault campaign (``scout campaign``) over seeds, exact counts per seed;
7. ``budget``: scout at its defaults -- the replay cadence the overhead budget chooses (spec/budget.md)
   -- against no scout on the tiny GPT (4 ranks), the 4.2M GPT and the 54.6M GPT at batch 8 and 16,
   paired, with an A/A pair for the noise: the overhead, the budget, the cycle chosen and the SDC
   bound it gives; goal: each within the budget plus the pairs' noise. A run covers the cycle its
   model's probe chose where that takes minutes; otherwise (the 54.6M GPT: a cycle of hours) its
   pair is compared over the steps without replay and replay's share, scout's own measurement in
   the run, is added (``budget_run_plan``).

The overhead, parts and batch sections run the trainers with glibc's heap kept (``--allocator``;
bench/attach_overhead.py ALLOCATORS); the parts section also runs the goal's pair with glibc's stock
malloc (``--stock-rounds``), beside the goal.

Every section records the machine (CPU model, cores) and the load average before and after;
timings are ratios measured side by side. ``--quick`` runs every path at toy sizes (CI: a test
runs it and checks the JSON's shape and the document generator, not the figures); the full run
takes hours on 2 cores and should run on a quiet machine, detached from the shell that starts it
by ``setsid`` (``nohup`` is not enough: torchrun's agent installs its own SIGHUP handler, so the
shell's hang-up ends every job the run has going).

    ./dev bench evaluate                          # full run: JSON, plots, docs/evaluation.md
    ./dev py bench/evaluate.py --sections latency # one section again; the others are kept
    ./dev py bench/evaluate.py --render           # the document again, from the JSON
    ./dev py bench/evaluate.py --quick --output /tmp/e.json --doc /tmp/e.md --plots /tmp/plots

Exit status: 0 when every goal is met, 1 when one is missed (bench/run.py prints the table).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

import attach_overhead  # noqa: E402
from _goals import Goal, at_most, load_average  # noqa: E402

from scout.job.config import Config  # noqa: E402
from scout.scenarios import launcher  # noqa: E402

RESULTS = BENCH / "results" / "evaluation.json"
DOC = REPO / "docs" / "evaluation.md"
PLOTS = REPO / "docs" / "evaluation"
SCHEMA = "scout.evaluation/1"
SECTIONS = ("overhead", "parts", "batch", "latency", "recovery", "false_alarms", "campaign", "budget")
TRAIN_GPT = REPO / "examples" / "train_gpt.py"
WORLD = 4  # ranks of the real jobs (examples/train_gpt.py)
GPT_LAYERS = 4  # examples/train_gpt.py's GPT
CADENCES = (1, 2, 5, 10, 20)
LATENCY_INTERVAL_STEPS = 2  # the replay cadence of the real jobs of the latency, recovery and false-alarm sections
#: The budget section's models (spec/budget.md; issue 38): the tiny GPT of issue 38 on 4 ranks, the
#: 4.2M GPT, and the 54.6M GPT at batch 8 and 16, each at scout's defaults against no scout.
BUDGET_MODELS: tuple[dict[str, Any], ...] = (
    {"key": "tiny", "name": "tiny GPT", "size": "tiny3", "batch": 8, "nproc": 4, "sequence": 32},
    {"key": "small", "name": "4.2M GPT", "size": "small", "batch": 8, "nproc": 2, "sequence": 128},
    {"key": "large8", "name": "54.6M GPT, batch 8", "size": "large", "batch": 8, "nproc": 2, "sequence": 128},
    {"key": "large16", "name": "54.6M GPT, batch 16", "size": "large", "batch": 16, "nproc": 2, "sequence": 128},
)
QUICK_BUDGET_MODELS: tuple[dict[str, Any], ...] = (
    {"key": "tiny", "name": "tiny GPT", "size": "tiny", "batch": 2, "nproc": 2, "sequence": 32},)
#: The budget section's measured steps per run: the cycle a probe run chose, within these bounds
#: (a run's mean step time holds its replay only when the run is a whole cycle or more).
BUDGET_STEPS_MIN, BUDGET_STEPS_MAX = 24, 1000
#: Where the probe run was over budget, replay never runs after the decision (BUDGET-4: the
#: longest cadence), so there is no cycle to cover: a run is as many steps as take about this long
#: (the 4.2M GPT: ~100 steps, where 1,000 steps made the section's one model take 2 hours).
BUDGET_OVER_RUN_S = 40.0
#: A run covers a whole cycle only while the probe's cycle takes at most this long on this box (a
#: model's 5 rounds are 20 runs: two pairs of two jobs). Beyond it -- the 54.6M GPT at 1 %: cycles
#: of 180 to 1,644 steps of 2.7 s in two probes, 3 to 20 hours of runs -- its runs measure the
#: steps free of replay and add replay's share: ``budget_run_plan``.
BUDGET_CYCLE_RUN_S_MAX = 120.0
#: The A/A pair of the budget section: no scout against no scout, paired alike (the pairs' noise).
ALIKE = attach_overhead.Arm("alike", scout=False)
BATCHES = (16,)  # the batch section's batches (the parts section's goal is at batch 8)
PARTS_BATCH = 8
FACTORS = (1.2, 1.5, 2.0)
CHECKPOINT_EVERY = (1, 2, 5)
#: The parts of the A/B table: attach settings (observer, replay) or bench switches
#: (scout/job/bench_switches.py).
PARTS = ("observer", "instrumentation", "completion", "ddp_hook", "loop_timer", "replay", "gate")
OVERHEAD_GOAL = attach_overhead.GOAL_CPU
REPLAY_FORMULA_FACTOR = 1.5  # the replay share must match its formula within this factor
HANG_PAST_THRESHOLD_GOAL_S = 1.0  # TARGETS.md: report <= threshold + 1 s
STRAGGLER_CHECKS_GOAL = {1.5: 5, 1.2: 20}  # TARGETS.md
EXAMPLE_FAULT = re.compile(r"EXAMPLE-FAULT (\S+) rank (\d+) step (\d+) at ([0-9.]+)")
JOB_TIMEOUT_S = 900.0



# --------------------------------------------------------------------------------------------
# The machine, the load, and real jobs of examples/train_gpt.py
# --------------------------------------------------------------------------------------------


def host() -> dict[str, Any]:
    """What every figure needs beside it: the CPU, the cores, the software."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import torch

    return {"cpu_model": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "machine": platform.machine(), "system": platform.system(), "python": platform.python_version(),
            "torch": torch.__version__.split("+")[0]}


@contextlib.contextmanager
def measured(section: dict[str, Any]) -> Iterator[None]:
    """Record the load average before and after a section, and its duration."""
    section["load_before"] = load_average()
    started = time.monotonic()
    section["started"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        yield
    finally:
        section["duration_s"] = round(time.monotonic() - started, 1)
        section["load_after"] = load_average()


def _report_time_s(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp()


def _read_reports(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "reports.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def train_gpt(work: Path, name: str, *, steps: int, fault: str = "", settings: dict[str, Any] | None = None,
              checkpoint: bool = False, max_restarts: int = 0, timeout_s: float = JOB_TIMEOUT_S) -> dict[str, Any]:
    """One ``torchrun --nproc-per-node 4`` job of examples/train_gpt.py (gloo on CPU), scout's
    settings as ``SCOUT_*`` variables: its exit code, wall time, reports and injected faults.
    The job runs in its own session; past ``timeout_s`` the whole session is killed."""
    directory = work / name
    run_dir, checkpoint_dir = directory / "run", directory / "ckpt"
    directory.mkdir(parents=True)
    arguments: list[object] = ["--steps", steps, "--run-dir", run_dir, "--device", "cpu"]
    if checkpoint:
        arguments += ["--checkpoint-dir", checkpoint_dir]
    if fault:
        arguments += ["--fault", fault]
    # The job gets only the settings given here (the report audit of a test session passes on).
    # Latency, recovery and false alarms are measured at a known cadence, set as a user sets it
    # (spec/budget.md BUDGET-8): one layer every 2 steps. The overhead budget's cadence for this
    # tiny model is a cycle of a thousand steps or more (the overhead sections measure it, with
    # the SDC bound it gives).
    env = launcher.torchrun_env({"job_id": f"evaluate-{name}-{os.getpid()}", "replay_interval_steps": LATENCY_INTERVAL_STEPS,
                                 **(settings or {})},
                                drop_prefixes=("SCOUT_", "EXAMPLE_FAULT"), keep={"SCOUT_REPORT_AUDIT_FILE"})
    started = time.time()
    log = directory / "job.log"
    job = launcher.launch(launcher.torchrun_command(TRAIN_GPT, WORLD, arguments, max_restarts=max_restarts), env,
                          cwd=directory, timeout_s=timeout_s, log_path=log)  # killed whole past timeout_s
    code = job.returncode
    text = log.read_text(encoding="utf-8", errors="replace")
    faults = [{"kind": m[1], "rank": int(m[2]), "step": int(m[3]), "time_s": float(m[4])}
              for m in EXAMPLE_FAULT.finditer(text)]
    return {"name": name, "exit_code": code, "wall_s": round(time.time() - started, 2), "started_s": started,
            "reports": _read_reports(run_dir), "faults": faults, "log_tail": text[-2000:]}


def _named(record: dict[str, Any]) -> list[int]:
    return list(record.get("ranks") or [])


def _median_range(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------------------------
# 1, 2: overhead against cadence, and the A/B table of parts
# --------------------------------------------------------------------------------------------


def _replay_formula(run: dict[str, Any]) -> float:
    """The replay's expected share of a step (issue 23): 1 / (cycle x batch / rows), the cycle
    ``interval x layers`` steps (with lanes, ``interval x ceil(layers / lanes)``)."""
    rows = run["replay_rows"] or run["batch"]
    cycle = run.get("cycle_steps") or run["replay_interval_steps"] * run["layers"]
    return 1.0 / (cycle * run["batch"] / rows)


def _arm_row(results: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """An arm over rounds: its overhead over its pair's reference (median, range), and from
    inside its runs the shares of a step (of its reference's mean step time) of scout's own
    parts and processes."""
    row: dict[str, Any] = {"overhead": attach_overhead.summary(results, arm)}
    shares: dict[str, list[float]] = {}
    cpu: list[float] = []
    for result in results:
        run = result["runs"][arm]
        reference_run = result["runs"][f"{result['references'][arm]}@{arm}"]
        reference = attach_overhead.mean_step_s(reference_run)
        # The CPU the job spends per step, against its reference's: rank 0's trainer (every
        # thread) and its observer. Load moves it far less than wall time.
        cpu.append((run["trainer_cpu_s"] + run.get("observer_cpu_s", 0.0)) / len(run["step_s"])
                   / ((reference_run["trainer_cpu_s"] + reference_run.get("observer_cpu_s", 0.0))
                      / len(reference_run["step_s"])) - 1)
        window_s = reference * len(run["step_s"])
        parts = dict(run.get("costs_s", {}))
        if "observer_cpu_s" in run:
            parts["observer_cpu_s"] = run["observer_cpu_s"]
        parts["background_cpu_s"] = run["background_cpu_s"]
        parts["trainer_cpu_s"] = run["trainer_cpu_s"] - reference_run["trainer_cpu_s"]
        for name, seconds in parts.items():
            shares.setdefault(name, []).append(seconds / window_s)
        if "replay_interval_steps" in run:
            row["replay_formula"] = _replay_formula(run)
    row["shares"] = {name: _median_range(values) for name, values in shares.items()}
    row["cpu_overhead"] = _median_range(cpu)
    return row


def _reference_step_s(results: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    return _median_range([attach_overhead.mean_step_s(r["runs"][f"{r['references'][arm]}@{arm}"]) for r in results])


def _round_detail(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: r[key] for key in ("round", "first", "overhead", "load_before", "load_after")}
            for r in results]


def run_overhead(section: dict[str, Any], quick: bool, rounds: int, log: Callable[[str], None],
                 allocator: str = attach_overhead.DEFAULT_ALLOCATOR) -> None:
    sizes = {"tiny": 8} if quick else {"small": 80, "large": 24}  # measured steps: whole cycles where it can
    cadences = (2,) if quick else CADENCES
    section.update({"cadences": list(cadences), "rounds": rounds, "sizes": {}, "design": "paired",
                    "allocator": allocator})
    for size, steps in sizes.items():
        pairs = [(attach_overhead.OFF, attach_overhead.Arm(f"k{k}", cadence=k)) for k in cadences]
        log(f"== overhead: {size} model, arms {[a.name for _, a in pairs]} each paired with off, {rounds} rounds "
            f"of {steps} steps")
        results = attach_overhead.paired(pairs, rounds=rounds, size=size, steps=steps, batch=2 if quick else 8,
                                         log=log, allocator=allocator)
        first = results[0]["runs"][f"k{cadences[0]}"]
        entry: dict[str, Any] = {
            "parameters": first["parameters"], "layers": first["layers"], "batch": first["batch"], "steps": steps,
            "off_step_s": _reference_step_s(results, f"k{cadences[0]}"),
            "arms": {f"k{k}": {"cadence": k, **_arm_row(results, f"k{k}")} for k in cadences},
            "rounds": _round_detail(results),
        }
        section["sizes"][size] = entry


def run_parts(section: dict[str, Any], quick: bool, rounds: int, log: Callable[[str], None],
              only: Sequence[str] = (), goal_rounds: int | None = None,
              allocator: str = attach_overhead.DEFAULT_ALLOCATOR, stock_rounds: int = 0) -> None:
    """The defaults against no scout in ``goal_rounds`` rounds (the goal), and each part's cost
    in ``rounds`` rounds: the defaults against the defaults with that part off; every
    comparison a pair taking turns (attach_overhead.paired), its trainers' malloc set up as
    ``allocator`` says. A run is one whole cycle at the defaults (24 steps: the once-a-cycle
    recipes are in it). ``stock_rounds`` > 0: the goal's pair again with glibc's stock malloc,
    to show what the allocator does to the comparison (not the goal)."""
    size, steps = ("tiny", 8) if quick else ("large", 24)
    # quick: one bench switch, to exercise the path; ``only``: the parts asked for (--parts)
    chosen = tuple(only) or (("ddp_hook",) if quick else PARTS)
    defaults = attach_overhead.DEFAULTS
    goal_rounds = rounds if goal_rounds is None else goal_rounds
    log(f"== parts: {size} model, the defaults against no scout in {goal_rounds} rounds, {len(chosen)} part(s) in "
        f"{rounds} rounds, of {steps} steps")
    # The warm-up covers the overhead budget's calibration window (spec/budget.md BUDGET-5).
    warmup = attach_overhead.warmup_for(attach_overhead.SIZES[size]["layers"])
    goal = attach_overhead.paired([(attach_overhead.OFF, defaults)], rounds=goal_rounds, size=size, steps=steps,
                                  batch=2 if quick else PARTS_BATCH, log=log, allocator=allocator, warmup=warmup)
    if stock_rounds:
        log(f"== parts: the defaults against no scout with glibc's stock malloc, {stock_rounds} rounds")
        stock = attach_overhead.paired([(attach_overhead.OFF, defaults)], rounds=stock_rounds, size=size,
                                       steps=steps, batch=2 if quick else PARTS_BATCH, log=log, allocator="stock",
                                       warmup=warmup)
        section["stock_allocator"] = {"rounds": stock_rounds, "off_step_s": _reference_step_s(stock, "defaults"),
                                      "defaults": _arm_row(stock, "defaults"), "round_detail": _round_detail(stock),
                                      "rounds_figures": _rounds_figures(stock)}
    results = attach_overhead.paired([(defaults, attach_overhead.Arm(f"no-{p}", off=(p,))) for p in chosen],
                                     rounds=rounds, size=size, steps=steps, batch=2 if quick else PARTS_BATCH,
                                     log=log, allocator=allocator, warmup=warmup)
    first = goal[0]["runs"]["defaults"]
    parts: dict[str, Any] = {}
    for part in chosen:
        # What the part costs: the defaults' step over the step without it, minus one, per round.
        row = _arm_row(results, f"no-{part}")
        cost = [1 / (1 + r["overhead"][f"no-{part}"]) - 1 for r in results]
        parts[part] = {"cost": _median_range(cost), "without_against_defaults": row["overhead"],
                       "cpu_against_defaults": row["cpu_overhead"]}
    section.update({
        "size": size, "parameters": first["parameters"], "layers": first["layers"],
        "batch": first["batch"], "steps": steps, "rounds": rounds, "goal_rounds": goal_rounds, "ranks": 2,
        "budget_clock": "own",  # the budget's clock leaves out the other job's turns (Baton.clock)
        "design": "paired", "allocator": allocator, "off_step_s": _reference_step_s(goal, "defaults"),
        "defaults": _arm_row(goal, "defaults"), "parts": parts,
        "round_detail": _round_detail(goal) + _round_detail(results),
        "goal_rounds_figures": _rounds_figures(goal),
    })


def _rounds_figures(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round of the defaults against no scout: the overhead and both runs' figures per step."""
    return [{"overhead": r["overhead"]["defaults"], "off": attach_overhead.round_figures(r["runs"]["off@defaults"]),
             "defaults": attach_overhead.round_figures(r["runs"]["defaults"])} for r in results]


def run_batch(section: dict[str, Any], quick: bool, rounds: int, batches: Sequence[int],
              log: Callable[[str], None], allocator: str = attach_overhead.DEFAULT_ALLOCATOR) -> None:
    """The parts section's goal pair (the defaults against no scout, one whole cycle per run) at
    each of ``batches``, in ``rounds`` rounds each."""
    size, steps = ("tiny", 8) if quick else ("large", 24)
    section.update({"size": size, "steps": steps, "rounds": rounds, "ranks": 2, "design": "paired", "batches": {},
                    "allocator": allocator})
    for batch in batches:
        log(f"== batch: {size} model at batch {batch}, the defaults against no scout in {rounds} rounds of {steps} "
            "steps")
        goal = attach_overhead.paired([(attach_overhead.OFF, attach_overhead.DEFAULTS)], rounds=rounds, size=size,
                                      steps=steps, batch=batch, log=log, allocator=allocator,
                                      warmup=attach_overhead.warmup_for(attach_overhead.SIZES[size]["layers"]))
        first = goal[0]["runs"]["defaults"]
        section.update({"parameters": first["parameters"], "layers": first["layers"]})
        section["batches"][str(batch)] = {
            "batch": batch, "off_step_s": _reference_step_s(goal, "defaults"),
            "defaults": _arm_row(goal, "defaults"), "rounds": _round_detail(goal),
            "rounds_figures": _rounds_figures(goal)}


def budget_run_plan(probe: dict[str, Any], quick: bool) -> tuple[int, str]:
    """The measured steps of the budget section's runs of one model, and how they measure it:

    * ``"cycle"``: the cycle its probe run chose, so that a run's mean step holds its replay;
    * ``"over-budget"``: where the probe's last decision was over budget (replay off after it,
      BUDGET-4), as many steps as take :data:`BUDGET_OVER_RUN_S`;
    * ``"free"``: where the probe's cycle takes longer than :data:`BUDGET_CYCLE_RUN_S_MAX`, as
      many steps as take :data:`BUDGET_OVER_RUN_S`; a round's overhead is then its pair's over the
      steps on which the run with scout replayed nothing, plus replay's share at the run's cadence
      by scout's own measurement in it (``attach_overhead.replay_share``; :func:`_free_figures`).

    Within the section's bounds."""
    from _evaluation_doc import over_budget

    low, high = (4, 40) if quick else (BUDGET_STEPS_MIN, BUDGET_STEPS_MAX)
    step_s = attach_overhead.mean_step_s(probe)
    timed = min(max(math.ceil(BUDGET_OVER_RUN_S / step_s), low), high)
    if over_budget(probe.get("cadence_decisions") or []):
        return timed, "over-budget"
    cycle = int(probe.get("cycle_steps") or 0)
    if cycle * step_s > BUDGET_CYCLE_RUN_S_MAX:
        return timed, "free"
    return min(max(cycle, low), high), "cycle"


def _free_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``"free"`` row (:func:`budget_run_plan`): per round the overhead of the pair over the steps
    on which the run with scout replayed nothing (the same steps of its reference), replay's share
    at the run's cadence by scout's own measurement, and their sum -- the row's overhead; and how
    many measured steps replayed (left out of the first figure, paid for by the second)."""
    measured, shares, totals, replayed = [], [], [], 0
    for result in results:
        run = result["runs"]["defaults"]
        reference = result["runs"][f"{result['references']['defaults']}@defaults"]
        flags = run.get("replayed") or [False] * len(run["step_s"])
        free = [i for i, flag in enumerate(flags) if not flag]
        replayed += len(flags) - len(free)
        with_scout = statistics.fmean(run["step_s"][i] for i in free)
        without = statistics.fmean(reference["step_s"][i] for i in free)
        measured.append(with_scout / without - 1)
        shares.append(float(run.get("replay_share") or 0.0))
        totals.append(measured[-1] + shares[-1])
    return {"measured_overhead": _median_range(measured), "replay_share": _median_range(shares),
            "overhead": _median_range(totals), "replayed_steps": replayed}


def run_budget(section: dict[str, Any], quick: bool, rounds: int, log: Callable[[str], None],
               allocator: str = attach_overhead.DEFAULT_ALLOCATOR, only: Sequence[str] = (),
               earlier: dict[str, Any] | None = None) -> None:
    """Per model of :data:`BUDGET_MODELS`, scout's defaults against no scout -- the cadence the
    overhead budget chose after its calibration window, which the warm-up covers -- in ``rounds``
    pairs, each run as long as the cycle a probe run chose (so that its mean step holds the
    replay), and an A/A pair (no scout against no scout) for the pairs' noise; with the cadence
    each run chose, the SDC bound (one cycle) and the checkpoint interval it gives. ``only``: the
    models by key (``--budget-models``); the others of an ``earlier`` run of the section are kept."""
    budget = Config().overhead_budget
    kept = {} if earlier is None or not only else dict(earlier.get("models", {}))
    models = QUICK_BUDGET_MODELS if quick else BUDGET_MODELS
    section.update({"design": "paired", "rounds": rounds, "allocator": allocator, "overhead_budget": budget,
                    "checkpoint_every_cycles": Config().checkpoint_every_cycles, "models": kept,
                    "planned": [model["name"] for model in models]})
    work = Path(tempfile.mkdtemp(prefix="scout-budget-"))
    try:
        for model in models:
            if only and model["key"] not in only:
                continue
            size, layers = model["size"], attach_overhead.SIZES[model["size"]]["layers"]
            warmup = attach_overhead.warmup_for(layers)
            started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            shape = {"size": size, "batch": model["batch"], "nproc": model["nproc"], "sequence": model["sequence"]}
            probe = attach_overhead.one_run(attach_overhead.DEFAULTS, steps=2, device="cpu", work=work, warmup=warmup,
                                            allocator=allocator, **shape)
            steps, design = budget_run_plan(probe, quick)
            log(f"== budget: {model['name']}, probe cycle {probe.get('cycle_steps')} steps; the defaults and an A/A "
                f"pair against no scout, {rounds} rounds of {steps} steps after {warmup} of warm-up ({design})")
            results = attach_overhead.paired([(attach_overhead.OFF, attach_overhead.DEFAULTS),
                                              (attach_overhead.OFF, ALIKE)], rounds=rounds, steps=steps, log=log,
                                             allocator=allocator, warmup=warmup, **shape)
            runs = [r["runs"]["defaults"] for r in results]
            cycles = [int(run.get("cycle_steps") or 0) for run in runs]
            section["models"][model["name"]] = {
                # When, and under which account of scout's work: a model re-run alone (``only``)
                # sits beside rows measured earlier. BUDGET-10: F holds the hooks' time. The budget's
                # clock leaves out the other job's turns (bench/attach_overhead.py Baton.clock).
                "started": started, "budget_counts_hooks": True, "budget_clock": "own",
                **shape, "parameters": runs[0]["parameters"], "layers": layers, "steps": steps, "warmup": warmup,
                "probe_cycle_steps": probe.get("cycle_steps"), "probe_decisions": probe.get("cadence_decisions"),
                "off_step_s": _reference_step_s(results, "defaults"),
                "overhead": attach_overhead.summary(results, "defaults"),
                "noise": attach_overhead.summary(results, "alike"),
                "cadence": [{"replay_interval_steps": run.get("replay_interval_steps"), "lanes": run.get("replay_lanes"),
                             "cycle_steps": run.get("cycle_steps"), "decisions": run.get("cadence_decisions")}
                            for run in runs],
                "cycle_steps": _median_range(cycles), "rounds": _round_detail(results), "design": design,
                "probe_step_s": attach_overhead.mean_step_s(probe)}
            if design == "free":
                section["models"][model["name"]].update(_free_figures(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# 3: detection latency
# --------------------------------------------------------------------------------------------


def _hang_case(work: Path, seed: int, threshold_s: float) -> dict[str, Any]:
    rng = random.Random(f"hang:{seed}")
    rank, step = rng.randrange(WORLD), rng.randrange(5, 15)
    hold_s = threshold_s + 8.0
    job = train_gpt(work, f"hang-{seed}", steps=step + 4, fault=f"hang-before-backward:{rank}:{step}:{hold_s:g}",
                    settings={"stall_threshold_s": threshold_s})
    case: dict[str, Any] = {"seed": seed, "rank": rank, "step": step, "exit_code": job["exit_code"],
                            "wall_s": job["wall_s"], "threshold_s": threshold_s}
    stalls = sorted((r for r in job["reports"] if r["source"] == "observer"), key=_report_time_s)
    if not job["faults"] or not stalls:
        case.update(detected=False, reports=[r["kind"] for r in job["reports"]], log_tail=job["log_tail"][-600:])
        return case
    first = stalls[0]
    case.update(detected=True, kind=first["kind"], named=_named(first), right=first["kind"] == "hang"
                and _named(first) == [rank], past_threshold_s=round(
                    _report_time_s(first) - job["faults"][0]["time_s"] - threshold_s, 3))
    return case


def _sdc_case(work: Path, seed: int) -> dict[str, Any]:
    rng = random.Random(f"sdc:{seed}")
    rank, step = rng.randrange(WORLD), rng.randrange(4, 12)
    cycle = LATENCY_INTERVAL_STEPS * GPT_LAYERS  # the jobs' replay_interval_steps x hidden layers
    job = train_gpt(work, f"sdc-{seed}", steps=step + cycle + 4, fault=f"sdc:{rank}:{step}")
    case: dict[str, Any] = {"seed": seed, "rank": rank, "onset_step": step, "exit_code": job["exit_code"],
                            "wall_s": job["wall_s"], "cycle_steps": cycle}
    found = sorted((r for r in job["reports"] if r["kind"] == "sdc"), key=lambda r: r["step"])
    if not found:
        case.update(detected=False, log_tail=job["log_tail"][-600:])
        return case
    case.update(detected=True, step=found[0]["step"], named=_named(found[0]), right=_named(found[0]) == [rank],
                steps_after_onset=found[0]["step"] - step)
    return case


def _straggler_real_case(work: Path, seed: int, factor: float, checks_max: int) -> dict[str, Any]:
    rng = random.Random(f"straggler:{seed}:{factor}")
    rank = rng.randrange(WORLD)
    interval = LATENCY_INTERVAL_STEPS  # the jobs' replay_interval_steps: one replay check every 2 steps
    job = train_gpt(work, f"straggler-{factor:g}-{seed}", steps=interval * checks_max, fault=f"slow:{rank}:{factor:g}")
    confirmed = [r for r in job["reports"] if r["kind"] == "straggler" and r["evidence"].get("change") == "confirmed"]
    first: dict[str, int] = {}
    for record in sorted(confirmed, key=lambda r: r["step"]):
        if _named(record) == [rank]:
            first.setdefault(record["evidence"]["straggler"], record["step"] // interval)
    others = sorted({r for record in confirmed for r in _named(record) if r != rank})
    device = first.get("device")  # StragglerKind.DEVICE: the replay's compute timing (STRAG-1)
    return {"seed": seed, "factor": factor, "rank": rank, "exit_code": job["exit_code"], "wall_s": job["wall_s"],
            "checks_max": checks_max, "first_check_by_kind": first, "checks_to_confirm": device,
            "others_confirmed": others}


def _straggler_sim(seeds: Sequence[int], rounds: int) -> list[dict[str, Any]]:
    from scout.scenarios.localization import STRAGGLER_ROUND, straggler_confirmation_round
    from scout.scenarios.registry import ScenarioParams

    rows = []
    for factor in FACTORS:
        for seed in seeds:
            params = ScenarioParams(ranks=8, seed=seed, group_size=8, rounds=rounds)
            rank, round_id = straggler_confirmation_round(params, factor)
            rows.append({"factor": factor, "seed": seed, "rank": rank, "rounds": rounds,
                         "checks_to_confirm": None if round_id is None else round_id - STRAGGLER_ROUND + 1})
    return rows


def run_latency(section: dict[str, Any], quick: bool, seeds: Sequence[int], work: Path,
                log: Callable[[str], None]) -> None:
    threshold_s = 2.0 if quick else 10.0  # quick: a short threshold to keep CI short; full: the default
    hang, sdc, real = [], [], []
    for seed in seeds:
        hang.append(_hang_case(work, seed, threshold_s))
        log(f"  hang seed {seed}: {hang[-1].get('past_threshold_s')} s past the threshold, "
            f"named {hang[-1].get('named')} (injected {hang[-1]['rank']})")
        sdc.append(_sdc_case(work, seed))
        log(f"  sdc seed {seed}: {sdc[-1].get('steps_after_onset')} steps after onset, named {sdc[-1].get('named')}")
    checks_max = 30
    for factor in (() if quick else FACTORS):  # quick: the simulator only (CI time)
        for seed in seeds:
            real.append(_straggler_real_case(work, seed, factor, checks_max))
            log(f"  straggler {factor}x seed {seed}: confirmed at check {real[-1]['checks_to_confirm']} "
                f"(kinds {real[-1]['first_check_by_kind']}), others {real[-1]['others_confirmed']}")
    sim_seeds = list(range(10)) if not quick else list(seeds)
    simulated = _straggler_sim(sim_seeds, rounds=12 if quick else 40)

    def summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
        values = [row[key] for row in rows if row.get(key) is not None]
        return {**_median_range(values), "missed": sum(1 for row in rows if row.get(key) is None)}

    section.update({
        "hang": {"threshold_s": threshold_s, "cases": hang, "summary": summary(hang, "past_threshold_s"),
                 "wrong": sum(1 for c in hang if c.get("detected") and not c.get("right"))},
        "sdc": {"cycle_steps": 2 * GPT_LAYERS, "cases": sdc, "summary": summary(sdc, "steps_after_onset"),
                "wrong": sum(1 for c in sdc if c.get("detected") and not c.get("right"))},
        "straggler": {
            "simulated": {"cases": simulated, "by_factor": {
                f"{f:g}": summary([r for r in simulated if r["factor"] == f], "checks_to_confirm") for f in FACTORS},
                "note": "the simulator (the straggler-timing job of scout simulate at a chosen factor: the "
                        "product's replay pipeline, 8 ranks, 1 % jitter, a check every step)"},
            "real": {"cases": real, "by_factor": {
                f"{f:g}": summary([r for r in real if r["factor"] == f], "checks_to_confirm")
                for f in sorted({r["factor"] for r in real})},
                "note": "examples/train_gpt.py --fault slow:RANK:FACTOR, 4 ranks on this machine, a replay check every "
                        "2 steps; the check at which the slowed rank was confirmed device-slow"},
        },
    })


# --------------------------------------------------------------------------------------------
# 4: recovery
# --------------------------------------------------------------------------------------------


def _recovery_case(work: Path, kind: str, every: int, seed: int, threshold_s: float) -> dict[str, Any]:
    rng = random.Random(f"recovery:{kind}:{every}:{seed}")
    cycle = LATENCY_INTERVAL_STEPS * GPT_LAYERS
    # A verified checkpoint exists once the one saved at the first checkpoint boundary had a
    # clean cycle after it; the fault comes some steps after that.
    first_verified = cycle * every + cycle
    rank, onset = rng.randrange(WORLD), first_verified + 2 + rng.randrange(cycle)
    settings: dict[str, Any] = {"checkpoint_every_cycles": every}
    if kind == "sdc":
        fault, settings["on_sdc"] = f"sdc:{rank}:{onset}", "restart"
    else:
        fault, settings["on_hang"] = f"hang-before-backward:{rank}:{onset}:{threshold_s + 120:g}", "restart"
        settings["stall_threshold_s"] = threshold_s
    steps = onset + 2 * cycle
    job = train_gpt(work, f"recovery-{kind}-{every}-{seed}", steps=steps, fault=fault, settings=settings,
                    checkpoint=True, max_restarts=1)
    case: dict[str, Any] = {"kind": kind, "checkpoint_every_cycles": every, "seed": seed, "rank": rank,
                            "onset_step": onset, "steps": steps, "exit_code": job["exit_code"], "wall_s": job["wall_s"]}
    reports = job["reports"]
    detections = sorted((r for r in reports if r["generation"] == 0 and (
        r["kind"] == "sdc" if kind == "sdc" else r["source"] == "observer")), key=_report_time_s)
    restored = [r for r in reports if r["kind"] == "restart" and r["generation"] >= 1
                and r["reason"] in ("restored", "started")]
    if not job["faults"] or not detections or not restored:
        case.update(recovered=False, reports=[(r["kind"], r["reason"], r["generation"]) for r in reports],
                    log_tail=job["log_tail"][-800:])
        return case
    fault_s, detected, resumed = job["faults"][0]["time_s"], detections[0], restored[0]
    # The last step trained before the fault was acted on: an SDC stops every rank at the step
    # that detected it; a hang stops at the hung step, which never completed.
    last = detected["step"] if kind == "sdc" else onset - 1
    case.update(
        recovered=True, named=_named(detected), right=_named(detected) == [rank],
        detected_step=detected["step"], restored_step=resumed["step"], choice=resumed["evidence"].get("choice"),
        restored_from_checkpoint=resumed["reason"] == "restored",
        detect_s=round(_report_time_s(detected) - fault_s, 2), resume_s=round(_report_time_s(resumed) - fault_s, 2),
        restart_s=round(_report_time_s(resumed) - _report_time_s(detected), 2),
        steps_lost=max(0, last - resumed["step"]), rollback_steps=onset - resumed["step"],
        finished=any(r["kind"] == "finished" and r["generation"] >= 1 for r in reports))
    return case


def run_recovery(section: dict[str, Any], quick: bool, seeds: Sequence[int], work: Path,
                 log: Callable[[str], None]) -> None:
    threshold_s = 2.0 if quick else 10.0
    everies = (1,) if quick else CHECKPOINT_EVERY
    kinds = ("sdc",) if quick else ("sdc", "hang")  # quick: CI time
    cases = []
    for kind in kinds:
        for every in everies:
            for seed in seeds:
                cases.append(_recovery_case(work, kind, every, seed, threshold_s))
                case = cases[-1]
                log(f"  recovery {kind} every {every} seed {seed}: resumed {case.get('resume_s')} s after the fault, "
                    f"from step {case.get('restored_step')} (onset {case['onset_step']}), "
                    f"{case.get('steps_lost')} steps lost")
    table = []
    for kind in kinds:
        for every in everies:
            mine = [c for c in cases if c["kind"] == kind and c["checkpoint_every_cycles"] == every]
            done = [c for c in mine if c.get("recovered")]
            table.append({"kind": kind, "checkpoint_every_cycles": every, "checkpoint_every_steps": 2 * GPT_LAYERS * every,
                          "cases": len(mine), "recovered": len(done),
                          "resume_s": _median_range([c["resume_s"] for c in done]),
                          "detect_s": _median_range([c["detect_s"] for c in done]),
                          "restart_s": _median_range([c["restart_s"] for c in done]),
                          "steps_lost": _median_range([c["steps_lost"] for c in done]),
                          "rollback_steps": _median_range([c["rollback_steps"] for c in done])})
    section.update({"threshold_s": threshold_s, "cycle_steps": 2 * GPT_LAYERS, "cases": cases, "table": table})


# --------------------------------------------------------------------------------------------
# 5: false alarms
# --------------------------------------------------------------------------------------------


def _bound(events: int, trials: int) -> dict[str, Any]:
    from scout.core.rates import rule_of_three, upper_bound

    if trials == 0:
        return {"events": events, "rounds": 0, "upper_95": None, "rule_of_three": None}
    return {"events": events, "rounds": trials, "upper_95": upper_bound(events, trials),
            "rule_of_three": rule_of_three(trials) if events == 0 else None}


OBSERVER_KINDS = ("hang", "desync", "group_stall", "unresponsive", "inconclusive", "data_stall", "checkpoint_stall")


def _count_real(job: dict[str, Any], steps: int, threshold_s: float) -> dict[str, dict[str, int]]:
    """Per fault kind of one healthy job: the rounds in which it could have named someone, its
    false attributions (a rank named) and its false alarms (a report naming no one). Rounds come
    from the schedule at the defaults: a replay vote every 2 steps (plus embedding, output head
    and optimizer once per cycle), two timing comparisons (compute, communication) per replay
    check plus two (loop and forward times, LOOP-7) every ``loop_check_steps`` (the default), and
    for the observers one window of the stall threshold per rank over the training time (from
    the job's start report to its finished one)."""
    interval, cycle = 2, 2 * GPT_LAYERS
    votes = steps // interval + 3 * (steps // cycle)
    times = {r["kind"]: _report_time_s(r) for r in job["reports"] if r["kind"] in ("restart", "finished")}
    training_s = times["finished"] - times["restart"] if len(times) == 2 else 0.0
    rounds = {"sdc": votes, "straggler": 2 * (steps // interval) + 2 * (steps // Config().loop_check_steps),
              "hang": int(WORLD * training_s / threshold_s)}
    counts = {kind: {"rounds": n, "false_attributions": 0, "false_alarms": 0} for kind, n in rounds.items()}
    for record in job["reports"]:
        kind = {"sdc": "sdc", "straggler": "straggler"}.get(record["kind"], "hang" if record["kind"] in OBSERVER_KINDS
                                                                   else None)
        if kind is None or (kind == "straggler" and record["evidence"].get("change") != "confirmed"):
            continue
        counts[kind]["false_attributions" if _named(record) else "false_alarms"] += 1
    return counts


def run_false_alarms(section: dict[str, Any], quick: bool, seeds: Sequence[int], work: Path,
                     log: Callable[[str], None]) -> None:
    from scout.scenarios.registry import ScenarioParams, run_scenario

    # Simulated at scale: the product's replay pipeline and observer driver on the simulator.
    # (ranks, seeds); the straggler job runs `straggler_steps` checks.
    straggler_sizes = ((64, 2),) if quick else ((256, 5),)
    observer_sizes = ((64, 2),) if quick else ((1024, 3), (4096, 1))
    straggler_steps = 6 if quick else 24
    sim: dict[str, dict[str, Any]] = {"straggler": {"rounds": 0, "false_attributions": 0, "false_alarms": 0, "runs": 0},
                                      "hang": {"rounds": 0, "false_attributions": 0, "false_alarms": 0, "runs": 0}}
    for ranks, count in straggler_sizes:
        for index in range(count):
            params = ScenarioParams(ranks=ranks, seed=1000 + index, group_size=8, rounds=straggler_steps)
            report = run_scenario("straggler-healthy", params)
            # Rows: (step, "STATUS=groups ...", SDC named, stragglers confirmed); one vote per group per step.
            named = {r for row in report.rows for r in (*row[2], *row[3])}
            entry = sim["straggler"]
            entry["runs"] += 1
            entry["rounds"] += sum(int(count) for row in report.rows for count in re.findall(r"=(\d+)", row[1]))
            entry["false_attributions"] += len(named)
            entry["false_alarms"] += sum(1 for row in report.rows if "INCONCLUSIVE" in row[1])
            log(f"  simulated healthy timing, {ranks} ranks seed {params.seed}: {entry}")
    for ranks, count in observer_sizes:
        for index in range(count):
            report = run_scenario("observer-healthy", ScenarioParams(ranks=ranks, seed=1000 + index, group_size=8))
            entry = sim["hang"]
            entry["runs"] += 1
            threshold_s = 1.0  # the observer scenarios' threshold (scout/scenarios/observer.py)
            entry["rounds"] += int(ranks * report.result.virtual_time_s / threshold_s)
            entry["false_attributions"] += sum(1 for row in report.rows if row[4])
            entry["false_alarms"] += sum(1 for row in report.rows if not row[4])
            log(f"  simulated healthy observers, {ranks} ranks seed {1000 + index}: {entry}")
    # Real 4-rank jobs: examples/train_gpt.py at the defaults with every rank's step up to
    # jitter_s slower at random (seeded), far below the stall threshold.
    jitter_s = 0.3
    steps = 40 if quick else 200
    real_seeds = seeds[:1] if quick else seeds
    real: dict[str, dict[str, int]] = {}
    jobs = []
    for seed in real_seeds:
        job = train_gpt(work, f"healthy-{seed}", steps=steps, fault=f"jitter:{jitter_s:g}:{seed}")
        counts = _count_real(job, steps, 10.0)
        jobs.append({"seed": seed, "exit_code": job["exit_code"], "wall_s": job["wall_s"], "counts": counts,
                     "reports": [(r["kind"], r["reason"], _named(r)) for r in job["reports"]
                                 if r["kind"] not in ("restart", "finished", "checkpoint")]})
        for kind, values in counts.items():
            total = real.setdefault(kind, {"rounds": 0, "false_attributions": 0, "false_alarms": 0})
            for key, value in values.items():
                total[key] += value
        log(f"  real healthy seed {seed}: {counts}")
    section.update({
        "simulated": {kind: {**values, "bound": _bound(values["false_attributions"], values["rounds"])}
                      for kind, values in sim.items()},
        "real": {kind: {**values, "bound": _bound(values["false_attributions"], values["rounds"])}
                 for kind, values in real.items()},
        "real_jobs": jobs, "jitter_s": jitter_s, "steps": steps,
        "units": {"sdc": "one replay vote (a recipe, a replica group, a check)",
                  "straggler": "one timing comparison (a kind, a replica group, a check)",
                  "hang": "one observer watching one stall threshold of healthy training"},
    })


# --------------------------------------------------------------------------------------------
# 6: the campaign over seeds
# --------------------------------------------------------------------------------------------


def run_campaign(section: dict[str, Any], quick: bool, seeds: Sequence[int], log: Callable[[str], None]) -> None:
    from scout.scenarios import campaign

    per_seed = []
    if quick:
        seeds = range(max(5, len(seeds)))  # a quick seed costs about a second: the >= 5 of the issue
    for seed in seeds:
        result = campaign.CampaignResult(quick=quick, seed=seed)
        started = time.monotonic()
        if quick:  # one case per simulated kind at 8 ranks; no real jobs (CI-sized plumbing)
            plan = campaign.CampaignPlan(True, seed, tuple(campaign.sim_cases(campaign.SIM_KINDS, ((8, 1),), seed)),
                                         tuple(campaign.sim_cases(campaign.SIM_HEALTHY, ((8, 1),), seed)))
            campaign.run_sim_part(plan, result)
        else:  # the full campaign, as scout campaign runs it: simulated, real processes, device semantics
            campaign.run_campaign(result, campaign.PARTS, log)
        result.wall_s = time.monotonic() - started
        document = result.to_json()
        per_seed.append({"seed": seed, "wall_s": round(result.wall_s, 1), "totals": document["totals"],
                         "table": document["table"], "failures": document["failures"], "ok": document["ok"]})
        log(f"  campaign seed {seed}: {document['totals']}")
    totals: dict[str, int] = {}
    for entry in per_seed:
        for key, value in entry["totals"].items():
            if isinstance(value, int):
                totals[key] = totals.get(key, 0) + value
    section.update({"seeds": list(seeds), "per_seed": per_seed, "totals": totals,
                    "real_part": not quick})


# --------------------------------------------------------------------------------------------
# Goals, the document, the command line
# --------------------------------------------------------------------------------------------


def goals(document: dict[str, Any]) -> list[Goal]:
    """The goals the sections present in ``document`` check (bench/run.py's table)."""
    sections = document["sections"]
    found: list[Goal] = []
    parts = sections.get("parts")
    if parts:
        overhead = parts["defaults"]["overhead"]
        found.append(at_most(f"attach overhead at defaults ({parts['parameters'] / 1e6:.1f}M GPT, 2 ranks)",
                             100 * overhead["median"], 100 * OVERHEAD_GOAL, "%",
                             f"median of {overhead['n']} paired rounds, range {100 * overhead['min']:.2f} to "
                             f"{100 * overhead['max']:.2f} %"))
        replay = parts["defaults"]["shares"].get("replay_cpu_s")
        formula = parts["defaults"].get("replay_formula")
        if replay and formula:
            ratio = replay["median"] / formula
            found.append(at_most("replay share within 1.5x of its formula", max(ratio, 1 / ratio),
                                 REPLAY_FORMULA_FACTOR, "x", f"replay's CPU time {100 * replay['median']:.3f} % of a "
                                 f"step, formula {100 * formula:.3f} %"))
    batch_section = sections.get("batch")
    if batch_section:
        for entry in batch_section["batches"].values():
            overhead = entry["defaults"]["overhead"]
            found.append(at_most(f"attach overhead at defaults, batch {entry['batch']} "
                                 f"({batch_section['parameters'] / 1e6:.1f}M GPT, 2 ranks)", 100 * overhead["median"],
                                 100 * OVERHEAD_GOAL, "%", f"median of {overhead['n']} paired rounds, range "
                                 f"{100 * overhead['min']:.2f} to {100 * overhead['max']:.2f} %"))
    latency = sections.get("latency")
    if latency:
        hang = latency["hang"]
        worst = hang["summary"]["max"]
        found.append(at_most("hang reported past the threshold (worst seed)", float("inf") if worst is None
                             or hang["summary"]["missed"] or hang["wrong"] else worst,
                             HANG_PAST_THRESHOLD_GOAL_S, "s", f"{hang['summary']['n']} seeds, {hang['wrong']} wrong"))
        sdc = latency["sdc"]
        worst = sdc["summary"]["max"]
        found.append(at_most("SDC detected after onset (worst seed)", float("inf") if worst is None
                             or sdc["summary"]["missed"] or sdc["wrong"] else worst, sdc["cycle_steps"], "steps",
                             "goal: within one cycle"))
        for factor, limit in STRAGGLER_CHECKS_GOAL.items():
            row = latency["straggler"]["simulated"]["by_factor"].get(f"{factor:g}")
            if row and row["n"]:
                found.append(at_most(f"straggler {factor:g}x confirmed (simulated, median checks)", row["median"]
                                     if not row["missed"] else float("inf"), limit, "checks", f"{row['n']} seeds"))
    alarms = sections.get("false_alarms")
    if alarms:
        events = sum(v["false_attributions"] for part in ("simulated", "real") for v in alarms[part].values())
        found.append(at_most("false attributions in healthy runs", events, 0, "",
                             "simulated at scale and real 4-rank jobs, every kind"))
    budget_section = sections.get("budget")
    if budget_section:
        budget = budget_section["overhead_budget"]
        for name, entry in budget_section["models"].items():
            overhead, noise = entry["overhead"], entry["noise"]
            allowed = budget + max(abs(noise["min"]), abs(noise["max"]))
            found.append(at_most(f"overhead within the budget at the defaults ({name}, {entry['nproc']} ranks)",
                                 100 * overhead["median"], 100 * allowed, "%",
                                 f"median of {overhead['n']} paired rounds, range {100 * overhead['min']:+.2f} to "
                                 f"{100 * overhead['max']:+.2f} %; the budget {100 * budget:g} % plus the pairs' noise "
                                 f"(no scout against no scout: {100 * noise['min']:+.2f} to {100 * noise['max']:+.2f} %)"))
    campaign_section = sections.get("campaign")
    if campaign_section:
        totals = campaign_section["totals"]
        found.append(at_most("campaign: faults not localized, all seeds",
                             totals.get("injected", 0) - totals.get("localized", 0), 0, "",
                             f"{len(campaign_section['seeds'])} seeds"))
        found.append(at_most("campaign: false attributions, all seeds", totals.get("false_attributions", 0), 0, ""))
    return found


def _write(document: dict[str, Any], output: Path) -> None:
    document["goals"] = [goal.to_json() for goal in goals(document)]
    document["all_goals_met"] = all(goal["met"] for goal in document["goals"])
    document["load_average_1_5_15_min"] = load_average()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every path at toy sizes (CI); figures not the goal's")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per latency/recovery/campaign (default 5; quick 1)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved A/B rounds (default 5; quick 1)")
    parser.add_argument("--goal-rounds", type=int, default=None,
                        help="rounds of the defaults against no scout, the overhead goal's (default 10; quick 1)")
    parser.add_argument("--parts", default="", help=f"the parts section's parts off, comma-separated, of "
                        f"{', '.join(PARTS)} (default: all; quick: ddp_hook)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="the batch section's batches, comma-separated (default %(default)s; quick: 4)")
    parser.add_argument("--allocator", choices=sorted(attach_overhead.ALLOCATORS),
                        default=attach_overhead.DEFAULT_ALLOCATOR,
                        help="the trainers' glibc malloc setup in the overhead, parts and batch sections, both arms "
                             "alike (default: heap; bench/attach_overhead.py ALLOCATORS)")
    parser.add_argument("--stock-rounds", type=int, default=None,
                        help="rounds of the goal's pair with glibc's stock malloc, beside the goal (default 3; "
                             "quick 0)")
    parser.add_argument("--budget-models", default="", help="the budget section's models, comma-separated, of "
                        f"{', '.join(m['key'] for m in BUDGET_MODELS)} (default: all; the others of an earlier run are "
                        "kept)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="the JSON (default bench/results/evaluation.json)")
    parser.add_argument("--doc", type=Path, default=None, help="the document (default docs/evaluation.md; "
                        "not written by --quick unless given)")
    parser.add_argument("--plots", type=Path, default=None, help="the plots' directory (default docs/evaluation/)")
    parser.add_argument("--render", action="store_true", help="only render the document from the JSON")
    args = parser.parse_args(argv)
    import _evaluation_doc

    doc = args.doc if args.doc is not None else (None if args.quick else DOC)
    plots = args.plots if args.plots is not None else (doc.parent / "evaluation" if doc is not None else PLOTS)
    if args.render:
        document = json.loads(args.output.read_text(encoding="utf-8"))
        _evaluation_doc.write(document, doc or DOC, plots)
        return 0
    chosen = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; the sections are {', '.join(SECTIONS)}")
    only = [part.strip() for part in args.parts.split(",") if part.strip()]
    budget_models = [key.strip() for key in args.budget_models.split(",") if key.strip()]
    if sorted(set(budget_models) - {m["key"] for m in BUDGET_MODELS}):
        parser.error(f"unknown budget model(s) {sorted(set(budget_models) - {m['key'] for m in BUDGET_MODELS})}; the "
                     f"models are {', '.join(m['key'] for m in BUDGET_MODELS)}")
    if sorted(set(only) - set(PARTS)):
        parser.error(f"unknown part(s) {sorted(set(only) - set(PARTS))}; the parts are {', '.join(PARTS)}")
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        parser.error(f"--batches must be positive integers, comma-separated, got {args.batches!r}")
    if args.quick:
        batches = [4]
    seeds = list(range(args.seeds if args.seeds is not None else (1 if args.quick else 5)))
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    goal_rounds = args.goal_rounds if args.goal_rounds is not None else (1 if args.quick else 10)
    stock_rounds = args.stock_rounds if args.stock_rounds is not None else (0 if args.quick else 3)
    if stock_rounds < 0:
        parser.error(f"--stock-rounds must be >= 0, got {stock_rounds}")
    if not seeds or rounds < 1 or goal_rounds < 1:
        parser.error(f"--seeds, --rounds and --goal-rounds must be >= 1, got {args.seeds}, {args.rounds} and "
                     f"{args.goal_rounds}")
    document: dict[str, Any] = {}
    if args.output.exists():
        with contextlib.suppress(ValueError):
            document = json.loads(args.output.read_text(encoding="utf-8"))
    if document.get("schema") != SCHEMA or document.get("quick") != args.quick:
        document = {"schema": SCHEMA, "quick": args.quick, "sections": {}}
    document["host"] = host()
    work = Path(tempfile.mkdtemp(prefix="scout-evaluate-"))

    def log(line: str) -> None:
        print(line, flush=True)

    started = time.monotonic()
    try:
        for name in SECTIONS:
            if name not in chosen:
                continue
            section: dict[str, Any] = {"quick": args.quick}
            log(f"== {name} (load {load_average()})")
            with measured(section):
                if name == "overhead":
                    run_overhead(section, args.quick, rounds, log, args.allocator)
                elif name == "parts":
                    run_parts(section, args.quick, rounds, log, only, goal_rounds, args.allocator, stock_rounds)
                elif name == "batch":
                    run_batch(section, args.quick, goal_rounds, batches, log, args.allocator)
                elif name == "latency":
                    run_latency(section, args.quick, seeds, work, log)
                elif name == "recovery":
                    run_recovery(section, args.quick, seeds, work, log)
                elif name == "false_alarms":
                    run_false_alarms(section, args.quick, seeds, work, log)
                elif name == "budget":
                    run_budget(section, args.quick, rounds, log, args.allocator, budget_models,
                               document["sections"].get("budget"))
                else:
                    run_campaign(section, args.quick, seeds, log)
            section["host"] = document["host"]
            document["sections"][name] = section
            document["duration_s"] = round(sum(s.get("duration_s", 0.0) for s in document["sections"].values()), 1)
            _write(document, args.output)  # after every section: a long run keeps what it measured
            log(f"   {name}: {section['duration_s']} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"evaluation: {time.monotonic() - started:.0f} s; {args.output}")
    if doc is not None:  # from the JSON as written: the document is render(JSON), nothing else
        _evaluation_doc.write(json.loads(args.output.read_text(encoding="utf-8")), doc, plots)
        log(f"wrote {doc} and the plots in {plots}")
    for goal in document["goals"]:
        log(f"goal {goal['name']}: {goal['measured']:.4g} {goal['unit']} ({goal['comparison']} {goal['target']:g}) "
            f"{'met' if goal['met'] else 'NOT MET'}")
    return 0 if document["all_goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
