"""``scout simulate``: run a named scenario on the deterministic simulated cluster.

    scout simulate --list
    scout simulate exchange-silent-peer --ranks 4096 --seed 7
    scout simulate corrupt-evidence --ranks 16 --json

Prints a table (or JSON with ``--json``), the checks the scenario makes, and always the seed
and the command that replays the run exactly. Exit status: 0 when every check passed, 1 when
one failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from scout.commands._arguments import integer
from scout.scenarios.registry import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_ROUNDS,
    ScenarioParams,
    ScenarioReport,
    UnknownScenario,
    get_scenario,
    run_scenario,
    scenario_names,
)
from scout.transport.sim.errors import SimulationError
from scout.transport.sim.faults import describe_ranks

DEFAULT_RANKS = 8
SEED_BITS = 32  # a seed drawn when none is given: short enough to type back
SEED_MAX = 2**64 - 1  # seeds are non-negative: random.Random(-s) is the same run as Random(s)



def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a scenario on the simulated cluster (seeded, reproducible)",
        description="Run a named scenario on the deterministic simulated cluster. The same "
        "scenario, ranks and seed always give the same run.",
    )
    parser.add_argument("scenario", nargs="?", help="scenario name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--ranks",
        type=integer("--ranks"),
        default=DEFAULT_RANKS,
        help=f"simulated ranks (default {DEFAULT_RANKS})",
    )
    parser.add_argument(
        "--seed", type=integer("--seed"), default=None,
        help="seed, an integer >= 0 (default: a random one, printed)"
    )
    parser.add_argument(
        "--group-size",
        type=integer("--group-size"),
        default=DEFAULT_GROUP_SIZE,
        help=f"replica group size: peers that compare evidence (default {DEFAULT_GROUP_SIZE})",
    )
    parser.add_argument(
        "--rounds", type=integer("--rounds"), default=DEFAULT_ROUNDS,
        help=f"rounds (default {DEFAULT_ROUNDS})"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--trace", type=integer("--trace"), default=0, metavar="N",
        help="also print the first N trace records"
    )
    parser.set_defaults(func=main)


def _error(message: str) -> int:
    print(f"scout simulate: error: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    if args.list:
        return _list_scenarios()
    if not args.scenario:
        return _error("name a scenario, or pass --list; known: " + ", ".join(scenario_names()))
    try:
        get_scenario(args.scenario)
    except UnknownScenario as exc:
        return _error(str(exc))
    if args.ranks < 1:
        return _error(f"--ranks must be >= 1, got {args.ranks}")
    if args.trace < 0:
        return _error(f"--trace must be >= 0, got {args.trace}")
    if args.rounds < 1:
        return _error(f"--rounds must be >= 1, got {args.rounds}")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        return _error(f"--seed must be in 0..{SEED_MAX}, got {args.seed} (seeds are non-negative: "
                      "a negative seed would replay the run of its absolute value)")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(SEED_BITS)
    try:
        params = ScenarioParams(
            ranks=args.ranks, seed=seed, group_size=args.group_size, rounds=args.rounds
        )
    except ValueError as exc:
        return _error(str(exc))
    try:
        report = run_scenario(args.scenario, params)
    except ValueError as exc:
        return _error(str(exc))
    except SimulationError as exc:
        # The run itself broke (a bound hit, a program raised): say so, with the seed.
        print(f"scout simulate: {args.scenario} failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        document = report.to_json()
        if args.trace:
            document["trace"] = [
                list(map(_plain, record)) for record in report.result.trace.records[: args.trace]
            ]
        print(json.dumps(document, indent=2, sort_keys=False))
    else:
        print(render(report, trace_records=args.trace))
    return 0 if report.ok else 1


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _list_scenarios() -> int:
    names = scenario_names()
    width = max(len(name) for name in names)
    for name in names:
        spec = get_scenario(name)
        print(f"{name:<{width}}  {spec.summary} (ranks >= {spec.min_ranks})")
    return 0


def _cell(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return describe_ranks(value) if value else "-"
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value)


def render(report: ScenarioReport, *, trace_records: int = 0) -> str:
    """The human-readable form: header, faults, table, checks, run figures, seed."""
    params = report.params
    lines = [
        f"scenario {report.scenario}: {report.summary}",
        f"ranks={params.ranks} seed={params.seed} group_size={params.group_size} "
        f"rounds={params.rounds}",
    ]
    lines += [f"fault: {fault}" for fault in report.faults] or ["fault: none"]
    lines.append("")
    table = [list(report.columns)] + [[_cell(cell) for cell in row] for row in report.rows]
    widths = [max(len(row[index]) for row in table) for index in range(len(report.columns))]
    for row in table:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    lines.append("")
    lines.append("checks:")
    for check in report.checks:
        lines.append(f"  {'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    result = report.result
    lines.append("")
    lines.append(
        f"events={result.events} messages={result.messages_sent} "
        f"dropped={result.messages_dropped} virtual_time_s={result.virtual_time_s:.6f} "
        f"wall_s={report.wall_s:.3f} events_per_s={report.events_per_s:.0f}"
    )
    lines.append(f"trace: {len(result.trace)} records, sha256 {report.trace_digest[:16]}")
    if trace_records:
        lines.append(result.trace.format(trace_records))
    verdict = "ok" if report.ok else "FAILED"
    lines.append(f"{verdict}: seed={params.seed}; {report.reproduce}")
    return "\n".join(lines)
