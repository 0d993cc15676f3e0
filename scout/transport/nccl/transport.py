"""The torch.distributed binding: tensors over a ProcessGroup, evidence over a Store.

Design (docs/transports.md has the long form):

* **Tensor collectives** (:meth:`TorchTransport.all_gather_tensor`,
  :meth:`TorchTransport.broadcast_tensor`) go through the process group's backend -- NCCL for
  CUDA tensors, gloo for CPU tensors -- with ``async_op=True``, and are waited for by polling
  ``work.is_completed()`` (:func:`scout.transport.nccl.work.wait_work`): a timed ``work.wait``
  would abort an NCCL communicator (spec/transport.md WAIT-1). A backend cannot say who is
  missing, so a member whose collective #n is still running after a short grace records "I
  entered tensor collective #n of this group" under one store key per member; on a deadline
  the members whose key is below ``n`` are the missing ones. After a deadline the operation is
  still in flight inside the backend: the group's tensor collectives refuse to run until it
  completes (a late peer entered) and work again after that (WAIT-3); the exchange keeps
  working throughout.
* **Evidence** (exchange, all_gather, broadcast, barrier of codec payloads) goes through a
  ``torch.distributed.Store``, not the process group: a Store keeps working while NCCL streams
  are busy or stuck, and keys give partial results for free (a member that did not answer is
  a key that is not there). Each member writes one key per round
  (``scout/<namespace>/<stream>/<group>/<number>/<rank>``) and polls ``check`` for its peers'
  keys against a ``time.monotonic`` deadline; it never calls a blocking ``get``/``wait`` on a
  key that might be absent. Each member deletes its own keys once they are ``keep_rounds``
  rounds old, so the store holds a bounded number of scout keys.
* The store must stay reachable when a trainer freezes, so it should be hosted by a process
  that is not a trainer: torchrun's agent store (the default ``MASTER_ADDR:MASTER_PORT`` under
  torchrun), or a dedicated ``TCPStore(..., is_master=True)`` server. Any ``Store`` works; the
  transport uses its own ``clone()`` so it never shares a connection with other users.
"""

from __future__ import annotations

import collections
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore
from torch.distributed.distributed_c10d import PrefixStore, Store

from scout.core.guards import whole_number
from scout.transport._binding import (
    Frame,
    FrameError,
    PieceBinding,
    PollSettings,
    Stream,
    group_key,
    unpack_frame,
    wait_until,
)
from scout.transport.base import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DeadlineExceeded,
    Group,
    GroupError,
    TransportError,
    check_timeout_s,
)
from scout.transport.nccl.work import WORK_POLL, TimedOut, completed_now, wait_work

__all__ = ["TorchTransport"]

# A tensor collective still running after this long (or a quarter of its timeout, if less)
# records in the store that this member entered it; see _tensor_collective.
_NOTICE_GRACE_S = 0.05
# Reads of keys already seen by check() get at least this long, one store round trip.
_MIN_READ_TIMEOUT_S = 1.0
# Transports built on the same namespace in this process, so that every rank numbers its
# instances alike (like torch.distributed.new_group) and two instances never share keys.
_instances_by_namespace: collections.Counter[str] = collections.Counter()


class TorchTransport(PieceBinding):
    """The transport contract over a torch.distributed process group and a Store.

    Ranks are the ranks *within* ``process_group`` (the default group when None), so over a
    subgroup the transport's world is that subgroup. ``store`` carries the evidence; when None
    the transport connects a client to ``MASTER_ADDR:MASTER_PORT`` (torchrun's store). Every
    rank must construct its transports in the same order; ``namespace`` (default: the torchrun
    run id and restart count, and the process group's ranks) separates jobs sharing one store.

    Not thread-safe: drive one transport from one thread.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        store: Store | None = None,
        namespace: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        busy_poll_s: float = 0.002,
        poll_interval_s: float = 0.005,
        keep_rounds: int = 16,
        store_timeout_s: float = 30.0,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "TorchTransport needs an initialized process group: call "
                "torch.distributed.init_process_group(...) first (torchrun sets up the "
                "environment for it)"
            )
        pg = process_group if process_group is not None else dist.group.WORLD
        if pg is None:
            raise RuntimeError("torch.distributed has no default process group")
        rank = dist.get_rank(pg)
        if rank < 0:
            raise GroupError(
                f"this process (global rank {dist.get_rank()}) is not a member of the process "
                "group given to TorchTransport; build it only on the group's members"
            )
        if not whole_number(keep_rounds) or keep_rounds < 1:
            raise ValueError(
                f"TorchTransport: keep_rounds must be an int >= 1, got {keep_rounds!r}"
            )
        self._store_timeout = timedelta(
            seconds=check_timeout_s(store_timeout_s, "TorchTransport store_timeout_s")
        )
        super().__init__(
            rank=rank,
            size=dist.get_world_size(pg),
            max_payload_bytes=max_payload_bytes,
            poll=PollSettings(busy_poll_s=busy_poll_s, poll_interval_s=poll_interval_s),
        )
        self._pg = pg
        self._global_ranks = tuple(dist.get_process_group_ranks(pg))
        if namespace is None:
            namespace = _default_namespace(self._global_ranks)
        instance = _instances_by_namespace[namespace]
        _instances_by_namespace[namespace] += 1
        self._namespace = f"{namespace}/{instance}"
        self._store = PrefixStore(f"scout/{self._namespace}", _own_client(store))
        self._store.set_timeout(self._store_timeout)
        self._keep_rounds = keep_rounds
        # This rank's own evidence keys, oldest first, per (stream, group key); each deque is
        # trimmed to keep_rounds by deleting the oldest key from the store.
        self._own_keys: dict[tuple[Stream, int], collections.deque[str]] = {}
        self._tensor_groups: dict[int, dist.ProcessGroup] = {group_key(self._world): pg}
        self._tensor_numbers: dict[int, int] = {}
        # Per group whose tensor collectives refuse to run: the collective still in flight past
        # its deadline (usable again once it completes, WAIT-3), or why they never will again.
        self._tensor_unusable: dict[int, _InFlight | str] = {}

    @property
    def process_group(self) -> dist.ProcessGroup:
        return self._pg

    @property
    def namespace(self) -> str:
        """The store prefix (below ``scout/``) under which this transport keeps its keys."""
        return self._namespace

    # -- tensors ---------------------------------------------------------------------------------

    def register_process_group(self, group: Group, process_group: dist.ProcessGroup) -> None:
        """Let tensor collectives run on ``group``, over ``process_group`` (no communication).

        Create ``process_group`` with ``torch.distributed.new_group(ranks)`` on every rank of
        the job (torch requires that); its members, in order, must be ``group``'s ranks.
        """
        self._check_open("register_process_group")
        group = self._member_group(group, "register_process_group")
        expected = [self._global_ranks[r] for r in group.ranks]
        actual = list(dist.get_process_group_ranks(process_group))
        if actual != expected:
            raise GroupError(
                f"register_process_group: group {group.name!r} {list(group.ranks)} is global "
                f"ranks {expected}, but the process group has global ranks {actual}; build it "
                f"with torch.distributed.new_group({sorted(expected)}) and list the group's "
                "ranks in that order"
            )
        self._tensor_groups[group_key(group)] = process_group

    def all_gather_tensor(
        self,
        tensor: torch.Tensor,
        *,
        timeout_s: float,
        group: Group | None = None,
        out: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Every member's ``tensor``, ordered by peer position (``torch.distributed.all_gather``).

        ``out`` (one tensor per member, like ``tensor``) is filled and returned; allocated when
        None. DeadlineExceeded names the members that never entered the call.
        """
        self._check_open("all_gather_tensor")
        timeout_s = check_timeout_s(timeout_s, "all_gather_tensor")
        group = self._member_group(group, "all_gather_tensor")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"all_gather_tensor: tensor must be a torch.Tensor, got {type(tensor).__name__}"
            )
        if out is None:
            out = [torch.empty_like(tensor) for _ in group.ranks]
        elif len(out) != group.size:
            raise ValueError(
                f"all_gather_tensor: out has {len(out)} tensors; group {group.name!r} has "
                f"{group.size} members"
            )
        pg = self._tensor_group(group, "all_gather_tensor")
        gathered = out
        self._tensor_collective(
            "all_gather_tensor",
            group,
            lambda: dist.all_gather(gathered, tensor, group=pg, async_op=True),
            timeout_s,
        )
        return out

    def broadcast_tensor(
        self, tensor: torch.Tensor, *, root: int, timeout_s: float, group: Group | None = None
    ) -> torch.Tensor:
        """``root``'s ``tensor`` copied in place into every member's ``tensor``; returns it."""
        self._check_open("broadcast_tensor")
        timeout_s = check_timeout_s(timeout_s, "broadcast_tensor")
        group = self._member_group(group, "broadcast_tensor")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"broadcast_tensor: tensor must be a torch.Tensor, got {type(tensor).__name__}"
            )
        if root not in group.ranks:
            raise GroupError(
                f"broadcast_tensor: root {root!r} is not a member of group {group.name!r} "
                f"{list(group.ranks)}"
            )
        pg = self._tensor_group(group, "broadcast_tensor")
        root_position = group.ranks.index(root)
        self._tensor_collective(
            "broadcast_tensor",
            group,
            lambda: dist.broadcast(tensor, group=pg, group_src=root_position, async_op=True),
            timeout_s,
        )
        return tensor

    def _tensor_group(self, group: Group, operation: str) -> dist.ProcessGroup:
        pg = self._tensor_groups.get(group_key(group))
        if pg is None:
            raise GroupError(
                f"{operation}: group {group.name!r} {list(group.ranks)} has no process group; "
                "create one with torch.distributed.new_group(...) on every rank and pass it to "
                "register_process_group()"
            )
        return pg

    def _tensor_collective(
        self, operation: str, group: Group, launch: Callable[[], Any], timeout_s: float
    ) -> None:
        key = group_key(group)
        self._check_tensor_usable(key)
        number = self._tensor_numbers.get(key, 0)
        self._tensor_numbers[key] = number + 1
        start_s = time.monotonic()
        deadline_s = start_s + timeout_s
        work = launch()
        # A collective that completes within the grace needs no notice: everyone was there.
        # Only one still running tells the store "I entered #number", so that a peer reaching
        # its deadline can name who never came; the healthy path makes no store round trip.
        grace_s = min(_NOTICE_GRACE_S, timeout_s / 4)
        failure = wait_work(work, start_s + grace_s, WORK_POLL)
        if isinstance(failure, TimedOut):
            self._store_op(operation, self._store.set, f"t/{key:x}/{self._rank}", str(number))
            failure = wait_work(work, deadline_s, WORK_POLL)
        if failure is None:
            return
        missing = [r for r in group.ranks if r != self._rank and not self._entered(key, r, number)]
        if isinstance(failure, TimedOut):
            # WAIT-2, WAIT-3: the work stays in flight (never a timed wait, so an NCCL
            # communicator is not aborted); the group's tensors wait for it to complete.
            self._tensor_unusable[key] = _InFlight(operation, number, group.name, missing, work)
            self._stats.deadlines_exceeded += 1
            raise DeadlineExceeded(f"{operation} on group {group.name!r}", timeout_s, missing)
        self._tensor_unusable[key] = _broken(operation, number, group.name, failure)
        raise TransportError(
            f"{operation} on group {group.name!r} failed in the backend ({failure}); "
            f"ranks {missing} never entered it"
        ) from failure

    def _check_tensor_usable(self, key: int) -> None:
        """WAIT-3: a group whose last collective passed its deadline runs again once that
        collective completed without error (one look, never a wait); else TransportError."""
        unusable = self._tensor_unusable.get(key)
        if unusable is None:
            return
        if isinstance(unusable, str):
            raise TransportError(unusable)
        outcome = completed_now(unusable.work)
        if isinstance(outcome, TimedOut):
            raise TransportError(
                f"{unusable.operation}: tensor collective #{unusable.number} on group "
                f"{unusable.group_name!r} is still in flight (ranks {unusable.missing} had not "
                "entered it by its deadline); this group's tensor collectives run again once it "
                "completes. exchange() still works"
            )
        if outcome is not None:
            broken = _broken(unusable.operation, unusable.number, unusable.group_name, outcome)
            self._tensor_unusable[key] = broken
            raise TransportError(broken) from outcome
        del self._tensor_unusable[key]

    def _entered(self, key: int, member: int, number: int) -> bool:
        notice_key = f"t/{key:x}/{member}"
        if not self._store_op("tensor deadline", self._store.check, [notice_key]):
            return False
        value = self._store_op("tensor deadline", self._store.get, notice_key)
        try:
            return int(bytes(value)) >= number
        except ValueError:
            return False

    # -- the binding primitives ------------------------------------------------------------------

    def _post(
        self, stream: Stream, number: int, group: Group, frame: bytes, targets: Sequence[int]
    ) -> None:
        # One key per member and round: every target reads it, so targets needs no fan-out.
        gkey = group_key(group)
        key = _evidence_key(stream, gkey, number, self._rank)
        self._store_op("post", self._store.set, key, frame)
        own = self._own_keys.setdefault((stream, gkey), collections.deque())
        own.append(key)
        while len(own) > self._keep_rounds:
            self._store_op("garbage collection", self._store.delete_key, own.popleft())

    def _collect(
        self,
        stream: Stream,
        number: int,
        group: Group,
        sources: Sequence[int],
        deadline_s: float,
    ) -> dict[int, Frame]:
        gkey = group_key(group)
        keys = {source: _evidence_key(stream, gkey, number, source) for source in sources}
        everyone = list(keys.values())

        def all_arrived() -> bool:
            return not everyone or bool(self._store_op("collect", self._store.check, everyone))

        if wait_until(all_arrived, deadline_s, self._poll):
            present = list(sources)
        else:
            present = [
                s for s in sources if self._store_op("collect", self._store.check, [keys[s]])
            ]
        frames: dict[int, Frame] = {}
        values = self._get_present([keys[s] for s in present], deadline_s)
        for source, data in zip(present, values, strict=True):
            if data is None:
                continue
            try:
                frame = unpack_frame(data)
            except FrameError:
                self._stats.undecodable_dropped += 1
                continue
            if frame.sender != source:
                self._stats.undecodable_dropped += 1
            elif (frame.stream, frame.group_key, frame.number) != (stream, gkey, number):
                self._stats.late_or_wrong_round_dropped += 1
            else:
                frames[source] = frame
        return frames

    def _get_present(self, keys: list[str], deadline_s: float) -> list[bytes | None]:
        """Values of keys that ``check`` found; None for one deleted since (its owner's GC).

        A get of a missing key blocks until the store timeout, so for these reads the timeout
        is the time left (at least _MIN_READ_TIMEOUT_S, for one round trip).
        """
        if not keys:
            return []
        read_timeout_s = max(deadline_s - time.monotonic(), _MIN_READ_TIMEOUT_S)
        self._store.set_timeout(timedelta(seconds=read_timeout_s))
        try:
            try:
                return [bytes(v) for v in self._store.multi_get(keys)]
            except dist.DistError:
                pass  # a key vanished between check and get: fetch one by one, gaps as None
            values: list[bytes | None] = []
            for key in keys:
                try:
                    present = self._store.check([key])
                    values.append(bytes(self._store.get(key)) if present else None)
                except dist.DistError:
                    values.append(None)
            return values
        finally:
            self._store.set_timeout(self._store_timeout)

    def _release(self) -> None:
        # A slower peer may still be collecting this rank's last piece of each group, so the
        # newest key per (stream, group) stays, as do the tensor notices (one per group); the
        # rest goes. What stays is bounded and disappears with the store or the job.
        for own in self._own_keys.values():
            for key in list(own)[:-1]:
                try:
                    self._store.delete_key(key)
                except dist.DistError:
                    return  # the store is gone; nothing left to clean

    def _store_op(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except dist.DistError as exc:
            raise TransportError(
                f"{what}: the store did not answer ({exc}); the transport needs its store to "
                "be reachable -- host it in a process that is not a trainer (torchrun's agent, "
                "or a dedicated TCPStore server)"
            ) from exc


@attrs.frozen
class _InFlight:
    """A tensor collective that passed its deadline and is still in the backend (WAIT-3)."""

    operation: str
    number: int
    group_name: str
    missing: list[int]
    work: Any


def _broken(operation: str, number: int, group_name: str, failure: Exception) -> str:
    return (
        f"{operation}: tensor collective #{number} on group {group_name!r} failed in the backend "
        f"({failure}); this group's tensor collectives are unusable. exchange() still works; "
        "rebuild the process group (or restart the job) for tensors"
    )


def _evidence_key(stream: Stream, gkey: int, number: int, rank: int) -> str:
    return f"{int(stream)}/{gkey:x}/{number}/{rank}"


def _default_namespace(global_ranks: Sequence[int]) -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    members = hashlib.blake2b(",".join(map(str, global_ranks)).encode(), digest_size=4).hexdigest()
    return f"{run_id}/restart{restart}/pg{members}"


def _own_client(store: Store | None) -> Store:
    """A store client used by this transport alone."""
    if store is None:
        host = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if not host or not port:
            raise ValueError(
                "TorchTransport: no store was given and MASTER_ADDR/MASTER_PORT are not set; "
                "pass store=torch.distributed.TCPStore(host, port, is_master=False) pointing at "
                "a store hosted outside the trainers, or run under torchrun"
            )
        return TCPStore(host, int(port), is_master=False, wait_for_workers=False)
    if not isinstance(store, Store):
        raise TypeError(f"TorchTransport: store must be a torch.distributed.Store, got {store!r}")
    try:
        clone: Store = store.clone()  # type: ignore[attr-defined]  # missing from torch's stubs
        return clone
    except (RuntimeError, NotImplementedError):
        return store  # a Store without clone(): share it (the caller must not use it concurrently)
