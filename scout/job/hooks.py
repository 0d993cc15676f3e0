"""DDP's gradient all-reduces, visible to the observer (docs/observer.md "What is seen").

DDP launches one all-reduce per gradient bucket from C++ during backward, so wrapping the
``torch.distributed`` functions never sees them: a rank that hangs before or inside backward
used to look exactly like its peers, which wait inside those all-reduces. A communication hook
publishes each bucket's launch -- one op and a fingerprint of (group, bucket index, size,
dtype) -- and then runs the default all-reduce. Launches are published, completions are not
(they come from a communication thread in an order that differs between ranks; see
``ProgressPublisher.enter_async_collective``), so every rank waiting on a late peer shows the
same coordinate, and the late peer is behind it.

The hook averages the bucket (INSTR-15) with one ``ReduceOp.AVG`` all-reduce where the backend
divides inside its reduction (NCCL), else by a division on the training thread and a sum, as
DDP's default hook does. Either is a pass DDP alone does not make (it fuses the scaling into its
copy into the bucket when no hook is registered); gloo's ``AVG`` makes the same pass on gloo's
thread, where the budget could not see it, so the division is done here and timed as scout's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.observer import instrument
from scout.observer.progress import ProgressPublisher
from scout.reports import guard
from scout.reports.guard import Part
from scout.reports.hook_time import HOOK_TIME, now_ns

__all__ = ["publish_ddp_buckets"]

logger = logging.getLogger("scout")


def publish_ddp_buckets(
    model: Any, publisher: ProgressPublisher, listeners: Sequence[Callable[[], Callable[[], None] | None]] = ()
) -> bool:
    """Register the publishing communication hook on a DDP model; False (and a warning) when the
    model is not DDP or already has a communication hook of its own. ``listeners`` (read at each
    call, so they may be added later) are called at each bucket's launch, and what each returns
    when the bucket's all-reduce completed: in the callback of its work's future, which on NCCL
    runs with a current stream that waits for the all-reduce, so a timer's mark recorded there
    completes with it (loop stragglers, LOOP-5)."""
    if not isinstance(model, DistributedDataParallel):
        return False
    group = model.process_group if model.process_group is not None else dist.group.WORLD
    ranks = tuple(dist.get_process_group_ranks(group))
    size = group.size()
    # INSTR-15: whether the backend divides inside its reduction, decided at the first bucket (the
    # same device and backend on every rank, so alike everywhere); False after a refusal of AVG.
    average: list[bool | None] = [None]

    def launch_in_reduction(buffer: Any) -> Any:
        """The bucket's average by one AVG all-reduce (the backend divides inside its reduction);
        None where the backend refused AVG -- before any byte moved (it checks the op first), on
        every rank alike -- and from then on the hook divides and sums."""
        try:
            return _all_reduce(group, buffer, dist.ReduceOp.AVG)
        except (RuntimeError, ValueError) as error:
            average[0] = False
            logger.debug("scout: the DDP hook falls back to a division and a sum: %s", error)
            return None

    # Each bucket's fingerprint, by (index, dtype, size): the same few buckets every step, and
    # describing one costs more than the dictionary look-up (issue 38: the fixed per-step cost).
    fingerprints: dict[tuple[int, Any, int], int] = {}

    def bucket_fingerprint_of(buffer: Any, index: int) -> int:
        key = (index, buffer.dtype, buffer.numel())
        found = fingerprints.get(key)
        if found is None:
            call = CollectiveCall("all_reduce", ranks, (TensorMeta(str(buffer.dtype), (buffer.numel(),)),),
                                  reduce_op="SUM", detail=(("ddp_bucket", index),))
            found = fingerprints[key] = fingerprint(call)
        return found

    def hook(state: Any, bucket: Any) -> Any:
        started = now_ns()  # spec/budget.md BUDGET-10: scout's part, not the all-reduce
        buffer = bucket.buffer()
        finishers: list[Callable[[], None]] = []
        tracker, entry, bucket_fingerprint = None, None, 0
        if guard.running(Part.DDP_HOOK):  # spec/guard.md: off, the hook only averages the bucket
            try:
                if guard.INJECTING:
                    guard.inject("ddp_hook.bucket")
                bucket_fingerprint = bucket_fingerprint_of(buffer, bucket.index())
                publisher.enter_async_collective(bucket_fingerprint)
                finishers = [finish for finish in map(_started, tuple(listeners)) if finish is not None]
                tracker = instrument.completion_tracker(group)
            except Exception as error:  # GUARD-3: never into the backward
                guard.failed(Part.DDP_HOOK, error, "ddp comm hook")
            if tracker is not None:
                try:
                    entry = tracker.begin(bucket_fingerprint)
                except Exception as error:
                    guard.failed(Part.COMPLETION, error, "ddp comm hook")
                    tracker = None
        # DDP's default hook, spelled out so that the bucket's Work is at hand for completion
        # tracking (INSTR-11): the bucket's average by an asynchronous all-reduce (INSTR-15). It is
        # the job's collective: what it raises is the job's (GUARD-1), and it runs whatever
        # happened to scout's work above, so the gradients are averaged as without scout.
        if average[0] is None:
            average[0] = _averages_in_reduction(group, buffer)
        divided_ns = 0
        launching = now_ns()
        work = launch_in_reduction(buffer) if average[0] else None
        if work is None:
            # INSTR-15: the average's pass over the bucket is scout's work on the training
            # thread (without the hook DDP fuses it into its copy), so it is in the hook's own
            # time (BUDGET-10); the sum is the job's.
            began = now_ns()
            buffer.div_(size)
            divided_ns = now_ns() - began
            work = _all_reduce(group, buffer, dist.ReduceOp.SUM)
        launched = now_ns()
        if tracker is not None:
            try:
                tracker.end(entry, work)
            except Exception as error:
                guard.failed(Part.COMPLETION, error, "ddp comm hook")

        inline = True  # until then() returns: a callback run inside it is in the hook's own time

        def completed(done: Any) -> Any:
            # spec/budget.md BUDGET-10: on the communication thread, but DDP waits for this
            # future before the backward returns: the step pays for it. Run inline by then() (a
            # future complete at enqueue, as NCCL's), it is counted with the hook's own time.
            began = now_ns()
            for finish in finishers:
                try:
                    finish()
                except Exception:  # diagnostics never break the training step
                    logger.debug("scout: a bucket listener failed", exc_info=True)
            value = done.value()[0]
            if not inline:
                HOOK_TIME.spent_ns += now_ns() - began
            return value

        future = work.get_future().then(completed)
        inline = False
        HOOK_TIME.spent_ns += launching - started + divided_ns + now_ns() - launched
        return future

    def _started(listener: Callable[[], Callable[[], None] | None]) -> Callable[[], None] | None:
        try:
            return listener()
        except Exception:  # diagnostics never break the training step
            logger.debug("scout: a bucket listener failed", exc_info=True)
            return None

    # DDP checks the hook's annotations as objects (this module's are strings).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,  # type: ignore[attr-defined]
                            "return": torch.futures.Future[torch.Tensor]}
    try:
        model.register_comm_hook(group, hook)
    except RuntimeError as error:
        logger.warning("scout: DDP's gradient all-reduces stay unseen by the observer (%s): a communication hook "
                       "is already registered on this model", error)
        return False
    return True


#: Whether this torch's AllreduceOptions has ``asyncOp`` (newer releases: the backend then knows
#: that the caller does not wait, as ``dist.all_reduce(async_op=True)`` tells it).
_ASYNC_OPTION = dist.is_available() and hasattr(dist.AllreduceOptions(), "asyncOp")


def _all_reduce(group: Any, buffer: Any, op: Any) -> Any:
    """The bucket's all-reduce, asynchronous, straight into the group: what ``dist.all_reduce(buffer,
    op, group, async_op=True)`` does for a dense real tensor, less its Python checks and scout's
    own wrapper, which would only pass it through (the hook published and tracks the bucket
    itself). Issue 38: ~8 us a bucket on this box, at every bucket of every step. A complex bucket
    takes ``dist.all_reduce`` (it reduces the real view), inside ``already_published``."""
    if buffer.is_complex():
        with instrument.already_published():
            return dist.all_reduce(buffer, op=op, group=group, async_op=True)
    options = dist.AllreduceOptions()
    options.reduceOp = op
    if _ASYNC_OPTION:
        options.asyncOp = True
    return group.allreduce([buffer], options)


def _averages_in_reduction(group: Any, buffer: Any) -> bool:
    """INSTR-15: True where the group's backend for the bucket's device divides inside its
    reduction (NCCL, on a CUDA bucket); gloo's AVG is a sum and a pass dividing it afterwards."""
    if buffer.device.type != "cuda":
        return False
    try:
        return str(group._get_backend(buffer.device).name()).lower() == "nccl"
    except Exception:  # GUARD-3: never into the backward; a division and a sum are right anywhere
        return False
