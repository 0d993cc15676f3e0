"""The classes of failure a restart recovers from (spec/recovery.md): one home for the names the
recovery table, the gate's manifest (the typed restart cause, GATE-36) and the report kinds
(:mod:`scout.reports.kinds`) share. Pure."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

__all__ = ["FAILURE_ORDER", "FailureClass", "deciding_failure"]


class FailureClass(enum.Enum):
    SDC = "sdc"
    INACCESSIBLE = "inaccessible"
    STRAGGLER = "straggler"
    HANG = "hang"
    DATA_STALL = "data-stall"
    CHECKPOINT_STALL = "checkpoint-stall"
    UNCERTAIN = "uncertain"


#: When an attempt ended with several failures, the one that rules out the most checkpoints
#: decides the restore (spec/recovery.md: observed corruption first, then the failures that can
#: corrupt silently, then those that say nothing about numbers).
FAILURE_ORDER: Final = (FailureClass.SDC, FailureClass.HANG, FailureClass.INACCESSIBLE, FailureClass.UNCERTAIN,
                        FailureClass.CHECKPOINT_STALL, FailureClass.DATA_STALL, FailureClass.STRAGGLER)
assert frozenset(FAILURE_ORDER) == frozenset(FailureClass), "FAILURE_ORDER must rank every failure class once"


def deciding_failure(failures: Iterable[FailureClass]) -> FailureClass | None:
    """The failure of ``failures`` that decides a restore (:data:`FAILURE_ORDER`); None for none."""
    found = frozenset(failures)
    return next((failure for failure in FAILURE_ORDER if failure in found), None)
