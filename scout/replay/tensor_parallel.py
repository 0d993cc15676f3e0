"""Replay of tensor-parallel modules on their local shards, without communication (spec/replay.md
TP-1..TP-5).

A tensor-parallel block (``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel``, its
parameters DTensors) computes on its local shards and meets the other shards in collectives of
its tensor-parallel group: the all-reduce that sums ``RowwiseParallel``'s partial outputs, the
one that sums ``ColwiseParallel``'s input gradients, and the all-gathers and reduce-scatters of
sequence parallel. Its replicas -- the ranks that hold the same shard of the same stage in other
data-parallel replicas -- each sit in a *different* tensor-parallel group.

The scheme (TP-1): a replay runs the block's own forward and backward, its own hooks and
DTensor's own redistributions, on this rank's local shards and the source's captured inputs, and
replaces every collective by a local stand-in of the same shape that uses this rank's own
contribution alone -- an all-reduce returns its input, an all-gather tiles its input, a
reduce-scatter keeps the first chunk of its input, a broadcast returns its input. The stand-in
is a deterministic function of what this rank computed, so

- replicas of one shard replay the same function of equal shards and equal inputs: their
  signatures are equal, bit for bit, as the replicas of a data-parallel layer are (TP-2);
- a rank whose shard or computation is corrupt changes its own replay only -- no other rank's
  replay consumes its contribution -- so the vote in its replica group names it and nobody else,
  not its tensor-parallel partners (TP-3);
- no replay enters a collective of the training job, so no group has to replay in lock-step with
  another and no readiness decision of one group can leave a collective of another unmatched
  (TP-4): the replay groups are the replica groups, exactly as for data-parallel layers.

The values a replay computes are not those of the live step (partial sums stand for totals), and
that is why the live path's self-check (SELF-1) cannot use it: a tensor-parallel call is not
self-checked (UNCHECKED with the reason, TP-5).

The stand-ins are installed by a ``TorchDispatchMode`` for the replay's duration: the functional
collectives (``_c10d_functional``, what DTensor and the parallel styles call) are replaced, and a
c10d collective (``torch.distributed.all_reduce`` inside a module) fails the replay
(``REPLAY_FAILED``, Inconclusive) rather than enter the training job's process group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TP_NOT_SELF_CHECKED", "LocalCollectives", "UnreplayableCollective"]

#: TP-5: why a tensor-parallel call's live output is not self-checked.
TP_NOT_SELF_CHECKED: Final = ("a tensor-parallel module: its live output depends on the other shards' collectives, "
                              "which a replay on one rank does not reproduce (TP-5)")


class UnreplayableCollective(RuntimeError):
    """A replayed module called a collective that has no local stand-in (TP-1)."""


def _input(args: tuple[Any, ...], _kwargs: Mapping[str, Any]) -> torch.Tensor:
    tensor = args[0]
    assert isinstance(tensor, torch.Tensor)
    return tensor


def _same(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """all_reduce, broadcast, an even all_to_all: this rank's contribution, unchanged."""
    return _input(args, kwargs).clone()


def _in_place(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """all_reduce_, broadcast_: the input stays what this rank contributed."""
    return _input(args, kwargs)


def _gathered(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """all_gather_into_tensor(input, group_size, group): this rank's piece in every slot."""
    tensor, group_size = _input(args, kwargs), int(args[1])
    return torch.cat([tensor] * group_size, dim=0)


def _scattered(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """reduce_scatter_tensor(input, op, group_size, group): the first chunk of this rank's input."""
    tensor, group_size = _input(args, kwargs), int(args[2])
    return tensor.chunk(group_size, dim=0)[0].clone()


def _exchanged(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """all_to_all_single(input, output_split_sizes, input_split_sizes, group): this rank's input
    when it receives what it sends (equal splits); anything else has no stand-in of its shape."""
    tensor = _input(args, kwargs)
    if list(args[1]) != list(args[2]) or len(set(args[1])) > 1:
        raise UnreplayableCollective("an all_to_all_single with uneven splits has no local stand-in (TP-1)")
    return tensor.clone()


def _waited(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    return _input(args, kwargs)


#: TP-1: the functional collectives' local stand-ins, by operator name.
STAND_INS: Final[Mapping[str, Callable[[tuple[Any, ...], Mapping[str, Any]], torch.Tensor]]] = {
    "_c10d_functional::all_reduce": _same,
    "_c10d_functional::all_reduce_": _in_place,
    "_c10d_functional::broadcast": _same,
    "_c10d_functional::broadcast_": _in_place,
    "_c10d_functional::all_gather_into_tensor": _gathered,
    "_c10d_functional_autograd::all_gather_into_tensor": _gathered,
    "_c10d_functional::reduce_scatter_tensor": _scattered,
    "_c10d_functional_autograd::reduce_scatter_tensor": _scattered,
    "_c10d_functional::all_to_all_single": _exchanged,
    "_c10d_functional_autograd::all_to_all_single": _exchanged,
    "_c10d_functional::wait_tensor": _waited,
}
_COLLECTIVE_NAMESPACES: Final = ("_c10d_functional", "_c10d_functional_autograd", "c10d")
#: Operators of those namespaces that do not communicate (funcol wraps a result for autograd).
PASS_THROUGH: Final = frozenset({"_c10d_functional::_wrap_tensor_autograd"})


class LocalCollectives(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """TP-1: while active, every functional collective is replaced by its local stand-in, and
    any other collective raises :class:`UnreplayableCollective` instead of communicating.
    ``replaced`` counts the stand-ins used (by operator name)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.replaced: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name if hasattr(func, "_schema") else str(func)
        namespace = name.split("::", 1)[0]
        if namespace in _COLLECTIVE_NAMESPACES and name not in PASS_THROUGH:
            stand_in = STAND_INS.get(name)
            if stand_in is None:
                raise UnreplayableCollective(
                    f"the replayed module called {name}, a collective of the training job with no local stand-in; "
                    "tensor-parallel replay replaces only the functional collectives DTensor uses (TP-1)")
            self.replaced[name] = self.replaced.get(name, 0) + 1
            return stand_in(args, kwargs)
        return func(*args, **kwargs)
