"""scout's own gloo process groups, on a shared event loop (spec/transport.md WAIT-6).

A gloo group's event-loop thread belongs to its *device* and wakes every 10 ms whatever the
group does; one device serves any number of groups. :func:`new_group` builds a gloo group (a
backend registered once as :data:`BACKEND`) on the device of the job's default process group
when that group has a gloo backend, else on one device this module creates once per process,
so scout's groups add no event loop to a gloo job and one to any other. Each group keeps its own
connections, queue and one worker thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import torch
import torch.distributed as dist

__all__ = ["BACKEND", "LOOP_THREAD_NAME", "loop_threads", "new_group", "own_loop_threads"]

#: The backend name scout's gloo groups are created with (``torch.distributed.get_backend``).
BACKEND: Final = "scoutgloo"
#: Worker threads per group: scout runs one call at a time on each of its groups.
WORKER_THREADS: Final = 1

#: The name gloo's TCP transport gives a device's event-loop thread (``/proc/self/task/*/comm``).
LOOP_THREAD_NAME: Final = "gloo_tcp_loop"
_TASKS: Final = Path("/proc/self/task")

_lock = threading.Lock()
_registered = False
_own_device: Any = None  # created at most once, for a job whose default group has no gloo
_loops_before_own_device: frozenset[int] = frozenset()


def loop_threads(name: str = LOOP_THREAD_NAME) -> frozenset[int]:
    """The ids of this process's threads called ``name`` (empty where /proc is absent)."""
    found = set()
    with contextlib.suppress(OSError):
        for task in _TASKS.iterdir():
            with contextlib.suppress(OSError, ValueError):
                if (task / "comm").read_text(encoding="utf-8").strip() == name:
                    found.add(int(task.name))
    return frozenset(found)


def own_loop_threads() -> frozenset[int]:
    """The event-loop threads of the device scout made for itself (WAIT-5 keeps them at
    ``SCHED_IDLE``): those that appeared since it was made, once its groups connected; empty
    while scout's groups share the default group's device."""
    with _lock:
        if _own_device is None:
            return frozenset()
        before = _loops_before_own_device
    return loop_threads() - before


def _default_gloo_devices() -> list[Any]:
    """The gloo devices of the default process group's CPU backend; empty when it has none."""
    group = dist.distributed_c10d._get_default_group()
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError):  # no backend for CPU tensors (NCCL only)
        return []
    if not isinstance(backend, dist.ProcessGroupGloo):
        return []
    return list(getattr(backend.options, "_devices", None) or [])  # torch's stubs lack the field


def _devices() -> list[Any]:
    global _own_device, _loops_before_own_device
    devices = _default_gloo_devices()
    if devices:
        return devices
    with _lock:
        if _own_device is None:
            _loops_before_own_device = loop_threads()
            _own_device = dist.ProcessGroupGloo.create_default_device()
        return [_own_device]


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in torch's stubs
    options._devices = _devices()
    options._threads = WORKER_THREADS
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, options)


def _register() -> None:
    global _registered
    with _lock:
        if not _registered and BACKEND.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
        _registered = True


def new_group(ranks: Sequence[int] | None = None, *, timeout_s: float) -> Any:
    """A gloo group of ``ranks`` (None: the whole world) on the shared device (WAIT-6), with
    backend timeout ``timeout_s``. Collective over the world, like
    ``torch.distributed.new_group``."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call init_process_group before scout's groups")
    if not timeout_s > 0:
        raise ValueError(f"a group's backend timeout must be > 0 s, got timeout_s={timeout_s!r}")
    _register()
    return dist.new_group(None if ranks is None else list(ranks), timeout=timedelta(seconds=timeout_s),
                          backend=BACKEND)
