"""``scout demo``: the main job of the README.

Today it runs the consensus verdict over the worked examples of ``spec/examples/verdict.txt``
and prints them as a table, each verdict checked against the expected line; later issues give
the demo a simulated hang, straggler and SDC campaign.
"""

from __future__ import annotations

import argparse
import json
import shutil
from typing import Any

from scout.spec_examples import EXAMPLES_PATH, actual_line, load_examples, render_verdict


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the verdict rule over the worked examples and print a table"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run(args: argparse.Namespace) -> int:
    examples = load_examples()
    rows: list[dict[str, Any]] = []
    mismatches = 0
    for example in examples:
        got = actual_line(example)
        ok = got == example.expected
        mismatches += not ok
        rows.append(
            {
                "line": example.line_number,
                "mode": example.mode,
                # A non-default timing config is shown in front of the evidence it applies to.
                "evidence": example.header[len(example.mode) :].strip(),
                "verdict": got,
                "matches_spec": ok,
            }
        )
    if args.json:
        print(json.dumps({"examples": str(EXAMPLES_PATH), "rows": rows}, indent=2))
        return 1 if mismatches else 0
    width = max(100, shutil.get_terminal_size((140, 20)).columns)
    evidence_width = min(48, width // 3)
    print(f"scout demo: the consensus verdict over {len(rows)} worked examples ({EXAMPLES_PATH.name})")
    print("positions count from 0; MISSING = the peer did not answer; ms for timing mode\n")
    print(f"{'mode':<8} {'evidence':<{evidence_width}}  verdict")
    print(f"{'-' * 8} {'-' * evidence_width}  {'-' * 40}")
    for row in rows:
        mark = "" if row["matches_spec"] else "   <-- differs from spec/examples/verdict.txt"
        print(f"{row['mode']:<8} {_clip(row['evidence'], evidence_width):<{evidence_width}}  {row['verdict']}{mark}")
    print(f"\n{len(rows) - mismatches}/{len(rows)} verdicts match the spec's worked examples.")
    return 1 if mismatches else 0


__all__ = ["register", "render_verdict"]
