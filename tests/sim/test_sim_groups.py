"""The group table alone: each distinct group validated once, numbered, and checked per op."""

from __future__ import annotations

import random

import pytest

from scout.transport.base import Group, GroupError
from scout.transport.sim import SimContext, SimulationLimitExceeded
from scout.transport.sim import groups as groups_module
from scout.transport.sim.groups import GroupTable
from scout.transport.sim.process import Process


def _process(rank: int, table: GroupTable) -> Process:
    ctx = SimContext(
        rank=rank,
        size=table.size,
        world=table.world,
        program="main",
        shared={},
        random=random.Random(0),
    )
    return Process(rank, "main", ctx, (item for item in ()))


def test_equal_groups_share_one_number_and_the_world_is_the_first() -> None:
    table = GroupTable(4, "seed=0")
    first = table.intern(Group((1, 2), "pair"), "exchange")
    again = table.intern(Group((1, 2), "pair"), "all_gather")  # equal, another object
    assert table.world_info.gid == 0 and first.gid == again.gid == 1 and len(table) == 2
    assert first.positions == {1: 0, 2: 1} and first.members == frozenset({1, 2})


def test_an_op_names_the_world_by_default_and_must_be_a_member_of_its_group() -> None:
    table = GroupTable(4, "seed=0")
    assert table.member_group(_process(3, table), None, "barrier") is table.world_info
    with pytest.raises(GroupError, match="barrier: rank 3 is not a member of group 'pair'"):
        table.member_group(_process(3, table), Group((1, 2), "pair"), "barrier")


def test_a_group_outside_the_world_or_not_a_group_is_refused() -> None:
    table = GroupTable(4, "seed=0")
    with pytest.raises(GroupError, match=r"names ranks \[4\] outside the world of 4 ranks"):
        table.intern(Group((0, 4), "wide"), "exchange")
    with pytest.raises(GroupError, match="must be a scout.transport.base.Group"):
        table.intern((0, 1), "exchange")
    assert len(table) == 1


def test_a_run_that_builds_too_many_groups_is_stopped_with_its_reproduce_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(groups_module, "MAX_GROUPS", 3)
    table = GroupTable(4, "reproduce with seed=5")
    table.intern(Group((0, 1), "a"), "exchange")
    table.intern(Group((1, 2), "b"), "exchange")
    with pytest.raises(SimulationLimitExceeded, match="MAX_GROUPS=3.*seed=5"):
        table.intern(Group((2, 3), "c"), "exchange")
