"""A rank of tests/job/test_idle_loops.py (run by tests.replay._launch, gloo, forked ranks):
``scout.attach`` on a small DDP model, and the scheduling policy of every gloo event-loop thread
of the process, read around scout's calls (spec/transport.md WAIT-5)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import scout
from scout.job.idle_loops import loop_threads
from tests.replay._scenarios import SEQUENCE, VOCAB, TinyLM, _batch


def _policies(threads: frozenset[int]) -> dict[int, int]:
    return {thread: os.sched_getscheduler(thread) for thread in sorted(threads)}


def main(rank: int, world: int, *, steps: int = 6, fail_at: int | None = None) -> dict[str, Any]:
    user_loops = loop_threads()  # the default process group's, made before attach
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run_dir = Path(os.environ["SCOUT_TEST_SCRATCH"]) / "run"
    job = scout.attach(model, optimizer, run_dir=str(run_dir), observer=False, replay_interval_steps=1)
    scout_loops = loop_threads() - user_loops
    seen: dict[str, Any] = {"user_loops": len(user_loops), "scout_loops": len(scout_loops),
                            "after_attach": _policies(scout_loops), "user_after_attach": _policies(user_loops)}
    inside: list[dict[int, int]] = []
    control = job.parts.control
    run = control.run

    def recording_run(program: Any) -> Any:
        inside.append(_policies(scout_loops))
        if fail_at is not None and len(inside) == fail_at:
            raise RuntimeError("a failure inside job.step()")
        return run(program)

    control.run = recording_run  # type: ignore[method-assign]
    job.restore()
    seen["after_restore"] = _policies(scout_loops)
    failed = None
    for step in range(1, steps + 1):
        tokens = _batch(rank, step)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        try:
            job.step()
        except RuntimeError as error:
            failed = str(error)
            break
    seen["inside_steps"] = inside
    seen["after_steps"] = _policies(scout_loops)
    seen["failed"] = failed
    seen["idle_policy"], seen["normal_policy"] = os.SCHED_IDLE, os.SCHED_OTHER
    seen["sequence"] = SEQUENCE
    job.close()
    return seen
