"""What torch.distributed calls a process group: its name, the same on every member."""

from __future__ import annotations

from typing import Any

__all__ = ["group_name"]


def group_name(group: Any) -> str:
    """The group's name as torch.distributed knows it (equal on every rank of the group): from
    its own table first -- a Python process group's own ``group_name`` is never set, and asking
    costs a C++ exception -- else ``group.group_name``; "" when neither knows it."""
    from torch.distributed import distributed_c10d

    known = distributed_c10d._world.pg_names.get(group)
    if known:
        return str(known)
    try:
        return str(group.group_name)
    except RuntimeError:  # a Python process group torch has not registered
        return ""
