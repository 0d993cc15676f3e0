"""What ``scout.attach`` checks before it starts anything (docs/attach.md "Configuration"): the
configuration and the directories it will write, on every rank -- and one line for the user.

A mistake in the configuration is usually the same on every rank, and a traceback from each of
them (dozens of lines for one typo) buries it. So every rank runs the checks, the ranks exchange
what they found over a short-lived gloo group, and rank 0 raises one :class:`ConfigError` that
says what is wrong and on which ranks; the other ranks leave a few seconds later with exit
status 2 and print nothing (so the launcher's "root cause" is rank 0 and its message). A problem only some ranks have (a directory another node cannot write) is named with
those ranks, by rank 0, all the same.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from scout.job.config import ConfigError

__all__ = ["STARTUP_TIMEOUT_S", "check_directory", "checked_on_every_rank"]

#: Bound on the exchange of start-up problems: every rank reaches it within the launcher's own
#: start-up skew (the ranks were just rendezvoused by init_process_group).
STARTUP_TIMEOUT_S: Final = 120.0
#: Exit status of a rank whose problem rank 0 reports (argparse's status for a usage error).
EXIT_STATUS_CONFIG: Final = 2
#: The other ranks leave this long after rank 0 raised, so that rank 0's one message is printed
#: before the launcher stops the job, and the launcher names rank 0 as the first failure (its
#: "root cause"), not a rank that only echoes it.
OTHERS_EXIT_AFTER_S: Final = 5.0

T = TypeVar("T")


def check_directory(path: str | os.PathLike[str], key: str) -> Path:
    """Create ``path`` if needed and prove a file can be created in it; a :class:`ConfigError`
    naming ``key``, the path and the reason otherwise (never a raw ``PermissionError``)."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{key} {str(directory)!r} cannot be created: {error.strerror or error}; pass a "
                          f"directory this user can write") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".scout-write-probe-", dir=directory)
    except OSError as error:
        raise ConfigError(f"{key} {str(directory)!r} is not writable: {error.strerror or error}; pass a "
                          f"directory this user can write") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return directory


def _problems_by_text(gathered: list[str | None]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank, problem in enumerate(gathered):
        if problem:
            found.setdefault(problem, []).append(rank)
    return found


def summary(gathered: list[str | None], world_size: int) -> str | None:
    """One message for every problem the ranks found, each with the ranks that found it."""
    found = _problems_by_text(gathered)
    if not found:
        return None
    lines = []
    for problem, ranks in found.items():
        where = "every rank" if len(ranks) == world_size else f"rank{'s' if len(ranks) > 1 else ''} " + \
            ", ".join(str(rank) for rank in ranks)
        lines.append(f"{problem} [{where}]")
    return "; ".join(lines)


def checked_on_every_rank(check: Callable[[], T]) -> T:
    """Run ``check`` on every rank (collective over the world). If any rank's check raised a
    :class:`ConfigError`, rank 0 raises one ConfigError naming every problem and its ranks, and
    every other rank exits with status 2 ``OTHERS_EXIT_AFTER_S`` later, without printing;
    otherwise returns ``check()``."""
    import torch.distributed as dist

    result: T | None = None
    problem: str | None = None
    try:
        result = check()
    except ConfigError as error:
        problem = str(error)
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        if problem is not None:
            raise ConfigError(problem)
        assert result is not None
        return result
    from scout.transport import gloo_groups

    group = gloo_groups.new_group(timeout_s=STARTUP_TIMEOUT_S)  # WAIT-6
    gathered: list[str | None] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(gathered, problem, group=group)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)
    message = summary(gathered, dist.get_world_size())
    if message is None:
        assert result is not None
        return result
    if dist.get_rank() == 0:
        raise ConfigError(message)
    time.sleep(OTHERS_EXIT_AFTER_S)
    raise SystemExit(EXIT_STATUS_CONFIG)
