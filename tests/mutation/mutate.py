"""Bounded mutation runs with mutmut (``./dev mutate [TARGET ...]``; targets: targets.toml).

For each target this makes a working copy of the tree under ``.mutation/<target>/`` (scout/,
tests/, spec/, examples/, pyproject.toml with a ``[tool.mutmut]`` table for that target appended), runs
``mutmut run`` there, and writes ``.mutation/<target>/summary.json``: every mutant with its
status (killed, survived, timeout, no tests, ...) and the score. The working copy keeps mutmut's
cache, so a rerun only tests mutants whose function changed. The repository itself is never
mutated, and nothing here runs in CI: a full pass takes hours on 2 cores.

Options: ``--max-children N`` (default 2), ``--only GLOB`` (repeatable; mutant names, e.g.
``'scout.core.verdict.x_classify_exact__*'``), ``--fresh`` (drop the target's cache first),
``--list`` (print the targets), ``--timeout-s`` (wall-clock bound per target).

Records and the README (no mutmut run): ``--record TARGET...`` copies each target's
``summary.json`` into ``tests/mutation/runs/TARGET.json`` (committed: the run record, with the
command of each invocation that contributed); ``--summary`` renders the table of every target
-- mutants, killed, equivalent and not killable in-process (the survivors named in
``tests/mutation/explained.toml``; the reasons are in ``survivors.md``), not reached, unexplained
-- into the README's "How it is checked" section; ``--summary --check`` only says whether the
README is current and every survivor is explained (``tests/unit/test_mutation_summary.py``).

The score reported is killed / (killed + survived + timeout-as-survived excluded): a timeout
counts as killed (the mutant made the covering tests run past their limit, which a test run
would flag), "no tests" counts as survived, matching mutmut's own summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
TARGETS_FILE = Path(__file__).with_name("targets.toml")
RUNS = Path(__file__).with_name("runs")
EXPLAINED_FILE = Path(__file__).with_name("explained.toml")
README = REPO / "README.md"
SUMMARY_BLOCK = "mutation"
WORK = REPO / ".mutation"
# examples/: the self-check's and the ops tests run the example scripts.
COPIED = ("scout", "tests", "spec", "examples", "pyproject.toml", "README.md")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.so")

# mutmut's exit-code statuses, grouped as its own summary groups them.
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
SURVIVED = {"survived", "no tests"}
NOT_REACHED = {"not checked"}
#: How a survivor is explained (tests/mutation/explained.toml): its behaviour is the original's,
#: or the difference cannot be seen from inside the test process (survivors.md gives each reason).
EXPLANATIONS = ("equivalent", "not killable in-process")


def load_targets() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    data = tomllib.loads(TARGETS_FILE.read_text(encoding="utf-8"))
    return data.get("defaults", {}), data["targets"]


def mutmut_table(defaults: dict[str, Any], target: dict[str, Any], debug: bool = False) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    return "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["scout"]',
            f"only_mutate = {toml_list(target['mutate'])}",
            f"pytest_add_cli_args_test_selection = {toml_list(target['tests'])}",
            # -p no:randomly is harmless when absent; "not slow" keeps each pass bounded.
            'pytest_add_cli_args = ["-m", "not slow", "-p", "no:cacheprovider", "-q"]',
            f"timeout_multiplier = {float(target.get('timeout_multiplier', defaults.get('timeout_multiplier', 5.0)))}",
            f"timeout_constant = {float(target.get('timeout_constant_s', defaults.get('timeout_constant_s', 2.0)))}",
            "use_git_change_detection = false",
            # Tests read the spec tables and examples next to the package (spec/).
            'also_copy = ["spec", "examples"]',
            f"debug = {'true' if debug else 'false'}",
            "",
        ]
    )


def register_after_definition(path: Path, decorators: list[str]) -> None:
    """In the working copy only: turn ``@DECORATOR`` + ``def name(`` into a plain ``def`` and a
    ``DECORATOR(name)`` call after it. mutmut does not mutate decorated functions; the gate's
    guards, effects and predicates are all registered by decorator, and a registration call
    after the definition registers the same function under the same name."""
    if not decorators:
        return
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r"^@(" + "|".join(re.escape(d) for d in decorators) + r")\n(def (\w+)\()", re.M)
    registered = [(match.group(1), match.group(3)) for match in pattern.finditer(text)]
    text = pattern.sub(r"\2", text)
    lines = [f"{decorator}({name})" for decorator, name in registered]
    path.write_text(text + "\n\n# Registered after definition (tests/mutation/mutate.py).\n" + "\n".join(lines) + "\n", encoding="utf-8")


def prepare(name: str, defaults: dict[str, Any], target: dict[str, Any], fresh: bool, debug: bool) -> Path:
    work = WORK / name
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    # mutmut writes the mutated tree to mutants/, first on PYTHONPATH (run_target). Created here,
    # before mutmut starts: without it the stats pass of every fresh copy failed ("No module
    # named 'tests'") and a second run on the same copy worked -- most likely the path entry,
    # missing when the interpreter started, was cached as unimportable.
    (work / "mutants").mkdir(exist_ok=True)
    for item in COPIED:
        source, destination = REPO / item, work / item
        if source.is_dir():
            if destination.exists():
                shutil.rmtree(destination)
            shutil.copytree(source, destination, ignore=IGNORED)
        else:
            shutil.copy2(source, destination)
    mutated = set()
    for pattern in target["mutate"]:
        for path in sorted(work.glob(pattern)):
            register_after_definition(path, target.get("register_after", []))
            mutated.add(path.relative_to(work))
    refresh_unmutated(work, mutated)
    pyproject = work / "pyproject.toml"
    pyproject.write_text(pyproject.read_text(encoding="utf-8") + mutmut_table(defaults, target, debug), encoding="utf-8")
    return work


def refresh_unmutated(work: Path, mutated: set[Path]) -> None:
    """Bring mutmut's tree (``mutants/``) up to date for every file it does not mutate. mutmut
    copies the other files there once and never again, so a rerun after the repository changed
    (a merge) ran the mutants against stale modules, tests and spec tables; found when a rerun of
    core-machine failed its clean test on an old spec/observer.toml. The mutated files and
    mutmut's ``.meta`` results are left to mutmut (it regenerates a file whose source changed
    and retests only the functions whose text changed)."""
    tree = work / "mutants"
    if not any(tree.iterdir()):
        return
    for item in ("scout", "tests", "spec"):
        for source in (work / item).rglob("*"):
            relative = source.relative_to(work)
            if source.is_file() and relative not in mutated:
                destination = tree / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)


def statuses(work: Path) -> dict[str, str]:
    """Mutant name -> status, from mutmut's own result listing."""
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    found: dict[str, str] = {}
    for line in listing.stdout.splitlines():
        name, sep, status = line.strip().partition(": ")
        if sep and "__mutmut_" in name:
            found[name] = status.strip()
    return found


def run_target(name: str, defaults: dict[str, Any], target: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    work = prepare(name, defaults, target, args.fresh, args.debug)
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    # The editable install points at the repository; the mutated copy must win on sys.path.
    environment["PYTHONPATH"] = os.pathsep.join([str(work / "mutants"), str(work)])
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children)]
    command += args.only
    started = time.monotonic()
    print(f"== mutate {name}: {' '.join(target['mutate'])}", flush=True)
    # A session of its own: on the wall-clock bound the whole group (mutmut and the workers it
    # forked) is stopped, and the mutants tested so far keep their results.
    process = subprocess.Popen(command, cwd=work, env=environment, start_new_session=True)
    try:
        returncode = process.wait(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        print(f"== mutate {name}: stopped at the {args.timeout_s:.0f} s bound", flush=True)
        os.killpg(process.pid, signal.SIGTERM)
        try:
            returncode = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait()
    elapsed_s = time.monotonic() - started
    found = statuses(work)
    counts: dict[str, int] = {}
    for status in found.values():
        counts[status] = counts.get(status, 0) + 1
    killed = sum(counts.get(s, 0) for s in KILLED)
    survived = sum(counts.get(s, 0) for s in SURVIVED)
    summary = {
        "target": name,
        "mutate": target["mutate"],
        "tests": target["tests"],
        "invocation": " ".join(["./dev mutate", name, *args.invocation]),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mutmut_exit_code": returncode,
        "elapsed_s": round(elapsed_s, 1),
        "counts": counts,
        "score": round(killed / (killed + survived), 4) if killed + survived else None,
        "survivors": sorted(n for n, s in found.items() if s in SURVIVED),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: summary[k] for k in ("target", "elapsed_s", "counts", "score")}), flush=True)
    return summary


# ------------------------------------------------------------------------------------------
# Run records and the README table
# ------------------------------------------------------------------------------------------


def record(name: str) -> Path:
    """Copy ``.mutation/NAME/summary.json`` into the committed run record; each invocation that
    contributed (a full run, then ``--only`` reruns of survivors with new tests) stays listed."""
    summary = json.loads((WORK / name / "summary.json").read_text(encoding="utf-8"))
    path = RUNS / f"{name}.json"
    history: list[dict[str, Any]] = []
    if path.exists():
        history = json.loads(path.read_text(encoding="utf-8")).get("invocations", [])
    entry = {key: summary.get(key) for key in ("invocation", "finished_utc", "elapsed_s", "mutmut_exit_code")}
    if entry["invocation"]:
        entry["invocation"] = _short_invocation(entry["invocation"])
    if entry not in history:
        history.append(entry)
    statuses_by_kind = {status: count for status, count in sorted(summary["counts"].items())}
    data = {
        "target": name,
        "mutate": summary["mutate"],
        "tests": summary["tests"],
        "counts": statuses_by_kind,
        "survivors": summary["survivors"],
        "invocations": history,
    }
    RUNS.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _short_invocation(invocation: str) -> str:
    """The command with a long list of ``--only NAME`` (a rerun of one run's survivors) counted
    instead of spelled out."""
    words = invocation.split()
    names = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--only"]
    if len(names) <= 3:
        return invocation
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--only":
            skip = True
        else:
            kept.append(word)
    return " ".join([*kept, f"--only <{len(names)} mutant names>"])


def load_explained() -> dict[str, dict[str, str]]:
    """Target -> {survivor's mutant name: how it is explained}."""
    data = tomllib.loads(EXPLAINED_FILE.read_text(encoding="utf-8"))
    explained: dict[str, dict[str, str]] = {}
    for target, kinds in data.items():
        names: dict[str, str] = {}
        for kind, mutants in kinds.items():
            if kind not in EXPLANATIONS:
                raise ValueError(f"{EXPLAINED_FILE.name}: [{target}] {kind!r} is not one of {EXPLANATIONS}")
            for mutant in mutants:
                if mutant in names:
                    raise ValueError(f"{EXPLAINED_FILE.name}: [{target}] {mutant} is listed twice")
                names[mutant] = kind
        explained[target] = names
    return explained


def table_rows(targets: dict[str, dict[str, Any]], explained: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """One row per target of targets.toml, from its run record (None where it has none)."""
    rows = []
    for name, target in targets.items():
        path = RUNS / f"{name}.json"
        if not path.exists():
            rows.append({"target": name, "mutate": target["mutate"], "record": None})
            continue
        run = json.loads(path.read_text(encoding="utf-8"))
        counts: dict[str, int] = run["counts"]
        mine = explained.get(name, {})
        survivors = run["survivors"]
        kinds = [mine.get(mutant) for mutant in survivors]
        stale = sorted(set(mine) - set(survivors))
        rows.append({
            "target": name,
            "mutate": target["mutate"],
            "record": path.name,
            "same_definition": run["mutate"] == target["mutate"] and run["tests"] == target["tests"],
            "mutants": sum(counts.values()),
            "killed": sum(counts.get(s, 0) for s in KILLED),
            "equivalent": kinds.count("equivalent"),
            "not_killable": kinds.count("not killable in-process"),
            "unexplained": sorted(m for m, k in zip(survivors, kinds, strict=True) if k is None),
            "stale": stale,
            "not_reached": sum(counts.get(s, 0) for s in NOT_REACHED),
            "other": sorted(s for s in counts if s not in KILLED | SURVIVED | NOT_REACHED),
        })
    return rows


def _percent(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.1f}%"


def render_summary(targets: dict[str, dict[str, Any]], explained: dict[str, dict[str, str]]) -> str:
    """The README block: one row per target (generated; `./dev mutate --summary`)."""
    from scout.core.machine.render import begin_marker, end_marker

    lines = [
        begin_marker(SUMMARY_BLOCK),
        "<!-- Generated by `./dev mutate --summary` from tests/mutation/runs/*.json and "
        "tests/mutation/explained.toml; do not edit. -->",
        "",
        "| target | modules | mutants | killed | equivalent | not killable in-process | not reached | "
        "unexplained | killed of the killable |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in table_rows(targets, explained):
        modules = ", ".join(f"`{m}`" for m in row["mutate"])
        if row["record"] is None:
            lines.append(f"| {row['target']} | {modules} | not recorded (earlier rounds: survivors.md) | | | | | | |")
            continue
        killable = row["mutants"] - row["equivalent"] - row["not_killable"] - row["not_reached"]
        lines.append(
            f"| {row['target']} | {modules} | {row['mutants']} | {row['killed']} | {row['equivalent']} | "
            f"{row['not_killable']} | {row['not_reached']} | {len(row['unexplained'])} | "
            f"{_percent(row['killed'], killable)} |"
        )
    lines += [
        "",
        "Equivalent: the mutant behaves as the original does; not killable in-process: the difference "
        "shows only across processes or on hardware this machine lacks. Each survivor and its reason: "
        "`tests/mutation/survivors.md`.",
        end_marker(SUMMARY_BLOCK),
        "",
    ]
    return "\n".join(lines)


def summary_problems(targets: dict[str, dict[str, Any]], explained: dict[str, dict[str, str]]) -> list[str]:
    """Why the records do not support the table: unexplained survivors, explanations of
    mutants that no longer survive, statuses the table has no column for."""
    problems = []
    for row in table_rows(targets, explained):
        if row["record"] is None:
            continue
        if row["unexplained"]:
            problems.append(f"{row['target']}: survivors not in {EXPLAINED_FILE.name}: {row['unexplained']}")
        if row["stale"]:
            problems.append(f"{row['target']}: {EXPLAINED_FILE.name} explains mutants that did not survive: "
                            f"{row['stale']}")
        if row["other"]:
            problems.append(f"{row['target']}: statuses without a column: {row['other']}")
        if not row["same_definition"]:
            problems.append(f"{row['target']}: {row['record']} was run with other modules or tests than "
                            f"{TARGETS_FILE.name} lists now; run the target again and record it")
    unknown = sorted(set(explained) - set(targets))
    if unknown:
        problems.append(f"{EXPLAINED_FILE.name}: targets not in {TARGETS_FILE.name}: {unknown}")
    return problems


def write_summary(check: bool) -> int:
    from scout.core.machine.render import splice

    _defaults, targets = load_targets()
    explained = load_explained()
    problems = summary_problems(targets, explained)
    current = README.read_text(encoding="utf-8")
    wanted = splice(current, render_summary(targets, explained), SUMMARY_BLOCK, README.name)
    if check:
        if wanted != current:
            problems.append(f"{README.name}: the mutation table is not current; run `./dev mutate --summary`")
    elif wanted != current:
        README.write_text(wanted, encoding="utf-8")
        print(f"wrote the mutation table into {README.name}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="targets from tests/mutation/targets.toml (default: all)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], help="a mutant-name glob within the target (repeatable)")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--debug", action="store_true", help="mutmut's debug output (every pytest run)")
    parser.add_argument("--timeout-s", type=float, default=6 * 3600, help="wall-clock bound per target")
    parser.add_argument("--record", action="store_true",
                        help="copy each target's summary.json into tests/mutation/runs/ (no run)")
    parser.add_argument("--summary", action="store_true",
                        help="render the mutation table into the README from the run records (no run)")
    parser.add_argument("--check", action="store_true", help="with --summary: only check the README is current")
    args = parser.parse_args(argv)
    # What this invocation asked for beyond the target names, for the run record.
    args.invocation = [a for a in argv if a not in args.targets or a.startswith("-")]
    defaults, targets = load_targets()
    if args.summary:
        return write_summary(args.check)
    if args.record:
        for name in args.targets:
            if name not in targets:
                parser.error(f"unknown target {name!r}; known: {sorted(targets)}")
            print(f"recorded {record(name).relative_to(REPO)}")
        return 0
    if args.list:
        for name, target in targets.items():
            print(f"{name}: {' '.join(target['mutate'])}")
        return 0
    unknown = [t for t in args.targets if t not in targets]
    if unknown:
        parser.error(f"unknown target(s) {unknown}; known: {sorted(targets)}")
    failed = False
    for name in args.targets or list(targets):
        summary = run_target(name, defaults, targets[name], args)
        failed |= summary["score"] is None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
