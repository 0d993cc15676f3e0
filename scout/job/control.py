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
from functools import cached_property
from typing import Any, TypeVar

import torch.distributed as dist

from scout.core.drive import Handler, drive
from scout.transport import gloo_groups
from scout.transport.program import AllGather, Barrier, Broadcast

__all__ = ["ControlGroup", "ControlOp"]

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

    @cached_property
    def answers(self) -> dict[type, Handler]:
        """The handler table, built once: :meth:`run` drives ``job.step()``'s program every step."""
        return control_answers(self)

    def run(self, program: Generator[Any, Any, T]) -> T:
        """Drive a rank program to its end, answering its ops (``ControlOp``) on this group."""
        return drive(program, self.answers, who="scout's control group")


#: The ops :meth:`ControlGroup.run` answers, each job-wide (``group`` None).
ControlOp = AllGather | Broadcast | Barrier


def _job_wide(op: ControlOp) -> None:
    if op.group is not None:
        raise TypeError(f"scout's control group runs job-wide AllGather, Broadcast and Barrier ops (group None), "
                        f"not {op!r}: run an op on a sub-group on that group's own transport")


def control_answers(control: ControlGroup) -> dict[type, Handler]:
    """Each control op answered on the group, after refusing one on a sub-group."""

    def all_gather(op: AllGather) -> list[Any]:
        _job_wide(op)
        return control.all_gather(op.payload)

    def broadcast(op: Broadcast) -> Any:
        _job_wide(op)
        return control.broadcast(op.payload, op.root)

    def barrier(op: Barrier) -> None:
        _job_wide(op)
        control.barrier()

    return {AllGather: all_gather, Broadcast: broadcast, Barrier: barrier}
