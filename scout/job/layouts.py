"""The job's layout as ``scout.attach`` uses it (spec/replay.md LAYOUT-1..LAYOUT-5, docs/layouts.md):
``attach(..., layout=...)`` takes a ``DeviceMesh`` or a :class:`scout.core.layouts.ParallelLayout`;
from it follow the replay groups and their gate names, the observer's peers, the checkpoint's
namespace per pipeline stage, and the one paragraph rank 0 writes about what the layout can do.
Without ``layout`` the ``peers`` (default: the whole world, DDP replicas) decide as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from scout.core.layouts import Coverage, ParallelLayout
from scout.job.checks import group_names

__all__ = ["JobLayout", "resolve_layout"]


@attrs.frozen
class JobLayout:
    """What the layout decides for one rank."""

    rank: int
    partition: tuple[tuple[int, ...], ...]  # the replica groups (LAYOUT-1)
    names: tuple[str, ...]  # the gate's name of each (LAYOUT-2)
    layout: ParallelLayout | None = None  # None: peers given (or the default), no roles known

    @property
    def index(self) -> int:
        return next(i for i, group in enumerate(self.partition) if self.rank in group)

    @property
    def observer_peers(self) -> tuple[int, ...]:
        """LAYOUT-3: the replicas, or the whole world when the job is one group of them."""
        if self.layout is not None:
            return self.layout.observer_peers(self.rank)
        if len(self.partition) > 1:
            return self.partition[self.index]
        return tuple(sorted(r for group in self.partition for r in group))

    @property
    def partners(self) -> bool:
        """A rank's step waits on ranks that are not its replicas: pipeline or tensor-parallel
        neighbours (LAYOUT-3)."""
        return self.layout is not None and (self.layout.stages > 1 or self.layout.tensor_size > 1)

    @property
    def loop_check_off(self) -> str | None:
        """LAYOUT-3: why the loop and forward straggler checks are off, or None. They time the
        loop less its published waits; the waits of pipelining's point-to-point transfers and of
        DTensor's collectives are not published, so a rank waiting for a slow neighbour would
        look slow itself. Replay timing (local: TP-4) judges stragglers instead."""
        if not self.partners:
            return None
        return ("the loop and forward straggler checks are off: a rank that waits for a slow pipeline or "
                "tensor-parallel neighbour would look slow itself (those waits are not published); replay "
                "timing names a slow rank")

    @property
    def uncovered(self) -> bool:
        """LAYOUT-4: the layout gives every group one replica: replay has nothing to compare."""
        return self.layout is not None and self.layout.coverage() is Coverage.NONE

    @property
    def stage(self) -> int:
        return 0 if self.layout is None else self.layout.stage_of(self.rank)

    @property
    def stages(self) -> int:
        return 1 if self.layout is None else self.layout.stages

    @property
    def checkpoint_namespace(self) -> str | None:
        """LAYOUT-5's checkpoints: each pipeline stage saves its own model and optimizer under a
        key of its own (``pp<stage>``): stage modules name their layers alike (``layers.0`` on
        every stage), and DCP keeps one copy of entries that share a key."""
        return f"pp{self.stage}" if self.stages > 1 else None

    def said(self) -> list[str]:
        """LAYOUT-5: rank 0's lines at attach -- the layout and what it can do, once, in words;
        nothing for a plain data-parallel job whose replicas name."""
        if self.layout is None:
            return []
        layout = self.layout
        coverage = layout.coverage()
        lines = [f"scout: layout {layout.describe()}; "
                 + {Coverage.NAMES: "replay names a faulty rank in each group, the observer names a hung one",
                    Coverage.DETECTS: "DETECT ONLY: replay sees a disagreement and the observer a stall, but neither "
                                      "can name a rank",
                    Coverage.NONE: "NOT COVERED: every group holds one replica, so replay is off (nothing to "
                                   "compare), no checkpoint is saved or verified, and no hang can be localized"}[coverage]]
        advice = layout.advice()
        if advice is not None:
            lines.append(f"scout: {advice} (docs/layouts.md)")
        if self.loop_check_off is not None and coverage is not Coverage.NONE:
            lines.append(f"scout: {self.loop_check_off} (docs/layouts.md)")
        return lines


def resolve_layout(layout: Any, peers_partition: Sequence[Sequence[int]] | None, *, rank: int,
                   world_size: int) -> JobLayout:
    """LAYOUT-1: the job's groups from ``layout`` (a ``DeviceMesh`` or a ``ParallelLayout``), or
    from the peers' partition (None: the whole world) when no layout is given."""
    if layout is None:
        partition = (tuple(range(world_size)),) if peers_partition is None else tuple(
            tuple(int(r) for r in group) for group in peers_partition)
        return JobLayout(rank, partition, group_names("dp", len(partition)))
    if peers_partition is not None:
        raise ValueError("scout.attach: pass layout= or peers=, not both (the layout decides the replay peers)")
    if not isinstance(layout, ParallelLayout):
        from scout.replay.mesh import layout_of_mesh

        try:
            layout = layout_of_mesh(layout)
        except TypeError:
            raise TypeError(f"scout.attach: layout must be a DeviceMesh or a scout.ParallelLayout, got "
                            f"{type(layout).__name__}") from None
    if sorted(layout.ranks) != list(range(world_size)):
        raise ValueError(f"scout.attach: the layout {layout.describe()} spans ranks {sorted(layout.ranks)}, not the "
                         f"world of {world_size}: pass the root mesh (every rank of the job)")
    return JobLayout(rank, layout.replica_groups(), layout.group_names(), layout)
