"""scout's own gloo group over the whole job: small control traffic -- hosts, the restore
decision, the canary's readings and each check step's one exchange -- bounded by
``collective_timeout_s`` and apart from the training job's process groups and backend.

:meth:`ControlGroup.run` executes a rank program (``scout.transport.program``) on it, which is
how the job runs ``scout.job.pipeline.run_step``, ``scout.job.restore.run_restore``,
``scout.job.save.run_save`` and the framework's programs (``scout.job.framework``): job-wide
``AllGather``, ``Broadcast`` and ``Barrier`` are the ops they yield; anything else is a bug and
raises naming the op. The ops' ``timeout_s`` is the group's own (``collective_timeout_s``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

import torch.distributed as dist

from scout.transport import gloo_groups
from scout.transport.program import AllGather, Barrier, Broadcast

__all__ = ["ControlGroup"]

T = TypeVar("T")


class ControlGroup:
    """A gloo group spanning the world (creating it is collective over the world)."""

    def __init__(self, timeout_s: float) -> None:
        self.group = gloo_groups.new_group(timeout_s=timeout_s)  # WAIT-6: no event loop of its own
        self.world_size = dist.get_world_size()

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, by rank."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def broadcast(self, value: Any, source: int = 0) -> Any:
        """``source``'s ``value`` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=source, group=self.group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def run(self, program: Generator[Any, Any, T]) -> T:
        """Drive a rank program to its end, answering its ops on this group."""
        answer: Any = None
        while True:
            try:
                op = program.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(op, AllGather) and op.group is None:
                answer = self.all_gather(op.payload)
            elif isinstance(op, Broadcast) and op.group is None:
                answer = self.broadcast(op.payload, op.root)
            elif isinstance(op, Barrier) and op.group is None:
                self.barrier()
                answer = None
            else:
                raise TypeError(f"scout's control group runs job-wide AllGather, Broadcast and Barrier ops, not {op!r}")
