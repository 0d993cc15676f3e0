"""The observers' channel and rendezvous (spec/observer.md OBS-AUTH-1..OBS-AUTH-8): every
datagram an attacker or an unlucky network could produce is refused before it reaches the
decoder, and a live observer process survives all of them."""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout.core.observer import (
    Delegate,
    Evidence,
    Finding,
    Reply,
    Request,
    RoundId,
    Scope,
    Stage,
    StallKind,
    StallReport,
)
from scout.observer import wire
from scout.observer.channel import HEADER_BYTES, UdpChannel
from scout.observer.rendezvous import (
    DirectoryRendezvous,
    RendezvousFailed,
    StoreRendezvous,
    group_id,
    group_key,
    peer_record,
    peers_from_records,
)

pytestmark = pytest.mark.processes

SECRET = secrets.token_bytes(32)


def _pair(group: tuple[int, ...] = (0, 1), secret: bytes = SECRET) -> tuple[UdpChannel, UdpChannel]:
    gid = group_id("job", 0, group)
    first, second = (UdpChannel(group_key(secret, gid), gid, p) for p in (0, 1))
    records = [peer_record(*c.address, c.nonce, "host") for c in (first, second)]
    peers = peers_from_records(records)
    first.set_peers(peers)
    second.set_peers(peers)
    return first, second


def _collect(channel: UdpChannel, want: int, timeout_s: float = 2.0) -> list[tuple[int, bytes]]:
    received: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(received) + sum(channel.refused.values()) < want:
        received += channel.receive(0.05)
    return received


@pytest.fixture
def pair():  # type: ignore[no-untyped-def]
    first, second = _pair()
    yield first, second
    first.close()
    second.close()


def _raw(second: UdpChannel, body: bytes) -> bytes:
    """Capture what ``second`` puts on the wire for ``body``."""
    sniffer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sniffer.bind(("127.0.0.1", 0))
    real = second.peers[0]
    try:
        second.peers[0] = type(real)(*sniffer.getsockname(), real.nonce, real.hostname)
        second.send(0, body)
        sniffer.settimeout(2)
        datagram, _ = sniffer.recvfrom(70_000)
    finally:
        second.peers[0] = real
        sniffer.close()
    return datagram


def test_OBS_AUTH_1_genuine_datagrams_are_delivered_once(pair) -> None:  # type: ignore[no-untyped-def]
    first, second = pair
    second.send(0, b"genuine")
    second.send(0, b"again")
    assert _collect(first, 2) == [(1, b"genuine"), (1, b"again")]


def test_OBS_AUTH_2_truncated_and_oversized_datagrams_are_refused(pair) -> None:  # type: ignore[no-untyped-def]
    first, second = pair
    datagram = _raw(second, b"x" * 10)
    second.socket.sendto(datagram[: HEADER_BYTES - 1], first.address)
    second.socket.sendto(b"SCOB", first.address)
    assert _collect(first, 2) == [] and first.refused["size"] == 2
    assert first.check(b"\0" * 60_001, second.address) is None and first.refused["size"] == 3


def test_OBS_AUTH_3_a_datagram_of_another_group_sharing_the_secret_is_refused() -> None:
    first, second = _pair((0, 1))
    other_first, other_second = _pair((2, 3))
    try:
        foreign = _raw(other_second, b"from another group")
        other_second.socket.close()
        # The other group's datagram, sent from the address the rendezvous gave position 1 here.
        second.socket.sendto(foreign, first.address)
        assert _collect(first, 1) == [] and first.refused["foreign-group"] == 1
    finally:
        for channel in (first, second, other_first):
            channel.close()


def test_OBS_AUTH_4_a_datagram_without_the_group_key_is_refused() -> None:
    first, second = _pair()
    _, stranger = _pair(secret=secrets.token_bytes(32))
    try:
        stranger.group_id = first.group_id
        forged = _raw(stranger, b"forged")
        second.socket.sendto(forged, first.address)
        assert _collect(first, 1) == [] and first.refused["bad-tag"] == 1
    finally:
        for channel in (first, second, stranger):
            channel.close()


def test_OBS_AUTH_5_a_captured_datagram_replayed_from_another_socket_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    first, second = pair
    captured = _raw(second, b"evidence")
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        attacker.sendto(captured, first.address)
        assert _collect(first, 1) == [] and first.refused["wrong-address"] == 1
    finally:
        attacker.close()


def test_OBS_AUTH_6_a_datagram_of_an_earlier_incarnation_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    first, second = pair
    old = _raw(second, b"before the restart")
    # The observer at position 1 restarted on the same address with a new nonce, and the new
    # rendezvous record says so; a datagram of its earlier incarnation is replayed.
    record = first.peers[1]
    first.peers[1] = type(record)(record.host, record.port, secrets.token_bytes(8), record.hostname)
    second.socket.sendto(old, first.address)
    assert _collect(first, 1) == [] and first.refused["old-incarnation"] == 1


def test_OBS_AUTH_7_duplicates_and_stale_sequence_numbers_are_refused(pair) -> None:  # type: ignore[no-untyped-def]
    first, second = pair
    captured = _raw(second, b"once")
    second.socket.sendto(captured, first.address)
    second.socket.sendto(captured, first.address)
    assert _collect(first, 2) == [(1, b"once")] and first.refused["duplicate"] == 1
    for _ in range(70):  # move the window past the captured sequence number
        second.send(0, b"later")
    assert len(_collect(first, 70 + 1)) == 70
    second.socket.sendto(captured, first.address)
    assert _collect(first, 1 + 70 + 1) == [] and first.refused["stale"] == 1


def _report(positions: tuple[int, ...]) -> StallReport:
    evidence = tuple(Evidence(1, 3, 0, Stage.COMPUTE, 2.0) for _ in range(3))
    return StallReport(StallKind.HANG, Finding.BEHIND, Scope.RANK, (1, 3), RoundId(0, 1), 0, 0, positions, (), (),
                       evidence, 2.0, "x")


@pytest.mark.parametrize("positions", [(3,), (-1,), (0, 7)])
def test_OBS_AUTH_8_out_of_range_positions_in_any_message_are_refused(positions: tuple[int, ...]) -> None:
    for message in (Request(RoundId(positions[-1], 1)), Reply(RoundId(0, 1), positions[-1], None),
                    Delegate(RoundId(0, 1), 1, _report(positions))):
        with pytest.raises(wire.WireError):
            wire.decode_message(wire.encode_message(message), 3)
    assert wire.decode_message(wire.encode_message(Delegate(RoundId(0, 1), 1, _report((2,)))), 3)


def test_OBS_AUTH_rendezvous_through_a_store_names_the_missing_positions() -> None:
    class Store:  # the torch.distributed.Store methods StoreRendezvous uses
        def __init__(self) -> None:
            self.data: dict[str, bytes] = {}

        def set(self, key: str, value: bytes) -> None:
            self.data[key] = bytes(value)

        def get(self, key: str) -> bytes:
            return self.data[key]

        def check(self, keys: list[str]) -> bool:
            return all(k in self.data for k in keys)

        def wait(self, keys: list[str], timeout: object) -> None:
            if not self.check(keys):
                raise RuntimeError("timed out")

    store = Store()
    with pytest.raises(RendezvousFailed, match=r"positions \[1\] did not register"):
        StoreRendezvous(store, "scout/job/0").exchange(0, 2, "zero", 0.1)
    store.set("scout/job/0/1", b"one")
    assert StoreRendezvous(store, "scout/job/0").exchange(0, 2, "zero", 0.1) == ["zero", "one"]


def test_OBS_AUTH_directory_rendezvous_names_the_missing_positions(tmp_path: Path) -> None:
    with pytest.raises(RendezvousFailed, match=r"positions \[1, 2\] did not appear"):
        DirectoryRendezvous(tmp_path / "rdzv").exchange(0, 3, "zero", 0.2)


def test_OBS_AUTH_a_live_observer_survives_every_probe(tmp_path: Path) -> None:
    """A real observer process, joined with one real peer channel (this test), is sent each
    hostile datagram in turn; it refuses them all and is still alive and answering."""
    from scout.observer.launch import _environment
    from scout.observer.progress import ProgressPublisher, RecordIdentity

    job_id = f"probe-{secrets.token_hex(4)}"
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, 0))
    publisher.begin_step(1)
    gid = group_id(job_id, 0, (0, 1))
    key = group_key(SECRET, gid)
    peer = UdpChannel(key, gid, 1)
    stats = tmp_path / "stats.json"
    spec = {
        "job_id": job_id, "generation": 0, "rank": 0, "group_ranks": [0, 1], "group_id": gid.hex(),
        "group_key": key.hex(), "record_name": publisher.name, "record_token": publisher.token.hex(),
        "config": {"attach_deadline_s": 60.0}, "trainer_pid": os.getpid(), "trainer_start_ticks": 0,
        "report_path": None, "stats_path": str(stats), "poll_interval_s": 0.02, "bind_host": "127.0.0.1",
        "hostname": "h", "on_hang": "report",
    }
    observer = subprocess.Popen([sys.executable, "-m", "scout.observer.process"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=_environment())
    try:
        assert observer.stdin is not None and observer.stdout is not None
        observer.stdin.write((json.dumps(spec) + "\n").encode())
        observer.stdin.flush()
        started = json.loads(observer.stdout.readline())
        records = [peer_record(*started["address"], bytes.fromhex(started["nonce"]), "h"),
                   peer_record(*peer.address, peer.nonce, "h")]
        peer.set_peers(peers_from_records(records))
        observer.stdin.write((json.dumps({"peers": records}) + "\n").encode())
        observer.stdin.flush()
        target = peer.peers[0].address
        deadline = time.monotonic() + 30
        while publisher.observer_pid() != observer.pid and time.monotonic() < deadline:
            time.sleep(0.01)  # joined and attached: it now reads its socket
        genuine = _raw_to(peer, wire.encode_message(Request(RoundId(1, 1))))
        probes = [
            genuine[:10],  # truncated
            b"\0" * 60_500,  # oversized
            genuine,  # from the peer's socket: accepted once (a valid round request)
            genuine,  # from the peer's socket again: a duplicate
            genuine[:HEADER_BYTES] + b"\xff" * 40,  # tag mismatch
            struct.pack("<4sB8s", b"SCOB", 2, b"12345678") + genuine[13:],  # foreign group
        ]
        for probe in probes:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
                other.sendto(probe, target)  # from a socket the rendezvous does not know
            peer.socket.sendto(probe, target)
        # Valid, authenticated, but malformed observer messages: decoded and dropped.
        for body in (b"\x00garbage", wire.codec.encode(("d", 1, 1, 1, ("hang",) * 13)),
                     wire.encode_message(Delegate(RoundId(1, 1), 1, _report((5,))))):
            peer.send(0, body)
        time.sleep(0.5)
        assert observer.poll() is None, "the observer died of a probe"
    finally:
        observer.terminate()
        observer.wait(10)
        peer.close()
        publisher.close()
    result = json.loads(stats.read_text())
    # From an unknown socket every probe is refused; from the peer's own socket all but the
    # first copy of the genuine datagram.
    assert result["refused"] == {"size": 4, "wrong-address": 2, "duplicate": 1, "bad-tag": 2, "foreign-group": 2}, result
    assert result["undecodable"] == 3 and result["failed"] is False, result


def _raw_to(channel: UdpChannel, body: bytes) -> bytes:
    """A datagram ``channel`` would send to position 0, captured instead of sent."""
    return _raw(channel, body)
