"""Parallel layouts: which ranks are replicas of one another (spec/replay.md LAYOUT-1..LAYOUT-6).
Pure: no torch, no I/O.

A job's ranks form a mesh -- ``("dp",)`` for DDP, ``("replicate", "shard")`` for HSDP,
``("pp", "dp", "tp")`` for pipeline x data x tensor parallel -- laid out row-major, as
``torch.distributed.device_mesh.init_device_mesh`` lays them out. Each dimension has a *role*:

- *replicate* (``dp``, ``replicate``, ``dp_replicate``): ranks that differ only there hold the
  same state and do the same work on different data -- replicas;
- *pipeline* (``pp``): the coordinate is the pipeline stage;
- *tensor* (``tp``): the coordinate is the tensor-parallel shard;
- any other (``shard``, ``dp_shard``, ``cp``, ``ep``): ranks that differ there hold other state.

Replicas are the ranks that share every coordinate outside the replicate dimensions -- the same
pipeline stage, the same tensor shard, the same FSDP shard (LAYOUT-1). Those groups are what replay
compares, what the gate names, and whom an observer asks (LAYOUT-2, LAYOUT-3). How many replicas
a group holds decides what scout can do there (LAYOUT-4): three or more *name* a faulty rank, two
only *detect* a disagreement, one checks nothing.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

import attrs

from scout.core.guards import whole_number

__all__ = [
    "PIPELINE_NAMES",
    "REPLICATE_NAMES",
    "TENSOR_NAMES",
    "Coverage",
    "ParallelLayout",
    "coverage_of",
    "layouts_of",
]

#: LAYOUT-1: dimension names whose role is known without being told.
REPLICATE_NAMES: Final = ("dp", "replicate", "dp_replicate", "ddp", "data")
PIPELINE_NAMES: Final = ("pp", "pipeline", "pipe")
TENSOR_NAMES: Final = ("tp", "tensor")


class Coverage(enum.Enum):
    """LAYOUT-4: what replica groups of a size can do."""

    NAMES = "names"  # >= 3 replicas: a strict majority names a single faulty rank
    DETECTS = "detects"  # 2 replicas: a disagreement is seen, nobody can be named
    NONE = "none"  # 1 replica: nothing to compare


def coverage_of(replicas: int) -> Coverage:
    if not whole_number(replicas) or replicas < 1:
        raise ValueError(f"a replica group holds at least one rank, got {replicas!r}")
    return Coverage.NAMES if replicas >= 3 else Coverage.DETECTS if replicas == 2 else Coverage.NONE


def _sizes(shape: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(shape)
    if not sizes:
        raise ValueError("the mesh has no dimensions: give its shape, e.g. (2, 3, 1)")
    bad = [s for s in sizes if not whole_number(s) or s < 1]
    if bad:
        raise ValueError(f"mesh dimension sizes must be ints >= 1, got shape {sizes}")
    return sizes


def _role(given: str | None, names: tuple[str, ...], known: tuple[str, ...], what: str) -> str | None:
    if given is not None:
        if given not in names:
            raise ValueError(f"the {what} dimension {given!r} is not one of the mesh dimensions {names}")
        return given
    found = [n for n in names if n in known]
    if len(found) > 1:
        raise ValueError(f"the mesh dimensions {names} name {found} as {what}: say which one with {what}=...")
    return found[0] if found else None


@attrs.frozen
class ParallelLayout:
    """A job's mesh with the role of each dimension (module docstring). Build it with
    :meth:`of` (sizes by name, ``ParallelLayout.of(pp=2, dp=3, tp=1)``), :meth:`from_names`
    (any mesh), or ``scout.replay.mesh.layout_of_mesh`` from a ``DeviceMesh``."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    ranks: tuple[int, ...]  # row-major: rank at each mesh position
    replicate: tuple[str, ...]
    pipeline: str | None = None
    tensor: str | None = None

    def __attrs_post_init__(self) -> None:
        shape = _sizes(self.shape)
        if len(self.dim_names) != len(shape):
            raise ValueError(f"the mesh has {len(shape)} dimensions (shape {shape}) but {len(self.dim_names)} names "
                             f"{self.dim_names}: name every dimension")
        if len(set(self.dim_names)) != len(self.dim_names) or not all(isinstance(n, str) and n
                                                                       for n in self.dim_names):
            raise ValueError(f"mesh dimension names must be distinct non-empty strings, got {self.dim_names}")
        size = math.prod(shape)
        if len(self.ranks) != size or sorted(self.ranks) != sorted(set(self.ranks)):
            raise ValueError(f"a mesh of shape {shape} holds {size} distinct ranks; the layout lists {list(self.ranks)}")
        if not self.replicate:
            raise ValueError(f"no replicate dimension among {self.dim_names}: name the data-parallel dimension(s) whose "
                             f"ranks are replicas (replicate=('dp',)); known names: {', '.join(REPLICATE_NAMES)}")
        unknown = [n for n in self.replicate if n not in self.dim_names]
        if unknown or len(set(self.replicate)) != len(self.replicate):
            raise ValueError(f"replicate dimensions {list(self.replicate)} must be distinct mesh dimensions of "
                             f"{self.dim_names}")
        for role, name in (("pipeline", self.pipeline), ("tensor", self.tensor)):
            if name is not None and (name not in self.dim_names or name in self.replicate):
                raise ValueError(f"the {role} dimension {name!r} must be a mesh dimension of {self.dim_names} "
                                 "and not a replicate one")
        if self.pipeline is not None and self.pipeline == self.tensor:
            raise ValueError(f"{self.pipeline!r} cannot be both the pipeline and the tensor dimension")

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_names(cls, shape: Sequence[int], dim_names: Sequence[str], ranks: Sequence[int] | None = None, *,
                   replicate: str | Sequence[str] | None = None, pipeline: str | None = None,
                   tensor: str | None = None) -> ParallelLayout:
        """LAYOUT-1: a mesh whose roles are the ones given, else the ones its names say."""
        sizes, names = _sizes(shape), tuple(dim_names)
        if len(names) != len(sizes):
            raise ValueError(f"the mesh has {len(sizes)} dimensions (shape {sizes}) but {len(names)} names {names}")
        if replicate is None:
            chosen = tuple(n for n in names if n in REPLICATE_NAMES)
        else:
            chosen = (replicate,) if isinstance(replicate, str) else tuple(replicate)
        layout = tuple(range(math.prod(sizes))) if ranks is None else tuple(int(r) for r in ranks)
        return cls(sizes, names, layout, chosen, _role(pipeline, names, PIPELINE_NAMES, "pipeline"),
                   _role(tensor, names, TENSOR_NAMES, "tensor"))

    @classmethod
    def of(cls, **sizes: int) -> ParallelLayout:
        """Sizes by dimension name, outermost first: ``of(pp=2, dp=3, tp=2)`` is the mesh
        ``init_device_mesh(device, (2, 3, 2), mesh_dim_names=("pp", "dp", "tp"))`` lays out."""
        return cls.from_names(tuple(sizes.values()), tuple(sizes))

    # -- coordinates -----------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def _axis(self, name: str) -> int:
        return self.dim_names.index(name)

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """The mesh coordinate of ``rank``."""
        try:
            flat = self.ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank} is not in the mesh (ranks {sorted(self.ranks)})") from None
        coordinate = []
        for size in reversed(self.shape):
            coordinate.append(flat % size)
            flat //= size
        return tuple(reversed(coordinate))

    def size_of(self, name: str | None) -> int:
        """The size of a dimension (1 for None: a role the mesh does not have)."""
        return 1 if name is None else self.shape[self._axis(name)]

    @property
    def stages(self) -> int:
        return self.size_of(self.pipeline)

    @property
    def tensor_size(self) -> int:
        return self.size_of(self.tensor)

    @property
    def replicas(self) -> int:
        """Ranks in each replica group."""
        return math.prod(self.size_of(name) for name in self.replicate)

    def stage_of(self, rank: int) -> int:
        return 0 if self.pipeline is None else self.coordinate(rank)[self._axis(self.pipeline)]

    def tensor_index(self, rank: int) -> int:
        return 0 if self.tensor is None else self.coordinate(rank)[self._axis(self.tensor)]

    def _groups(self, varying: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Ranks that share every coordinate outside ``varying``: groups in row-major order of
        the fixed coordinates, members in row-major order of the varying ones."""
        axes = sorted(self._axis(name) for name in varying)
        fixed = [a for a in range(len(self.shape)) if a not in axes]
        strides = [math.prod(self.shape[a + 1:]) for a in range(len(self.shape))]
        groups = []
        for kept in itertools.product(*(range(self.shape[a]) for a in fixed)):
            members = []
            for moving in itertools.product(*(range(self.shape[a]) for a in axes)):
                flat = sum(value * strides[axis] for axis, value in zip(fixed, kept, strict=True))
                flat += sum(value * strides[axis] for axis, value in zip(axes, moving, strict=True))
                members.append(self.ranks[flat])
            groups.append(tuple(members))
        return tuple(groups)

    # -- what follows from the roles -------------------------------------------------------

    def replica_groups(self) -> tuple[tuple[int, ...], ...]:
        """LAYOUT-1 (PEER-1): the replica groups; a rank's position in its group is its replica
        index."""
        return self._groups(self.replicate)

    def tensor_groups(self) -> tuple[tuple[int, ...], ...]:
        """The tensor-parallel groups: the ranks of one replica and one stage (a rank alone when
        the mesh has no tensor dimension)."""
        return self._groups(() if self.tensor is None else (self.tensor,))

    def pipeline_groups(self) -> tuple[tuple[int, ...], ...]:
        """The pipelines: the stages of one replica and one tensor shard, in stage order."""
        return self._groups(() if self.pipeline is None else (self.pipeline,))

    def group_of(self, rank: int) -> int:
        """The index of ``rank``'s replica group."""
        return next(i for i, group in enumerate(self.replica_groups()) if rank in group)

    def group_names(self) -> tuple[str, ...]:
        """LAYOUT-2: the gate's name of each replica group. Without a pipeline or tensor
        dimension of more than one rank: ``dp`` for one group, ``dp0``, ``dp1``, ... for several
        (HSDP's shards); otherwise the group's coordinates outside the replicate dimensions,
        those of size 1 left out: ``pp1.tp0``."""
        groups = self.replica_groups()
        if self.stages == 1 and self.tensor_size == 1:
            return ("dp",) if len(groups) == 1 else tuple(f"dp{i}" for i in range(len(groups)))
        names = []
        for group in groups:
            coordinate = self.coordinate(group[0])
            parts = [f"{name}{coordinate[axis]}" for axis, name in enumerate(self.dim_names)
                     if name not in self.replicate and self.shape[axis] > 1]
            names.append(".".join(parts))
        return tuple(names)

    def observer_peers(self, rank: int) -> tuple[int, ...]:
        """LAYOUT-3: the peers ``rank``'s observer asks when its trainer stops: its replicas,
        the ranks whose progress matches its own step for step."""
        return self.replica_groups()[self.group_of(rank)]

    def coverage(self) -> Coverage:
        """LAYOUT-4: what every replica group can do (they all hold :attr:`replicas` ranks)."""
        return coverage_of(self.replicas)

    def describe(self) -> str:
        """The layout in words: sizes by role, and who the replicas are."""
        sizes = " x ".join(f"{name} {size}" for name, size in zip(self.dim_names, self.shape, strict=True))
        holds = [what for what, name in (("pipeline stage", self.pipeline), ("tensor shard", self.tensor))
                 if name is not None and self.size_of(name) > 1]
        others = [n for n, s in zip(self.dim_names, self.shape, strict=True)
                  if s > 1 and n not in self.replicate and n not in (self.pipeline, self.tensor)]
        holds += [f"{name} coordinate" for name in others]
        same = ("the same " + " and the same ".join(holds)) if holds else "the same state"
        groups = len(self.replica_groups())
        return (f"{sizes} ({self.world_size} ranks): {groups} replica group(s) of {self.replicas} rank(s) "
                f"holding {same}")

    def advice(self) -> str | None:
        """LAYOUT-5: what to change for this layout to name a rank, in words; None when it
        names already."""
        coverage = self.coverage()
        if coverage is Coverage.NAMES:
            return None
        what = ("a disagreement is detected but nobody can be named (two replicas cannot outvote each other)"
                if coverage is Coverage.DETECTS else "no replay can be compared, so nothing is checked or certified")
        others = self.world_size // self.replicas
        return (f"with {self.replicas} replica(s) per group {what}; to name a faulty rank give each "
                f"{'shard' if others > 1 else 'model'} at least 3 replicas: a world of >= {3 * others} ranks at "
                f"this {'pipeline x tensor x shard' if others > 1 else 'size'} split, or fewer pipeline stages or "
                "tensor shards at this world size")

    def roles(self) -> Mapping[str, str]:
        """Every dimension's role, by name (for reports)."""
        return {name: ("replicate" if name in self.replicate else "pipeline" if name == self.pipeline else
                       "tensor" if name == self.tensor else "fixed") for name in self.dim_names}


def layouts_of(world_size: int) -> Iterator[ParallelLayout]:
    """LAYOUT-6: every ``(pp, dp, tp)`` layout of ``world_size`` ranks, in the order
    ``pp``, ``tp`` ascending (for the documentation's table and its test)."""
    if not whole_number(world_size) or world_size < 1:
        raise ValueError(f"a world holds at least one rank, got {world_size!r}")
    for pp in range(1, world_size + 1):
        for tp in range(1, world_size // pp + 1):
            if world_size % (pp * tp) == 0:
                yield ParallelLayout.of(pp=pp, dp=world_size // (pp * tp), tp=tp)
