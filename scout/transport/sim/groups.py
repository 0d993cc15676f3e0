"""The groups (channels) of a simulated run: each distinct ``Group`` validated once, interned.

Messages and collectives carry a group's small integer id (``gid``) instead of the group, and a
member's position in it is a dict lookup. Programs pass the same ``Group`` object round after
round, so a cache keyed by ``id()`` skips even the hashing of its ranks.
"""

from __future__ import annotations

from typing import Any

from scout.transport.base import Group, GroupError
from scout.transport.sim.errors import SimulationLimitExceeded
from scout.transport.sim.faults import describe_ranks
from scout.transport.sim.process import Process

__all__ = ["MAX_GROUPS", "GroupInfo", "GroupTable"]

MAX_GROUPS = 1_000_000  # distinct groups (channels) one run may use
_GROUP_CACHE_LIMIT = 65_536


class GroupInfo:
    """A validated group, interned: ``gid`` is a small int carried by every message."""

    __slots__ = ("gid", "group", "label", "members", "positions", "ranks", "size")

    def __init__(self, gid: int, group: Group) -> None:
        self.gid = gid
        self.group = group
        self.ranks = group.ranks
        self.size = len(group.ranks)
        self.positions = {rank: position for position, rank in enumerate(group.ranks)}
        self.members = frozenset(group.ranks)
        self.label = group.name


class GroupTable:
    """Every group a run used, by value; ``world`` is interned first (gid 0)."""

    __slots__ = ("_cache", "_groups", "reproduce", "size", "world", "world_info")

    def __init__(self, size: int, reproduce: str) -> None:
        self.size = size
        self.reproduce = reproduce
        self._groups: dict[Group, GroupInfo] = {}
        self._cache: dict[int, tuple[Group, GroupInfo]] = {}
        self.world = Group(tuple(range(size)), "world")
        self.world_info = self.intern(self.world, "world")

    def __len__(self) -> int:
        return len(self._groups)

    def intern(self, group: Any, op_name: str) -> GroupInfo:
        """The group's info, validating and numbering it the first time it is seen."""
        if not isinstance(group, Group):
            raise GroupError(
                f"{op_name}: group must be a scout.transport.base.Group, got {group!r}"
            )
        info = self._groups.get(group)
        if info is None:
            if len(self._groups) >= MAX_GROUPS:
                raise SimulationLimitExceeded(
                    f"{op_name}: programs used more than MAX_GROUPS={MAX_GROUPS} distinct "
                    "groups; build each group once and reuse it",
                    self.reproduce,
                )
            outside = [rank for rank in group.ranks if rank >= self.size]
            if outside:
                raise GroupError(
                    f"{op_name}: group {group.name!r} names ranks {describe_ranks(outside)} "
                    f"outside the world of {self.size} ranks (0..{self.size - 1})"
                )
            info = GroupInfo(len(self._groups), group)
            self._groups[group] = info
        if len(self._cache) >= _GROUP_CACHE_LIMIT:
            self._cache.clear()
        # Keyed by id() for speed: programs pass the same Group object round after round. The
        # entry holds the object, so its id cannot be reused while the entry exists.
        self._cache[id(group)] = (group, info)
        return info

    def member_group(self, process: Process, group: Group | None, op_name: str) -> GroupInfo:
        """The group an op of ``process`` names (``None``: the world); it must be a member."""
        if group is None:
            info = self.world_info
        else:
            cached = self._cache.get(id(group))
            info = (
                cached[1]
                if cached is not None and cached[0] is group
                else self.intern(group, op_name)
            )
        if process.rank not in info.positions:
            raise GroupError(
                f"{op_name}: rank {process.rank} is not a member of group {info.label!r} "
                f"{describe_ranks(info.ranks)}"
            )
        return info
