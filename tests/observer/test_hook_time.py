"""spec/budget.md BUDGET-10: scout's hooks inside a training step time their own code, and only it,
into the process's hook time, which ``job.step()`` reads for the overhead budget (BUDGET-3's F).

In-process, on a one-rank gloo group: each hook's own work is made slow on purpose (a publish, a
listener, a capture that sleeps) and so is the job's work beside it (the collective a wrapper
calls, the bucket's all-reduce), and the hook time must hold the one and not the other."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from scout.core.recipes import RecipeClass, RecipeId  # noqa: E402
from scout.job.hooks import publish_ddp_buckets  # noqa: E402
from scout.observer import instrument as inst  # noqa: E402
from scout.observer.progress import ProgressPublisher, RecordIdentity  # noqa: E402
from scout.replay.capture import ModuleCapture  # noqa: E402
from scout.reports.hook_time import HOOK_TIME  # noqa: E402

pytestmark = pytest.mark.torchdist

OWN_S = 0.02  # what a hook's own (slowed) code takes
JOBS_S = 0.08  # what the job's work beside it takes: never in the hook time


def _slow(action: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return action(*args, **kwargs)
    return slowed


class _LateWork:
    """A collective's work whose future holds ``[tensor]`` ``after_s`` after its launch (None:
    already at its launch, as NCCL's future is at enqueue)."""

    def __init__(self, tensor: Any, after_s: float | None) -> None:
        self.future: Any = torch.futures.Future()
        if after_s is None:
            self.future.set_result([tensor])
        else:
            threading.Timer(after_s, self.future.set_result, args=([tensor],)).start()

    def get_future(self) -> Any:
        return self.future

    def is_completed(self) -> bool:
        return bool(self.future.done())

    def wait(self, timeout: Any = None) -> bool:
        self.future.wait()
        return True


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def publisher() -> Iterator[ProgressPublisher]:
    made = ProgressPublisher(RecordIdentity(f"hook-time-{os.getpid()}-{time.monotonic_ns()}", 0, 0))
    try:
        yield made
    finally:
        inst.uninstrument()
        made.close()


def test_BUDGET_10_the_layer_publishes_count_their_own_time(publisher: ProgressPublisher) -> None:
    inst.instrument(publisher)
    publisher.advance = _slow(publisher.advance, OWN_S)  # type: ignore[method-assign]
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    assert inst.instrument_module(model) == 3
    HOOK_TIME.take_s()
    model(torch.randn(2, 4))
    spent_s = HOOK_TIME.take_s()
    assert spent_s >= 3 * OWN_S, spent_s
    assert HOOK_TIME.take_s() == 0.0  # taken: the sum restarts


def test_BUDGET_10_a_wrapped_collective_counts_scouts_part_and_not_the_collective(
    one_rank: None, publisher: ProgressPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dist, "all_reduce", _slow(dist.all_reduce, JOBS_S))  # the job's collective, slow
    inst.instrument(publisher)
    publisher.enter_collective = _slow(publisher.enter_collective, OWN_S)  # type: ignore[method-assign]
    HOOK_TIME.take_s()
    began = time.perf_counter()
    dist.all_reduce(torch.ones(4))
    took_s = time.perf_counter() - began
    spent_s = HOOK_TIME.take_s()
    assert took_s >= OWN_S + JOBS_S
    assert OWN_S <= spent_s < JOBS_S, spent_s


@pytest.mark.parametrize("slow", ["hook", "division", "callback", "inline-callback"])
def test_BUDGET_10_the_ddp_bucket_hook_and_its_callback_count_their_own_time_and_not_the_all_reduce(
    one_rank: None, publisher: ProgressPublisher, monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """Scout's part of the bucket hook before its all-reduce, and the bucket's completion callback
    (on gloo's thread; the backward waits for it), are counted; the all-reduce is the job's. A
    callback that runs inline -- the future already complete when the hook asks for it, as on
    NCCL -- is inside the hook's own time and counted once. On gloo the bucket's average is the
    hook's division and a sum (INSTR-15): the division is scout's pass over the gradients, counted."""
    model = DistributedDataParallel(nn.Linear(4, 4))
    ran: list[str] = []

    def finish() -> None:
        if slow.endswith("callback"):
            time.sleep(OWN_S)  # a slow completion listener
        ran.append(f"callback on {threading.current_thread().name}")

    def listener() -> Callable[[], None]:
        if slow == "hook":
            time.sleep(OWN_S)  # a slow loop listener at the bucket's launch
        ran.append("hook")
        return finish

    assert publish_ddp_buckets(model, publisher, [listener])
    # The bucket's all-reduce (one rank: its average is the bucket) completes JOBS_S after its
    # launch, on a thread of its own (the callback never runs inline in the hook), or already at
    # its launch (the callback runs inline).
    after_s = None if slow == "inline-callback" else JOBS_S
    ops: list[Any] = []

    def late(tensor: Any, op: Any = dist.ReduceOp.SUM, *args: Any, **kwargs: Any) -> _LateWork:
        ops.append(op)
        return _LateWork(tensor, after_s)

    # The hook's all-reduce goes straight into the group (scout.job.hooks._all_reduce).
    monkeypatch.setattr("scout.job.hooks._all_reduce", lambda group, tensor, op: late(tensor, op))
    if slow == "division":  # the hook's pass over the bucket, slow (DDP's own divisions are in C++)
        monkeypatch.setattr(torch.Tensor, "div_", _slow(torch.Tensor.div_, OWN_S))
    HOOK_TIME.take_s()
    model(torch.randn(2, 4)).sum().backward()
    spent_s = HOOK_TIME.take_s()
    assert len(ran) == 2, f"the hook and its callback ran before the backward returned: {ran}"
    assert ops == [dist.ReduceOp.SUM], ops
    assert OWN_S <= spent_s < min(JOBS_S, 2 * OWN_S), spent_s  # counted once, the all-reduce never


def test_INSTR_15_BUDGET_10_a_refused_avg_falls_back_for_good_to_a_counted_division_and_a_sum(
    one_rank: None, publisher: ProgressPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend taken to divide inside its reduction that refuses AVG (before any byte moved):
    that bucket and every later one are divided by the hook, counted, and summed; AVG is not asked
    again."""
    model = DistributedDataParallel(nn.Linear(4, 4))
    assert publish_ddp_buckets(model, publisher)
    monkeypatch.setattr("scout.job.hooks._averages_in_reduction", lambda group, buffer: True)
    ops: list[Any] = []

    def refusing(tensor: Any, op: Any = dist.ReduceOp.SUM, *args: Any, **kwargs: Any) -> _LateWork:
        ops.append(op)
        if op == dist.ReduceOp.AVG:
            raise RuntimeError("Cannot use ReduceOp.AVG with this backend")
        return _LateWork(tensor, None)

    monkeypatch.setattr("scout.job.hooks._all_reduce", lambda group, tensor, op: refusing(tensor, op))
    monkeypatch.setattr(torch.Tensor, "div_", _slow(torch.Tensor.div_, OWN_S))
    for _ in range(2):
        HOOK_TIME.take_s()
        model(torch.randn(2, 4)).sum().backward()
        spent_s = HOOK_TIME.take_s()
        assert OWN_S <= spent_s < min(JOBS_S, 2 * OWN_S), spent_s
    assert ops == [dist.ReduceOp.AVG, dist.ReduceOp.SUM, dist.ReduceOp.SUM], ops


def test_BUDGET_10_CAP_1_capture_counts_its_hook_when_armed_and_has_none_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = RecipeId(RecipeClass.HIDDEN, 0)
    module = nn.Linear(4, 4)
    capture = ModuleCapture({layer: module}, max_capture_bytes=2**20)
    try:
        HOOK_TIME.take_s()
        module(torch.randn(2, 4))
        assert HOOK_TIME.take_s() == 0.0  # not armed: no hook of capture's on the module (CAP-1)
        monkeypatch.setattr(capture, "_record", _slow(capture._record, OWN_S))
        capture.arm(1, [layer])
        module(torch.randn(2, 4))
        assert HOOK_TIME.take_s() >= OWN_S
    finally:
        capture.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_INSTR_15_the_buckets_all_reduce_goes_straight_into_the_group_and_reduces_as_dist_all_reduce(
    one_rank: None, publisher: ProgressPublisher, dtype: Any
) -> None:
    """Issue 38: the hook hands a real bucket to its group itself -- what dist.all_reduce(async_op=
    True) does, less its Python checks and the collective wrapper -- so the wrapper neither
    publishes nor counts it; a complex bucket takes dist.all_reduce (its real view), passed through.
    Either way the work's future holds the bucket, reduced."""
    from scout.job.hooks import _all_reduce

    inst.instrument(publisher)
    published = []
    publisher.enter_collective = lambda fingerprint: published.append(fingerprint)  # type: ignore[method-assign]
    bucket = torch.arange(6, dtype=torch.float32).to(dtype)
    expected = bucket.clone()
    work = _all_reduce(dist.group.WORLD, bucket, dist.ReduceOp.SUM)
    work.wait()
    (value,) = work.get_future().value()
    result = value if not torch.is_complex(bucket) or torch.is_complex(value) else torch.view_as_complex(value)
    assert torch.equal(result, expected) and result.data_ptr() == bucket.data_ptr()  # one rank: its sum
    assert published == []  # the hook publishes the bucket itself; the wrapper passed it through
