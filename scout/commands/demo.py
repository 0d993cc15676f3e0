"""``scout demo``: the main job of the README.

By default it runs a real multi-process training job on CPU (4 gloo ranks, observers enabled,
a hang injected on rank 2: ``scout.demo.hang``), prints the observer's report and the
verdict over the peers' evidence, and exits 0 only if the injected rank was named.
``scout demo --verdicts`` runs the consensus verdict over the worked examples of
``spec/examples/verdict.txt`` and prints them as a table, each checked against its expected line.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from typing import Any

from scout.spec_examples import EXAMPLES_PATH, actual_line, load_examples, render_verdict


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run a 4-rank CPU training job with an injected hang and print the observer's report"
    )
    parser.add_argument("--verdicts", action="store_true",
                        help="instead, run the verdict rule over the worked examples and print a table")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=90.0, metavar="S",
                        help="hard bound on each phase's job in seconds (default 90)")
    parser.add_argument("--phase", choices=("all", "hang", "replay"), default="all",
                        help="hang: the observer job only; replay: the SDC/straggler/gate job only; "
                        "all (default): both, then the summary")
    parser.set_defaults(func=run)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run(args: argparse.Namespace) -> int:
    if args.verdicts:
        return run_verdicts(args)
    return run_job(args)


def run_job(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("scout demo: the demo job needs torch (pip install 'scout-localize[torch]'); "
              "`scout demo --verdicts` runs without it", file=sys.stderr)
        return 2
    from scout.demo.hang import CONFIG, run_demo

    if not (math.isfinite(args.timeout) and args.timeout > 0):
        print(f"scout demo: --timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2
    log = None if args.json else (lambda line: print(f"scout demo: {line}", flush=True))
    if args.phase == "replay":
        return run_replay_phase(args, log, hang=None)
    result = run_demo(timeout_s=args.timeout, log=log)
    if args.phase == "all":
        if not args.json:
            if result.report is not None:
                print()
                print(render_report(result.report, result.detection_latency_s, CONFIG["stall_threshold_s"]))
            for problem in result.problems:
                print(f"FAILED: {problem}")
        return run_replay_phase(args, log, hang=result)
    if args.json:
        print(json.dumps({"ok": result.ok, "report": result.report, "detection_latency_s": result.detection_latency_s,
                          "wall_s": result.wall_s, "leftover_segments": list(result.leftover_segments),
                          "problems": list(result.problems)}, indent=2))
        return 0 if result.ok else 1
    report = result.report
    if report is not None:
        print()
        print(render_report(report, result.detection_latency_s, CONFIG["stall_threshold_s"]))
    print()
    if result.leftover_segments:
        print(f"cleaned up {len(result.leftover_segments)} shared-memory record(s) left by killed ranks")
    for problem in result.problems:
        print(f"FAILED: {problem}")
    if result.ok:
        print(f"ok: the observers named the injected rank; job took {result.wall_s:.1f} s, every process and "
              "shared-memory record cleaned up")
    return 0 if result.ok else 1


def run_replay_phase(args: argparse.Namespace, log: Any, hang: Any) -> int:
    """Phase 2: SDC and straggler localized by in-situ replay, the gate's certified checkpoint,
    the recovery decision; then the summary table. Exit 0 only if every fault was localized."""
    from scout.commands.certificate import run as print_certificate
    from scout.demo.hang import _forkserver
    from scout.demo.replay import SDC_RANK, SLOW_RANK, cleanup, run_replay_demo
    from scout.gate.recovery import Choice, FailureClass, recover

    hang_ok: bool | None = None if hang is None else bool(hang.ok)
    result = run_replay_demo(context=_forkserver(), timeout_s=args.timeout, log=log)
    try:
        sdc_named = sorted({
            tuple(r["outliers"]) for r in result.results if r["status"] == "ATTRIBUTED"
        })
        sdc_ok = sdc_named == [(SDC_RANK,)]
        confirmed = sorted({rank for _, ranks in result.confirmed for rank in ranks})
        straggler_ok = confirmed == [SLOW_RANK]
        decision = None
        if result.gate_state is not None:
            decision = recover(result.gate_state, FailureClass.SDC)
        gate_ok = decision is not None and decision.choice is Choice.VERIFIED
        rows = []
        if hang_ok is not None:
            rows.append(("hang: rank 2 sleeps before an all-reduce", "rank 2 behind", "see report above", hang_ok))
        rows.append((f"SDC: bit flip in rank {SDC_RANK}'s hidden-layer output", f"rank {SDC_RANK}",
                     "ranks " + (", ".join(str(list(t)) for t in sdc_named) or "none"), sdc_ok))
        ratio = f" (replay compute {result.compute_ratio:.1f}x)" if result.compute_ratio else ""
        rows.append((f"straggler: rank {SLOW_RANK} computes slower", f"rank {SLOW_RANK} confirmed",
                     f"confirmed {confirmed}{ratio}", straggler_ok))
        chosen = "none" if decision is None else f"{decision.choice.value} {decision.checkpoint} (rule {decision.rule})"
        rows.append(("recovery after the SDC", "the verified checkpoint, not the quarantined one", chosen, gate_ok))
        ok = result.ok and sdc_ok and straggler_ok and gate_ok and hang_ok is not False
        if args.json:
            print(json.dumps({
                "ok": ok,
                "hang_ok": hang_ok,
                "hang_report": None if hang is None else hang.report,
                "detection_latency_s": None if hang is None else hang.detection_latency_s,
                "sdc_attributed": [list(t) for t in sdc_named],
                "stragglers_confirmed": confirmed,
                "compute_ratio": result.compute_ratio,
                "recovery": None if decision is None else decision.to_json(),
                "replay_wall_s": result.wall_s,
                "problems": list(result.problems) + ([] if hang is None else list(hang.problems)),
            }, indent=2, default=str))
            return 0 if ok else 1
        if decision is not None:
            print()
            print(f"recovery decision for an SDC: restore {decision.choice.value} checkpoint "
                  f"{decision.checkpoint} -- {decision.reason} (rule {decision.rule}: {decision.why})")
        if result.manifest_dir is not None and gate_ok:
            print("\ncertificate of the verified checkpoint (scout certificate MANIFEST):")
            print_certificate(argparse.Namespace(manifest=result.manifest_dir, step=None, json=False,
                                                 list=False, job_id=None))
        for problem in result.problems:
            print(f"FAILED: {problem}")
        print()
        widths = (48, 26, 36)
        print(f"{'fault injected':<{widths[0]}} {'expected':<{widths[1]}} {'localized as':<{widths[2]}} ok")
        print(f"{'-' * widths[0]} {'-' * widths[1]} {'-' * widths[2]} --")
        for fault, expected, got, good in rows:
            print(f"{_clip(fault, widths[0]):<{widths[0]}} {_clip(expected, widths[1]):<{widths[1]}} "
                  f"{_clip(got, widths[2]):<{widths[2]}} {'yes' if good else 'NO'}")
        print()
        print("ok: every injected fault was localized" if ok else "FAILED: not every injected fault was localized")
        return 0 if ok else 1
    finally:
        cleanup(result)


def render_report(report: dict[str, Any], latency_s: float | None, threshold_s: float) -> str:
    """One readable block: which rank, why, the evidence (the verdict table), idle time, latency."""
    found = report["evidence"]
    where = found["stuck_position"]
    lines = [
        "=" * 78,
        f"scout observer report: {report['kind']} ({found['scope']}-scoped, finding {found['finding']})",
        f"  rank(s) at fault : {report['ranks']} on {', '.join(report['hosts']) or 'unknown host'}",
        f"  why              : {report['reason']}; the majority is stuck at step {where['step']} op {where['op']}",
        f"  idle             : {found['idle_s']:.2f} s (threshold {threshold_s:.1f} s)",
    ]
    if latency_s is not None:
        lines.append(f"  detection latency: {latency_s:+.3f} s after the threshold (report - hang start - threshold)")
    lines.append(f"  reported by rank {report['reporter_rank']} (decided by rank {found['decided_by_rank']}, "
                 f"round {found['round']['initiator_rank']}/{found['round']['number']})")
    lines.append("  evidence (one row per peer; the verdict is the strict majority of step/op and fingerprint):")
    lines.append(f"    {'rank':>4}  {'step':>4}  {'op':>4}  {'stage':<12} {'fingerprint':<18}  {'idle_s':>6}  verdict")
    attributed = set(found["attributed_ranks"])
    for row in found["peers"]:
        if row.get("missing"):
            lines.append(f"    {row['rank']:>4}  {'-':>4}  {'-':>4}  {'MISSING':<12} {'-':<18}  {'-':>6}  missing")
            continue
        verdict = "OUTLIER" if row["rank"] in attributed else "majority"
        lines.append(f"    {row['rank']:>4}  {row['step']:>4}  {row['op']:>4}  {row['stage']:<12} "
                     f"{row['fingerprint']:<18}  {row['idle_s']:>6.2f}  {verdict}")
    majority = len(found["peers"]) - len(attributed) - len(found["missing_ranks"])
    lines.append(f"  verdict: Attributed {sorted(attributed)} -- {majority} of {len(found['peers'])} peers "
                 "form the strict majority" if attributed else "  verdict: no single rank attributed")
    lines.append("=" * 78)
    return "\n".join(lines)


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
