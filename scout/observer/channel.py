"""The observers' own channel: authenticated UDP datagrams between the observers of one group
(spec/observer.md OBS-AUTH-1..OBS-AUTH-8).

Why not the trainers' process group or a store served from inside a trainer: the channel must
keep working when any single trainer is frozen or dead. Each observer owns its socket; after the
rendezvous there is no central server at all, so no single process's death takes the channel
down. Datagrams may be lost or reordered -- the observer protocol is built for that (numbered
rounds, deadlines, missing evidence).

*What a datagram proves.* Header ``magic, version, group id, sender position, sender nonce,
sequence number`` then a 16-byte HMAC-SHA256 tag over header and body under the *group key*
(derived per group from the job's secret: :func:`scout.observer.rendezvous.group_key`). A
datagram is delivered only if (OBS-AUTH-*):

1. its length is between the header and ``DATAGRAM_BYTES_MAX`` and magic and version match;
2. its group id is this group's (a group sharing the job secret cannot inject into another);
3. its tag verifies under the group key (a stray process or another job is refused);
4. its sender position is a peer of the rendezvous record, and the datagram came from the
   address that record names for it (a captured datagram replayed from another socket is refused);
5. its nonce is the one that peer published at its start (a datagram of an earlier incarnation
   of that observer is refused);
6. its sequence number was not seen before from that sender, within a window of
   ``REPLAY_WINDOW`` (a duplicated or replayed datagram is refused; an older one beyond the
   window is refused as stale).

A refused datagram is counted by reason and logged at most once per :data:`LOG_INTERVAL_S`;
it never reaches the decoder.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import selectors
import socket
import struct
import sys
import time
from collections import Counter
from typing import Final

import attrs

__all__ = [
    "DATAGRAM_BYTES_MAX",
    "HEADER_BYTES",
    "REPLAY_WINDOW",
    "Peer",
    "UdpChannel",
]

_MAGIC: Final = b"SCOB"
_VERSION: Final = 2
# magic, version, group id, sender position, sender nonce, sequence number
_PREFIX: Final = struct.Struct("<4sB8sH8sQ")
_TAG_BYTES: Final = 16
HEADER_BYTES: Final = _PREFIX.size + _TAG_BYTES
DATAGRAM_BYTES_MAX: Final = 60_000  # below the UDP limit; a report of a 4096-rank group fits
RECEIVE_BATCH_MAX: Final = 256  # datagrams handled per receive() call: a flood cannot starve the loop
REPLAY_WINDOW: Final = 64  # sequence numbers remembered per sender (reordering tolerated within it)
LOG_INTERVAL_S: Final = 10.0
NONCE_BYTES: Final = 8
GROUP_ID_BYTES: Final = 8


@attrs.frozen
class Peer:
    """One observer of the group as the rendezvous recorded it."""

    host: str
    port: int
    nonce: bytes
    hostname: str = ""

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


class _SeenWindow:
    """Sequence numbers seen from one sender: the highest, and a bitmap of the ones below it."""

    __slots__ = ("bits", "highest")

    def __init__(self) -> None:
        self.highest = -1
        self.bits = 0

    def accept(self, sequence: int) -> str | None:
        """None if ``sequence`` is new (and remember it), else why it is refused."""
        if sequence > self.highest:
            shift = sequence - self.highest
            self.bits = ((self.bits << shift) | 1) & ((1 << REPLAY_WINDOW) - 1) if shift < REPLAY_WINDOW else 1
            self.highest = sequence
            return None
        behind = self.highest - sequence
        if behind >= REPLAY_WINDOW:
            return "stale"
        if self.bits >> behind & 1:
            return "duplicate"
        self.bits |= 1 << behind
        return None


class UdpChannel:
    """One observer's end of its group's channel. ``peers`` is set once by the rendezvous."""

    def __init__(self, group_key: bytes, group_id: bytes, position: int, *, host: str = "127.0.0.1") -> None:
        if len(group_key) < 16:
            raise ValueError(f"the group key must be at least 16 bytes, got {len(group_key)}")
        if len(group_id) != GROUP_ID_BYTES:
            raise ValueError(f"the group id must be {GROUP_ID_BYTES} bytes, got {len(group_id)}")
        if not 0 <= position < 2**16:
            raise ValueError(f"position must be in [0, 65536), got {position}")
        self.key = group_key
        self.group_id = group_id
        self.position = position
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.socket.bind((host, 0))
        except OSError as error:
            self.socket.close()
            raise OSError(f"the observer cannot bind a UDP socket on {host!r}: {error}; set the observer "
                          "interface (observer_host) to an address of this host") from error
        self.socket.setblocking(False)
        self.address: tuple[str, int] = self.socket.getsockname()
        self.peers: dict[int, Peer] = {}
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.socket, selectors.EVENT_READ)
        self._sequence = 0
        self._seen: dict[int, _SeenWindow] = {}
        self.sent = 0
        self.received = 0
        self.refused: Counter[str] = Counter()
        self.send_errors = 0
        self._last_log_s = -LOG_INTERVAL_S

    def set_peers(self, peers: dict[int, Peer]) -> None:
        """The rendezvous record: every position of the group, this one included."""
        own = peers.get(self.position)
        if own is None or own.nonce != self.nonce:
            raise ValueError(f"the rendezvous record for position {self.position} is not this observer's")
        self.peers = dict(peers)
        self._seen = {position: _SeenWindow() for position in peers}

    def _tag(self, prefix: bytes, body: bytes) -> bytes:
        return hmac.new(self.key, prefix + body, hashlib.sha256).digest()[:_TAG_BYTES]

    def send(self, position: int, body: bytes) -> None:
        if len(body) + HEADER_BYTES > DATAGRAM_BYTES_MAX:
            raise ValueError(f"message of {len(body)} bytes exceeds DATAGRAM_BYTES_MAX={DATAGRAM_BYTES_MAX}")
        self._sequence += 1
        prefix = _PREFIX.pack(_MAGIC, _VERSION, self.group_id, self.position, self.nonce, self._sequence)
        try:
            self.socket.sendto(prefix + self._tag(prefix, body) + body, self.peers[position].address)
            self.sent += 1
        except OSError:
            # A full buffer or an unreachable peer is a lost message: the protocol copes.
            self.send_errors += 1

    def receive(self, timeout_s: float) -> list[tuple[int, bytes]]:
        """Authenticated datagrams that arrive within ``timeout_s`` (at most RECEIVE_BATCH_MAX)."""
        messages: list[tuple[int, bytes]] = []
        if not self.selector.select(max(0.0, timeout_s)):
            return messages
        for _ in range(RECEIVE_BATCH_MAX):
            try:
                datagram, source = self.socket.recvfrom(DATAGRAM_BYTES_MAX + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            checked = self.check(datagram, source)
            if checked is not None:
                messages.append(checked)
        return messages

    def check(self, datagram: bytes, source: tuple[str, int]) -> tuple[int, bytes] | None:
        """The (sender position, body) of an acceptable datagram, else None (counted)."""
        if not HEADER_BYTES <= len(datagram) <= DATAGRAM_BYTES_MAX:
            return self._refuse(source, "size")
        magic, version, group_id, sender, nonce, sequence = _PREFIX.unpack_from(datagram)
        if magic != _MAGIC or version != _VERSION:
            return self._refuse(source, "not-scout")
        if group_id != self.group_id:
            return self._refuse(source, "foreign-group")
        prefix = datagram[: _PREFIX.size]
        tag = datagram[_PREFIX.size : HEADER_BYTES]
        body = datagram[HEADER_BYTES:]
        if not hmac.compare_digest(tag, self._tag(prefix, body)):
            return self._refuse(source, "bad-tag")
        peer = self.peers.get(sender)
        if peer is None or sender == self.position:
            return self._refuse(source, "unknown-sender")
        if tuple(source[:2]) != peer.address:
            return self._refuse(source, "wrong-address")
        if nonce != peer.nonce:
            return self._refuse(source, "old-incarnation")
        why = self._seen[sender].accept(sequence)
        if why is not None:
            return self._refuse(source, why)
        self.received += 1
        return sender, body

    def _refuse(self, source: object, why: str) -> tuple[int, bytes] | None:
        self.refused[why] += 1
        now = time.monotonic()
        if now - self._last_log_s >= LOG_INTERVAL_S:
            self._last_log_s = now
            print(f"scout: observer {self.position} refused a datagram from {source}: {why} "
                  f"({sum(self.refused.values())} refused so far)", file=sys.stderr, flush=True)
        return None

    def close(self) -> None:
        self.selector.close()
        self.socket.close()
