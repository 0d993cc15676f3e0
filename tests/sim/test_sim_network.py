"""The network part alone: latency, link faults, cuts, payload encoding and corruption.

Built on a bare scheduler and trace, with no program running: each test calls the network the
way the messaging and collectives parts do and reads back what it scheduled or counted.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from scout.transport.base import Group, PayloadTooLarge
from scout.transport.codec import encode
from scout.transport.sim import Corrupt, Delay, Drop, LatencyModel, Partition, SimContext
from scout.transport.sim.network import UNDECODED, Network, immutable
from scout.transport.sim.process import Process
from scout.transport.sim.scheduler import Scheduler
from scout.transport.sim.trace import Trace

LATENCY = LatencyModel(base_latency_s=0.001, jitter_s=0.0005, collective_step_latency_s=0.002)


def _network(seed: int = 3, *, max_payload_bytes: int = 1 << 20, **options: Any) -> Network:
    return Network(
        Scheduler(seed),
        Trace(),
        LATENCY,
        max_payload_bytes=max_payload_bytes,
        trace_messages=options.get("trace_messages", False),
    )


def _process(rank: int, name: str = "main") -> Process:
    def idle(ctx: SimContext) -> Any:
        yield from ()

    ctx = SimContext(
        rank=rank,
        size=8,
        world=Group(tuple(range(8)), "world"),
        program=name,
        shared={},
        random=random.Random(0),
    )
    return Process(rank, name, ctx, idle(ctx))


def test_a_message_takes_the_base_latency_plus_one_seeded_jitter_draw() -> None:
    network = _network(seed=11)
    expected = random.Random(11).random() * LATENCY.jitter_s + LATENCY.base_latency_s
    assert network.delivery_time_s(0, 1, 2.0) == pytest.approx(2.0 + expected, abs=0)


def test_a_delay_touches_only_its_direction() -> None:
    network = _network()
    network.add_link_fault(0, Delay(ranks={0}, extra_latency_s=0.5, direction="from"))
    base_s = LATENCY.base_latency_s + LATENCY.jitter_s  # the largest undelayed latency
    assert network.delivery_time_s(0, 1, 0.0) >= 0.5  # type: ignore[operator]
    assert network.delivery_time_s(1, 0, 0.0) <= base_s  # type: ignore[operator]
    network.remove_link_fault(0)
    assert network.delivery_time_s(0, 1, 0.0) <= base_s  # type: ignore[operator]


def test_a_partition_loses_messages_both_ways_and_cuts_a_group_that_spans_it() -> None:
    network = _network()
    network.add_link_fault(4, Partition(side_a={0, 1}, side_b={2}))
    assert network.delivery_time_s(0, 2, 0.0) is None
    assert network.delivery_time_s(2, 1, 0.0) is None
    assert network.delivery_time_s(0, 1, 0.0) is not None
    assert network.cut(frozenset({1, 2})) and not network.cut(frozenset({0, 1, 3}))
    assert network.cut_off(2, 0) and not network.cut_off(0, 1)


def test_a_certain_drop_cuts_and_a_probable_one_does_not() -> None:
    network = _network()
    network.add_link_fault(0, Drop(src_ranks={0}, dst_ranks={1}, probability=0.5))
    assert not network.cut(frozenset({0, 1})) and not network.cut_off(0, 1)
    network.add_link_fault(1, Drop(src_ranks={0}, dst_ranks={1}))
    assert network.cut(frozenset({0, 1})) and network.cut_off(0, 1)
    assert not network.cut_off(1, 0)  # a drop is one way
    assert not network.cut(frozenset({0, 2}))


def test_cut_off_draws_no_random_number() -> None:
    network = _network()
    network.add_link_fault(0, Drop(src_ranks={0}, dst_ranks={1}, probability=0.5))
    before = network.scheduler.rng.getstate()
    network.cut_off(0, 1)
    network.cut(frozenset({0, 1}))
    assert network.scheduler.rng.getstate() == before


def test_a_probable_drop_flips_a_seeded_coin_per_message() -> None:
    def lost(seed: int) -> list[bool]:
        network = _network(seed)
        network.add_link_fault(0, Drop(src_ranks={0}, dst_ranks={1}, probability=0.5))
        return [network.delivery_time_s(0, 1, 0.0) is None for _ in range(64)]

    assert lost(1) == lost(1)
    assert 0 < sum(lost(1)) < 64


def _arrivals(network: Network, every_target_present: bool) -> list[tuple[float, int]]:
    """Send one message from rank 2 to a group of six; return (arrival time, rank) in order."""
    arrivals: list[tuple[float, int]] = []
    scheduler = network.scheduler
    kind = scheduler.register(lambda target, _: arrivals.append((scheduler.now_s, target.rank)))
    column: list[Process | None] = [_process(rank) for rank in range(6)]
    network.send_to_group(kind, 2, tuple(range(6)), column, "m", every_target_present)
    scheduler.run()
    return arrivals


def test_the_group_fast_path_delivers_what_one_send_per_member_would() -> None:
    fast, slow = _network(seed=5), _network(seed=5)
    arrivals = _arrivals(fast, every_target_present=True)
    assert arrivals == _arrivals(slow, every_target_present=False)
    assert sorted(rank for _, rank in arrivals) == [0, 1, 3, 4, 5]
    assert fast.messages_sent == slow.messages_sent == 5


def test_send_counts_what_it_discards_and_what_a_fault_drops() -> None:
    network = _network(trace_messages=True)
    network.send(0, 0, None, 1, "to nobody")
    network.add_link_fault(0, Partition(side_a={0}, side_b={1}))
    network.send(0, 0, _process(1), 1, "across the cut")
    assert (network.messages_sent, network.messages_discarded, network.messages_dropped) == (
        2,
        1,
        1,
    )
    assert [record[3] for record in network.trace] == ["dropped"]
    assert network.scheduler.pending == 0


def test_a_collective_takes_its_tree_steps_plus_the_largest_delay_among_its_members() -> None:
    network = _network(seed=9)
    network.add_link_fault(0, Delay(ranks={1}, extra_latency_s=0.25))
    network.add_link_fault(1, Delay(ranks={3}, extra_latency_s=0.75))
    network.add_link_fault(2, Delay(ranks={7}, extra_latency_s=9.0))  # not a member
    steps_s = LATENCY.collective_latency_s(random.Random(9), 4)
    assert network.collective_latency_s(4, frozenset({0, 1, 2, 3})) == steps_s + 0.75


def test_a_payload_over_the_limit_is_refused_on_its_encoded_size() -> None:
    network = _network(max_payload_bytes=len(encode(b"x" * 10)))
    network.outgoing(_process(0), b"x" * 10, "exchange")
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
        network.outgoing(_process(0), b"x" * 11, "exchange")


def test_immutable_values_are_shared_and_mutable_ones_decoded_per_receiver() -> None:
    network = _network()
    data, value, wire_data, wire_value = network.outgoing(_process(0), (1, "a"), "send")
    assert value == (1, "a") and wire_value is value and wire_data == data
    data, value, _, _ = network.outgoing(_process(0), [1, 2], "send")
    assert value is UNDECODED and network.value_of(_process(1), data, value) == [1, 2]
    assert immutable((1, (b"x", None))) and not immutable((1, [2]))


def test_a_value_corruption_is_what_the_sender_and_its_peers_see() -> None:
    network = _network()
    fault = Corrupt(rank=0, rewrite=lambda value: value + 1)
    network.add_corruption(fault)
    _, value, _, wire_value = network.outgoing(_process(0), 41, "exchange")
    assert value == wire_value == 42
    assert network.outgoing(_process(1), 41, "exchange")[1] == 41  # other ranks untouched
    network.remove_corruption(fault)
    assert network.outgoing(_process(0), 41, "exchange")[1] == 41 and not network.corrupting
    assert [record[4][:2] for record in network.trace] == [("exchange", "value")]


def test_a_wire_corruption_reaches_only_the_peers_and_may_not_decode() -> None:
    network = _network()
    network.add_corruption(Corrupt(rank=0, rewrite=lambda data: data[:1], layer="wire"))
    data, value, wire_data, wire_value = network.outgoing(_process(0), "seven", "exchange")
    assert value == "seven" and wire_data == data[:1] and wire_value is UNDECODED
    receiver = _process(1)
    assert network.value_of(receiver, wire_data, wire_value) is UNDECODED
    assert receiver.stats.undecodable_dropped == 1
    assert network.value_of(receiver, data, UNDECODED) == "seven"
