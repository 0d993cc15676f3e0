"""How the observers of a group learn each other's addresses, and the keys they authenticate with
(spec/observer.md OBS-AUTH-*).

The rendezvous runs on the *trainer* side, once, before training starts, while every trainer is
alive: each trainer starts its observer (which binds its UDP socket and reports its address and
a fresh nonce), the trainers exchange those records through what the launcher already runs, and
each hands the table to its observer. After that the observers need nothing but their sockets.

- :class:`StoreRendezvous` -- a ``torch.distributed`` store. Under ``torchrun`` the default
  process group's store is the elastic agent's (``TORCHELASTIC_USE_AGENT_STORE``): it lives
  outside the trainers, at ``MASTER_ADDR:MASTER_PORT``, so no trainer hosts it;
- :class:`TransportRendezvous` -- an all-gather over a scout transport, e.g. MPI on a
  duplicated communicator under ``mpiexec``;
- :class:`DirectoryRendezvous` -- files in a directory every rank sees; an explicit option for
  one host or a shared filesystem, never the default.

*Keys.* One random 32-byte secret per job attempt comes from rank 0 through the same store or an
MPI broadcast (:func:`shared_secret`); it is never written to a file. Each group's key is
``HMAC-SHA256(secret, "scout/observer-group/" + group id)`` with the group id derived from the
job id, the restart generation and the group's ranks, so a datagram is bound to its group and to
this attempt, and an observer process only ever holds its own group's key.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from scout.observer.channel import GROUP_ID_BYTES, Peer

__all__ = [
    "DirectoryRendezvous",
    "Rendezvous",
    "RendezvousFailed",
    "StoreRendezvous",
    "TransportRendezvous",
    "group_id",
    "group_key",
    "peer_record",
    "peers_from_records",
    "shared_secret",
]

SECRET_BYTES: Final = 32
RECORD_BYTES_MAX: Final = 4096
_POLL_S: Final = 0.02


class RendezvousFailed(RuntimeError):
    """The observers of a group did not all appear before the deadline."""


def group_id(job_id: str, generation: int, ranks: Sequence[int]) -> bytes:
    """8 bytes naming one group of one job attempt."""
    text = json.dumps(["scout-observer-group", job_id, int(generation), [int(r) for r in ranks]])
    return hashlib.blake2b(text.encode(), digest_size=GROUP_ID_BYTES).digest()


def group_key(secret: bytes, group: bytes) -> bytes:
    """The key of one group's channel, derived from the job secret (OBS-AUTH-3)."""
    if len(secret) < 16:
        raise ValueError(f"the job secret must be at least 16 bytes, got {len(secret)}")
    return hmac.new(secret, b"scout/observer-group/" + group, hashlib.sha256).digest()


def peer_record(host: str, port: int, nonce: bytes, hostname: str) -> str:
    """What one observer publishes: its address, its start nonce and its host's name."""
    return json.dumps({"host": host, "port": port, "nonce": nonce.hex(), "hostname": hostname}, sort_keys=True)


def peers_from_records(records: Sequence[str]) -> dict[int, Peer]:
    """The rendezvous table, by position; RendezvousFailed naming a malformed record."""
    peers: dict[int, Peer] = {}
    for position, text in enumerate(records):
        try:
            value = json.loads(text)
            peer = Peer(str(value["host"]), int(value["port"]), bytes.fromhex(value["nonce"]), str(value["hostname"]))
        except (ValueError, KeyError, TypeError) as error:
            raise RendezvousFailed(f"the rendezvous record of position {position} is malformed: {text[:200]!r}") from error
        if not 0 < peer.port < 65536:
            raise RendezvousFailed(f"the rendezvous record of position {position} names port {peer.port}")
        peers[position] = peer
    return peers


class Rendezvous(Protocol):
    def exchange(self, position: int, size: int, record: str, timeout_s: float) -> list[str]:
        """Publish this position's record; return every position's, in position order.
        Collective over the group's trainers; RendezvousFailed naming the missing positions."""
        ...


def _check_record(record: str) -> bytes:
    data = record.encode()
    if len(data) > RECORD_BYTES_MAX:
        raise ValueError(f"a rendezvous record is at most {RECORD_BYTES_MAX} bytes, got {len(data)}")
    return data


class StoreRendezvous:
    """Records as keys ``<prefix>/<position>`` of a store with the ``torch.distributed.Store``
    interface (``set``, ``get``, ``wait``, ``check``)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")

    def exchange(self, position: int, size: int, record: str, timeout_s: float) -> list[str]:
        self.store.set(f"{self.prefix}/{position}", _check_record(record))
        keys = [f"{self.prefix}/{p}" for p in range(size)]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=timeout_s))
        except Exception as error:  # torch raises DistStoreError (a RuntimeError) on timeout
            missing = [p for p, key in enumerate(keys) if not self.store.check([key])]
            raise RendezvousFailed(
                f"observers at positions {missing} did not register in the store under {self.prefix!r} within "
                f"{timeout_s} s: their trainers did not call scout.attach, or it failed there ({error})"
            ) from error
        return [bytes(self.store.get(key)).decode() for key in keys]


class TransportRendezvous:
    """Records gathered with ``transport.all_gather`` over ``group`` (e.g. MPI)."""

    def __init__(self, transport: Any, group: Any = None) -> None:
        self.transport = transport
        self.group = group

    def exchange(self, position: int, size: int, record: str, timeout_s: float) -> list[str]:
        _check_record(record)
        from scout.transport.base import DeadlineExceeded

        try:
            gathered = self.transport.all_gather(record, timeout_s=timeout_s, group=self.group)
        except DeadlineExceeded as error:
            raise RendezvousFailed(f"the observers' rendezvous did not complete within {timeout_s} s: {error}") from error
        if len(gathered) != size or not all(isinstance(item, str) for item in gathered):
            raise RendezvousFailed(f"the rendezvous gathered {len(gathered)} records for a group of {size}")
        return list(gathered)


class DirectoryRendezvous:
    """Records as files ``<directory>/<position>.json``, written atomically. The directory must
    be unique per (job, generation, group) and visible to every rank of the group."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def exchange(self, position: int, size: int, record: str, timeout_s: float) -> list[str]:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{position}.json"
        temporary = self.directory / f".{position}.json.{os.getpid()}"
        temporary.write_bytes(_check_record(record))
        os.replace(temporary, final)
        deadline = time.monotonic() + timeout_s
        found: dict[int, str] = {}
        while True:
            for p in range(size):
                if p not in found:
                    with contextlib.suppress(FileNotFoundError):
                        found[p] = (self.directory / f"{p}.json").read_text(encoding="utf-8")
            if len(found) == size:
                return [found[p] for p in range(size)]
            if time.monotonic() >= deadline:
                missing = sorted(set(range(size)) - set(found))
                raise RendezvousFailed(
                    f"observers at positions {missing} did not appear in {self.directory} within {timeout_s} s: "
                    "their trainers did not start, or cannot reach this directory"
                )
            time.sleep(_POLL_S)


def shared_secret(rank: int, *, store: Any = None, key: str = "", transport: Any = None, timeout_s: float) -> bytes:
    """The job attempt's secret: drawn by rank 0, shared through ``store`` (under ``key``) or a
    broadcast over ``transport``. Collective over the job's trainers."""
    if store is not None:
        if rank == 0:
            store.set(key, secrets.token_bytes(SECRET_BYTES).hex())
        try:
            store.wait([key], datetime.timedelta(seconds=timeout_s))
        except Exception as error:
            raise RendezvousFailed(f"rank 0 did not publish the job secret under {key!r} within {timeout_s} s") from error
        return bytes.fromhex(bytes(store.get(key)).decode())
    if transport is not None:
        value = transport.broadcast(secrets.token_bytes(SECRET_BYTES) if rank == 0 else None, root=0,
                                    timeout_s=timeout_s)
        return bytes(value)
    raise ValueError("shared_secret needs a store or a transport")
