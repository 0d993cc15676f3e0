"""The wall time scout's hooks take inside a training step (spec/budget.md BUDGET-10).

The overhead budget charges scout for its time on the training thread (BUDGET-3's ``F``):
``job.step()`` times itself, and every hook scout runs inside the forward, the backward, the
optimizer step or the data loader adds its own code's time here. ``job.step()`` takes the sum at
its start (the training phase's hooks) and discards what accumulated while it ran (its own
collectives pass through scout's wrappers, and its time already holds them).

A hook does::

    started = now_ns()
    try:
        ...  # scout's part of the hook
    finally:
        HOOK_TIME.spent_ns += now_ns() - started

Two reads of a vDSO clock (tens of nanoseconds each); no lock: a hook on another thread adding at
the same moment may lose one addition, which only undercounts (BUDGET-10). No torch here.
"""

from __future__ import annotations

import time
from typing import Final

__all__ = ["HOOK_TIME", "HookTime", "now_ns"]

#: The clock hooks read (monotonic, ns).
now_ns: Final = time.perf_counter_ns


class HookTime:
    """The hooks' time since the last :meth:`take_s`, in ns (BUDGET-10)."""

    __slots__ = ("spent_ns",)

    def __init__(self) -> None:
        self.spent_ns = 0

    def take_s(self) -> float:
        """The hooks' time since the last call, in seconds; the sum restarts at 0."""
        spent, self.spent_ns = self.spent_ns, 0
        return spent / 1e9


#: The process's one sum: a process runs one training loop under scout (one ``scout.attach``).
HOOK_TIME: Final = HookTime()
