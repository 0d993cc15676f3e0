"""Trainer programs for the observer runtime tests.

``plain_rank``: no torch. A "training step" publishes three layers of progress and then enters
a "collective" -- a multiprocessing barrier with a bounded wait -- so that one rank holding back
blocks the others inside it, as a real all-reduce would. ``gloo_rank``: the same scenarios over a
real gloo process group with instrumented torch.distributed calls.

Every program reports to the test through ``control`` (a bounded queue): ("ready", rank, trainer
pid, observer pid), ("report", rank, record) from the observer's callback, ("done", rank, info).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.observer.launch import start_observer
from scout.observer.progress import ProgressPublisher, RecordIdentity
from scout.observer.rendezvous import DirectoryRendezvous
from tests import processes

COLLECTIVE_FINGERPRINT = fingerprint(CollectiveCall("all_reduce", None, (TensorMeta("torch.float32", (4,)),),
                                                    reduce_op="SUM"))
OTHER_FINGERPRINT = fingerprint(CollectiveCall("barrier"))
WAIT_MAX_S = 60.0


def _observe(publisher: ProgressPublisher, rank: int, world: int, options: dict[str, Any], control: Any) -> Any:
    group = tuple(options.get("group", range(world)))
    if rank not in group:
        return None
    handle = start_observer(
        publisher,
        group_ranks=group,
        secret=options["secret"],
        rendezvous=DirectoryRendezvous(options["rendezvous_dir"]),
        config=options["config"],
        report_path=options["report_path"],
        stats_path=os.path.join(options["directory"], f"stats-{rank}.json"),
        on_report=lambda record: control.put(("report", rank, record)),
        on_failure="report",
        poll_interval_s=options.get("poll_interval_s", 0.05),
    )
    return handle


def plain_rank(rank: int, world: int, job_id: str, options: dict[str, Any], barrier: Any, control: Any) -> None:
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    scenario = options["scenario"]
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, rank))
    handle = _observe(publisher, rank, world, options, control)
    if handle is not None:
        handle.wait_ready(WAIT_MAX_S)
    control.put(("ready", rank, os.getpid(), None if handle is None else handle.pid))
    barrier.wait(WAIT_MAX_S)
    step_s = options.get("step_s", 0.05)
    for step in range(1, options.get("steps", 4) + 1):
        publisher.begin_step(step)
        if handle is not None:
            handle.check()
        for _ in range(3):
            time.sleep(step_s / 3)
            publisher.advance()
        hold = scenario == "behind" and rank == 2 and step == 3
        if hold or (scenario == "group" and rank not in options["group"] and step == 3):
            time.sleep(options["hold_s"])
        desync = scenario == "desync" and rank == 1 and step == 3
        publisher.enter_collective(OTHER_FINGERPRINT if desync else COLLECTIVE_FINGERPRINT)
        if desync:
            time.sleep(options["hold_s"])  # blocked in another collective, which never completes
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(options.get("collective_timeout_s", WAIT_MAX_S))
        publisher.exit_collective()
    publisher.close()
    if handle is not None:
        handle.close()
    control.put(("done", rank, None))


def gloo_rank(rank: int, world: int, job_id: str, options: dict[str, Any], control: Any) -> None:
    """Real gloo ranks, instrumented torch.distributed. Scenarios: behind (rank 2 sleeps before
    the all-reduce of step 3), desync (rank 1 calls barrier where the others all-reduce), group
    (rank 4, outside the observed group, sleeps: everyone observed blocks in one all-reduce),
    sigstop (rank 3 stops itself with SIGSTOP in the compute of step 3), killed (the test kills rank 1; the others keep waiting),
    observer_killed (the test kills rank 2's observer; later rank 0 holds back), healthy."""
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    import torch
    import torch.distributed as dist

    from scout.observer import instrument as scout

    torch.set_num_threads(1)
    scenario = options["scenario"]
    dist.init_process_group("gloo", init_method=f"file://{options['init_file']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=options.get("collective_timeout_s", WAIT_MAX_S)))
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, rank))
    handle = _observe(publisher, rank, world, options, control)
    scout.instrument(publisher)
    if handle is not None:
        scout.check_at_each_step(handle.check)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    scout.instrument_module(model)
    if handle is not None:
        handle.wait_ready(WAIT_MAX_S)
    control.put(("ready", rank, os.getpid(), None if handle is None else handle.pid))
    dist.barrier()
    step_s = options.get("step_s", 0.05)
    info: dict[str, Any] = {}
    for step in range(1, options.get("steps", 4) + 1):
        scout.mark_step(step)
        model(torch.ones(1, 8))
        time.sleep(step_s)
        if scenario == "sigstop" and rank == 3 and step == options.get("stop_step", 3):
            # Frozen by SIGSTOP in its compute, before this step's all-reduce: always the same
            # place, so the others block in that all-reduce and this rank is behind them
            # (stopped from outside at a random moment it could be inside the all-reduce too).
            os.kill(os.getpid(), signal.SIGSTOP)
        tensor = torch.ones(4)
        holds = (scenario == "behind" and rank == 2) or (scenario == "group" and rank == 4) or (
            scenario == "observer_killed" and rank == 0)
        if holds and step == options.get("hold_step", 3):
            control.put(("holding", rank, time.monotonic()))
            time.sleep(options["hold_s"])
        try:
            if scenario == "desync" and rank == 1 and step == 3:
                dist.barrier()
            else:
                dist.all_reduce(tensor)
        except RuntimeError as error:
            # A dead peer makes gloo fail fast: stay here, stuck, as a rank waiting on a dead
            # peer would under NCCL, until the test is done.
            info["collective_error"] = str(error)[:200]
            control.put(("stuck", rank, step))
            time.sleep(options.get("stuck_s", 30.0))
            break
    scout.uninstrument()
    publisher.close()
    if handle is not None:
        handle.close()
    control.put(("done", rank, info))
    control.close()
    control.join_thread()  # flush the queue before the hard exit below
    os._exit(0)  # skip process-group teardown: peers may be gone
