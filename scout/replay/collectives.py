"""The two collectives replay needs, every wait bounded (READY-4).

Two implementations of the :class:`PeerGroup` protocol the replayer sees:
:class:`TransportPeerGroup` over the project's binding ``scout.transport.nccl.TorchTransport``
(preferred: its deadlines name the ranks that never entered), and :class:`TorchPeerGroup`, a
thin adapter straight over torch.distributed that needs no store.

Replay runs its collectives on a process group of its own, never the training job's: after a
deadline passes a group may be unusable (gloo and NCCL cannot cancel an operation in flight,
transport contract guarantee 3), and that must not take the job's data-parallel group with it.
Creating a group is itself a collective over the whole world (``torch.distributed.new_group``).

Communication timing (spec/replay.md STRAG-1, COMM-1..COMM-3). Every collective call is timed in
two parts on the monotonic clock: *entry* -- from the call, after the tensors are staged, until
the operation is handed to the backend (this peer's own side of the communication path, and any
injected delay) -- and *wait* -- from then until it returns, most of which is waiting for the
peer that arrives last. The replayer exchanges both, per call, and votes on each peer's own
communication time (entry plus the part of the wait every peer shares), so the peer that the
others wait for is named, not the peers that waited.
"""

from __future__ import annotations

import datetime
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import attrs
import torch
import torch.distributed as dist

from scout.transport import gloo_groups
from scout.transport._binding import PollSettings
from scout.transport.base import DeadlineExceeded, TransportError, check_timeout_s
from scout.transport.nccl.work import WORK_POLL, TimedOut, wait_work

__all__ = [
    "CollectiveTimer",
    "CollectiveTimes",
    "EntryHookHandle",
    "OwnWallClock",
    "PeerGroup",
    "RunQueueDelay",
    "TorchPeerGroup",
    "TransportPeerGroup",
]


class PeerGroup(Protocol):
    """What the replayer needs from its peers."""

    @property
    def position(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def ranks(self) -> tuple[int, ...]: ...

    # Optional: a ``timer`` attribute (a CollectiveTimer) enables communication timing.

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        """Every peer's row (all rows have the same length), by peer position."""
        ...

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        """Overwrite ``tensors`` in place with the source peer's."""
        ...


@attrs.frozen
class CollectiveTimes:
    """Seconds this peer spent inside collectives since the timer was last taken: the sums,
    and each collective's ``(entry_s, wait_s)`` in call order (the first
    ``CollectiveTimer.PER_CALL_MAX`` of them)."""

    entry_s: float = 0.0  # call -> handed to the backend: this peer's own side
    wait_s: float = 0.0  # handed to the backend -> returned: mostly waiting for peers
    count: int = 0  # collective calls
    calls: tuple[tuple[float, float], ...] = ()

    @property
    def total_s(self) -> float:
        return self.entry_s + self.wait_s


class EntryHookHandle:
    """Removes one entry hook (``remove()`` is idempotent)."""

    def __init__(self, hooks: dict[int, Callable[[str], None]], key: int) -> None:
        self._hooks = hooks
        self._key = key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


class RunQueueDelay:
    """Seconds the calling thread has spent runnable but waiting for a CPU, from Linux's
    ``/proc/self/task/<tid>/schedstat``; always 0 where that is not available. One file
    descriptor per calling thread is kept open (at most ``THREADS_MAX``), so a reading is one
    ``pread``."""

    THREADS_MAX = 8

    def __init__(self) -> None:
        self._files: dict[int, int | None] = {}

    def __call__(self) -> float:
        # Keyed by the thread's Python identity (no system call, unlike its native id: this runs
        # several times a training step, issue 38); the native id only names the file.
        thread = threading.get_ident()
        fd = self._files.get(thread, -1)
        if fd == -1:
            fd = None
            if len(self._files) < self.THREADS_MAX:
                try:
                    fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
                except OSError:
                    fd = None
                self._files[thread] = fd
        if fd is None:
            return 0.0
        try:
            return int(os.pread(fd, 64, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self) -> None:
        for fd in self._files.values():
            if fd is not None:
                os.close(fd)
        self._files.clear()

    def __del__(self) -> None:
        self.close()


class OwnWallClock:
    """STRAG-1's ``own`` clock: the monotonic wall clock less the time the host kept the reading
    thread runnable but off a CPU (its run-queue delay, as LOOP-1 and COMM-1 subtract it) -- the
    thread's own time, computing or waiting, without the host's contention. Never decreases (the
    delay grows only while the wall clock does); where Linux does not report the delay it is the
    wall clock."""

    def __init__(self) -> None:
        self._delay = RunQueueDelay()

    #: Reads of the delay around the wall clock before taking an unsettled one: a preemption
    #: between the two reads would count its delay against a wall time read before it.
    READS_MAX = 3

    def __call__(self) -> int:
        before = self._delay()
        for _ in range(self.READS_MAX):
            wall_ns = time.monotonic_ns()
            after = self._delay()
            if after == before:
                break
            before = after
        return wall_ns - round(after * 1e9)


class CollectiveTimer:
    """Accumulates the time a peer spends inside collectives, apart from replay compute
    (STRAG-1), split into entry and wait (COMM-1), on the monotonic clock.

    The entry part leaves out the time the host kept this thread waiting for a CPU (Linux
    run-queue delay): a descheduled thread is contention on the host, not this peer's side of
    the communication path. Entry hooks run at the start of every collective, inside its
    entry part: the fault injector ``scout.replay.faults.slow_communication`` delays a peer's
    collectives there (it sleeps, which is not run-queue delay).
    """

    _keys = itertools.count()
    #: Per-call times kept between two ``take()`` calls (a check makes at most five).
    PER_CALL_MAX = 8

    def __init__(self) -> None:
        self._entry_s = 0.0
        self._wait_s = 0.0
        self._count = 0
        self._calls: list[tuple[float, float]] = []
        self._entry_of_call = 0.0
        self._delay_at_entry = 0.0
        self._run_queue_delay = RunQueueDelay()
        self._hooks: dict[int, Callable[[str], None]] = {}

    def add_entry_hook(self, hook: Callable[[str], None]) -> EntryHookHandle:
        """Call ``hook(operation)`` at the start of every collective (opt-in, for faults)."""
        key = next(self._keys)
        self._hooks[key] = hook
        return EntryHookHandle(self._hooks, key)

    def enter(self, operation: str) -> float:
        """Start of a collective call; returns its start time."""
        self._delay_at_entry = self._run_queue_delay()
        started = time.monotonic()
        for hook in tuple(self._hooks.values()):
            hook(operation)
        return started

    def posted(self, started: float) -> float:
        """The operation was handed to the backend; returns that time."""
        now = time.monotonic()
        delayed = self._run_queue_delay() - self._delay_at_entry
        self._entry_of_call = max(0.0, now - started - delayed)
        self._entry_s += self._entry_of_call
        self._count += 1
        return now

    def returned(self, posted: float) -> None:
        wait_s = time.monotonic() - posted
        self._wait_s += wait_s
        if len(self._calls) < self.PER_CALL_MAX:
            self._calls.append((self._entry_of_call, wait_s))

    def peek(self) -> CollectiveTimes:
        return CollectiveTimes(self._entry_s, self._wait_s, self._count, tuple(self._calls))

    def take(self) -> CollectiveTimes:
        """The times so far, and start again from zero."""
        times = self.peek()
        self._entry_s, self._wait_s, self._count = 0.0, 0.0, 0
        self._calls = []
        return times


class TorchPeerGroup:
    """A replay peer group over torch.distributed (gloo on CPU; NCCL for CUDA tensors).

    ``ranks``: one group (default: the whole world, DDP replicas). ``partition``: every peer
    group of the job (disjoint; each rank finds its own) -- needed whenever there is more than
    one group, because every rank must create every group, in the same order
    (``torch.distributed.new_group`` is collective over the world). :meth:`from_mesh` and
    :meth:`from_process_group` compute the partition (PEER-1..PEER-3).

    ``timeout_s`` bounds each collective: past it the call raises DeadlineExceeded and leaves
    the operation in flight, never aborting the communicator (spec/transport.md WAIT-1, WAIT-2).
    ``backend_timeout_s`` is the replay groups' own backend timeout, after which NCCL's watchdog
    aborts them (WAIT-4); it must exceed ``timeout_s`` (default: the larger of
    ``DEFAULT_BACKEND_TIMEOUT_S`` and 10 x ``timeout_s``).
    """

    #: WAIT-4: the replay groups' backend timeout unless given (NCCL's default is 10 minutes).
    DEFAULT_BACKEND_TIMEOUT_S: Final = 1800.0

    def __init__(
        self,
        ranks: Sequence[int] | None = None,
        *,
        partition: Sequence[Sequence[int]] | None = None,
        timeout_s: float = 60.0,
        backend: str = "gloo",
        device: torch.device | str = "cpu",
        backend_timeout_s: float | None = None,
        poll: PollSettings = WORK_POLL,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized: call init_process_group before building "
                "a replay peer group"
            )
        self.timeout_s = check_timeout_s(timeout_s, "TorchPeerGroup")
        if backend_timeout_s is None:
            backend_timeout_s = max(self.DEFAULT_BACKEND_TIMEOUT_S, 10 * self.timeout_s)
        self.backend_timeout_s = check_timeout_s(backend_timeout_s, "TorchPeerGroup backend")
        if not self.backend_timeout_s > self.timeout_s:
            raise ValueError(
                f"TorchPeerGroup: backend_timeout_s={backend_timeout_s!r} must exceed "
                f"timeout_s={timeout_s!r}, or the backend's watchdog aborts a late collective "
                "before scout's deadline names who is late (spec/transport.md WAIT-4)"
            )
        self._poll = poll
        world_size = dist.get_world_size()
        if ranks is not None and partition is not None:
            raise ValueError("give the peer ranks or a partition into peer groups, not both")
        if partition is not None:
            groups = [tuple(int(r) for r in group) for group in partition]
        elif ranks is not None:
            groups = [tuple(int(r) for r in ranks)]
        else:
            groups = [tuple(range(world_size))]
        _check_partition(groups, world_size)
        rank = dist.get_rank()
        own: tuple[tuple[int, ...], Any] | None = None
        # Every rank of the world takes part in creating every group, members or not.
        for members in groups:
            if backend == "gloo":  # WAIT-6: on the job's gloo device, no event loop of its own
                group = gloo_groups.new_group(members, timeout_s=self.backend_timeout_s)
            else:
                group = dist.new_group(
                    list(members),
                    timeout=datetime.timedelta(seconds=self.backend_timeout_s),
                    backend=backend,
                )
            if rank in members:
                own = (members, group)
        if own is None:
            where = list(groups[0]) if len(groups) == 1 else [list(g) for g in groups]
            raise ValueError(f"rank {rank} is not one of the peers {where}")
        self._ranks, self._group = own
        self._position = self._ranks.index(rank)
        #: Every peer group of the job, this rank's among them (the gate votes per group).
        self.partition: tuple[tuple[int, ...], ...] = tuple(groups)
        self.device = torch.device(device)
        self._timer = CollectiveTimer()

    @classmethod
    def from_mesh(cls, mesh: Any, replicate: str | Sequence[str], **options: Any) -> TorchPeerGroup:
        """Peers along the replicate dimension(s) of a ``DeviceMesh`` (PEER-1, PEER-2): DDP
        ``("dp",)``, HSDP ``("replicate", "shard")``, data x tensor ``("dp", "tp")``. The mesh
        must span the whole world (the root mesh, not a slice): every rank creates every group.
        No communication beyond creating the groups."""
        from scout.replay.mesh import mesh_layout, replica_groups

        layout = mesh_layout(mesh)
        world_size = dist.get_world_size()
        if sorted(layout.ranks) != list(range(world_size)):
            raise ValueError(
                f"the device mesh {layout.dim_names} of shape {layout.shape} spans ranks "
                f"{sorted(layout.ranks)}, not the whole world of {world_size}; pass the root "
                "mesh (every rank must create every replay group)"
            )
        partition = replica_groups(layout.shape, layout.dim_names, replicate, layout.ranks)
        return cls(partition=partition, **options)

    @classmethod
    def from_process_group(cls, group: Any, **options: Any) -> TorchPeerGroup:
        """Peers = the members of ``group`` (e.g. DDP's ``process_group``, or
        ``mesh.get_group("replicate")``), in a replay group of their own (PEER-3). Collective
        over the world: the ranks exchange their groups' members (one all-gather on the default
        process group) to learn the whole partition."""
        mine = tuple(int(r) for r in dist.get_process_group_ranks(group))
        world_size = dist.get_world_size()
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        partition: list[tuple[int, ...]] = []
        for rank, members in enumerate(gathered):
            members = tuple(members)
            if rank not in members:
                raise ValueError(f"rank {rank} reported a process group {list(members)} without it")
            if members not in partition:
                partition.append(members)
        return cls(partition=partition, **options)

    @property
    def timer(self) -> CollectiveTimer:
        return self._timer

    @property
    def position(self) -> int:
        return self._position

    @property
    def size(self) -> int:
        return len(self._ranks)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self._ranks

    def _wait(self, work: dist.Work, operation: str, posted: float) -> None:
        """WAIT-1, WAIT-2: poll the work until ``timeout_s`` after it was handed to the backend;
        ``wait()`` only once it completed, so a deadline never aborts the communicator."""
        try:
            outcome = wait_work(work, posted + self.timeout_s, self._poll)
        finally:
            self.timer.returned(posted)
        if isinstance(outcome, TimedOut):
            raise DeadlineExceeded(operation, self.timeout_s, ())
        if outcome is not None:
            raise TransportError(f"{operation} failed in the backend ({outcome})") from outcome

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        operation = f"replay all_gather of {len(row)} int64"
        mine = torch.tensor(list(row), dtype=torch.int64, device=self.device)
        gathered = [torch.empty_like(mine) for _ in self._ranks]
        started = self.timer.enter(operation)
        work = dist.all_gather(gathered, mine, group=self._group, async_op=True)
        assert work is not None
        self._wait(work, operation, self.timer.posted(started))
        return [t.cpu().tolist() for t in gathered]

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        """One broadcast of all tensors' raw bytes (dtype-agnostic, one latency, not one per
        tensor); every peer's tensors must have the same byte sizes (READY-1 checked that)."""
        if not 0 <= source_position < self.size:
            raise ValueError(f"source_position {source_position} outside 0..{self.size - 1}")
        # COMM-1: staging the bytes is this peer's compute, not its side of the path.
        packed = _pack(tensors, self.device)
        started = self.timer.enter(f"replay broadcast of {len(tensors)} tensors")
        if packed is None:
            self.timer.returned(self.timer.posted(started))
            return
        work = dist.broadcast(
            packed, src=self._ranks[source_position], group=self._group, async_op=True
        )
        assert work is not None
        posted = self.timer.posted(started)
        self._wait(
            work, f"replay broadcast of {len(tensors)} tensors, {packed.numel()} bytes", posted
        )
        _unpack(packed, tensors)


class TransportPeerGroup:
    """A replay peer group over ``scout.transport.nccl.TorchTransport``: the project's binding,
    whose deadlines also name the ranks that never entered a collective.

    Build the transport over a process group used only by replay
    (``TorchTransport(torch.distributed.new_group(ranks), store=...)``): after a deadline the
    transport marks that group's tensor collectives unusable, which must not hit training.
    """

    def __init__(
        self, transport: Any, *, timeout_s: float = 60.0, device: torch.device | str = "cpu"
    ) -> None:
        self.timeout_s = check_timeout_s(timeout_s, "TransportPeerGroup")
        self._transport = transport
        self._ranks: tuple[int, ...] = tuple(transport.world.ranks)
        self.device = torch.device(device)
        self._timer = CollectiveTimer()

    @property
    def timer(self) -> CollectiveTimer:
        return self._timer

    @property
    def position(self) -> int:
        return int(self._transport.rank)

    @property
    def size(self) -> int:
        return len(self._ranks)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self._ranks

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        # The transport's call blocks: its entry ends where the transport is called.
        mine = torch.tensor(list(row), dtype=torch.int64, device=self.device)
        started = self.timer.enter(f"replay all_gather of {len(row)} int64")
        posted = self.timer.posted(started)
        try:
            gathered = self._transport.all_gather_tensor(mine, timeout_s=self.timeout_s)
            return [t.cpu().tolist() for t in gathered]
        finally:
            self.timer.returned(posted)

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        if not 0 <= source_position < self.size:
            raise ValueError(f"source_position {source_position} outside 0..{self.size - 1}")
        packed = _pack(tensors, self.device)
        started = self.timer.enter(f"replay broadcast of {len(tensors)} tensors")
        posted = self.timer.posted(started)
        if packed is None:
            self.timer.returned(posted)
            return
        try:
            self._transport.broadcast_tensor(
                packed, root=self._ranks[source_position], timeout_s=self.timeout_s
            )
            _unpack(packed, tensors)
        finally:
            self.timer.returned(posted)


def _check_partition(groups: Sequence[tuple[int, ...]], world_size: int) -> None:
    """Peer groups are non-empty, hold distinct ranks of the world, and do not overlap."""
    seen: dict[int, tuple[int, ...]] = {}
    for members in groups:
        if not members:
            raise ValueError("a peer group is empty: every group needs at least one rank")
        if len(set(members)) != len(members) or not all(0 <= r < world_size for r in members):
            raise ValueError(
                f"peer ranks {list(members)} must be distinct ranks of 0..{world_size - 1}"
            )
        for rank in members:
            if rank in seen:
                raise ValueError(
                    f"rank {rank} is in two peer groups, {list(seen[rank])} and {list(members)}"
                )
            seen[rank] = members


def _pack(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor | None:
    """The tensors' bytes end to end in one uint8 buffer on ``device`` (None if empty)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    total = sum(sizes)
    if total == 0:
        return None
    packed = torch.empty(total, dtype=torch.uint8, device=device)
    offset = 0
    for tensor, size in zip(tensors, sizes, strict=True):
        if size:
            packed[offset : offset + size].copy_(_bytes_of(tensor))
        offset += size
    return packed


def _unpack(packed: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        if size:
            _bytes_of(tensor).copy_(packed[offset : offset + size])
        offset += size


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 view sharing the tensor's memory (the tensor must be contiguous)."""
    if not tensor.is_contiguous():
        raise ValueError(
            f"broadcast needs contiguous tensors, got shape {tuple(tensor.shape)} with strides "
            f"{tensor.stride()}"
        )
    flat = tensor.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)
