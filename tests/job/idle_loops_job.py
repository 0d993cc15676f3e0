"""A rank of tests/job/test_idle_loops.py (run by tests.replay._launch, gloo, forked ranks):
``scout.attach`` on a small DDP model, and the scheduling policy of every gloo event-loop thread
of the process, read around scout's calls (spec/transport.md WAIT-5, WAIT-6). ``own_device``:
as a job whose default group has no gloo backend (NCCL only), scout's groups get a device of
their own (the one seam: ``gloo_groups._default_gloo_devices`` answers none)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import scout
from scout.transport import gloo_groups
from tests.replay._scenarios import SEQUENCE, VOCAB, TinyLM, _batch


def _policies(threads: frozenset[int]) -> dict[int, int]:
    return {thread: os.sched_getscheduler(thread) for thread in sorted(threads)}


def main(rank: int, world: int, *, steps: int = 6, fail_at: int | None = None, own_device: bool = False) -> dict[str, Any]:
    if own_device:
        gloo_groups._default_gloo_devices = lambda: []  # type: ignore[assignment]
    user_loops = gloo_groups.loop_threads()  # the default process group's, made before attach
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run_dir = Path(os.environ["SCOUT_TEST_SCRATCH"]) / "run"
    job = scout.attach(model, optimizer, run_dir=str(run_dir), observer=False, replay_interval_steps=1)
    scout_loops = gloo_groups.loop_threads() - user_loops
    seen: dict[str, Any] = {"user_loops": len(user_loops), "scout_loops": len(scout_loops),
                            "after_attach": _policies(scout_loops), "user_after_attach": _policies(user_loops)}
    inside: list[dict[int, int]] = []
    control = job.parts.control
    run = control.run

    def recording_run(program: Any) -> Any:
        inside.append(_policies(scout_loops))
        if fail_at is not None and len(inside) == fail_at:
            # What job.step() lets through (spec/guard.md GUARD-1: an error of scout's own would be
            # a report): an interrupt in the middle of scout's collectives.
            raise KeyboardInterrupt("a failure inside job.step()")
        return run(program)

    control.run = recording_run  # type: ignore[method-assign]
    job.restore()  # a rank program on the control group too (scout/job/restore.py): one call
    seen["calls_in_restore"] = len(inside)
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
        except KeyboardInterrupt as error:
            failed = str(error)
            break
    seen["inside_steps"] = inside
    seen["after_steps"] = _policies(scout_loops)
    replay = next(check for check in job.pipeline.checks if check.name == "replay")
    seen["replayed_steps"] = sorted({result.step for result in replay.runner.results})
    seen["backend"] = str(dist.get_backend(control.group))
    if failed is None:  # WAIT-6: a scout collective in flight on rank 0 delays no collective of the job's
        pending = dist.all_reduce(torch.ones(2), group=control.group, async_op=True) if rank == 0 else None
        user = torch.full((3,), float(rank + 1))
        dist.all_reduce(user)
        seen["user_sum_while_scout_pending"] = user.tolist()
        seen["scout_pending_then"] = pending is not None and not pending.is_completed()
        # Rank 1 joins scout's collective only after rank 0 looked (a job collective between them):
        # otherwise a rank 0 descheduled after the all-reduce could find it completed.
        dist.barrier()
        if pending is None:
            dist.all_reduce(torch.ones(2), group=control.group)
        else:
            pending.wait()
    seen["failed"] = failed
    seen["idle_policy"], seen["normal_policy"] = os.SCHED_IDLE, os.SCHED_OTHER
    seen["sequence"] = SEQUENCE
    job.close()
    return seen
