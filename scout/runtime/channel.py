"""The observers' own channel: authenticated UDP datagrams between the observers of a group.

Why not the trainers' process group or a store served from inside a trainer: the channel must
keep working when any single trainer is frozen or dead (issue 4). Each observer owns its socket;
after rendezvous there is no central server at all, so no single process's death takes the
channel down. Datagrams may be lost -- the observer protocol is built for that (numbered rounds,
deadlines, missing evidence).

*Authentication.* Every datagram carries an HMAC-SHA256 tag (truncated to 16 bytes) under the
job's secret. A datagram without a valid tag -- a stray process, another job, a corrupt packet --
is refused, counted, and logged (at most once per :data:`LOG_INTERVAL_S`), never decoded.

*Rendezvous.* Each observer publishes ``host port`` under its position and reads everyone
else's, until all are there or the deadline passes; then :class:`RendezvousFailed` names the
positions that never appeared. :class:`DirectoryRendezvous` uses a directory on a filesystem the
observers share (one host, or a shared filesystem); a torch job can use
:class:`StoreRendezvous` over a ``torch.distributed`` store hosted outside the trainers (the
observer of position 0 serves a fresh ``TCPStore``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import selectors
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Final, Protocol

__all__ = [
    "DATAGRAM_BYTES_MAX",
    "DirectoryRendezvous",
    "Rendezvous",
    "RendezvousFailed",
    "StoreRendezvous",
    "UdpChannel",
]

_MAGIC: Final = b"SCOB"
_HEADER: Final = struct.Struct("<4sBH16s")  # magic, version, sender position, tag
_VERSION: Final = 1
_TAG_BYTES: Final = 16
DATAGRAM_BYTES_MAX: Final = 60_000  # below the UDP limit; a report of a 4096-rank group fits
RECEIVE_BATCH_MAX: Final = 256  # datagrams handled per receive() call: a flood cannot starve the loop
LOG_INTERVAL_S: Final = 10.0
_POLL_S: Final = 0.02


class RendezvousFailed(RuntimeError):
    """The observers of a group did not all appear before the deadline."""


class Rendezvous(Protocol):
    def publish(self, position: int, address: tuple[str, int]) -> None: ...

    def collect(self, group_size: int, deadline_s: float) -> dict[int, tuple[str, int]]: ...


def _parse_address(text: str, where: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(" ")
    if not host or not port.isdigit():
        raise RendezvousFailed(f"{where} holds {text!r}, not 'host port'")
    return host, int(port)


class DirectoryRendezvous:
    """Addresses as files ``<directory>/<position>.addr``, written atomically. The directory
    must be unique per (job, generation, group): use a fresh one per launch."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def publish(self, position: int, address: tuple[str, int]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{position}.addr"
        temporary = self.directory / f".{position}.addr.{os.getpid()}"
        temporary.write_text(f"{address[0]} {address[1]}\n", encoding="utf-8")
        os.replace(temporary, final)

    def collect(self, group_size: int, deadline_s: float) -> dict[int, tuple[str, int]]:
        found: dict[int, tuple[str, int]] = {}
        while True:
            for position in range(group_size):
                if position in found:
                    continue
                path = self.directory / f"{position}.addr"
                try:
                    text = path.read_text(encoding="utf-8")
                except FileNotFoundError:
                    continue
                found[position] = _parse_address(text, str(path))
            if len(found) == group_size:
                return found
            if time.monotonic() >= deadline_s:
                missing = sorted(set(range(group_size)) - set(found))
                raise RendezvousFailed(
                    f"observers at positions {missing} did not appear in {self.directory} before the "
                    "deadline (join_deadline_s): their processes did not start, or cannot reach this directory"
                )
            time.sleep(_POLL_S)


class StoreRendezvous:
    """Addresses as keys ``scout-observer/<group>/<position>`` in a key-value store with the
    ``torch.distributed.Store`` interface (``set``, ``get``, ``check``)."""

    def __init__(self, store: Any, group_key: str) -> None:
        self.store = store
        self.prefix = f"scout-observer/{group_key}/"

    def publish(self, position: int, address: tuple[str, int]) -> None:
        self.store.set(f"{self.prefix}{position}", f"{address[0]} {address[1]}")

    def collect(self, group_size: int, deadline_s: float) -> dict[int, tuple[str, int]]:
        found: dict[int, tuple[str, int]] = {}
        while True:
            for position in range(group_size):
                key = f"{self.prefix}{position}"
                if position not in found and self.store.check([key]):
                    found[position] = _parse_address(self.store.get(key).decode(), key)
            if len(found) == group_size:
                return found
            if time.monotonic() >= deadline_s:
                missing = sorted(set(range(group_size)) - set(found))
                raise RendezvousFailed(f"observers at positions {missing} did not register in the store before the deadline")
            time.sleep(_POLL_S)


class UdpChannel:
    """One observer's end of the group channel."""

    def __init__(self, secret: bytes, position: int, *, host: str = "127.0.0.1") -> None:
        if len(secret) < 16:
            raise ValueError(f"the job secret must be at least 16 bytes, got {len(secret)}")
        self.secret = secret
        self.position = position
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind((host, 0))
        self.socket.setblocking(False)
        self.address: tuple[str, int] = self.socket.getsockname()
        self.peers: dict[int, tuple[str, int]] = {}
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.socket, selectors.EVENT_READ)
        self.sent = 0
        self.received = 0
        self.refused = 0  # bad tag, bad header, unknown sender
        self.send_errors = 0
        self._last_log_s = -LOG_INTERVAL_S

    def join(self, rendezvous: Rendezvous, group_size: int, deadline_s: float) -> None:
        rendezvous.publish(self.position, self.address)
        self.peers = rendezvous.collect(group_size, deadline_s)

    def _tag(self, header: bytes, body: bytes) -> bytes:
        return hmac.new(self.secret, header + body, hashlib.sha256).digest()[:_TAG_BYTES]

    def send(self, position: int, body: bytes) -> None:
        if len(body) > DATAGRAM_BYTES_MAX:
            raise ValueError(f"message of {len(body)} bytes exceeds DATAGRAM_BYTES_MAX={DATAGRAM_BYTES_MAX}")
        prefix = _MAGIC + bytes([_VERSION]) + struct.pack("<H", self.position)
        datagram = prefix + self._tag(prefix, body) + body
        try:
            self.socket.sendto(datagram, self.peers[position])
            self.sent += 1
        except OSError:
            # A full buffer or an unreachable peer is a lost message: the protocol copes.
            self.send_errors += 1

    def receive(self, timeout_s: float) -> list[tuple[int, bytes]]:
        """Authenticated datagrams that arrive within ``timeout_s`` (at most RECEIVE_BATCH_MAX)."""
        messages: list[tuple[int, bytes]] = []
        if not self.selector.select(max(0.0, timeout_s)):
            return messages
        while len(messages) < RECEIVE_BATCH_MAX:
            try:
                datagram, source = self.socket.recvfrom(DATAGRAM_BYTES_MAX + _HEADER.size)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            checked = self._check(datagram, source)
            if checked is not None:
                messages.append(checked)
        return messages

    def _check(self, datagram: bytes, source: Any) -> tuple[int, bytes] | None:
        if len(datagram) < _HEADER.size or datagram[:4] != _MAGIC or datagram[4] != _VERSION:
            return self._refuse(source, "not a scout observer datagram")
        (sender,) = struct.unpack_from("<H", datagram, 5)
        tag = datagram[7 : 7 + _TAG_BYTES]
        body = datagram[_HEADER.size :]
        if not hmac.compare_digest(tag, self._tag(datagram[:7], body)):
            return self._refuse(source, "wrong job token (authentication tag mismatch)")
        if sender not in self.peers:
            return self._refuse(source, f"unknown sender position {sender}")
        self.received += 1
        return sender, body

    def _refuse(self, source: Any, why: str) -> tuple[int, bytes] | None:
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log_s >= LOG_INTERVAL_S:
            self._last_log_s = now
            print(f"scout: observer {self.position} refused a datagram from {source}: {why} "
                  f"({self.refused} refused so far)", file=sys.stderr, flush=True)
        return None  # refused: nothing to deliver

    def close(self) -> None:
        self.selector.close()
        self.socket.close()
