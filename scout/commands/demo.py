"""``scout demo``: the main job of the README -- the example training script under torchrun.

It runs ``examples/train_gpt.py`` (a small GPT with DDP and DCP and the five scout lines) three
times under ``torchrun --nproc-per-node 4`` on CPU, each with a fault injected the way it happens
in life, and reads each run directory as a user would (``scout report``):

1. **hang** -- rank 2 sleeps between forward and backward; the observers name it;
2. **sdc** -- rank 1's second block computes one wrong bit from step 57 on; replay attributes it,
   ``on_sdc=restart`` stops every rank, torchrun restarts the job, ``restore()`` resumes from the
   recovery-verified checkpoint older than the corruption, and the job finishes;
3. **straggler** -- every torch operation of rank 3 computes 1.5 times as long (a slow device);
   replay's sequential test confirms it.

It exits 0 only if every fault was localized as injected. ``scout demo --verdicts`` runs the
consensus verdict over the worked examples of ``spec/examples/verdict.txt`` instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import scout
from scout.reports.kinds import ReportKind, RestartReason
from scout.spec_examples import EXAMPLES_PATH, actual_line, load_examples, render_verdict

EXAMPLE = Path(scout.__file__).resolve().parents[1] / "examples" / "train_gpt.py"
#: (name, fault, steps, restarts, scout settings, what localizes it). The SDC and straggler
#: scenarios replay one layer every 2 steps, set as a user sets it: on this tiny model the
#: overhead budget's cadence (spec/budget.md) would replay once in a thousand steps or more.
SCENARIOS: tuple[tuple[str, str, int, int, dict[str, str]], ...] = (
    ("hang", "hang-before-backward:2:20:9:until-named", 24, 0, {"stall_threshold_s": "3", "recheck_interval_s": "2"}),
    ("sdc", "sdc:1:57", 100, 1, {"on_sdc": "restart", "replay_interval_steps": "2"}),
    ("straggler", "slow:3:1.5", 60, 0, {"replay_interval_steps": "2"}),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the example GPT under torchrun with a hang, an SDC (and restart) and a straggler"
    )
    parser.add_argument("--verdicts", action="store_true",
                        help="instead, run the verdict rule over the worked examples and print a table")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="hard bound on each job in seconds (default 300)")
    parser.add_argument("--phase", choices=("all", *(name for name, *_ in SCENARIOS)), default="all",
                        help="run one scenario only (default: all)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the run and checkpoint directories under DIR (default: a temporary directory)")
    parser.set_defaults(func=run)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run(args: argparse.Namespace) -> int:
    if args.verdicts:
        return run_verdicts(args)
    return run_job(args)


def _localized(name: str, records: list[dict[str, Any]]) -> tuple[bool, str]:
    """Did the run name the injected fault as injected?"""
    if name == "hang":
        hangs = [r for r in records if r["kind"] == ReportKind.HANG]
        ok = len(hangs) == 1 and hangs[0]["ranks"] == [2]
        return ok, f"hang reports: {[(r['ranks'], r['step'], r['reason']) for r in hangs]}"
    if name == "sdc":
        sdc = [r for r in records if r["kind"] == ReportKind.SDC]
        restored = [r for r in records if r["kind"] == ReportKind.RESTART and r["reason"] == RestartReason.RESTORED]
        finished = [r for r in records if r["kind"] == ReportKind.FINISHED]
        ok = (len(sdc) == 1 and sdc[0]["ranks"] == [1] and len(restored) == 1
              and restored[0]["evidence"].get("choice") == "verified" and restored[0]["step"] < 57
              and bool(finished) and finished[-1]["step"] == 100)
        return ok, (f"sdc reports: {[(r['ranks'], r['step']) for r in sdc]}; restored: "
                    f"{[(r['step'], r['evidence'].get('choice')) for r in restored]}")
    confirmed = [r for r in records if r["kind"] == ReportKind.STRAGGLER and not r["reason"].startswith("recovered")]
    ok = any(r["ranks"] == [3] for r in confirmed) and all(r["ranks"] == [3] for r in confirmed)
    return ok, f"stragglers confirmed: {[(r['ranks'], r['step'], r['reason']) for r in confirmed]}"


def run_job(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        print(f"scout demo: --timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2
    if not EXAMPLE.is_file():
        print(f"scout demo: the example training script {EXAMPLE} is not here; the demo runs from a source "
              "checkout (`scout demo --verdicts` runs anywhere)", file=sys.stderr)
        return 2
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        print("scout demo: torchrun is not installed (pip install 'scout-localize[torch]')", file=sys.stderr)
        return 2
    from scout import reports
    from scout.reports.picture import render_picture
    from scout.reports.summary import load_run, summary_text

    base = args.keep or Path(tempfile.mkdtemp(prefix="scout-demo-"))
    results: list[dict[str, Any]] = []
    try:
        for name, fault, steps, restarts, settings in SCENARIOS:
            if args.phase not in ("all", name):
                continue
            work = base / name
            shutil.rmtree(work, ignore_errors=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                   **{f"SCOUT_{k.upper()}": v for k, v in settings.items()}}
            command = [torchrun, "--nproc-per-node", "4", "--standalone", "--max-restarts", str(restarts),
                       str(EXAMPLE), "--steps", str(steps), "--run-dir", str(work / "run"),
                       "--checkpoint-dir", str(work / "ckpt"), "--fault", fault]
            if not args.json:
                print(f"scout demo: {name}: torchrun --nproc-per-node 4 examples/train_gpt.py --fault {fault}"
                      + "".join(f" SCOUT_{k.upper()}={v}" for k, v in settings.items()), flush=True)
            started = time.monotonic()
            try:
                job = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout,
                                     start_new_session=True)
                code: int | None = job.returncode
            except subprocess.TimeoutExpired:
                code = None
            records = reports.read_records(work / "run" / reports.REPORTS_FILE)
            ok, detail = _localized(name, records)
            ok = ok and code == 0
            result = {"scenario": name, "fault": fault, "localized": ok, "exit_code": code, "detail": detail,
                      "wall_s": round(time.monotonic() - started, 1), "run_dir": str(work / "run")}
            results.append(result)
            if not args.json:
                view = load_run(work / "run")
                print(summary_text(view), end="")
                print(f"picture: {render_picture(view, work / 'run' / 'scout-report.png')}")
                print(f"scout demo: {name}: {'localized' if ok else 'NOT localized'} -- {detail} "
                      f"({result['wall_s']} s, torchrun exit {code})\n", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    ok = bool(results) and all(r["localized"] for r in results)
    if args.json:
        print(json.dumps({"scenarios": results, "ok": ok}, indent=2))
    else:
        print(f"{'scenario':<10} {'localized':<10} {'wall_s':>7}  detail")
        for r in results:
            print(f"{r['scenario']:<10} {str(r['localized']):<10} {r['wall_s']:>7}  {_clip(r['detail'], 90)}")
        print("ok: every injected fault was localized" if ok else "FAILED: not every injected fault was localized")
    return 0 if ok else 1


def run_verdicts(args: argparse.Namespace) -> int:
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
