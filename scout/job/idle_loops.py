"""scout's own gloo event loop yields to training (spec/transport.md WAIT-5).

A gloo device owns a ``gloo_tcp_loop`` thread that wakes every 10 ms whatever its groups do. On
a job whose default group is gloo, scout's groups share that group's device and add no loop
(WAIT-6); elsewhere they share one device of scout's (``gloo_groups.own_loop_threads``), idle
between scout's calls, whose wake-ups only take CPU from the training threads on a host whose
cores they keep busy. :class:`IdleLoops` keeps those threads at ``SCHED_IDLE``, and puts them
back at the normal policy for the length of each call that can run a collective on them
(:meth:`IdleLoops.awake`), so they are never starved while scout needs them. Linux only;
elsewhere, or where the kernel refuses, nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

__all__ = ["IdleLoops"]

logger = logging.getLogger("scout")


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
