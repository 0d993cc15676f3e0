"""DDP's gradient all-reduces, visible to the observer (docs/observer.md "What is seen").

DDP launches one all-reduce per gradient bucket from C++ during backward, so wrapping the
``torch.distributed`` functions never sees them: a rank that hangs before or inside backward
used to look exactly like its peers, which wait inside those all-reduces. A communication hook
publishes each bucket's launch -- one op and a fingerprint of (group, bucket index, size,
dtype) -- and then runs the default all-reduce. Launches are published, completions are not
(they come from a communication thread in an order that differs between ranks; see
``ProgressPublisher.enter_async_collective``), so every rank waiting on a late peer shows the
same coordinate, and the late peer is behind it.

The hook averages with one ``ReduceOp.AVG`` all-reduce where the backend has it (INSTR-9): DDP
copies gradients into a hooked bucket without the scaling it fuses into that copy when no hook is
registered, so dividing the bucket before a sum (``default_hooks.allreduce_hook``) would add a
pass over every gradient on the training thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.observer import instrument
from scout.observer.progress import ProgressPublisher

__all__ = ["publish_ddp_buckets"]

logger = logging.getLogger("scout")


def publish_ddp_buckets(
    model: Any, publisher: ProgressPublisher, listeners: Sequence[Callable[[int, int], None]] = ()
) -> bool:
    """Register the publishing communication hook on a DDP model; False (and a warning) when the
    model is not DDP or already has a communication hook of its own. ``listeners`` (read at each
    call, so they may be added later) get each bucket's launch and completion times in
    monotonic ns (loop stragglers, LOOP-1)."""
    if not isinstance(model, DistributedDataParallel):
        return False
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group = model.process_group
    ranks = tuple(dist.get_process_group_ranks(group))
    average = [True]  # INSTR-9: ReduceOp.AVG until the backend refuses it (alike on every rank)

    def all_reduce_mean(state: Any, bucket: Any) -> Any:
        if average[0]:
            buffer = bucket.buffer()
            try:
                work = dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=group, async_op=True)
            except (RuntimeError, ValueError) as error:
                # Refused before any byte moved (the backend checks the op first), on every rank.
                average[0] = False
                logger.debug("scout: the DDP hook falls back to a division and a sum: %s", error)
            else:
                assert work is not None
                return work.get_future().then(lambda done: done.value()[0])
        return default_hooks.allreduce_hook(state, bucket)

    def hook(state: Any, bucket: Any) -> Any:
        try:
            buffer = bucket.buffer()
            call = CollectiveCall("all_reduce", ranks, (TensorMeta(str(buffer.dtype), (buffer.numel(),)),),
                                  reduce_op="SUM", detail=(("ddp_bucket", bucket.index()),))
            publisher.enter_async_collective(fingerprint(call))
        except Exception:  # diagnostics never break the training step
            logger.debug("scout: could not publish a DDP bucket", exc_info=True)
        entry_ns = time.monotonic_ns()
        with instrument.already_published():
            future = all_reduce_mean(state, bucket)
        if not listeners:
            return future

        def completed(done: Any) -> Any:
            exit_ns = time.monotonic_ns()
            for listener in tuple(listeners):
                try:
                    listener(entry_ns, exit_ns)
                except Exception:  # diagnostics never break the training step
                    logger.debug("scout: a bucket listener failed", exc_info=True)
            return done.value()

        return future.then(completed)

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
