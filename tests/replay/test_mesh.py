"""Replay peer groups from device meshes (spec/replay.md PEER-1..PEER-4): the pure mapping,
exhaustively on every small mesh, against a naive definition by coordinates; the DeviceMesh
adapter on a stand-in object. Real processes: test_replay_distributed.py (FSDP2/HSDP)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from scout.replay.mesh import MeshLayout, mesh_layout, peer_ranks, replica_groups


def _shapes(size_max: int, dims_max: int) -> list[tuple[int, ...]]:
    shapes = []
    for dims in range(1, dims_max + 1):
        for shape in itertools.product(range(1, size_max + 1), repeat=dims):
            if math.prod(shape) <= size_max:
                shapes.append(shape)
    return shapes


def _coordinates(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(s) for s in shape)))  # row-major, like DeviceMesh


SHAPES = _shapes(size_max=8, dims_max=3)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_PEER_1_peers_share_every_coordinate_outside_the_replicate_dims_exhaustively(
    shape: tuple[int, ...],
) -> None:
    """Every mesh of up to 8 ranks and 3 dims, every non-empty set of replicate dims, the
    identity layout and a reversed one: the groups partition the ranks; two ranks are peers
    iff their coordinates agree outside the replicate dims; a group is ordered by the
    replicate coordinates; peer_ranks agrees with replica_groups."""
    names = tuple(f"d{axis}" for axis in range(len(shape)))
    coordinates = _coordinates(shape)
    size = len(coordinates)
    for layout in (tuple(range(size)), tuple(reversed(range(size)))):
        coordinate_of = dict(zip(layout, coordinates, strict=True))
        for count in range(1, len(shape) + 1):
            for replicate in itertools.combinations(names, count):
                axes = [names.index(n) for n in replicate]
                groups = replica_groups(shape, names, replicate, layout)
                flat = [r for g in groups for r in g]
                assert sorted(flat) == sorted(layout)  # a partition
                assert all(len(g) == math.prod(shape[a] for a in axes) for g in groups)
                group_of = {r: g for g in groups for r in g}
                for a, b in itertools.product(layout, repeat=2):
                    same = all(
                        coordinate_of[a][axis] == coordinate_of[b][axis]
                        for axis in range(len(shape))
                        if axis not in axes
                    )
                    assert (group_of[a] == group_of[b]) == same, (shape, replicate, a, b)
                for group in groups:
                    keys = [tuple(coordinate_of[r][a] for a in sorted(axes)) for r in group]
                    assert keys == sorted(keys)
                for rank in layout:
                    assert peer_ranks(shape, names, replicate, rank, layout) == group_of[rank]


def test_PEER_1_the_three_layouts_of_the_issue() -> None:
    # DDP: one data-parallel dimension, one group.
    assert replica_groups((4,), ("dp",), "dp") == ((0, 1, 2, 3),)
    # FSDP2 HSDP: rank (i, j) holds shard j of replica i; peers hold the same shard.
    assert replica_groups((2, 2), ("replicate", "shard"), "replicate") == ((0, 2), (1, 3))
    assert peer_ranks((3, 2), ("replicate", "shard"), "replicate", 4) == (0, 2, 4)
    # 2-D data x tensor: peers share the tensor coordinate.
    assert replica_groups((2, 4), ("dp", "tp"), "dp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    # Pipeline x data x tensor: one stage, one tensor shard, every data replica.
    assert peer_ranks((2, 2, 2), ("pp", "dp", "tp"), "dp", 5) == (5, 7)
    # Replicas over two dimensions (HSDP's replicate and an outer data dimension).
    assert peer_ranks((2, 2, 2), ("outer", "replicate", "shard"), ("outer", "replicate"), 3) == (
        1,
        3,
        5,
        7,
    )
    # A permuted rank layout is followed, not assumed.
    assert replica_groups((2, 2), ("dp", "tp"), "dp", (3, 2, 1, 0)) == ((3, 1), (2, 0))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (((2, 2), ("dp", "tp"), "pp", 0), r"replicate dimension\(s\) \['pp'\] not in the mesh"),
        (((2, 2), ("dp",), "dp", 0), "2 dimensions .* but 1 names"),
        (((2, 0), ("dp", "tp"), "dp", 0), r"sizes must be ints >= 1, got shape \(2, 0\)"),
        (((2, 2), ("dp", "dp"), "dp", 0), "names must be distinct"),
        (((2, 2), ("dp", "tp"), (), 0), "no replicate dimension given"),
        (((2, 2), ("dp", "tp"), "dp", 7), r"rank 7 is not in the mesh \(ranks \[0, 1, 2, 3\]\)"),
        ((((), (), "dp", 0)), "no dimensions"),
    ],
)
def test_PEER_4_bad_meshes_are_errors_naming_the_value(
    arguments: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        peer_ranks(*arguments)  # type: ignore[arg-type]


def test_PEER_4_a_layout_must_list_every_rank_once() -> None:
    with pytest.raises(ValueError, match="holds 4 ranks, but the layout lists 3"):
        replica_groups((2, 2), ("dp", "tp"), "dp", (0, 1, 2))
    with pytest.raises(ValueError, match=r"ranks \[1\] appear more than once"):
        replica_groups((2, 2), ("dp", "tp"), "dp", (0, 1, 1, 2))


class _FakeMesh:
    """What mesh_layout reads from a DeviceMesh: ``mesh`` (the rank layout) and its names."""

    def __init__(self, layout: torch.Tensor, names: tuple[str, ...] | None) -> None:
        self.mesh = layout
        self.mesh_dim_names = names


def test_PEER_2_a_device_mesh_gives_its_shape_names_and_layout() -> None:
    mesh = _FakeMesh(torch.tensor([[0, 1], [2, 3]]), ("replicate", "shard"))
    assert mesh_layout(mesh) == MeshLayout((2, 2), ("replicate", "shard"), (0, 1, 2, 3))
    with pytest.raises(ValueError, match="no dimension names"):
        mesh_layout(_FakeMesh(torch.tensor([[0, 1], [2, 3]]), None))
    with pytest.raises(TypeError, match="expected a torch.distributed DeviceMesh, got int"):
        mesh_layout(3)


def test_PEER_3_PEER_4_a_partition_into_peer_groups_is_checked_before_any_group_is_made() -> None:
    from scout.replay.collectives import _check_partition

    _check_partition([(0, 2), (1, 3)], 4)
    with pytest.raises(ValueError, match=r"rank 2 is in two peer groups, \[0, 2\] and \[2, 3\]"):
        _check_partition([(0, 2), (2, 3)], 4)
    with pytest.raises(ValueError, match=r"peer ranks \[0, 4\] must be distinct ranks of 0..3"):
        _check_partition([(0, 4)], 4)
    with pytest.raises(ValueError, match="a peer group is empty"):
        _check_partition([()], 4)
