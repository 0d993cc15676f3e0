"""The Transport contract: everything a scout core machine may ask of the world.

A core machine (verdict, observer, gate) never talks to a network. A *driver* runs it and,
when the machine needs evidence from its peers, calls one of the operations below on a
transport. Three bindings implement the same contract (docs/design.md §4):

* ``scout.transport.sim``  -- a deterministic simulated cluster (virtual clock, faults);
* ``scout.transport.mpi``  -- mpi4py over a communicator (CPU clusters, ``mpiexec``);
* ``scout.transport.nccl`` -- torch.distributed (NCCL tensors on GPU, gloo/TCPStore side channel).

Guarantees every binding gives (the conformance suite in ``tests/transport`` checks them):

1. **No call blocks forever.** Every operation that waits takes ``timeout_s`` (finite, >= 0).
   When it passes, :class:`DeadlineExceeded` names the ranks that did not take part.
2. **The evidence exchange returns partial results.** :meth:`Transport.exchange` sends one small
   payload to every member of a group and returns, at the latest when ``timeout_s`` passes, every
   answer that arrived for *this* ``round_id`` plus the members that did not answer. It never
   raises because a peer is silent; a silent peer is *missing evidence* (VERDICT spec), not an
   error. Answers for another round, or that cannot be decoded, are dropped and counted in
   :attr:`Transport.stats`; they never crash the receiver.
3. **Collectives** (:meth:`all_gather`, :meth:`broadcast`, :meth:`barrier`) are all-or-nothing:
   they either return the full result or raise :class:`DeadlineExceeded` naming the missing
   ranks. After a deadline on a collective the group may be unusable for further collectives
   (MPI and NCCL cannot cancel an operation in flight); the exchange keeps working.
4. **Payloads are bounded** by :attr:`Transport.max_payload_bytes` after encoding; a larger one
   raises :class:`PayloadTooLarge` before anything is sent.
5. **Misuse is an error that names the value**: a rank outside the group, a negative or
   non-finite timeout, an unencodable payload, any call after :meth:`close`.

Payloads are small evidence values encoded with :mod:`scout.transport.codec` (a restricted,
non-executable format: ``None``, bool, int, float, str, bytes, and tuples/lists/dicts of
them). Nothing received from a peer is ever unpickled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = [
    "DeadlineExceeded",
    "ExchangeResult",
    "Group",
    "GroupError",
    "PayloadTooLarge",
    "Transport",
    "TransportClosed",
    "TransportError",
    "TransportStats",
    "check_timeout_s",
]

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024


class TransportError(RuntimeError):
    """Base class of every error a transport raises on purpose."""


class DeadlineExceeded(TransportError):
    """A blocking call ran past its deadline. ``missing`` names the ranks that did not take part."""

    def __init__(self, operation: str, timeout_s: float, missing: Sequence[int]) -> None:
        self.operation = operation
        self.timeout_s = timeout_s
        self.missing = tuple(sorted(missing))
        super().__init__(
            f"{operation} did not complete within timeout_s={timeout_s}: "
            f"ranks {list(self.missing)} did not take part"
        )


class TransportClosed(TransportError):
    """The transport was used after close()."""


class PayloadTooLarge(TransportError, ValueError):
    """An encoded payload is larger than the transport's max_payload_bytes."""


class GroupError(TransportError, ValueError):
    """A rank outside the group, an empty group, or a group of another transport."""


@attrs.frozen
class Group:
    """An ordered set of global ranks. Peer *positions* used by verdicts index ``ranks``."""

    ranks: tuple[int, ...]
    name: str = "world"

    def __attrs_post_init__(self) -> None:
        if not self.ranks:
            raise GroupError(f"group {self.name!r} is empty: a group needs at least one rank")
        if len(set(self.ranks)) != len(self.ranks):
            raise GroupError(f"group {self.name!r} lists a rank twice: {list(self.ranks)}")
        if any(r < 0 for r in self.ranks):
            raise GroupError(f"group {self.name!r} has a negative rank: {list(self.ranks)}")

    @property
    def size(self) -> int:
        return len(self.ranks)

    def position(self, rank: int) -> int:
        """Peer position of ``rank`` in this group; GroupError if it is not a member."""
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise GroupError(
                f"rank {rank} is not a member of group {self.name!r} {list(self.ranks)}"
            ) from None


@attrs.frozen
class ExchangeResult:
    """What one evidence exchange produced: every answer that arrived, and who was silent."""

    round_id: int
    group: Group
    answers: Mapping[int, Any]  # global rank -> decoded payload (own rank included)
    missing: tuple[int, ...]  # global ranks that did not answer by the deadline

    @property
    def complete(self) -> bool:
        return not self.missing

    def by_position(self, missing_marker: Any) -> list[Any]:
        """Answers ordered by peer position, ``missing_marker`` where a peer was silent."""
        return [self.answers.get(r, missing_marker) for r in self.group.ranks]


@attrs.define
class TransportStats:
    """Counters a transport keeps for diagnosis; never used for decisions."""

    exchanges: int = 0
    late_or_wrong_round_dropped: int = 0
    undecodable_dropped: int = 0
    deadlines_exceeded: int = 0


def check_timeout_s(timeout_s: float, operation: str) -> float:
    """Validate a relative timeout: finite and >= 0. Returns it as float."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(
            f"{operation}: timeout_s must be a number of seconds, got {type(timeout_s).__name__}"
        )
    value = float(timeout_s)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{operation}: timeout_s must be finite and >= 0, got {timeout_s!r}")
    return value


@runtime_checkable
class Transport(Protocol):
    """What a scout driver may call. All ranks are *global* ranks of this transport's world."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def world(self) -> Group: ...

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def stats(self) -> TransportStats: ...

    def group(self, ranks: Sequence[int], name: str) -> Group:
        """A subgroup of the world. Local: no communication; every member must build it alike."""
        ...

    def exchange(
        self, payload: Any, *, round_id: int, timeout_s: float, group: Group | None = None
    ) -> ExchangeResult:
        """Send ``payload`` to every member of ``group``; gather theirs for ``round_id``.

        Returns by ``timeout_s`` at the latest, with partial results. Never raises for a
        silent peer.
        """
        ...

    def all_gather(self, payload: Any, *, timeout_s: float, group: Group | None = None) -> list[Any]:
        """Every member's payload, ordered by peer position; DeadlineExceeded otherwise."""
        ...

    def broadcast(
        self, payload: Any, *, root: int, timeout_s: float, group: Group | None = None
    ) -> Any:
        """The root's payload on every member (``payload`` is ignored off the root)."""
        ...

    def barrier(self, *, timeout_s: float, group: Group | None = None) -> None:
        """Return when every member arrived; DeadlineExceeded naming the absent otherwise."""
        ...

    def close(self) -> None:
        """Release resources. Idempotent. Any other call afterwards raises TransportClosed."""
        ...
