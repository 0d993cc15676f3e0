"""scout's own gloo groups' event-loop threads yield to training (spec/transport.md WAIT-5).

A gloo process group owns a ``gloo_tcp_loop`` thread that wakes every 10 ms whatever the group
does. scout's groups are idle between scout's calls, so those wake-ups only take CPU from the
training threads on a host whose cores they keep busy. :class:`IdleLoops` finds the loop threads
that appeared while ``scout.attach`` built its groups (``snapshot`` before, ``since`` after),
keeps them at ``SCHED_IDLE``, and puts them back at the normal policy for the length of each
call that can run a collective on them (:meth:`IdleLoops.awake`), so they are never starved
while scout needs them. Linux only; elsewhere, or where the kernel refuses, nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = ["LOOP_THREAD_NAME", "IdleLoops", "loop_threads"]

logger = logging.getLogger("scout")

#: The name gloo's TCP transport gives its event-loop thread (``/proc/self/task/*/comm``).
LOOP_THREAD_NAME: Final = "gloo_tcp_loop"
_TASKS: Final = Path("/proc/self/task")


def loop_threads(name: str = LOOP_THREAD_NAME) -> frozenset[int]:
    """The ids of this process's threads called ``name`` (empty where /proc is absent)."""
    found = set()
    with contextlib.suppress(OSError):
        for task in _TASKS.iterdir():
            with contextlib.suppress(OSError, ValueError):
                if (task / "comm").read_text(encoding="utf-8").strip() == name:
                    found.add(int(task.name))
    return frozenset(found)


def _policies_available() -> bool:
    return all(hasattr(os, name) for name in ("sched_setscheduler", "sched_getscheduler", "sched_getparam",
                                           "SCHED_IDLE", "sched_param"))


class IdleLoops:
    """The loop threads of scout's own groups, at ``SCHED_IDLE`` except inside :meth:`awake`."""

    def __init__(self, threads: frozenset[int]) -> None:
        self.threads = threads
        self._depth = 0
        self.working = bool(threads) and _policies_available()
        #: Each thread's policy before (the creating thread's, inherited): what awake() restores.
        self._normal: dict[int, tuple[int, os.sched_param]] = {}
        if self.working:
            for thread in threads:
                with contextlib.suppress(OSError):
                    self._normal[thread] = (os.sched_getscheduler(thread), os.sched_getparam(thread))
            self.working = bool(self._normal) and self._set(os.SCHED_IDLE)
        if threads and not self.working:
            logger.debug("scout: the event loops of scout's gloo groups keep their scheduling policy (WAIT-5: "
                         "SCHED_IDLE is not available here)")

    @classmethod
    def since(cls, before: frozenset[int]) -> IdleLoops:
        """The loop threads that exist now and did not in ``before`` (:func:`loop_threads`)."""
        return cls(loop_threads() - before)

    def _set(self, policy: int | None) -> bool:
        """Every thread to ``policy`` (None: its normal one); False if the kernel refused one
        that still exists."""
        ok = True
        for thread, (normal, parameter) in self._normal.items():
            try:
                if policy is None:
                    os.sched_setscheduler(thread, normal, parameter)
                else:
                    os.sched_setscheduler(thread, policy, os.sched_param(0))
            except ProcessLookupError:
                continue  # its group was destroyed
            except OSError:
                ok = False
        return ok

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        """The normal policy for the length of the block (nested blocks count once), so scout's
        collectives are never starved by busy cores; ``SCHED_IDLE`` again when the outermost
        block ends, however it ends."""
        if not self.working:
            yield
            return
        if self._depth == 0:
            self._set(None)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._set(os.SCHED_IDLE)
