"""Benchmark: what the core's run-time invariants cost (scout/core/invariants.py). Writes
bench/results/invariants.json.

Each workload runs with the checks on and off (``invariants.ENABLED``), interleaved, and the
median per-call CPU times of the thread are compared: the exact and timing verdicts at n = 16,384 with three
outliers (ATTRIBUTED, the checks' worst case), one gate step over the worked run of
spec/gate.md, one replay round of a 4-peer group, and one straggler check of 16 peers.
Goal: the checks add at most 5 % to every workload (they are O(1) or O(outliers) by design).
Run: ./dev py bench/invariants.py   (or ./dev bench invariants)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _goals import at_most, print_goals, write_results  # noqa: E402

from scout.core import invariants  # noqa: E402
from scout.core.recipes import DueRecipe, RecipeClass, RecipeId, ReplayStatus  # noqa: E402
from scout.core.replay_round import (  # noqa: E402
    EVIDENCE_OF,
    Executed,
    GatherEvidence,
    GatherReadiness,
    Prepared,
    communication_slot,
    replay_round,
)
from scout.core.straggler import DEFAULT_SEQUENTIAL_CONFIG, confirmation_start, confirmation_step  # noqa: E402
from scout.core.verdict import DEFAULT_TIMING_CONFIG, classify_exact, classify_timing  # noqa: E402
from scout.gate.step import initial_state, step  # noqa: E402

OVERHEAD_MAX = 0.05


def _verdicts() -> tuple[Callable[[], object], Callable[[], object]]:
    rng = random.Random(1)
    signatures = [7] * 16384
    times = [40.0 + rng.random() for _ in range(16384)]
    for position in (5, 900, 16000):
        signatures[position] = 8
        times[position] = 400.0
    return (lambda: classify_exact(signatures)), (lambda: classify_timing(times))


def _gate() -> Callable[[], object]:
    from tests.gate_story import CONFIG, story

    events = story()
    start = initial_state(CONFIG)

    def run() -> object:
        state = start
        for event in events:
            state, _ = step(state, event)
        return state

    return run


def _round() -> Callable[[], object]:
    due = DueRecipe(RecipeId(RecipeClass.HIDDEN, 0), 4, 0)
    prepared = [Prepared(due, ReplayStatus.OK, 99)]
    executed = Executed(ReplayStatus.OK, 0.04, (0.04,), {kind: 7 for kind in EVIDENCE_OF[RecipeClass.HIDDEN]})

    def run() -> object:
        round_ = replay_round(4, prepared, schedule_digest=1, group_size=4, timing=DEFAULT_TIMING_CONFIG)
        answer: object = None
        while True:
            try:
                op = round_.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(op, GatherReadiness):
                answer = [op.row] * 4
            elif isinstance(op, GatherEvidence):
                answer = [(*op.row, *communication_slot(()))] * 4
            else:
                answer = executed

    return run


def _straggler() -> Callable[[], object]:
    state = confirmation_start(16, DEFAULT_SEQUENTIAL_CONFIG)
    evidence = [0.0] * 15 + [0.4]
    return lambda: confirmation_step(state, evidence)


def _per_call_s(work: Callable[[], object], enabled: bool, budget_s: float) -> list[float]:
    """Per-call CPU time of this thread: time the host gave the core to other processes is not
    the checks' cost (a shared 2-core host is loaded by other work most of the time)."""
    invariants.ENABLED = enabled
    work()
    times = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.thread_time()
        work()
        times.append(time.thread_time() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved on/off rounds per workload")
    parser.add_argument("--budget-s", type=float, default=0.4, help="seconds per workload per round and setting")
    args = parser.parse_args()
    exact, timing = _verdicts()
    workloads = {"exact verdict n=16384": exact, "timing verdict n=16384": timing,
                 "gate: the worked run (33 steps)": _gate(), "replay round, 4 peers": _round(),
                 "straggler check, 16 peers": _straggler()}
    rows, goals = [], []
    try:
        for name, work in workloads.items():
            on: list[float] = []
            off: list[float] = []
            for _ in range(args.rounds):  # interleaved: drift on a shared host hits both alike
                on.append(statistics.median(_per_call_s(work, True, args.budget_s)))
                off.append(statistics.median(_per_call_s(work, False, args.budget_s)))
            with_s, without_s = statistics.median(on), statistics.median(off)
            overhead = with_s / without_s - 1.0
            rows.append({"workload": name, "with_us": with_s * 1e6, "without_us": without_s * 1e6,
                         "overhead": overhead})
            print(f"{name:<34} with {with_s * 1e6:10.1f} us  without {without_s * 1e6:10.1f} us  "
                  f"overhead {overhead:+.1%}")
            goals.append(at_most(f"invariants: {name}", max(0.0, overhead) * 100, OVERHEAD_MAX * 100, "%",
                                 f"{with_s * 1e6:.1f} us with, {without_s * 1e6:.1f} us without"))
    finally:
        invariants.ENABLED = True
    write_results("invariants", {"invariants": len(invariants.INVARIANTS), "ids": list(invariants.INVARIANTS),
                                 "rows": rows}, goals)
    print(f"{len(invariants.INVARIANTS)} run-time invariants in the core")
    print_goals(goals)
    return 0 if all(goal.met for goal in goals) else 1


if __name__ == "__main__":
    raise SystemExit(main())
