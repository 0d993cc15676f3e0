"""``scout campaign``: inject faults and count what scout names (docs/campaign.md).

    scout campaign --quick               # the CI matrix: a few minutes on 2 cores
    scout campaign --part device         # the NCCL-semantics matrix (emulated backend, torchrun)
    scout campaign --part innocence      # >= 500 random run-ahead schedules: never a wrong name
    scout campaign --part restarts       # lost checkpoints, failed saves, restarts at 256-1024 ranks
    scout campaign                       # >= 1000 simulated scenarios at 8-4096 ranks + real jobs
    scout campaign --part sim --json out.json
    scout campaign --real-case SIGSTOP --rank 2 --step 3 --seed 7     # one real job again

Prints a table with the columns of the paper's Table 3 -- injected, localized, misattributed,
inconclusive, missed -- per fault kind, the healthy runs with their false attributions, and every
failing case with the command that reproduces it. ``--json PATH`` also writes every case
(schema ``scout.campaign/1``). Exit status: 0 when every injected fault was localized and nothing
was falsely attributed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from scout.commands._arguments import integer

SEED_MAX = 2**32 - 1



def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "campaign",
        help="inject faults (simulated and in real processes) and count what scout localizes",
        description="Run the fault campaign: every fault kind on the simulator at 8-4096 ranks, the real-process "
        "fault kinds in 4-rank gloo jobs, and healthy runs; print injected / localized / misattributed / "
        "inconclusive / missed per kind.",
    )
    parser.add_argument("--quick", action="store_true", help="the CI-sized matrix (a few minutes on 2 cores)")
    parser.add_argument("--part", choices=("all", "sim", "restarts", "real", "device", "layouts", "innocence"),
                        default="all",
                        help="which part to run (restarts: lost checkpoints, failed saves and restarts on the "
                        "simulator at 256-1024 ranks; device: the NCCL-semantics matrix on the emulated backend; "
                        "layouts: pipeline, tensor and data parallel torchrun jobs of 6-8 ranks; innocence: random "
                        "run-ahead schedules on the emulated backend, never a wrong name, about an hour at full "
                        "size; layouts and innocence run only by name; all: sim, restarts, real and device)")
    parser.add_argument("--seed", type=integer("--seed"), default=0, help="campaign seed (default 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every case as JSON to PATH")
    parser.add_argument("--real-case", metavar="KIND", help="run one real-process case again (see --list)")
    parser.add_argument("--rank", type=integer("--rank"), default=0, help="with --real-case: the faulty rank")
    parser.add_argument("--step", type=integer("--step"), default=3, help="with --real-case: the fault's step")
    parser.add_argument("--list", action="store_true", help="list the fault kinds and exit")
    parser.set_defaults(func=main)


def _error(message: str) -> int:
    print(f"scout campaign: error: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    from scout.scenarios import campaign, device_campaign, real_campaign

    if args.list:
        for kind in campaign.SIM_KINDS + campaign.SIM_HEALTHY:
            print(f"sim   {kind.kind:<20} scout simulate {kind.scenario}")
        for kind in campaign.RESTART_KINDS + campaign.RESTART_HEALTHY:
            print(f"restarts {kind.kind:<28} scout simulate {kind.scenario}")
        for name in (*real_campaign.REAL_KINDS, *real_campaign.HEALTHY_KINDS):
            print(f"real  {name}")
        for name in (*device_campaign.DEVICE_KINDS, device_campaign.HEALTHY_KIND):
            print(f"device {name}")
        from scout.scenarios import layout_campaign

        for layout_kind in (*layout_campaign.LAYOUT_KINDS, *layout_campaign.FULL_ONLY_KINDS,
                            *layout_campaign.HEALTHY_KINDS):
            print(f"layouts {layout_kind.name}")
        return 0
    if not 0 <= args.seed <= SEED_MAX:
        return _error(f"--seed must be in 0..{SEED_MAX}, got {args.seed}")
    if args.real_case is not None:
        known = (*real_campaign.REAL_KINDS, *real_campaign.HEALTHY_KINDS)
        if args.real_case not in known:
            return _error(f"unknown real case {args.real_case!r}; known: {', '.join(known)}")
        if not 0 <= args.rank < real_campaign.WORLD:
            return _error(f"--rank must be in 0..{real_campaign.WORLD - 1}, got {args.rank}")
        if not 1 <= args.step <= 100:
            return _error(f"--step must be in 1..100, got {args.step}")
    if args.json is not None and args.json.exists() and args.json.is_dir():
        return _error(f"--json {args.json} is a directory; give a file path")
    result = campaign.CampaignResult(quick=args.quick, seed=args.seed)
    started = time.monotonic()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.real_case is not None:
        case = real_campaign.RealCase(args.real_case, args.rank, args.step, args.seed)
        result.cases += real_campaign.run_real_part([case], log)
    else:
        campaign.run_campaign(result, campaign.PARTS if args.part == "all" else (args.part,), log)
    result.wall_s = time.monotonic() - started
    print(campaign.render(result))
    if args.json is not None:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
        except OSError as error:
            return _error(f"cannot write {args.json}: {error.strerror or error}")
    return 0 if result.ok else 1
