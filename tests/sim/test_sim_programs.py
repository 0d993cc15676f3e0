"""Programs on the simulator: several per rank, messaging ops, time, bounds and failures."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim import (
    Delivered,
    ProgramFailed,
    Receive,
    Send,
    SimCluster,
    SimContext,
    SimulationLimitExceeded,
)
from tests.sim.helpers import run


def test_programs_with_one_name_form_one_domain() -> None:
    """A trainer's exchange and an observer's exchange on the same rank never mix."""

    def make(tag: str) -> Any:
        def program(ctx: SimContext) -> Generator[Any, Any, Any]:
            result = yield Exchange((tag, ctx.rank), round_id=1, timeout_s=1.0)
            return sorted(result.answers.values())

        return program

    cluster = SimCluster(3, seed=0)
    cluster.spawn(make("trainer"), name="trainer")
    cluster.spawn(make("observer"), name="observer")
    result = cluster.run()
    assert result.values("trainer") == [[("trainer", r) for r in range(3)]] * 3
    assert result.values("observer") == [[("observer", r) for r in range(3)]] * 3


def test_send_and_receive_carry_one_way_messages() -> None:
    def server(ctx: SimContext) -> Generator[Any, Any, Any]:
        got = []
        while True:
            message = yield Receive(timeout_s=1.0)
            if message is None:  # quiet for a second: done
                return got
            got.append((message.src, message.payload))
            yield Send(dst=message.src, payload=("ack", message.payload), program="client")

    def client(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Send(dst=0, payload=ctx.rank * 10, program="server", tag=3)
        reply = yield Receive(timeout_s=1.0)
        return reply

    cluster = SimCluster(3, seed=0)
    cluster.spawn(server, ranks=[0], name="server")
    cluster.spawn(client, ranks=[1, 2], name="client")
    result = cluster.run()
    assert sorted(result.value(0, "server")) == [(1, 10), (2, 20)]
    assert result.value(1, "client") == Delivered(
        src=0, program="server", tag=0, payload=("ack", 10)
    )


def test_receive_filters_by_tag_and_times_out() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        if ctx.rank == 1:
            yield Send(dst=0, payload="a", tag=1)
            yield Send(dst=0, payload="b", tag=2)
            return None
        yield Sleep(0.5)
        second = yield Receive(timeout_s=0.0, tag=2)
        first = yield Receive(timeout_s=0.0)
        nothing = yield Receive(timeout_s=0.25)
        return second.payload, first.payload, nothing, (yield Now())

    assert run(program, 2).value(0) == ("b", "a", None, 0.75)


def test_messages_to_a_missing_program_are_discarded() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Send(dst=1, payload=1, program="nobody")
        return None

    cluster = SimCluster(2, seed=0)
    cluster.spawn(program)
    result = cluster.run()
    assert result.messages_sent == 2 and result.messages_delivered == 0


def test_run_until_a_time_and_continue() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        for _ in range(10):
            yield Sleep(1.0)
        return (yield Now())

    cluster = SimCluster(2, seed=0)
    cluster.spawn(program)
    partial = cluster.run(until_s=4.5)
    assert cluster.now_s == 4.5 and len(partial.unfinished()) == 2
    samples = []
    cluster.call_at(6.0, lambda: samples.append(cluster.now_s))
    assert cluster.run().values() == [10.0, 10.0]
    assert samples == [6.0]


def test_a_program_that_never_ends_hits_the_virtual_time_bound_with_its_seed() -> None:
    def forever(ctx: SimContext) -> Generator[Any, Any, Any]:
        while True:
            yield Sleep(60.0)

    with pytest.raises(
        SimulationLimitExceeded, match=r"max_virtual_time_s=3600.*reproduce with seed=42"
    ):
        run(forever, 2, seed=42, max_virtual_time_s=3600.0)


def test_the_event_bound_names_the_seed() -> None:
    def busy(ctx: SimContext) -> Generator[Any, Any, Any]:
        for _ in range(1000):
            yield Sleep(0.001)

    with pytest.raises(SimulationLimitExceeded, match=r"max_events=100 .*reproduce with seed=5"):
        run(busy, 2, seed=5, max_events=100)


def test_a_program_that_never_waits_is_stopped() -> None:
    def spin(ctx: SimContext) -> Generator[Any, Any, Any]:
        while True:
            yield Now()

    with pytest.raises(SimulationLimitExceeded, match="without waiting"):
        run(spin, 1, max_ops_without_wait=1000)


def test_a_program_that_raises_fails_the_run_with_its_rank_and_seed() -> None:
    def broken(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Sleep(1.0)
        if ctx.rank == 2:
            raise KeyError("oops")
        return None

    cluster = SimCluster(4, seed=8, scenario="exchange-healthy")
    cluster.spawn(broken)
    with pytest.raises(ProgramFailed) as info:
        cluster.run()
    assert info.value.rank == 2 and isinstance(info.value.__cause__, KeyError)
    assert "reproduce with: scout simulate exchange-healthy --ranks 4 --seed 8" in str(info.value)


def test_spawn_refuses_bad_programs_and_ranks() -> None:
    cluster = SimCluster(2, seed=0)
    with pytest.raises(TypeError, match="not a generator"):
        cluster.spawn(lambda ctx: 42)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="rank 5 is not in the world of 2"):
        cluster.spawn(lambda ctx: iter(()), ranks=[5])  # type: ignore[arg-type,return-value]

    def idle(ctx: SimContext) -> Generator[Any, Any, Any]:
        yield Sleep(0.0)

    cluster.spawn(idle)
    with pytest.raises(ValueError, match="already runs a program named 'main'"):
        cluster.spawn(idle, ranks=[0])
    with pytest.raises(ValueError, match="ranks must be an int >= 1"):
        SimCluster(0, seed=0)


def test_context_carries_rank_world_limit_and_shared_memory() -> None:
    def program(ctx: SimContext) -> Generator[Any, Any, Any]:
        ctx.shared.setdefault("seen", []).append(ctx.program)
        yield Sleep(0.0)
        return ctx.rank, ctx.size, ctx.world.ranks, ctx.max_payload_bytes, ctx.shared["seen"]

    cluster = SimCluster(2, seed=0, max_payload_bytes=123)
    cluster.spawn(program, name="a")
    cluster.spawn(program, name="b")
    result = cluster.run()
    assert result.value(1, "a") == (1, 2, (0, 1), 123, ["a", "b"])
    assert cluster.shared(1)["seen"] == ["a", "b"]
