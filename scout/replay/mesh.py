"""Replay peer groups from a device mesh (spec/replay.md PEER-1..PEER-4).

Replay compares ranks that do identical work on identical state: the replicas of one
data-parallel dimension. On a mesh that is every rank that shares all coordinates *outside*
the replicate dimension(s):

- DDP: a 1-D mesh ``("dp",)``; one group, the whole mesh.
- FSDP2 with HSDP: ``("replicate", "shard")``; rank ``(i, j)`` holds shard ``j`` of replica
  ``i``, so its peers are the ranks ``(*, j)`` -- the same shard in every replica.
- 2-D data x tensor parallel: ``("dp", "tp")``; peers share the tensor coordinate and vary in
  ``dp`` (the same tensor shard of the same layer in every data-parallel replica).
- Any n-D mesh: ``("pp", "dp", "tp")`` with replicate ``"dp"`` groups ranks of one pipeline
  stage and one tensor shard.

The functions on shapes are pure (no torch): :func:`replica_groups` partitions a mesh into its
peer groups, :func:`peer_ranks` gives one rank's group. :func:`mesh_layout` reads a
``torch.distributed.device_mesh.DeviceMesh``; ``TorchPeerGroup.from_mesh`` builds the replay
group from it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from scout.core.guards import whole_number
from scout.core.layouts import ParallelLayout

__all__ = ["MeshLayout", "check_not_sharded_over_replicas", "layout_of_mesh", "mesh_layout", "peer_ranks",
           "replica_groups"]


@attrs.frozen
class MeshLayout:
    """A mesh's shape, dimension names and rank layout (row-major, like ``DeviceMesh.mesh``)."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    ranks: tuple[int, ...]


def _validated(
    shape: Sequence[int], dim_names: Sequence[str], ranks: Sequence[int] | None
) -> MeshLayout:
    shape_t = tuple(shape)
    names = tuple(dim_names)
    if not shape_t:
        raise ValueError("the mesh has no dimensions: give its shape, e.g. (2, 2)")
    bad_sizes = [
        s for s in shape_t if not (whole_number(s) and s >= 1)
    ]
    if bad_sizes:
        raise ValueError(f"mesh dimension sizes must be ints >= 1, got shape {shape_t}")
    if len(names) != len(shape_t):
        raise ValueError(
            f"the mesh has {len(shape_t)} dimensions (shape {shape_t}) but {len(names)} names "
            f"{names}: name every dimension"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"mesh dimension names must be distinct, got {names}")
    size = math.prod(shape_t)
    layout = tuple(range(size)) if ranks is None else tuple(ranks)
    if len(layout) != size:
        raise ValueError(
            f"a mesh of shape {shape_t} holds {size} ranks, but the layout lists {len(layout)}"
        )
    if len(set(layout)) != size:
        repeated = sorted({r for r in layout if layout.count(r) > 1})
        raise ValueError(f"ranks {repeated} appear more than once in the mesh layout")
    return MeshLayout(shape_t, names, layout)


def _replicate_axes(layout: MeshLayout, replicate: str | Sequence[str]) -> tuple[int, ...]:
    wanted = (replicate,) if isinstance(replicate, str) else tuple(replicate)
    if not wanted:
        raise ValueError(
            f"no replicate dimension given; name one of the mesh dimensions {layout.dim_names}"
        )
    unknown = [name for name in wanted if name not in layout.dim_names]
    if unknown:
        raise ValueError(
            f"replicate dimension(s) {unknown} not in the mesh dimensions {layout.dim_names}; "
            "name the data-parallel replicate dimension (e.g. 'dp' or 'replicate')"
        )
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"replicate dimensions repeated: {wanted}")
    return tuple(sorted(layout.dim_names.index(name) for name in wanted))


def replica_groups(
    shape: Sequence[int],
    dim_names: Sequence[str],
    replicate: str | Sequence[str],
    ranks: Sequence[int] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """Partition a mesh into replay peer groups (PEER-1).

    Two ranks are peers when their coordinates agree in every dimension not in ``replicate``.
    Groups are listed in row-major order of those other coordinates; within a group ranks are
    in row-major order of their replicate coordinates, so a rank's *position* in its group is
    its data-parallel replica index. ``ranks`` is the row-major rank layout (default
    ``0..size-1``). Errors name the offending value.
    """
    layout = _validated(shape, dim_names, ranks)
    axes = _replicate_axes(layout, replicate)
    # One definition of the groups (scout.core.layouts, LAYOUT-1); the roles of the other
    # dimensions do not change them.
    return ParallelLayout(layout.shape, layout.dim_names, layout.ranks,
                          tuple(layout.dim_names[a] for a in axes)).replica_groups()


def peer_ranks(
    shape: Sequence[int],
    dim_names: Sequence[str],
    replicate: str | Sequence[str],
    rank: int,
    ranks: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """This rank's replay peer group, in replica order (PEER-1)."""
    for group in replica_groups(shape, dim_names, replicate, ranks):
        if rank in group:
            return group
    layout = _validated(shape, dim_names, ranks)
    raise ValueError(f"rank {rank} is not in the mesh (ranks {sorted(layout.ranks)})")


def mesh_layout(mesh: Any) -> MeshLayout:
    """Shape, dimension names and rank layout of a ``DeviceMesh`` (PEER-2).

    The mesh must be named (``init_device_mesh(..., mesh_dim_names=...)``): replay needs to
    know which dimension holds the replicas.
    """
    names = getattr(mesh, "mesh_dim_names", None)
    layout_tensor = getattr(mesh, "mesh", None)
    if layout_tensor is None:
        raise TypeError(f"expected a torch.distributed DeviceMesh, got {type(mesh).__name__}")
    if not names:
        raise ValueError(
            f"the device mesh of shape {tuple(layout_tensor.shape)} has no dimension names; "
            "create it with init_device_mesh(..., mesh_dim_names=(...)) so the replicate "
            "dimension can be named"
        )
    return _validated(
        tuple(int(s) for s in layout_tensor.shape),
        tuple(str(n) for n in names),
        tuple(int(r) for r in layout_tensor.reshape(-1).tolist()),
    )


def layout_of_mesh(mesh: Any, *, replicate: str | Sequence[str] | None = None, pipeline: str | None = None,
                   tensor: str | None = None) -> ParallelLayout:
    """LAYOUT-1 from a ``DeviceMesh``: its shape, names and rank layout, each dimension's role
    given or read from its name (``dp``/``replicate``: replicas, ``pp``: stages, ``tp``: tensor
    shards). The mesh must be the root mesh, spanning every rank of the job."""
    read = mesh_layout(mesh)
    return ParallelLayout.from_names(read.shape, read.dim_names, read.ranks, replicate=replicate,
                                     pipeline=pipeline, tensor=tensor)


def check_not_sharded_over_replicas(model: Any, replicate: Sequence[str]) -> None:
    """spec/replay.md LAYOUT-1: raise ValueError when FSDP2 shards one of ``model``'s parameters
    over a dimension the layout calls a replicate one -- those ranks hold different shards, so
    their signatures differ by construction and two equal shards could outvote a third."""
    for name, parameter in model.named_parameters():
        mesh, placements = getattr(parameter, "device_mesh", None), getattr(parameter, "placements", None)
        if mesh is None or placements is None:
            continue  # a plain tensor (DDP, or a module FSDP2 does not manage)
        dims = tuple(mesh.mesh_dim_names or ())
        for dim, placement in zip(dims, placements, strict=False):
            if dim in replicate and placement.is_shard():
                raise ValueError(
                    f"scout.attach: the layout's replicate dimension {dim!r} is one the model's parameters are "
                    f"sharded over (parameter {name!r}, placements {tuple(placements)} on mesh dimensions {dims}): "
                    f"ranks along {dim!r} hold different shards, not replicas. Name FSDP2's shard dimension apart "
                    "(e.g. 'dp_shard') and give the replicas their own dimension (HSDP's 'replicate'), or pass "
                    "peers= naming the ranks that hold equal state (docs/layouts.md)")
