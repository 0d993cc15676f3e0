"""The channel's acceptance rules, datagram by datagram (spec/observer.md OBS-AUTH-1..OBS-AUTH-7).

``tests/observer/test_channel.py`` sends real datagrams between real sockets; these tests build
each datagram byte by byte and hand it to :meth:`UdpChannel.check` (the one function every
received datagram goes through), so that every rule is stated at its exact edge: which bytes
the tag covers, which length is the last accepted, which sequence number is the first stale.
The channels still own real sockets (their addresses are what OBS-AUTH-5 compares).
Mutation target ``observer-channel`` (tests/mutation/)."""

from __future__ import annotations

import hashlib
import hmac
import random
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from scout.observer import channel as channel_module
from scout.observer.channel import (
    DATAGRAM_BYTES_MAX,
    HEADER_BYTES,
    RECEIVE_BATCH_MAX,
    REPLAY_WINDOW,
    Peer,
    UdpChannel,
    _SeenWindow,
)

KEY = bytes(range(32))
GROUP = b"group-id"  # 8 bytes
PREFIX = struct.Struct("<4sB8sH8sQ")


def _datagram(sender: int, nonce: bytes, sequence: int, body: bytes, *, key: bytes = KEY, group: bytes = GROUP,
              magic: bytes = b"SCOB", version: int = 2) -> bytes:
    """What OBS-AUTH-1..4 accept, written out: the header, then HMAC-SHA256(key, header + body)
    cut to 16 bytes, then the body."""
    prefix = PREFIX.pack(magic, version, group, sender, nonce, sequence)
    return prefix + hmac.new(key, prefix + body, hashlib.sha256).digest()[:16] + body


class Group:
    """Three channels of one group on loopback, with their rendezvous record set."""

    def __init__(self) -> None:
        self.channels = [UdpChannel(KEY, GROUP, position) for position in range(3)]
        peers = {c.position: Peer(*c.address, c.nonce, f"host{c.position}") for c in self.channels}
        for c in self.channels:
            c.set_peers(peers)

    def datagram(self, sender: int, sequence: int, body: bytes = b"body", **kwargs: Any) -> bytes:
        return _datagram(sender, self.channels[sender].nonce, sequence, body, **kwargs)

    def close(self) -> None:
        for c in self.channels:
            c.close()


@pytest.fixture
def group() -> Iterator[Group]:
    made = Group()
    yield made
    made.close()


def test_OBS_AUTH_1_the_datagram_format_is_the_header_the_tag_and_the_body(group: Group) -> None:
    receiver, sender = group.channels[0], group.channels[1]
    assert HEADER_BYTES == PREFIX.size + 16 == 47
    assert receiver.check(group.datagram(1, 1, b"evidence"), sender.address) == (1, b"evidence")
    assert receiver.check(group.datagram(2, 1, b""), group.channels[2].address) == (2, b"")
    assert receiver.received == 2 and sum(receiver.refused.values()) == 0


def test_OBS_AUTH_1_send_puts_exactly_that_format_on_the_wire(group: Group) -> None:
    sniffer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sniffer.bind(("127.0.0.1", 0))
    sniffer.settimeout(5)
    sender = group.channels[1]
    try:
        sender.peers[0] = Peer(*sniffer.getsockname(), group.channels[0].nonce)
        sender.send(0, b"first")
        sender.send(0, b"second")
        assert [sniffer.recvfrom(70_000)[0] for _ in range(2)] == [group.datagram(1, 1, b"first"),
                                                                   group.datagram(1, 2, b"second")]
        assert sender.sent == 2 and sender.send_errors == 0
    finally:
        sniffer.close()


@pytest.mark.parametrize("where", ["first", "middle", "last", "every"])
def test_OBS_AUTH_4_a_tag_that_differs_in_any_one_byte_is_refused(group: Group, where: str) -> None:
    """The rule (issue 26): the whole 16-byte tag is compared. A datagram whose tag differs from
    the right one in one byte -- the first, one in the middle, the last, or any -- is refused
    as ``bad-tag``, whatever the byte is changed to."""
    receiver, address = group.channels[0], group.channels[1].address
    genuine = group.datagram(1, 5, b"evidence")
    tag_start = PREFIX.size
    offsets = {"first": [0], "middle": [7, 8], "last": [15], "every": list(range(16))}[where]
    for offset in offsets:
        for flip in (0x01, 0x80, 0xFF):
            forged = bytearray(genuine)
            forged[tag_start + offset] ^= flip
            assert receiver.check(bytes(forged), address) is None
    refused = len(offsets) * 3
    assert receiver.refused == {"bad-tag": refused} and receiver.received == 0
    # The genuine datagram is still new: a refused forgery did not use up its sequence number.
    assert receiver.check(genuine, address) == (1, b"evidence")


def test_OBS_AUTH_4_the_tag_covers_every_header_field_and_the_body(group: Group) -> None:
    receiver, address = group.channels[0], group.channels[1].address
    genuine = group.datagram(1, 9, b"evidence")
    # Change one byte of the sender position, the nonce, the sequence number and the body, keep
    # the tag: each is refused (magic, version and group id are refused before the tag).
    for index in (PREFIX.size - 18, PREFIX.size - 16, PREFIX.size - 8, PREFIX.size - 1, HEADER_BYTES, len(genuine) - 1):
        forged = bytearray(genuine)
        forged[index] ^= 0x01
        assert receiver.check(bytes(forged), address) is None, index
    assert receiver.refused == {"bad-tag": 6}
    # A tag made under another key, or cut to 15 bytes with the body shifted, is refused too.
    assert receiver.check(_datagram(1, group.channels[1].nonce, 9, b"x", key=bytes(32)), address) is None
    assert receiver.check(genuine[:HEADER_BYTES - 1] + genuine[HEADER_BYTES:], address) is None
    assert receiver.refused == {"bad-tag": 8}
    assert receiver.check(genuine, address) == (1, b"evidence")


def test_OBS_AUTH_2_lengths_from_the_header_to_the_maximum_are_accepted_exactly(group: Group) -> None:
    receiver, address = group.channels[0], group.channels[1].address
    largest = group.datagram(1, 1, b"x" * (DATAGRAM_BYTES_MAX - HEADER_BYTES))
    assert len(largest) == DATAGRAM_BYTES_MAX
    assert receiver.check(largest, address) == (1, b"x" * (DATAGRAM_BYTES_MAX - HEADER_BYTES))
    assert receiver.check(group.datagram(1, 2, b""), address) == (1, b"")
    too_large = group.datagram(1, 3, b"x" * (DATAGRAM_BYTES_MAX - HEADER_BYTES + 1))
    assert receiver.check(too_large, address) is None
    assert receiver.check(group.datagram(1, 4, b"")[:-1], address) is None
    assert receiver.check(b"", address) is None
    assert receiver.refused == {"size": 3} and receiver.received == 2


def test_OBS_AUTH_2_magic_and_version_must_match(group: Group) -> None:
    receiver, address = group.channels[0], group.channels[1].address
    for kwargs in ({"magic": b"SCOC"}, {"magic": b"scob"}, {"version": 1}, {"version": 3}):
        assert receiver.check(group.datagram(1, 1, **kwargs), address) is None
    assert receiver.refused == {"not-scout": 4}
    assert receiver.check(group.datagram(1, 1), address) == (1, b"body")


def test_OBS_AUTH_3_a_datagram_of_another_group_is_refused_before_its_tag(group: Group) -> None:
    receiver, address = group.channels[0], group.channels[1].address
    # Tagged correctly under this key, but for another group id: refused as foreign.
    assert receiver.check(group.datagram(1, 1, group=b"other-id"), address) is None
    assert receiver.refused == {"foreign-group": 1}


def test_OBS_AUTH_5_only_a_peer_of_the_record_at_its_own_address_is_heard(group: Group) -> None:
    receiver = group.channels[0]
    a1, a2 = group.channels[1].address, group.channels[2].address
    # Position 1's datagram from position 2's address, and from an address with IPv6-style
    # extra fields (the address compared is host and port only).
    assert receiver.check(group.datagram(1, 1), a2) is None
    assert receiver.refused == {"wrong-address": 1}
    assert receiver.check(group.datagram(1, 1), (*a1, 0, 0)) == (1, b"body")
    # A datagram claiming the receiver's own position, or a position not in the record.
    assert receiver.check(_datagram(0, receiver.nonce, 1, b"body"), receiver.address) is None
    assert receiver.check(_datagram(3, group.channels[1].nonce, 1, b"body"), a1) is None
    assert receiver.refused == {"wrong-address": 1, "unknown-sender": 2}


def test_OBS_AUTH_6_the_nonce_must_be_the_one_of_the_record(group: Group) -> None:
    receiver, address = group.channels[0], group.channels[1].address
    assert receiver.check(_datagram(1, bytes(8), 1, b"old"), address) is None
    assert receiver.refused == {"old-incarnation": 1}


def test_OBS_AUTH_7_duplicates_and_sequence_numbers_behind_the_window(group: Group) -> None:
    receiver, address = group.channels[0], group.channels[1].address
    accepted = [receiver.check(group.datagram(1, s), address) for s in (1, 1, 100, 100 - REPLAY_WINDOW + 1,
                                                                          100 - REPLAY_WINDOW, 99, 99)]
    assert accepted == [(1, b"body"), None, (1, b"body"), (1, b"body"), None, (1, b"body"), None]
    assert receiver.refused == {"duplicate": 2, "stale": 1}
    # Each sender has its own window: position 2's sequence number 1 is new.
    assert receiver.check(group.datagram(2, 1), group.channels[2].address) == (2, b"body")


class _ReferenceWindow:
    """The rule of OBS-AUTH-7 written naively: every number seen, and the highest."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def accept(self, sequence: int) -> str | None:
        highest = max(self.seen, default=-1)
        if sequence <= highest - REPLAY_WINDOW:
            return "stale"
        if sequence in self.seen:
            return "duplicate"
        self.seen.add(sequence)
        return None


def test_OBS_AUTH_7_the_window_equals_the_naive_rule_on_every_edge() -> None:
    rng = random.Random(26)
    scripts = [
        [0, 1, 63, 64, 0, 1, 2, 65, 1, 2, 128, 64, 65, 127, 128],
        [5, 5 + REPLAY_WINDOW, 5, 6, 5 + REPLAY_WINDOW - 1, 6],
        [10, 10 + REPLAY_WINDOW - 1, 10, 11, 10 + 2 * REPLAY_WINDOW - 2, 10 + REPLAY_WINDOW - 1, 10 + REPLAY_WINDOW - 2],
        [1, 1 + REPLAY_WINDOW + 1, 2, 1 + REPLAY_WINDOW + 1, 3],
    ]
    for _ in range(200):
        start = rng.randrange(0, 200)
        scripts.append([max(0, start + rng.randrange(-70, 140)) for _ in range(rng.randrange(1, 60))])
    for script in scripts:
        window, reference = _SeenWindow(), _ReferenceWindow()
        assert [window.accept(s) for s in script] == [reference.accept(s) for s in script], script
        # The memory is bounded: one bit per sequence number of the window, no more.
        assert 0 <= window.bits < 1 << REPLAY_WINDOW, script


def test_OBS_AUTH_7_a_jump_of_any_size_is_accepted_at_once() -> None:
    """A sender's sequence number is a 64-bit counter: the window moves by any distance in
    constant time and memory (a shift by the distance itself would not)."""
    window = _SeenWindow()
    assert window.accept(1) is None
    assert window.accept(2**63) is None
    assert window.accept(2**64 - 1) is None
    assert (window.accept(2**64 - 1), window.accept(2**63)) == ("duplicate", "stale")
    assert window.bits == 1


def test_OBS_AUTH_constructor_refuses_a_short_key_a_wrong_group_id_and_a_position_out_of_range() -> None:
    cases = [
        ((bytes(15), GROUP, 0), "the group key must be at least 16 bytes, got 15"),
        ((KEY, b"seven77", 0), "the group id must be 8 bytes, got 7"),
        ((KEY, b"nine-byte", 0), "the group id must be 8 bytes, got 9"),
        ((KEY, GROUP, -1), "position must be in [0, 65536), got -1"),
        ((KEY, GROUP, 65536), "position must be in [0, 65536), got 65536"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError) as error:
            UdpChannel(*args)
        assert str(error.value) == message
    for position, key in ((0, bytes(16)), (65535, KEY)):
        made = UdpChannel(key, GROUP, position)
        try:
            assert (made.position, made.key, made.group_id, len(made.nonce)) == (position, key, GROUP, 8)
            assert made.address[0] == "127.0.0.1" and made.address[1] > 0
            assert (made.sent, made.received, made.send_errors, made.peers) == (0, 0, 0, {})
        finally:
            made.close()


def test_OBS_AUTH_an_address_that_cannot_be_bound_says_which_setting_to_change() -> None:
    with pytest.raises(OSError) as error:
        UdpChannel(KEY, GROUP, 0, host="192.0.2.1")  # TEST-NET-1: never an address of this host
    assert str(error.value).startswith("the observer cannot bind a UDP socket on '192.0.2.1': ")
    assert str(error.value).endswith("; set the observer interface (observer_host) to an address of this host")


def test_OBS_AUTH_the_record_must_name_this_observer(group: Group) -> None:
    own = group.channels[0]
    others = {p: Peer("127.0.0.1", 1 + p, bytes(8)) for p in (1, 2)}
    for peers in (others, {**others, 0: Peer(*own.address, bytes(8))}):
        with pytest.raises(ValueError) as error:
            own.set_peers(peers)
        assert str(error.value) == "the rendezvous record for position 0 is not this observer's"
    record = {**others, 0: Peer(*own.address, own.nonce)}
    own.set_peers(record)
    assert own.peers == record and own.peers is not record
    assert Peer("h", 5, b"n").address == ("h", 5) and Peer("h", 5, b"n").hostname == ""


def test_OBS_AUTH_send_refuses_a_body_too_large_and_counts_what_the_socket_refuses(group: Group) -> None:
    sender = group.channels[1]
    largest = b"x" * (DATAGRAM_BYTES_MAX - HEADER_BYTES)
    sender.send(0, largest)
    with pytest.raises(ValueError) as error:
        sender.send(0, largest + b"x")
    assert str(error.value) == (f"message of {len(largest) + 1} bytes exceeds DATAGRAM_BYTES_MAX={DATAGRAM_BYTES_MAX}")
    assert sender.sent == 1
    # An address the socket cannot send to is a lost message, counted, not an exception.
    sender.peers[2] = Peer("127.0.0.1", 0, group.channels[2].nonce)
    sender.send(2, b"lost")
    sender.send(2, b"lost again")
    assert (sender.sent, sender.send_errors) == (1, 2)
    assert group.channels[0].receive(5.0) == [(1, largest)]


def test_OBS_AUTH_receive_delivers_at_most_a_batch_and_waits_at_most_its_timeout(group: Group) -> None:
    receiver, sender = group.channels[0], group.channels[1]
    receiver.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    assert receiver.receive(0.0) == [] and receiver.receive(-1.0) == []
    count = RECEIVE_BATCH_MAX + 5
    for sequence in range(1, count + 1):
        sender.send(0, struct.pack("<I", sequence))
    first = receiver.receive(5.0)
    assert len(first) == RECEIVE_BATCH_MAX
    rest = receiver.receive(5.0)
    assert [struct.unpack("<I", body)[0] for _, body in first + rest] == list(range(1, count + 1))
    # A refused datagram is not delivered, and the genuine ones around it are.
    sender.socket.sendto(b"noise", receiver.address)
    sender.send(0, b"after")
    got: list[tuple[int, bytes]] = []
    for _ in range(100):
        got += receiver.receive(0.1)
        if got:
            break
    assert got == [(1, b"after")] and receiver.refused == {"size": 1}


class _RecordingSelector:
    """The channel's selector, recording the bound of every wait it is asked for."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.waits: list[float] = []

    def select(self, timeout: float) -> Any:
        self.waits.append(timeout)
        return self.real.select(timeout)

    def close(self) -> None:
        self.real.close()


def test_OBS_AUTH_receive_waits_at_most_its_timeout_and_never_a_negative_one(group: Group) -> None:
    receiver = group.channels[0]
    receiver.selector = _RecordingSelector(receiver.selector)  # type: ignore[assignment]
    assert receiver.receive(0.0) == [] and receiver.receive(-3.0) == [] and receiver.receive(0.01) == []
    assert receiver.selector.waits == [0.0, 0.0, 0.01]  # type: ignore[attr-defined]


class _FailingSocket:
    """The channel's socket, whose receive fails with a socket error after ``good`` datagrams."""

    def __init__(self, real: socket.socket, good: int) -> None:
        self.real = real
        self.good = good

    def recvfrom(self, size: int) -> tuple[bytes, Any]:
        if self.good == 0:
            raise ConnectionRefusedError(111, "Connection refused")
        self.good -= 1
        return self.real.recvfrom(size)

    def close(self) -> None:
        self.real.close()


def test_OBS_AUTH_a_socket_error_ends_the_batch_and_keeps_what_was_received(group: Group) -> None:
    receiver, sender = group.channels[0], group.channels[1]
    sender.send(0, b"one")
    sender.send(0, b"two")
    receiver.socket = _FailingSocket(receiver.socket, good=1)  # type: ignore[assignment]
    got: list[tuple[int, bytes]] = []
    for _ in range(100):
        got += receiver.receive(0.1)
        if got:
            break
    assert got == [(1, b"one")]


class _Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def monotonic(self) -> float:
        return self.now_s


def test_OBS_AUTH_refusals_are_counted_by_reason_and_logged_at_most_once_per_interval(
    group: Group, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = _Clock(0.0)
    monkeypatch.setattr(channel_module, "time", clock)
    receiver, source = group.channels[0], ("127.0.0.1", 9)
    assert receiver.check(b"short", source) is None  # at time 0: the first refusal is logged
    assert receiver.check(b"short", source) is None
    clock.now_s = channel_module.LOG_INTERVAL_S - 0.001
    assert receiver.check(group.datagram(1, 1, version=9), source) is None
    clock.now_s = channel_module.LOG_INTERVAL_S
    assert receiver.check(group.datagram(1, 1, group=b"xxxxxxxx"), source) is None
    assert receiver.refused == {"size": 2, "not-scout": 1, "foreign-group": 1}
    assert capsys.readouterr().err.splitlines() == [
        "scout: observer 0 refused a datagram from ('127.0.0.1', 9): size (1 refused so far)",
        "scout: observer 0 refused a datagram from ('127.0.0.1', 9): foreign-group (4 refused so far)",
    ]


class _Stderr:
    def __init__(self) -> None:
        self.written: list[str] = []
        self.flushed_after: list[int] = []

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushed_after.append(len(self.written))


def test_OBS_AUTH_every_refusal_reason_logs_the_source_and_is_flushed_at_once(
    group: Group, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log line leaves the process when it is written (stderr may be a pipe to a launcher
    that buffers), and names where the datagram came from, whatever the reason."""
    clock = _Clock(100.0)
    monkeypatch.setattr(channel_module, "time", clock)
    stderr = _Stderr()
    monkeypatch.setattr(channel_module.sys, "stderr", stderr)
    receiver = group.channels[0]
    a1, a2 = group.channels[1].address, group.channels[2].address
    forged = bytearray(group.datagram(1, 1))
    forged[PREFIX.size] ^= 1
    cases = [
        (b"short", a1, "size"),
        (group.datagram(1, 1, version=9), a1, "not-scout"),
        (group.datagram(1, 1, group=b"xxxxxxxx"), a1, "foreign-group"),
        (bytes(forged), a1, "bad-tag"),
        (_datagram(0, receiver.nonce, 1, b""), receiver.address, "unknown-sender"),
        (group.datagram(1, 1), a2, "wrong-address"),
        (_datagram(1, bytes(8), 1, b""), a1, "old-incarnation"),
        (group.datagram(1, 5), a1, None),
        (group.datagram(1, 5), a1, "duplicate"),
    ]
    expected = []
    for datagram, source, why in cases:
        clock.now_s += channel_module.LOG_INTERVAL_S
        assert (receiver.check(datagram, source) is None) == (why is not None)
        if why is not None:
            expected.append(f"scout: observer 0 refused a datagram from {source}: {why} "
                            f"({sum(receiver.refused.values())} refused so far)\n")
    lines = "".join(stderr.written).splitlines(keepends=True)
    assert lines == expected
    assert len(stderr.flushed_after) == len(expected) and stderr.flushed_after[-1] == len(stderr.written)


def test_OBS_AUTH_close_releases_the_socket() -> None:
    made = UdpChannel(KEY, GROUP, 0)
    made.close()
    assert made.socket.fileno() == -1
