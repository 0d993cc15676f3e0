"""Private switches for scout's own benchmarks: one part of ``scout.attach`` off, to measure what
that part costs (bench/evaluate.py, the A/B table of parts in docs/evaluation.md; issue 23).

These are not settings. A user switches the observer or replay off with the ``observer`` and
``replay`` settings (docs/attach.md); the parts below have no user-facing switch because a job
without them loses what it needs to be diagnosed (e.g. without the DDP hook a rank stuck before
its gradient all-reduce looks like its peers). They are read from one environment variable, here
and nowhere else (scout/job/assemble.py and checks.py ask), so the benchmark can set them for
every rank of a ``torchrun`` job without changing the training script:

    SCOUT_BENCH_OFF=ddp_hook,loop_timer torchrun ... bench/attach_overhead.py --worker ...

No torch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

__all__ = ["PARTS", "VARIABLE", "parts_off"]

VARIABLE: Final = "SCOUT_BENCH_OFF"
#: What each switch removes from a job (scout/job/attach.py reads them):
PARTS: Final = {
    "instrumentation": "the per-layer forward hooks and the torch.distributed wrappers (their publishes, and "
                       "so the completion watcher too); the step marks stay, so the observer still sees every step",
    "completion": "the completion watcher (INSTR-9..13): its thread and the markers of every collective",
    "ddp_hook": "the DDP communication hook that publishes each gradient bucket's launch",
    "loop_timer": "the loop-straggler timer (LOOP-1): its listeners on collectives and DDP buckets",
    "gate": "the checkpoint gate's writer on rank 0 (replay still runs and votes)",
}


def parts_off(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The parts ``SCOUT_BENCH_OFF`` (comma-separated) switches off; empty when it is unset."""
    env = os.environ if environ is None else environ
    text = env.get(VARIABLE, "")
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(PARTS))
    if unknown:
        raise ValueError(f"{VARIABLE}={text!r} names unknown part(s) {unknown}; the parts are {sorted(PARTS)}")
    return names
