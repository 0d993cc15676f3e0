"""Real torch.distributed ranks for the observer tests: a forkserver that imports torch once,
then forks the ranks (gloo on CPU, OMP_NUM_THREADS=1). Every wait is bounded.

A rank program receives (rank, world_size, init_file, job_id, scenario, control) where control
is a queue of messages to the test; it reports ("ready", rank, record name, token) once its
record exists and ("done", rank, result) at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from scout.observer.progress import ProgressPublisher, RecordIdentity
from tests import processes

RANK_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 30.0


def forkserver_context() -> Any:
    """The suite's forkserver (tests/processes.py): torch imported once, so four ranks cost one
    torch import."""
    return processes.forkserver_context()


def blocked_rank_program(
    rank: int, world_size: int, init_file: str, job_id: str, release: Any, control: Any
) -> None:
    """Two all-reduces; rank 2 waits for ``release`` before the second, so the other ranks
    block inside it. Used to check what the record shows while a rank is blocked."""
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    import torch
    import torch.distributed as dist

    from scout.observer import instrument as scout_instrument

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=RANK_TIMEOUT_S),
    )
    original = dist.all_reduce
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, rank))
    scout_instrument.instrument(publisher)
    control.put(("ready", rank, publisher.name, publisher.token))
    scout_instrument.mark_step(1)
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if rank == 2:
        released = release.wait(RANK_TIMEOUT_S)
        assert released, "the test never released rank 2"
    dist.all_reduce(tensor)
    value = float(tensor[0])
    scout_instrument.uninstrument()
    restored = dist.all_reduce is original
    dist.barrier()
    dist.destroy_process_group()
    publisher.close()
    control.put(("done", rank, (value, restored)))


@contextmanager
def run_ranks(target: Any, world_size: int, tmp_path: Path, *extra: Any) -> Iterator[tuple[Any, list[Any]]]:
    """Start ``world_size`` ranks of ``target``; yield (control queue, processes); always reap."""
    context = forkserver_context()
    control = context.Queue(maxsize=64)
    init_file = str(tmp_path / "rendezvous")
    job_id = f"test-{os.getpid()}-{time.monotonic_ns()}"
    processes = [
        context.Process(target=target, args=(rank, world_size, init_file, job_id, *extra, control), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        yield control, processes
    finally:
        for process in processes:
            process.join(JOIN_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join(JOIN_TIMEOUT_S)


def collect(control: Any, kind: str, count: int, timeout_s: float = RANK_TIMEOUT_S) -> dict[int, Any]:
    """``count`` messages of ``kind`` from the ranks, keyed by rank; bounded wait."""
    found: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {sorted(found)} of {count} ranks sent {kind!r} in {timeout_s} s"
        message = control.get(timeout=remaining)
        if message[0] == kind:
            found[message[1]] = message[2:]
    return found
