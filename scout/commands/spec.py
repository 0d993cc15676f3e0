"""``scout spec``: regenerate what is generated from the spec tables -- the block of every
machine's document (``spec/<name>.toml`` -> ``spec/<name>.md``), the copy of each table the
package ships (``scout/core/tables/<name>.toml``) and the decision tables' Python -- and with
``--check`` only report what is stale, which is how CI proves that no diagram, table or packaged
copy has drifted from the spec (docs/spec-format.md)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from pathlib import Path
from typing import Any

import scout
from scout.core.machine import SpecError, load_machine, new_document, render_block, splice
from scout.core.machine.loader import PACKAGED_TABLES, read_toml

# The repository's spec/ directory, beside the package in a checkout (absent in a wheel).
REPOSITORY_SPEC = Path(scout.__file__).resolve().parents[1] / "spec"
PACKAGED_TABLES_DIR = Path(scout.__file__).resolve().parent / "core" / "tables"

# A stale document's diff is printed to help, not to be complete; the fix is always to rerun.
DIFF_LINES_MAX = 40


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "spec",
        help="regenerate the tables and diagrams in spec/*.md from the machine tables spec/*.toml",
        description=(
            "For every machine table spec/<name>.toml, validate it against its bindings and write "
            "its transition table, Mermaid diagram and invariants into spec/<name>.md between "
            "the <!-- BEGIN GENERATED: <name> --> and <!-- END GENERATED: <name> --> markers. "
            "Prose outside the markers is left alone."
        ),
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 if any generated block is stale or a table is invalid",
    )
    parser.add_argument(
        "--spec-dir",
        type=Path,
        default=Path("spec"),
        help="directory holding the machine tables (default: ./spec)",
    )
    parser.set_defaults(func=run)


def _read(path: Path) -> str | None:
    if not path.exists():
        return None
    with path.open(encoding="utf-8", newline="") as file:
        return file.read()


def _diff(current: str | None, expected: str, document: Path) -> str:
    lines = list(
        difflib.unified_diff(
            (current or "").splitlines(keepends=True),
            expected.splitlines(keepends=True),
            fromfile=f"{document} (on disk)",
            tofile=f"{document} (generated)",
        )
    )
    shown = "".join(lines[:DIFF_LINES_MAX])
    if len(lines) > DIFF_LINES_MAX:
        shown += f"... {len(lines) - DIFF_LINES_MAX} more diff lines\n"
    return shown


def _decision_outputs(table_path: Path, data: dict[str, Any]) -> list[tuple[Path, str | None, str]]:
    """Files derived from a decision table: (path, current text or None, expected text). The
    renderer module is named by ``[decision] renderer`` and provides ``generated_files``."""
    renderer = data["decision"]["renderer"]
    if not isinstance(renderer, str):
        raise SpecError(f"{table_path}: [decision] renderer must name the module that renders the table")
    module = importlib.import_module(renderer)
    outputs: list[tuple[Path, str | None, str]] = []
    for path, expected_of in module.generated_files(data, table_path):
        current = _read(path)
        outputs.append((path, current, expected_of(current)))
    return outputs


def run(args: argparse.Namespace) -> int:
    spec_dir: Path = args.spec_dir
    if not spec_dir.is_dir():
        print(
            f"scout spec: no spec directory at {spec_dir}; run from the repository root or pass --spec-dir",
            file=sys.stderr,
        )
        return 2
    failures = 0
    machines = 0
    for table_path in sorted(spec_dir.glob("*.toml")):
        outputs: list[tuple[Path, str | None, str]] = []
        try:
            data = read_toml(table_path)
            if "machine" not in data:
                decision = data.get("decision")
                if not (isinstance(decision, dict) and "renderer" in decision):
                    print(f"{table_path}: no [machine] table, skipped")
                    continue
                # A decision table (e.g. spec/recovery.toml) names the module that renders it.
                outputs = _decision_outputs(table_path, data)
            else:
                machine = load_machine(table_path)
                document = table_path.with_suffix(".md")
                current = _read(document)
                if current is None:
                    expected = new_document(machine.table)
                else:
                    expected = splice(current, render_block(machine.table), machine.name, str(document))
                outputs = [(document, current, expected)]
                if table_path.stem in PACKAGED_TABLES and spec_dir.resolve() == REPOSITORY_SPEC:
                    packaged = PACKAGED_TABLES_DIR / table_path.name
                    outputs.append((packaged, _read(packaged), _read(table_path) or ""))
        except (SpecError, ValueError, ImportError) as error:
            print(f"scout spec: {error}", file=sys.stderr)
            failures += 1
            continue
        machines += 1
        for document, current, expected in outputs:
            if current == expected:
                print(f"{document}: current")
            elif args.check:
                state = "missing" if current is None else "stale"
                print(
                    f"scout spec --check: {document} is {state}: its generated block does not match "
                    f"{table_path}. Run `scout spec` to regenerate it, then commit the result.\n"
                    f"{_diff(current, expected, document)}",
                    file=sys.stderr,
                )
                failures += 1
            else:
                with document.open("w", encoding="utf-8", newline="") as file:
                    file.write(expected)
                print(f"{document}: {'written' if current is None else 'updated'} from {table_path}")
    if machines == 0 and failures == 0:
        print(f"{spec_dir}: no machine tables (*.toml with a [machine] table); nothing to generate")
    return 1 if failures else 0
