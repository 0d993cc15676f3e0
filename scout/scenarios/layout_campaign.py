"""The layouts part of the fault campaign (``scout campaign --part layouts``; :mod:`.campaign`):
pipeline, tensor and data parallel jobs (spec/replay.md LAYOUT-*, TP-*; docs/layouts.md).

Each case is one ``torchrun`` job of ``examples/train_3d.py`` (a source checkout's: the example is
the user's script, written against the public API with ``scout.attach(..., layout=mesh)``) on
gloo, with one fault on a rank and at a step drawn from the case's seed:

=======================  ==================  =====================================================
kind                     layout              localized when
=======================  ==================  =====================================================
pp: sdc in stage 0       pp 2 x dp 3, 1F1B   ``sdc`` reports name exactly the rank, the first at the
                                             fault's step (a check of the faulty block)
pp: hang in stage 1      pp 2 x dp 3, GPipe  a ``hang`` report names the rank within the threshold
                                             + 1 s; any other rank named is misattributed
tp: sdc in a shard       tp 2 x dp 3         as for pp
tp: hang                 tp 2 x dp 3         as for pp
tp: slow rank 1.5x       tp 2 x dp 3         a ``straggler`` report names the rank (replay timing);
                                             any other rank named is misattributed
pp x tp: hang            pp 2 x tp 2 x dp 2  detect only (two replicas): ``inconclusive`` reports
(full matrix only)                           with reason ``detect-only`` from the rank's group, and
                                             nobody named
healthy                  pp 2 x dp 3 GPipe,  nothing reported
                         tp 2 x dp 3
=======================  ==================  =====================================================

The counts are what the jobs did: a neighbour that waits for a hung rank in an unpublished
point-to-point transfer or DTensor collective can be named with it (LAYOUT-3's known limit), and
then the case is *misattributed*. Every job is bounded (killed whole, its session, at
``JOB_TIMEOUT_S``).
"""

from __future__ import annotations

import datetime
import json
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.reports.kinds import ObserverReason, ReportKind
from scout.scenarios.campaign import CaseResult, Outcome, classify
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

__all__ = ["LAYOUT_KINDS", "LayoutCase", "classify_case", "example_path", "layout_cases", "run_layout_part"]

STALL_THRESHOLD_S: Final = 3.0
HOLD_S: Final = 8.0  # a hung rank sleeps this long: past the threshold and the observers' rounds
JOB_TIMEOUT_S: Final = 360.0
FAULT_KINDS: Final = frozenset({ReportKind.HANG, ReportKind.DATA_STALL, ReportKind.CHECKPOINT_STALL, ReportKind.DESYNC,
                                ReportKind.GROUP_STALL, ReportKind.UNRESPONSIVE, ReportKind.INCONCLUSIVE,
                                ReportKind.OBSERVER_FAILURE, ReportKind.SDC, ReportKind.STRAGGLER})


@attrs.frozen
class Kind:
    """One fault kind: its layout (example flags and world), where the fault goes and when."""

    name: str
    flags: tuple[str, ...]
    world: int
    candidates: tuple[int, ...]  # the ranks the fault may strike
    steps: tuple[int, ...]  # the steps it may strike at
    fault: str  # the example's fault, with {rank} and {step}
    tail_steps: int  # steps run after the fault's step
    expect: str  # "sdc", "hang", "straggler", "detect-only", "healthy"

    @property
    def replicas(self) -> int:
        """Ranks per replica group: the world over pipeline stages x tensor shards."""
        sizes = dict(zip(self.flags[::2], self.flags[1::2], strict=True))
        return self.world // (int(sizes.get("--pp", 1)) * int(sizes.get("--tp", 1)))


# Stage 0 of pp 2 x dp 3 holds ranks 0..2 and its second block is hidden.1, checked at steps 4, 8,
# 12, ... (a hidden layer every 2 steps, 2 per stage); under tp 2 x dp 3 hidden.1 is checked at
# steps 4, 12, 20 (4 layers).
LAYOUT_KINDS: Final = (
    Kind("pp: sdc in stage 0", ("--pp", "2", "--schedule", "1f1b"), 6, (0, 1, 2), (8, 12), "sdc:{rank}:{step}", 2,
         "sdc"),
    Kind("pp: hang in stage 1", ("--pp", "2"), 6, (3, 4, 5), (8, 10), "hang-before-forward:{rank}:{step}:" + str(HOLD_S),
         3, "hang"),
    Kind("tp: sdc in a shard", ("--tp", "2"), 6, tuple(range(6)), (4, 12), "sdc:{rank}:{step}", 2, "sdc"),
    Kind("tp: hang", ("--tp", "2"), 6, tuple(range(6)), (8, 10), "hang-before-forward:{rank}:{step}:" + str(HOLD_S),
         3, "hang"),
    Kind("tp: slow rank 1.5x", ("--tp", "2"), 6, tuple(range(6)), (1,), "slow:{rank}:1.5", 23, "straggler"),
)
FULL_ONLY_KINDS: Final = (
    Kind("pp x tp: hang (detect only)", ("--pp", "2", "--tp", "2"), 8, tuple(range(8)), (8,),
         "hang-before-forward:{rank}:{step}:" + str(HOLD_S + 3), 3, "detect-only"),
)
HEALTHY_KINDS: Final = (
    Kind("healthy pp", ("--pp", "2"), 6, (0,), (24,), "", 0, "healthy"),
    Kind("healthy tp", ("--tp", "2"), 6, (0,), (24,), "", 0, "healthy"),
)
_ALL: Final = {kind.name: kind for kind in (*LAYOUT_KINDS, *FULL_ONLY_KINDS, *HEALTHY_KINDS)}


@attrs.frozen
class LayoutCase:
    kind: str
    rank: int
    step: int
    seed: int

    @property
    def spec(self) -> Kind:
        return _ALL[self.kind]

    @property
    def healthy(self) -> bool:
        return self.spec.expect == "healthy"

    @property
    def fault(self) -> str:
        return self.spec.fault.format(rank=self.rank, step=self.step)

    @property
    def steps(self) -> int:
        return self.step + self.spec.tail_steps

    @property
    def reproduce(self) -> str:
        spec = self.spec
        return (f"reproduce with: torchrun --nproc-per-node {spec.world} --standalone examples/train_3d.py "
                f"{' '.join(spec.flags)} --steps {self.steps} --fault {self.fault or chr(39) * 2} "
                f"(SCOUT_STALL_THRESHOLD_S={STALL_THRESHOLD_S:g})")


def layout_cases(*, quick: bool, seed: int) -> list[LayoutCase]:
    """Quick: each kind once, on a rank and at a step drawn from the seed, and each healthy run
    once. Full: each kind twice (the detect-only layout too), the healthy runs twice."""
    rng = random.Random(f"layouts:{seed}")
    kinds = LAYOUT_KINDS if quick else (*LAYOUT_KINDS, *FULL_ONLY_KINDS)
    cases = [LayoutCase(kind.name, rng.choice(kind.candidates), rng.choice(kind.steps), rng.getrandbits(32))
             for kind in kinds for _ in range(1 if quick else 2)]
    cases += [LayoutCase(kind.name, 0, kind.steps[0], rng.getrandbits(32))
              for kind in HEALTHY_KINDS for _ in range(1 if quick else 2)]
    return cases


def example_path() -> Path | None:
    """examples/train_3d.py of the source checkout this package runs from; None from a wheel."""
    path = Path(__file__).resolve().parents[2] / "examples" / "train_3d.py"
    return path if path.is_file() else None


def _struck_at(output: str) -> float | None:
    found = re.findall(r"EXAMPLE-FAULT \S+ rank \d+ step \d+ at ([0-9.]+)", output)
    return float(found[0]) if found else None


def _time(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(str(record["time"]).replace("Z", "+00:00")).timestamp()


def classify_case(case: LayoutCase, records: Sequence[dict[str, Any]], output: str, *,
                  exit_code: int | None) -> tuple[Outcome, tuple[int, ...], str]:
    """The case's outcome from the job's reports (pure): what was named, and why it is (not)
    localized."""
    faults = [r for r in records if r.get("kind") in FAULT_KINDS]
    named = tuple(sorted({rank for r in faults for rank in r.get("ranks", [])}))
    expect = case.spec.expect
    problems = [] if exit_code == 0 else [f"the job ended with {exit_code} (None: killed at its deadline)"]
    if expect == "sdc":
        sdc = [r for r in faults if r["kind"] == ReportKind.SDC]
        if not sdc or {tuple(r["ranks"]) for r in sdc} != {(case.rank,)}:
            problems.append(f"sdc reports name {sorted({tuple(r['ranks']) for r in sdc})}, not [{case.rank}]")
        elif min(r["step"] for r in sdc) != case.step:
            problems.append(f"the first sdc report is at step {min(r['step'] for r in sdc)}, not {case.step}")
    elif expect == "hang":
        struck = _struck_at(output)
        hangs = [r for r in faults if r["kind"] == ReportKind.HANG and r["ranks"] == [case.rank]]
        if not hangs or struck is None:
            problems.append(f"no hang report names rank {case.rank}")
        elif not _time(hangs[0]) - struck <= STALL_THRESHOLD_S + 1.0:
            problems.append(f"named {_time(hangs[0]) - struck:.1f} s after the fault (threshold {STALL_THRESHOLD_S} s)")
    elif expect == "straggler":
        if not any(r["kind"] == ReportKind.STRAGGLER and r["ranks"] == [case.rank] for r in faults):
            problems.append(f"no straggler report names rank {case.rank}")
    elif expect == "detect-only":
        if not faults or any(r["kind"] != ReportKind.INCONCLUSIVE or r.get("reason") != ObserverReason.DETECT_ONLY
                             for r in faults) or \
                not any(case.rank in r["evidence"].get("group_ranks", ()) for r in faults):
            problems.append(f"expected only inconclusive detect-only reports from rank {case.rank}'s group, got "
                            f"{[(r['kind'], r.get('reason'), r['ranks']) for r in faults]}")
    elif faults:
        problems.append(f"{len(faults)} fault report(s) in a healthy run")
    injected = () if case.healthy else (case.rank,)
    extra = sorted(set(named) - set(injected))
    if extra and not case.healthy:
        why = " (LAYOUT-3: a neighbour waiting for it in an unpublished transfer)" if expect == "hang" else ""
        problems.append(f"also named rank(s) {extra}{why}")
    ok = not problems
    outcome = classify(injected, named, ok, bool(faults), case.healthy)
    return outcome, named, "; ".join(problems) if problems else "every check holds"


def _run_job(case: LayoutCase, example: Path, directory: Path) -> tuple[int | None, str, list[dict[str, Any]]]:
    run_dir = directory / "run"
    command = torchrun_command(example, case.spec.world, [*case.spec.flags, "--steps", case.steps, "--run-dir", run_dir,
                                                          "--fault", case.fault])
    env = torchrun_env({"stall_threshold_s": STALL_THRESHOLD_S, "recheck_interval_s": 2})
    job = launch(command, env, cwd=directory, timeout_s=JOB_TIMEOUT_S, merge_stderr=True)  # killed whole at the timeout
    code, output = job.returncode, job.stdout
    path = run_dir / "reports.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] \
        if path.exists() else []
    return code, output, records


def run_layout_case(case: LayoutCase, example: Path) -> CaseResult:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scout-layouts-") as scratch:
        code, output, records = _run_job(case, example, Path(scratch))
    outcome, named, detail = classify_case(case, records, output, exit_code=code)
    if code != 0:
        detail += f"; output: {output[-600:]}"
    return CaseResult("layouts", case.kind, case.spec.world, case.seed, outcome,
                      () if case.healthy else (case.rank,), named, detail, case.reproduce,
                      time.perf_counter() - started, case.spec.replicas, case.healthy)


def run_layout_part(cases: Sequence[LayoutCase], log: Callable[[str], None] | None = None) -> list[CaseResult]:
    """Every case, one job after the other (a multi-rank job at a time)."""
    example = example_path()
    if example is None:
        raise FileNotFoundError("the layouts part runs examples/train_3d.py from a source checkout of scout")
    say = log or (lambda line: None)
    started = time.perf_counter()
    results = []
    for case in cases:
        results.append(run_layout_case(case, example))
        say(f"  layouts: {case.kind} on rank {case.rank} at step {case.step}: {results[-1].outcome.value}")
    say(f"  layouts part: {len(cases)} torchrun jobs, {time.perf_counter() - started:.0f} s")
    return results
