"""The observer side of ``scout.attach``: start one out-of-band observer for this trainer rank
and find its peers (docs/observer.md, docs/cluster.md). Collective over the job's ranks.

The observers of a replica group find each other through one of three rendezvous strategies,
chosen here and nowhere else:

* a shared directory (``rendezvous_dir``), when the job names one;
* the launcher's store (torchrun's agent store lives outside the trainers, so it survives a
  frozen rank 0): :class:`~scout.observer.rendezvous.StoreRendezvous`;
* otherwise scout's own gloo group at start-up -- every trainer is alive at attach, so one
  all-gather of the records suffices (:class:`GroupRendezvous`).

The HMAC secret that binds the group's datagrams comes from the launcher's store when there is
one, else rank 0 draws it and broadcasts it over the gloo group.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scout.observer.launch import ObserverHandle, start_observer
from scout.observer.progress import ProgressPublisher
from scout.observer.rendezvous import DirectoryRendezvous, StoreRendezvous, shared_secret

__all__ = ["GroupRendezvous", "start_job_observer"]

logger = logging.getLogger("scout")


def _single_host() -> bool:
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if local and world:
        return local == world
    return True


def _routable_address() -> str:
    """The address of this host's interface that reaches MASTER_ADDR (no packet is sent)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
            address: str = probe.getsockname()[0]
        except OSError:
            address = socket.gethostbyname(socket.gethostname())
    return address


class GroupRendezvous:
    """The observers' rendezvous over scout's own gloo group (when no launcher store is known)."""

    def __init__(self, group: Any, group_index: int) -> None:
        self.group = group
        self.group_index = group_index

    def exchange(self, position: int, size: int, record: str, timeout_s: float) -> list[str]:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (self.group_index, position, record), group=self.group)
        mine = sorted((p, r) for g, p, r in gathered if g == self.group_index)
        return [r for _, r in mine]


def start_job_observer(
    publisher: ProgressPublisher,
    *,
    group_ranks: Sequence[int],
    group_index: int,
    control: Any,
    observer_config: Mapping[str, Any],
    rendezvous_dir: str | None,
    observer_host: str | None,
    report_path: Path,
    exclude_hosts_path: Path,
    hostname: str,
    on_hang: str,
    kill_grace_s: float,
    timeout_s: float,
    rounds_path: Path | None = None,
) -> ObserverHandle | None:
    """Start this rank's observer among ``group_ranks`` (collective over the world: every rank
    calls it, with its own group). None when the rank has no peer to compare progress with."""
    identity = publisher.identity
    if len(group_ranks) < 2:
        logger.warning("scout: rank %d has no peer to compare progress with; its observer is off", identity.rank)
        return None
    prefix = f"scout/{identity.job_id}/{identity.generation}"
    store = None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        # torchrun's agent serves the store outside the trainers: it survives any of them.
        store = dist.TCPStore(  # type: ignore[attr-defined]
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=timedelta(seconds=timeout_s))
    if store is not None:
        secret = shared_secret(identity.rank, store=store, key=f"{prefix}/secret", timeout_s=timeout_s)
    else:
        box = [os.urandom(32) if identity.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=control)
        secret = bytes(box[0])  # type: ignore[arg-type]
    rendezvous: Any
    if rendezvous_dir is not None:
        rendezvous = DirectoryRendezvous(Path(rendezvous_dir) / prefix.replace("/", "_") / str(group_index))
    elif store is not None:
        rendezvous = StoreRendezvous(store, f"{prefix}/observers/{group_index}")
    else:
        rendezvous = GroupRendezvous(control, group_index)
    bind_host = observer_host or ("127.0.0.1" if _single_host() else _routable_address())
    return start_observer(
        publisher, group_ranks=group_ranks, rendezvous=rendezvous, secret=secret, config=dict(observer_config),
        report_path=report_path, on_failure="report", on_hang=on_hang, exclude_hosts_path=exclude_hosts_path,
        bind_host=bind_host, hostname=hostname, kill_grace_s=kill_grace_s, timeout_s=timeout_s,
        rounds_path=rounds_path,
    )
