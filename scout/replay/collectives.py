"""The two collectives replay needs, every wait bounded (READY-4).

Two implementations of the :class:`PeerGroup` protocol the replayer sees:
:class:`TransportPeerGroup` over the project's binding ``scout.transport.nccl.TorchTransport``
(preferred: its deadlines name the ranks that never entered), and :class:`TorchPeerGroup`, a
thin adapter straight over torch.distributed that needs no store.

Replay runs its collectives on a process group of its own, never the training job's: after a
deadline passes a group may be unusable (gloo and NCCL cannot cancel an operation in flight,
transport contract guarantee 3), and that must not take the job's data-parallel group with it.
Creating a group is itself a collective over the whole world (``torch.distributed.new_group``).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from scout.transport.base import DeadlineExceeded, check_timeout_s

__all__ = ["CollectiveTimer", "PeerGroup", "TorchPeerGroup", "TransportPeerGroup"]


class PeerGroup(Protocol):
    """What the replayer needs from its peers."""

    @property
    def position(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def ranks(self) -> tuple[int, ...]: ...

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        """Every peer's row (all rows have the same length), by peer position."""
        ...

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        """Overwrite ``tensors`` in place with the source peer's."""
        ...


class CollectiveTimer:
    """Accumulates wall time spent inside collectives, apart from replay compute (STRAG-1)."""

    def __init__(self) -> None:
        self.elapsed_s = 0.0

    def reset(self) -> float:
        elapsed, self.elapsed_s = self.elapsed_s, 0.0
        return elapsed


class TorchPeerGroup:
    """A replay peer group over torch.distributed (gloo on CPU; NCCL for CUDA tensors)."""

    def __init__(
        self,
        ranks: Sequence[int] | None = None,
        *,
        timeout_s: float = 60.0,
        backend: str = "gloo",
        device: torch.device | str = "cpu",
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized: call init_process_group before building "
                "a replay peer group"
            )
        self.timeout_s = check_timeout_s(timeout_s, "TorchPeerGroup")
        world_size = dist.get_world_size()
        members = tuple(range(world_size)) if ranks is None else tuple(int(r) for r in ranks)
        if len(set(members)) != len(members) or not all(0 <= r < world_size for r in members):
            raise ValueError(
                f"peer ranks {list(members)} must be distinct ranks of 0..{world_size - 1}"
            )
        rank = dist.get_rank()
        # Every rank of the world takes part in creating the group, members or not.
        group = dist.new_group(
            list(members), timeout=datetime.timedelta(seconds=self.timeout_s), backend=backend
        )
        if rank not in members:
            raise ValueError(f"rank {rank} is not one of the peers {list(members)}")
        self._group = group
        self._ranks = members
        self._position = members.index(rank)
        self.device = torch.device(device)
        self.timer = CollectiveTimer()

    @property
    def position(self) -> int:
        return self._position

    @property
    def size(self) -> int:
        return len(self._ranks)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self._ranks

    def _wait(self, work: dist.Work, operation: str, started: float) -> None:
        try:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise DeadlineExceeded(operation, self.timeout_s, ()) from exc
        finally:
            self.timer.elapsed_s += time.perf_counter() - started

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        started = time.perf_counter()
        mine = torch.tensor(list(row), dtype=torch.int64, device=self.device)
        gathered = [torch.empty_like(mine) for _ in self._ranks]
        work = dist.all_gather(gathered, mine, group=self._group, async_op=True)
        assert work is not None
        self._wait(work, f"replay all_gather of {len(row)} int64", started)
        return [t.cpu().tolist() for t in gathered]

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        """One broadcast of all tensors' raw bytes (dtype-agnostic, one latency, not one per
        tensor); every peer's tensors must have the same byte sizes (READY-1 checked that)."""
        if not 0 <= source_position < self.size:
            raise ValueError(f"source_position {source_position} outside 0..{self.size - 1}")
        started = time.perf_counter()
        packed = _pack(tensors, self.device)
        if packed is None:
            return
        work = dist.broadcast(
            packed, src=self._ranks[source_position], group=self._group, async_op=True
        )
        assert work is not None
        self._wait(
            work, f"replay broadcast of {len(tensors)} tensors, {packed.numel()} bytes", started
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
        self.timer = CollectiveTimer()

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
        started = time.perf_counter()
        try:
            mine = torch.tensor(list(row), dtype=torch.int64, device=self.device)
            gathered = self._transport.all_gather_tensor(mine, timeout_s=self.timeout_s)
            return [t.cpu().tolist() for t in gathered]
        finally:
            self.timer.elapsed_s += time.perf_counter() - started

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        if not 0 <= source_position < self.size:
            raise ValueError(f"source_position {source_position} outside 0..{self.size - 1}")
        started = time.perf_counter()
        try:
            packed = _pack(tensors, self.device)
            if packed is None:
                return
            self._transport.broadcast_tensor(
                packed, root=self._ranks[source_position], timeout_s=self.timeout_s
            )
            _unpack(packed, tensors)
        finally:
            self.timer.elapsed_s += time.perf_counter() - started


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
