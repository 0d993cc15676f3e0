"""Waits that never abort a communicator (spec/transport.md WAIT-1..WAIT-4), against a fake
``Work`` with NCCL's contract (tests/transport/fake_nccl.py: a timed-out ``wait(timeout)``
aborts the communicator and every later collective fails), in-process. ``TorchTransport`` and
``TorchPeerGroup`` run on a one-rank gloo world with their backend calls replaced by the fake;
the same behaviour on real gloo ranks is ``torch_tensor_silent_peer`` in the conformance run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from scout.transport._binding import PollSettings
from scout.transport.base import DeadlineExceeded, TransportError
from scout.transport.nccl.work import FUTURE_SLICE_S, TIMED_OUT, completed_now, wait_work
from tests.transport.fake_nccl import CommunicatorAborted, FakeCommunicator

FAST_POLL = PollSettings(busy_poll_s=0.001, poll_interval_s=0.002, min_sleep_s=0.0001)
SLEEPING_POLL = PollSettings(busy_poll_s=0.0, poll_interval_s=0.002, min_sleep_s=0.0001)


def test_WAIT_2_the_fake_aborts_on_a_timed_out_wait_as_nccl_does() -> None:
    """What the old code did (``work.wait(timeout)``) costs the communicator: the fake is strict
    enough for the tests below to fail on it."""
    comm = FakeCommunicator()
    work = comm.collective(completes_after_s=None)
    with pytest.raises(CommunicatorAborted, match="timeout"):
        work.wait(timeout=timedelta(seconds=0.01))
    assert comm.aborted
    with pytest.raises(CommunicatorAborted):
        comm.collective()


def test_WAIT_1_a_work_is_waited_for_once_it_completed_and_never_with_a_timeout() -> None:
    comm = FakeCommunicator()
    work = comm.collective(completes_after_s=0.03)
    began_s = time.monotonic()
    assert wait_work(work, time.monotonic() + 10.0, FAST_POLL) is None
    assert time.monotonic() - began_s >= 0.03
    assert work.waits == [None]  # one wait, without a timeout, after completion
    assert work.polls > 1  # it polled is_completed while the work ran


def test_WAIT_1_polling_backs_off() -> None:
    """A long wait sleeps: 0.3 s polled at <= 2 ms is at most ~150 queries (plus the busy
    phase), not a spin of hundreds of thousands."""
    comm = FakeCommunicator()
    work = comm.collective(completes_after_s=None)
    assert wait_work(work, time.monotonic() + 0.3, FAST_POLL) is TIMED_OUT
    assert 3 < work.polls < 5000


def test_WAIT_2_a_deadline_leaves_the_work_in_flight_and_the_communicator_usable() -> None:
    comm = FakeCommunicator()
    late = comm.collective(completes_after_s=None)
    began_s = time.monotonic()
    assert wait_work(late, time.monotonic() + 0.05, FAST_POLL) is TIMED_OUT
    assert 0.05 <= time.monotonic() - began_s < 5.0
    assert not comm.aborted and late.waits == []
    # A later collective runs, and the late peer still completes the first one.
    assert wait_work(comm.collective(), time.monotonic() + 5.0, FAST_POLL) is None
    assert completed_now(late) is TIMED_OUT  # one look, no wait
    late.finish()
    assert completed_now(late) is None


def test_WAIT_1_a_backend_error_is_returned_not_raised() -> None:
    comm = FakeCommunicator()
    failed = comm.collective(error=RuntimeError("NCCL error: unhandled system error"))
    outcome = wait_work(failed, time.monotonic() + 5.0, FAST_POLL)
    assert isinstance(outcome, RuntimeError) and "unhandled system error" in str(outcome)

    class Raising:
        def is_completed(self) -> bool:
            raise RuntimeError("the query itself failed")

        def wait(self) -> bool:  # pragma: no cover - must not be reached
            raise AssertionError("wait() after a failed query")

    assert isinstance(wait_work(Raising(), time.monotonic() + 5.0, FAST_POLL), RuntimeError)


# -- the two users, on a one-rank gloo world with the fake backend -----------------------------

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


class FakeBackend:
    """Replaces ``torch.distributed.all_gather``: each call enqueues on the fake communicator
    and completes after the next delay (None: never, until finished by the test)."""

    def __init__(self, comm: FakeCommunicator, delays_s: list[float | None]) -> None:
        self.comm = comm
        self.delays_s = delays_s

    def all_gather(self, out: list[Any], tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        assert async_op, "scout's collectives must be asynchronous to be bounded"
        delay_s = self.delays_s.pop(0) if self.delays_s else 0.0
        work = self.comm.collective(completes_after_s=delay_s)
        for slot in out:
            slot.copy_(tensor)
        return work


@pytest.mark.torchdist
def test_WAIT_3_transport_tensors_refuse_while_in_flight_and_run_again_after(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout.transport.nccl import TorchTransport

    comm = FakeCommunicator()
    backend = FakeBackend(comm, [None])
    monkeypatch.setattr(dist, "all_gather", backend.all_gather)
    transport = TorchTransport(store=dist.HashStore(), namespace=f"waits-{time.monotonic_ns()}")
    try:
        mine = torch.ones(2)
        began_s = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            transport.all_gather_tensor(mine, timeout_s=0.1)
        assert 0.1 <= time.monotonic() - began_s < 5.0
        late = comm.works[0]
        assert not comm.aborted and late.waits == []  # WAIT-2
        with pytest.raises(TransportError, match="still in flight"):
            transport.all_gather_tensor(mine, timeout_s=1.0)
        assert len(comm.works) == 1  # refused without enqueueing anything
        late.finish()  # the late peer arrived
        gathered = transport.all_gather_tensor(mine, timeout_s=5.0)
        assert [g.tolist() for g in gathered] == [[1.0, 1.0]]
        assert len(comm.works) == 2 and comm.works[1].waits == [None]
        assert transport.stats.deadlines_exceeded == 1
    finally:
        transport.close()


@pytest.mark.torchdist
def test_WAIT_3_a_backend_failure_makes_the_tensor_path_unusable_for_good(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout.transport.nccl import TorchTransport

    comm = FakeCommunicator()
    backend = FakeBackend(comm, [None])
    monkeypatch.setattr(dist, "all_gather", backend.all_gather)
    transport = TorchTransport(store=dist.HashStore(), namespace=f"waits-{time.monotonic_ns()}")
    try:
        with pytest.raises(DeadlineExceeded):
            transport.all_gather_tensor(torch.ones(1), timeout_s=0.05)
        comm.works[0].error = RuntimeError("NCCL error: remote process exited")
        comm.works[0].finish()  # it completed, with an error, after the deadline
        for _ in range(2):
            with pytest.raises(TransportError, match="remote process exited.*unusable"):
                transport.all_gather_tensor(torch.ones(1), timeout_s=1.0)
        assert len(comm.works) == 1
    finally:
        transport.close()


@pytest.mark.torchdist
def test_WAIT_2_WAIT_4_peer_group_deadline_never_aborts_and_groups_outlive_it(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout.replay.collectives import TorchPeerGroup

    created: list[timedelta] = []
    new_group = dist.new_group

    def recording_new_group(*args: Any, **kwargs: Any) -> Any:
        created.append(kwargs["timeout"])
        return new_group(*args, **kwargs)

    monkeypatch.setattr(dist, "new_group", recording_new_group)
    peers = TorchPeerGroup(timeout_s=0.1, poll=FAST_POLL)
    assert created == [timedelta(seconds=TorchPeerGroup.DEFAULT_BACKEND_TIMEOUT_S)]  # WAIT-4
    comm = FakeCommunicator()
    monkeypatch.setattr(dist, "all_gather", FakeBackend(comm, [None]).all_gather)
    began_s = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        peers.all_gather_int64([7, 8])
    assert 0.1 <= time.monotonic() - began_s < 5.0
    assert not comm.aborted and comm.works[0].waits == []
    assert peers.timer.take().count == 1  # the timed-out call is still timed (COMM-1)
    assert peers.all_gather_int64([7, 8]) == [[7, 8]]  # the communicator still works
    with pytest.raises(ValueError, match=r"backend_timeout_s=0\.5 must exceed timeout_s=1\.0"):
        TorchPeerGroup(timeout_s=1.0, backend_timeout_s=0.5)
    assert TorchPeerGroup(timeout_s=600.0).backend_timeout_s == 6000.0


@pytest.mark.torchdist
def test_WAIT_1_peer_group_backend_failure_is_a_transport_error(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout.replay.collectives import TorchPeerGroup

    peers = TorchPeerGroup(timeout_s=5.0, poll=FAST_POLL)
    comm = FakeCommunicator()

    def failing(out: list[Any], tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        return comm.collective(error=RuntimeError("NCCL error: internal check failed"))

    monkeypatch.setattr(dist, "all_gather", failing)
    with pytest.raises(TransportError, match="internal check failed") as caught:
        peers.all_gather_int64([1])
    assert not isinstance(caught.value, DeadlineExceeded)


# -- WAIT-7: asleep on the work's future ---------------------------------------------------------


class FutureWork:
    """A work whose future completes ``after_s`` after it was made (None: never), with the
    queries of ``is_completed`` and the ``get_future`` calls counted."""

    def __init__(self, after_s: float | None) -> None:
        self.future: torch.futures.Future[None] = torch.futures.Future()
        self.polls = 0
        self.futures_asked = 0
        if after_s is not None:
            threading.Timer(after_s, self.future.set_result, args=(None,)).start()

    def is_completed(self) -> bool:
        self.polls += 1
        return self.future.done()

    def get_future(self) -> torch.futures.Future[None]:
        self.futures_asked += 1
        return self.future

    def wait(self) -> bool:
        return True


def test_WAIT_7_a_wait_sleeps_on_the_future_and_queries_once_it_completed() -> None:
    began_s = time.monotonic()  # before the work: its timer starts when it is made
    work = FutureWork(after_s=0.1)
    assert wait_work(work, time.monotonic() + 10.0, FAST_POLL) is None
    assert work.future.done() and time.monotonic() - began_s >= 0.1
    # One query per slice of FUTURE_SLICE_S and one after; WAIT-1's poll alone would have queried
    # every few hundred microseconds for 0.1 s.
    assert work.polls <= 0.1 / FUTURE_SLICE_S + 2 and work.futures_asked == 1


def test_WAIT_7_a_future_that_lags_its_work_costs_a_slice_not_the_deadline() -> None:
    """A backend whose future never completes although its work does: the wait ends within a
    slice of the work's completion, not at the deadline 10 s later."""
    work = FutureWork(after_s=None)
    done_at_s = time.monotonic() + 0.1
    work.is_completed = lambda: time.monotonic() >= done_at_s  # type: ignore[method-assign]
    began_s = time.monotonic()
    assert wait_work(work, time.monotonic() + 10.0, FAST_POLL) is None
    assert 0.1 <= time.monotonic() - began_s < 0.1 + FUTURE_SLICE_S + 1.0


def test_WAIT_7_a_future_that_never_completes_ends_at_the_deadline_and_the_work_stays_in_flight() -> None:
    work = FutureWork(after_s=None)
    began_s = time.monotonic()
    assert wait_work(work, time.monotonic() + 0.1, FAST_POLL) is TIMED_OUT
    assert 0.1 <= time.monotonic() - began_s < 5.0
    # WAIT-3's one look asks for no future: no callback piles up on a work that is only looked at.
    assert completed_now(work) is TIMED_OUT and work.futures_asked == 1
    work.future.set_result(None)
    assert completed_now(work) is None and work.futures_asked == 1


def test_WAIT_7_a_work_whose_backend_refuses_a_future_is_polled_as_before() -> None:
    comm = FakeCommunicator()
    work = comm.collective(completes_after_s=0.03)

    def refused() -> None:
        raise RuntimeError("getFuture is not supported by this backend")

    work.get_future = refused  # type: ignore[attr-defined]
    assert wait_work(work, time.monotonic() + 10.0, FAST_POLL) is None
    assert work.waits == [None] and work.polls > 1


def test_WAIT_7_on_real_gloo_a_rank_waiting_for_a_late_peer_queries_once_a_slice(tmp_path: Path) -> None:
    """Two gloo ranks of one process (threads): rank 0's all-gather waits 0.2 s for rank 1;
    the wait wakes when rank 1 arrives, with the gathered rows, and queries the work once per
    slice of FUTURE_SLICE_S and about once after (gloo completes the future a moment before the
    work's own flag, so a second query may be needed): a handful of queries. Without a busy phase,
    WAIT-1's poll alone queries >= 100 times in 0.2 s."""
    store = dist.HashStore()
    groups: list[Any] = [None, None]

    def build(rank: int) -> None:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=30)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, options)

    builders = [threading.Thread(target=build, args=(rank,)) for rank in (0, 1)]
    for thread in builders:
        thread.start()
    for thread in builders:
        thread.join(timeout=30.0)
    assert all(group is not None for group in groups)

    def gather(rank: int) -> tuple[Any, list[Any]]:
        rows = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]
        return groups[rank].allgather([rows], [torch.tensor([rank, 10 + rank])]), rows

    class Counted:
        def __init__(self, work: Any) -> None:
            self.work, self.polls = work, 0

        def is_completed(self) -> bool:
            self.polls += 1
            return bool(self.work.is_completed())

        def wait(self) -> bool:
            return bool(self.work.wait())

        def get_future(self) -> Any:
            return self.work.get_future()

    work, rows = gather(0)
    counted = Counted(work)
    late = threading.Timer(0.2, lambda: gather(1)[0].wait())
    late.start()
    began_s = time.monotonic()
    try:
        assert wait_work(counted, time.monotonic() + 30.0, SLEEPING_POLL) is None
    finally:
        late.join(timeout=30.0)
    assert time.monotonic() - began_s >= 0.15
    assert counted.polls < 20
    assert [row.tolist() for row in rows] == [[0, 10], [1, 11]]
