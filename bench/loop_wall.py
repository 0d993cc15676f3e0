"""Benchmark: loop stragglers in wall time (spec/replay.md LOOP-1..LOOP-3), from real jobs.

Input: the loop checks of real 4-rank torchrun jobs (``tests/job/straggler_job.py --loop-log``:
every check's per-rank log ratio to the centre, STRAG-2), healthy and with one rank slowed.
The sequential test (the real ``StragglerTracker``) is run over them at candidate settings:

* **healthy**: block-bootstrap sequences of 10,000 checks from the healthy jobs' checks (blocks
  of 4 consecutive checks, peers kept in place, so a rank that is persistently a little slower
  on this host stays so): false confirmations per 10,000 healthy checks (any peer), per trial;
* **slow**: each slowed job's own sequence from its first check: the check at which the slowed
  rank is confirmed (None: not within the run), and whether any other rank was; and
  block-bootstrap resamples of it (p90, max of the checks to confirm).

The jobs (4 ranks, DDP, gloo; a loop check every 10 steps), each alone on the host::

    SCOUT_LOOP_CHECK_STEPS=10 torchrun --nproc-per-node 4 --standalone tests/job/straggler_job.py \
        --steps 300 --run-dir R --loop-log healthy.jsonl [--fault slow-forward:2:1.5:sleep]

(faults: ``slow-forward`` or ``slow-loop``, ``RANK:FACTOR:sleep|spin``). Also the wall time a
loop check's ``end_step`` took on rank 0 (``check_ms``: the all-gather, waiting for the last
peer included).

Run: .venv/bin/python bench/loop_wall.py --healthy H.jsonl [...] --slow RANK:S.jsonl [...]
Writes bench/results/loop_wall.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
from pathlib import Path
from typing import Any

from scout.core.straggler import SequentialConfig
from scout.core.straggler.tracking import StragglerTracker
from scout.replay.stragglers import StragglerKind

RESULTS = Path(__file__).resolve().parent / "results" / "loop_wall.json"
BLOCK = 4


def _checks(path: str) -> list[list[float | None]]:
    return [json.loads(line)["evidence"] for line in Path(path).read_text().splitlines() if line.strip()]


def _resample(checks: list[list[float | None]], count: int, rng: random.Random) -> list[list[float | None]]:
    out: list[list[float | None]] = []
    while len(out) < count:
        start = rng.randrange(max(1, len(checks) - BLOCK + 1))
        out.extend(checks[start:start + BLOCK])
    return out[:count]


def _run(config: SequentialConfig, sequence: list[list[float | None]]) -> list[tuple[int, int]]:
    """(check index from 1, peer) of every confirmation."""
    tracker = StragglerTracker(StragglerKind.LOOP, range(len(sequence[0])), config)
    found = []
    for index, evidence in enumerate(sequence, start=1):
        found.extend((index, e.peer) for e in tracker.observe(index, evidence) if e.change == "confirmed")
    return found


def table(config: SequentialConfig, healthy: list[list[float | None]], slow: list[tuple[int, list[list[float | None]]]],
          trials: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    false = [len(_run(config, _resample(healthy, 10_000, rng))) for _ in range(trials)]
    rows = []
    for peer, checks in slow:
        own = _run(config, checks)
        first = next((i for i, p in own if p == peer), None)
        boot = []
        for _ in range(200):
            found = _run(config, _resample(checks, 60, rng))
            boot.append(next((i for i, p in found if p == peer), 61))
        boot.sort()
        rows.append({"peer": peer, "checks": len(checks), "confirmed_at_check": first,
                     "others_confirmed": sorted({p for _, p in own if p != peer}),
                     "bootstrap_median": statistics.median(boot), "bootstrap_p90": boot[int(0.9 * len(boot))],
                     "bootstrap_max": boot[-1]})
    return {"config": {k: getattr(config, k) for k in ("slow_ratio", "confirm_evidence", "clip_ratio",
                                                        "noise_spread", "noise_checks")},
            "healthy_false_confirmations_per_10000": false, "slow": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--healthy", nargs="+", required=True)
    parser.add_argument("--slow", nargs="+", default=[], help="PEER:PATH")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    healthy = [c for path in args.healthy for c in _checks(path)]
    slow = [(int(peer), _checks(path)) for peer, _, path in (s.partition(":") for s in args.slow)]
    candidates = [SequentialConfig(), SequentialConfig(noise_spread=0.1), SequentialConfig(noise_spread=None),
                  SequentialConfig(noise_spread=0.1, confirm_evidence=0.8),
                  SequentialConfig(slow_ratio=1.05, noise_spread=0.1, confirm_evidence=0.5),
                  SequentialConfig(slow_ratio=1.03, noise_spread=None, confirm_evidence=0.3)]
    check_ms = [json.loads(line)["check_ms"] for path in args.healthy for line in Path(path).read_text().splitlines()
                if line.strip() and "check_ms" in json.loads(line)]
    out = {"host": platform.node(), "inputs": {"healthy": args.healthy, "slow": args.slow},
           "healthy_checks": len(healthy), "block_checks": BLOCK,
           "check_ms_median": statistics.median(check_ms) if check_ms else None,
           "check_ms_max": max(check_ms) if check_ms else None,
           "rows": [table(c, healthy, slow, args.trials, args.seed) for c in candidates]}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print("check ms: median", out["check_ms_median"], "max", out["check_ms_max"])
    for row in out["rows"]:
        print(row["config"], "false/10k:", row["healthy_false_confirmations_per_10000"])
        for s in row["slow"]:
            print("   ", s)


if __name__ == "__main__":
    main()
