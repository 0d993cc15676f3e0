"""``scout report RUN_DIR``: what a run found, as a readable summary and a picture.

Prints the summary (faults by kind with ranks, hosts, steps and reasons; restarts and what they
restored; checkpoint trust) and writes ``RUN_DIR/scout-report.png`` (``--picture PATH`` for
another path or ``.svg``; ``--no-picture`` to skip it). ``--json`` prints the summary as JSON
(schema ``scout.run-summary/1``) instead. Exit status (spec/ops.md OPS-12, OPS-13): 0 no fault
reported and every attempt ended cleanly; 1 faults reported; 2 the run directory cannot be read;
3 no fault reported, but the run did not end cleanly -- an attempt raised, or left no
``finished`` report (a crash, a kill, a full run_dir; or it still runs), or lines of
``reports.jsonl`` could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("report", help="summarise a run directory and draw its rank x step picture")
    parser.add_argument("run_dir", type=Path, help="the run_dir given to scout.attach")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--picture", type=Path, default=None, help="where to write the picture (.png or .svg)")
    parser.add_argument("--no-picture", action="store_true", help="do not draw the picture")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scout.reports import ReportError
    from scout.reports.summary import load_run, summary_json, summary_text

    try:
        view = load_run(args.run_dir)
    except (OSError, ReportError) as error:
        print(f"scout report: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary_json(view), indent=2, sort_keys=True))
    else:
        print(summary_text(view), end="")
    if not args.no_picture:
        picture = args.picture or (args.run_dir / "scout-report.png")
        if picture.suffix.lower() not in (".png", ".svg"):
            print(f"scout report: --picture {picture} must end in .png or .svg", file=sys.stderr)
            return 2
        try:
            from scout.reports.picture import render_picture
        except ImportError as error:
            print(f"scout report: no picture ({error}); install matplotlib (pip install 'scout-localize[report]')",
                  file=sys.stderr)
        else:
            written = render_picture(view, picture)
            if not args.json:
                print(f"picture: {written}")
    if view.faults:
        return 1
    return 3 if view.unclean or view.skipped else 0
