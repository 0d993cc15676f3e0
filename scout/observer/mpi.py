"""Observers for an MPI job: the rendezvous and the secret over MPI itself, observing over UDP.

    from mpi4py import MPI
    from scout.transport.mpi import MpiTransport
    from scout.observer.mpi import start_mpi_observer

    transport = MpiTransport(MPI.COMM_WORLD)
    publisher, handle = start_mpi_observer(transport, config={"stall_threshold_s": 10.0})
    handle.wait_ready(120)
    ... publisher.begin_step(step); publisher.enter_collective(fp); comm.Allreduce(...); ...
    publisher.close(); handle.close()

Rank 0 draws the job's id and secret; the transport broadcasts them with a deadline over its
private duplicate of the communicator, and all-gathers the observers' addresses the same way
(:class:`~scout.observer.rendezvous.TransportRendezvous`): no shared directory, so the ranks may
sit on hosts that share no filesystem. After that the observers do not use MPI at all: each is a
separate process that talks to its peers over :class:`~scout.observer.channel.UdpChannel`,
exactly as for a torch job.

Why not an observer *thread* on a duplicated communicator inside each rank: a rank stopped with
SIGSTOP, or stuck in a C extension holding the GIL, freezes every thread in it, so such an
observer would fall silent exactly when its evidence is needed; its peers would then report it
*unresponsive* after ``confirm_rounds`` rounds rather than *behind* after one (the simulator
shows both: ``observer-frozen`` and ``observer-process-frozen``). It would also need
``MPI_THREAD_MULTIPLE`` and compete with the trainer for MPI's progress engine.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any

from scout.observer.launch import ObserverHandle, start_observer
from scout.observer.progress import ProgressPublisher, RecordIdentity
from scout.observer.rendezvous import TransportRendezvous

__all__ = ["start_mpi_observer"]

BOOTSTRAP_TIMEOUT_S = 60.0


def start_mpi_observer(
    transport: Any,
    *,
    group_ranks: tuple[int, ...] | None = None,
    config: dict[str, Any] | None = None,
    report_path: str | None = None,
    stats_path: str | None = None,
    on_report: Any = None,
    on_failure: str = "raise",
    bind_host: str | None = None,
    timeout_s: float = BOOTSTRAP_TIMEOUT_S,
) -> tuple[ProgressPublisher, ObserverHandle]:
    """Collective over ``transport`` (an :class:`~scout.transport.mpi.MpiTransport`): every rank
    calls it. Returns this rank's progress publisher and its observer's handle. The peer group
    is ``group_ranks`` (default: every rank of the transport). The observer binds ``bind_host``;
    by default loopback when every rank runs on this host, else this host's address."""
    rank = transport.rank
    bootstrap = (f"mpi-{os.getpid()}-{secrets.token_hex(4)}", secrets.token_bytes(32)) if rank == 0 else None
    job_id, secret = transport.broadcast(bootstrap, root=0, timeout_s=timeout_s)
    hostname = socket.gethostname()
    hostnames = transport.all_gather(hostname, timeout_s=timeout_s)
    if bind_host is None:
        bind_host = "127.0.0.1" if len(set(hostnames)) == 1 else socket.gethostbyname(hostname)
    group = tuple(range(transport.size)) if group_ranks is None else tuple(group_ranks)
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, rank))
    handle = start_observer(
        publisher, group_ranks=group, rendezvous=TransportRendezvous(transport, transport.group(group, "observers")),
        secret=bytes(secret), config=config, report_path=report_path, stats_path=stats_path, on_report=on_report,
        on_failure=on_failure, bind_host=bind_host, hostname=hostname, timeout_s=timeout_s,
    )
    return publisher, handle
