"""``./dev bench``: run every benchmark, then print one table of every goal -- the goal, the
measured figure, the ratio to the target, met or not -- and exit non-zero if a goal was missed
or a benchmark failed.

Each benchmark is a script in bench/ that writes bench/results/<name>.json with a ``goals``
list (bench/_goals.py). This runner starts each one as a subprocess with a time bound, reads
its JSON back and prints the table; a benchmark that crashes, times out or writes no JSON is a
row of its own, marked failed. A benchmark with nothing to measure on this host (the GPU one
without CUDA) is listed as skipped, with its reason, and does not fail the run.

Usage: ./dev bench [NAME ...] [--quick]
  NAME     run only these benchmarks (file names without .py, e.g. signature sim)
  --quick  smaller sizes (CI-sized smoke run; the figures are then not the goal's)
  --table  only print the table from the JSON files already in bench/results/
  --list   the benchmarks it runs, and the scripts of bench/ run by hand
  --check  import every script of bench/ and run its --help, in this process (CI runs this:
           tests/unit/test_bench_imports.py): a benchmark that cannot even start is caught here,
           not when someone next runs it
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"

# name -> (arguments of the full run, arguments of --quick, time bound in seconds)
BENCHMARKS: dict[str, tuple[list[str], list[str], float]] = {
    "verdict": ([], [], 600),
    "invariants": ([], ["--rounds", "3", "--budget-s", "0.1"], 300),
    "signature": ([], ["--size-mib", "32", "--repeats", "3"], 900),
    "signature_gpu": ([], [], 600),
    "sim": ([], ["--ranks", "1024", "--observer-ranks", "1024"], 3600),
    "exchange": ([], ["--max-ranks", "8", "--iterations", "20"], 1800),
    "transport": ([], [], 900),
    "observer": ([], [], 900),
    "gate_model_check": ([], [], 1800),
    "observer_process": ([], [], 300),
    "completion_watcher": ([], [], 600),
    "fixed_cost": ([], ["--rounds", "1", "--steps", "10", "--sections", "fixed"], 2400),
    # The overhead at the defaults (bench/attach_overhead.py's goal) is measured by evaluate's
    # A/B table of parts, with everything else the evaluation measures (docs/evaluation.md).
    "evaluate": ([], ["--quick"], 8 * 3600),
}
#: The other scripts of bench/, which ``./dev bench`` does not run, and why: studies run by hand,
#: with inputs of their own or for an hour, and the pair driver the evaluation runs. ``--check``
#: (CI) imports each and runs its ``--help`` all the same.
BY_HAND: dict[str, str] = {
    "attach_overhead": "the overhead at the defaults in step-by-step pairs; bench/evaluate.py measures with it",
    "ddp_average": "where the DDP bucket hook averages a CPU bucket (INSTR-15): gloo's AVG or its own division",
    "loop_wall": "loop-straggler settings replayed over recorded jobs' loop checks (needs --healthy logs)",
    "replay_clock": "which clock times replay on a CPU (STRAG-1): a study of real 4-rank jobs",
    "self_check": "what the live path's self-check costs per captured call (SELF-8)",
    "stragglers": "the straggler power table (STRAG-*, LOOP-*): about an hour",
}
#: Benchmarks whose JSON is not bench/results/<name>.json: (the full run's, the quick run's).
RESULT_FILES: dict[str, tuple[str, str]] = {"evaluate": ("evaluation.json", "evaluation-quick.json")}


def result_file(name: str, quick: bool = False) -> str:
    full, fast = RESULT_FILES.get(name, (f"{name}.json", f"{name}.json"))
    return fast if quick else full


def _row(benchmark: str, goal: dict, load: list) -> list[str]:
    ratio = goal.get("ratio")
    return [
        benchmark,
        goal["name"],
        f"{goal['measured']:.4g} {goal['unit']}",
        f"{goal['comparison']} {goal['target']:g}",
        "-" if ratio is None else f"{ratio:.2f}",
        "met" if goal["met"] else "NOT MET",
        "/".join(str(x) for x in load[:1]),
    ]


def table(names: list[str], failures: dict[str, str], results: Path = RESULTS, quick: bool = False) -> int:
    rows: list[list[str]] = []
    missed = 0
    for name in names:
        if name in failures:
            rows.append([name, "(benchmark)", "-", "-", "-", f"FAILED: {failures[name]}", "-"])
            missed += 1
            continue
        path = results / result_file(name, quick)
        if not path.exists():
            rows.append([name, "(benchmark)", "-", "-", "-", "no results (not run)", "-"])
            continue
        document = json.loads(path.read_text())
        load = document.get("load_average_1_5_15_min", [])
        if document.get("skipped"):
            rows.append([name, "(benchmark)", "-", "-", "-", f"skipped: {document['skipped']}", "-"])
            continue
        goals = document.get("goals")
        if not isinstance(goals, list) or not goals:
            rows.append([name, "(benchmark)", "-", "-", "-", "FAILED: no goals in its JSON", "-"])
            missed += 1
            continue
        for goal in goals:
            rows.append(_row(name, goal, load))
            missed += 0 if goal["met"] else 1
    header = ["benchmark", "goal", "measured", "target", "ratio", "verdict", "load"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print(line)
    counted = sum(1 for r in rows if r[1] != "(benchmark)" or "FAILED" in r[5])
    print(f"{missed} goal(s) missed or failed out of {counted}")
    return 1 if missed else 0


def scripts() -> list[str]:
    """Every script of bench/ (file names without .py) but the runner and the private modules."""
    return sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_") and p.stem != "run")


def listing() -> str:
    """What ``--list`` prints: the benchmarks ``./dev bench`` runs, then the scripts run by hand."""
    lines = ["benchmarks ./dev bench runs (time bound; --quick arguments):"]
    for name, (_, quick, bound_s) in BENCHMARKS.items():
        lines.append(f"  {name:<20} {bound_s / 60:>5.0f} min  {' '.join(quick) or '-'}")
    lines.append("scripts run by hand (./dev py bench/NAME.py --help):")
    lines += [f"  {name:<20} {why}" for name, why in BY_HAND.items()]
    return "\n".join(lines)


def check_help(name: str) -> str | None:
    """Run bench/<name>.py with ``--help`` in this process, as ``python bench/<name>.py --help``
    would: None if it printed its usage and exited 0, else what went wrong. A script that does
    not parse its arguments would run instead of answering: one that writes a result file is
    caught by the results directory changing."""
    path = BENCH / f"{name}.py"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in RESULTS.glob("*")) if RESULTS.exists() else []
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path), "--help"]
    sys.path.insert(0, str(BENCH))
    output = io.StringIO()
    problem: str | None = None
    try:
        with contextlib.redirect_stdout(output):
            runpy.run_path(str(path), run_name="__main__")
        problem = "ran to its end instead of printing its usage"
    except SystemExit as done:
        if done.code not in (0, None):
            problem = f"exited {done.code!r}"
    except BaseException as error:  # an ImportError, a NameError: what the check is for
        problem = f"{type(error).__name__}: {error}"
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    after = sorted((p.name, p.stat().st_mtime_ns) for p in RESULTS.glob("*")) if RESULTS.exists() else []
    if problem is None and "usage:" not in output.getvalue():
        problem = "printed no usage"
    if problem is None and after != before:
        problem = "wrote to bench/results/ when asked for --help"
    return problem


def check(names: list[str]) -> int:
    """``--check``: every script's --help; the list of each that failed, and exit 1 if one did."""
    failed = 0
    for name in names:
        problem = check_help(name)
        print(f"{name}: {'ok' if problem is None else 'FAILED: ' + problem}", flush=True)
        failed += problem is not None
    unlisted = sorted(set(scripts()) - set(BENCHMARKS) - set(BY_HAND))
    if unlisted:
        print(f"bench/ script(s) {unlisted} are neither run by ./dev bench (BENCHMARKS) nor listed as run by hand "
              "(BY_HAND) in bench/run.py", flush=True)
    gone = sorted((set(BENCHMARKS) | set(BY_HAND)) - set(scripts()))
    if gone:
        print(f"bench/run.py lists {gone}, which have no script in bench/", flush=True)
    return 1 if failed or unlisted or gone else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default all: {', '.join(BENCHMARKS)})")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--table", action="store_true", help="only print the table")
    parser.add_argument("--list", action="store_true", help="the benchmarks it runs, and the scripts run by hand")
    parser.add_argument("--check", action="store_true", help="import every bench/ script and run its --help (CI)")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.list:
        print(listing())
        return 0
    if arguments.check:
        return check(arguments.names or scripts())
    unknown = [n for n in arguments.names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    names = arguments.names or list(BENCHMARKS)
    failures: dict[str, str] = {}
    if not arguments.table:
        RESULTS.mkdir(parents=True, exist_ok=True)
        for name in names:
            full, quick, bound_s = BENCHMARKS[name]
            extra = quick if arguments.quick else full
            path = RESULTS / result_file(name, arguments.quick)
            if name in RESULT_FILES:
                extra = [*extra, "--output", str(path)]
            path.unlink(missing_ok=True)
            print(f"== bench/{name}.py {' '.join(extra)}  (load {os.getloadavg()[0]:.2f})", flush=True)
            started = time.monotonic()
            try:
                completed = subprocess.run(
                    [sys.executable, str(BENCH / f"{name}.py"), *extra],
                    timeout=bound_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                failures[name] = f"ran past {bound_s:.0f} s"
                continue
            print(f"   ({time.monotonic() - started:.0f} s, exit {completed.returncode})", flush=True)
            if not path.exists():
                failures[name] = f"exit {completed.returncode}, wrote no bench/results/{path.name}"
            elif completed.returncode not in (0, 1, 3):
                # 1 and 3: a benchmark that measured but missed a goal; the table shows which.
                failures[name] = f"exit {completed.returncode}"
    return table(names, failures, arguments.results, arguments.quick)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
