"""Bounded mutation runs with mutmut (``./dev mutate [TARGET ...]``; targets: targets.toml).

For each target this makes a working copy of the tree under ``.mutation/<target>/`` (scout/,
tests/, spec/, pyproject.toml with a ``[tool.mutmut]`` table for that target appended), runs
``mutmut run`` there, and writes ``.mutation/<target>/summary.json``: every mutant with its
status (killed, survived, timeout, no tests, ...) and the score. The working copy keeps mutmut's
cache, so a rerun only tests mutants whose function changed. The repository itself is never
mutated, and nothing here runs in CI: a full pass takes hours on 2 cores.

Options: ``--max-children N`` (default 2), ``--only GLOB`` (repeatable; mutant names, e.g.
``'scout.core.verdict.x_classify_exact__*'``), ``--fresh`` (drop the target's cache first),
``--list`` (print the targets), ``--timeout-s`` (wall-clock bound per target).

The score reported is killed / (killed + survived + timeout-as-survived excluded): a timeout
counts as killed (the mutant made the covering tests run past their limit, which a test run
would flag), "no tests" counts as survived, matching mutmut's own summary.
"""

from __future__ import annotations

import argparse
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
WORK = REPO / ".mutation"
COPIED = ("scout", "tests", "spec", "pyproject.toml", "README.md")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.so")

# mutmut's exit-code statuses, grouped as its own summary groups them.
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
SURVIVED = {"survived", "no tests"}


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
            'also_copy = ["spec"]',
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
    for pattern in target["mutate"]:
        for path in sorted(work.glob(pattern)):
            register_after_definition(path, target.get("register_after", []))
    pyproject = work / "pyproject.toml"
    pyproject.write_text(pyproject.read_text(encoding="utf-8") + mutmut_table(defaults, target, debug), encoding="utf-8")
    return work


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
        "mutmut_exit_code": returncode,
        "elapsed_s": round(elapsed_s, 1),
        "counts": counts,
        "score": round(killed / (killed + survived), 4) if killed + survived else None,
        "survivors": sorted(n for n, s in found.items() if s in SURVIVED),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: summary[k] for k in ("target", "elapsed_s", "counts", "score")}), flush=True)
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="targets from tests/mutation/targets.toml (default: all)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], help="a mutant-name glob within the target (repeatable)")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--debug", action="store_true", help="mutmut's debug output (every pytest run)")
    parser.add_argument("--timeout-s", type=float, default=6 * 3600, help="wall-clock bound per target")
    args = parser.parse_args(argv)
    defaults, targets = load_targets()
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
