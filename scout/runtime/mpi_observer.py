"""Observers for an MPI job: bootstrap over the MPI transport, observe over the UDP channel.

    from mpi4py import MPI
    from scout.transport.mpi import MpiTransport
    from scout.runtime.mpi_observer import start_mpi_observer

    transport = MpiTransport(MPI.COMM_WORLD)
    publisher, handle = start_mpi_observer(transport, config={"stall_threshold_s": 30.0})
    handle.wait_ready(120)
    ... publisher.begin_step(step); publisher.enter_collective(fp); comm.Allreduce(...); ...
    publisher.close(); handle.close()

Rank 0 draws the job's id and secret (and, unless given, a rendezvous directory under the
system's temporary directory: one host, or pass a directory on a shared filesystem); the
transport broadcasts them with a deadline, over its private duplicate of the communicator.
After that the observers do not use MPI at all: each is a spawned process that talks to its
peers over :class:`~scout.runtime.channel.UdpChannel`, exactly as for a torch job.

Why not an observer *thread* on a duplicated communicator inside each rank (which DESIGN.md
allows): a rank stopped with SIGSTOP, or stuck in a C extension holding the GIL, freezes every
thread in it, so such an observer would fall silent exactly when its evidence is needed; its
peers would then report it *unresponsive* after ``confirm_rounds`` rounds rather than *behind*
after one (the simulator shows both: ``observer-frozen`` and ``observer-process-frozen``). It
would also need ``MPI_THREAD_MULTIPLE`` and compete with the trainer for MPI's progress engine.
A separate process costs one interpreter per rank and a loopback or LAN UDP path between hosts.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import Any

from scout.runtime.observer import ObserverHandle, start_observer
from scout.runtime.progress import ProgressPublisher, RecordIdentity

__all__ = ["start_mpi_observer"]

BOOTSTRAP_TIMEOUT_S = 60.0


def start_mpi_observer(
    transport: Any,
    *,
    group_ranks: tuple[int, ...] | None = None,
    rendezvous_dir: str | None = None,
    config: dict[str, Any] | None = None,
    report_path: str | None = None,
    stats_path: str | None = None,
    on_report: Any = None,
    on_failure: str = "raise",
    timeout_s: float = BOOTSTRAP_TIMEOUT_S,
) -> tuple[ProgressPublisher, ObserverHandle]:
    """Collective over ``transport`` (an :class:`~scout.transport.mpi.MpiTransport`): every rank
    calls it. Returns this rank's progress publisher and its observer's handle. The peer group
    is ``group_ranks`` (default: every rank of the transport)."""
    rank = transport.rank
    bootstrap = None
    if rank == 0:
        directory = rendezvous_dir or tempfile.mkdtemp(prefix="scout-mpi-rendezvous-")
        bootstrap = (f"mpi-{os.getpid()}-{secrets.token_hex(4)}", secrets.token_bytes(32), directory)
    job_id, secret, directory = transport.broadcast(bootstrap, root=0, timeout_s=timeout_s)
    group = tuple(range(transport.size)) if group_ranks is None else tuple(group_ranks)
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, rank))
    handle = start_observer(
        publisher, group_ranks=group, secret=bytes(secret), rendezvous_dir=directory, config=config,
        report_path=report_path, stats_path=stats_path, on_report=on_report, on_failure=on_failure,
    )
    return publisher, handle
