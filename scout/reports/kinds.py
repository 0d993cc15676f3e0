"""Report kinds: one home for what each ``kind`` of a ``scout.report/1`` record means.

Every module that asks what a kind is -- which process writes it (its ``source``), whether it is
a fault, which failure class a restart recovers from after it (``scout.attach``'s restore and
the recovery table, spec/recovery.md), whether ``on_hang = "restart"`` acts on it (the observer
process), whether the trainer logs it as a warning, how ``scout report`` draws it -- asks
:class:`ReportKind`; no other module keeps a list of kinds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from scout.core.failure import FailureClass, deciding_failure

__all__ = ["Mark", "MarkStyle", "ReportKind", "Source", "attempt_failure", "at_fault_in_every_attempt"]


class Source(str, enum.Enum):
    """The part of scout that writes a kind of report."""

    OBSERVER = "observer"
    REPLAY = "replay"
    GATE = "gate"
    JOB = "job"


class MarkStyle(enum.Enum):
    """How ``scout report``'s picture (rank x step) draws a kind."""

    RANKS = "ranks"  # a marker on every rank the report names, at its step
    GROUP = "group"  # a band over the ranks of the group it names (group-scoped)
    STEP = "step"  # a tick above the ranks at its step (no rank at fault)
    SPAN = "span"  # a bar per rank from confirmation to recovery (stragglers)
    ATTEMPT = "attempt"  # a dashed line where a restarted attempt began (``restart`` ``restored``)
    CHECKPOINT = "checkpoint"  # drawn from the gate's manifest (final trust), not from the report
    NONE = "none"  # not drawn


@attrs.frozen
class Mark:
    style: MarkStyle
    symbol: str = ""  # a matplotlib marker, for RANKS and STEP
    colour: str = "#000000"


@attrs.frozen
class _Traits:
    source: Source
    fault: bool  # a finding about a rank, a host or a group (``scout report``'s fault table)
    failure: FailureClass | None  # what a restart after it recovers from (spec/recovery.md)
    on_hang_restart: bool  # ``on_hang = "restart"`` stops the job after it (observer findings)
    warns: bool  # the trainer logs it as a warning as well as writing it
    mark: Mark


class ReportKind(str, enum.Enum):
    """Every ``kind`` a report may have; dashboards key on the values (stable)."""

    HANG = "hang"  # a rank behind its peers' progress (or ahead of it: it skipped a collective)
    DATA_STALL = "data_stall"  # the same, while the rank waits for its data loader
    CHECKPOINT_STALL = "checkpoint_stall"  # the same, inside checkpoint I/O
    DESYNC = "desync"  # a rank inside a different collective than its peers
    GROUP_STALL = "group_stall"  # every rank of a group stuck at one point: fabric or a common cause
    UNRESPONSIVE = "unresponsive"  # a rank's observer did not answer (rank or host gone)
    INCONCLUSIVE = "inconclusive"  # observers could not decide (no strict majority)
    OBSERVER_FAILURE = "observer_failure"  # a rank's observer cannot do its job: hang detection is off there
    SDC = "sdc"  # replay (or the canary) attributed silent data corruption to a rank
    UNCHECKED = "unchecked"  # a replay could not be checked (Inconclusive or missing): not corruption
    STRAGGLER = "straggler"  # a rank confirmed slow (or recovered)
    CHECKPOINT = "checkpoint"  # a checkpoint's trust changed (verified, quarantined, ...)
    RESTART = "restart"  # the fault policy stopped the job, or a restart restored a checkpoint
    FINISHED = "finished"  # the job closed scout at the end of its loop (the step it reached)
    CADENCE = "cadence"  # the replay cadence the overhead budget chose, and what it buys (spec/budget.md)

    @property
    def source(self) -> Source:
        return _TRAITS[self].source

    @property
    def is_fault(self) -> bool:
        return _TRAITS[self].fault

    @property
    def failure(self) -> FailureClass | None:
        """The failure class a restart after this report recovers from; None: not a failure."""
        return _TRAITS[self].failure

    @property
    def on_hang_restart(self) -> bool:
        """``on_hang = "restart"`` stops the job after a report of this kind."""
        return _TRAITS[self].on_hang_restart

    @property
    def warns(self) -> bool:
        """The trainer logs a report of this kind as a warning (people read stderr first)."""
        return _TRAITS[self].warns

    @property
    def mark(self) -> Mark:
        return _TRAITS[self].mark


def _observer(failure: FailureClass | None, mark: Mark, *, restart: bool = True) -> _Traits:
    return _Traits(Source.OBSERVER, True, failure, restart, False, mark)


_TRAITS: Final[Mapping[ReportKind, _Traits]] = {
    ReportKind.HANG: _observer(FailureClass.HANG, Mark(MarkStyle.RANKS, "X", "#d73027")),
    ReportKind.DATA_STALL: _observer(FailureClass.DATA_STALL, Mark(MarkStyle.RANKS, "X", "#fc8d59")),
    ReportKind.CHECKPOINT_STALL: _observer(FailureClass.CHECKPOINT_STALL, Mark(MarkStyle.RANKS, "X", "#91bfdb")),
    ReportKind.DESYNC: _observer(FailureClass.HANG, Mark(MarkStyle.RANKS, "D", "#7b3294")),
    ReportKind.GROUP_STALL: _observer(FailureClass.HANG, Mark(MarkStyle.GROUP, "", "#fdae61")),
    ReportKind.UNRESPONSIVE: _observer(FailureClass.INACCESSIBLE, Mark(MarkStyle.RANKS, "v", "#4d4d4d")),
    ReportKind.INCONCLUSIVE: _observer(FailureClass.HANG, Mark(MarkStyle.NONE)),
    ReportKind.OBSERVER_FAILURE: _observer(None, Mark(MarkStyle.RANKS, "x", "#000000"), restart=False),
    ReportKind.SDC: _Traits(Source.REPLAY, True, FailureClass.SDC, False, True, Mark(MarkStyle.RANKS, "*", "#c51b7d")),
    ReportKind.UNCHECKED: _Traits(Source.GATE, False, None, False, True, Mark(MarkStyle.STEP, "|", "#f46d43")),
    ReportKind.STRAGGLER: _Traits(Source.REPLAY, True, FailureClass.STRAGGLER, False, True,
                                  Mark(MarkStyle.SPAN, "", "#542788")),
    ReportKind.CHECKPOINT: _Traits(Source.GATE, False, None, False, False, Mark(MarkStyle.CHECKPOINT)),
    ReportKind.RESTART: _Traits(Source.JOB, False, None, False, False, Mark(MarkStyle.ATTEMPT, "", "#2166ac")),
    ReportKind.FINISHED: _Traits(Source.JOB, False, None, False, False, Mark(MarkStyle.NONE)),
    ReportKind.CADENCE: _Traits(Source.JOB, False, None, False, False, Mark(MarkStyle.NONE)),
}
assert set(_TRAITS) == set(ReportKind), "every report kind has its traits"

_BY_VALUE: Final = {kind.value: kind for kind in ReportKind}
#: The ``restart`` reasons that mark the start of an attempt (``scout.attach``'s restore writes them).
ATTEMPT_STARTS: Final = frozenset({"started", "restored"})
#: The ``checkpoint`` reason of a save that failed or was not attempted (spec/gate.md GATE-40).
SAVE_FAILED: Final = "save-failed"
#: The ``restart`` reason of a stop with no restart left (spec/recovery.md RECOVERY-5).
EXHAUSTED: Final = "exhausted"


def at_fault_in_every_attempt(records: Iterable[Mapping[str, Any]], generation: int, ranks: Iterable[int],
                              hosts: Iterable[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """RECOVERY-5: of ``ranks`` and ``hosts`` (at fault in attempt ``generation``, the current
    one), those that a fault report (a kind with a failure class) or a policy stop also named in
    every earlier attempt that wrote reports."""
    named: dict[int, tuple[set[int], set[str]]] = {}
    for record in records:
        kind, attempt = _BY_VALUE.get(record["kind"]), int(record["generation"])
        if kind is None or attempt >= generation:
            continue
        at_fault = named.setdefault(attempt, (set(), set()))
        stop = kind is ReportKind.RESTART and record["reason"] not in ATTEMPT_STARTS | {EXHAUSTED}
        if stop or (kind.is_fault and kind.failure is not None):
            at_fault[0].update(record["ranks"])
            at_fault[1].update(record["hosts"])
    every_rank, every_host = set(ranks), set(hosts)
    for attempt_ranks, attempt_hosts in named.values():
        every_rank &= attempt_ranks
        every_host &= attempt_hosts
    return tuple(sorted(every_rank)), tuple(sorted(every_host))


def attempt_failure(records: Iterable[Mapping[str, Any]]) -> FailureClass | None:
    """The failure the last attempt of a run recorded: the deciding failure class
    (:func:`scout.core.failure.deciding_failure`) of the reports written after that attempt's
    start. None when no attempt started; UNCERTAIN when one did and nothing says why it ended."""
    found: list[FailureClass] | None = None
    for record in records:
        kind = _BY_VALUE.get(record["kind"])
        if kind is None:
            continue  # a kind of a newer schema revision: not one this version restores after
        if kind is ReportKind.RESTART and record["reason"] in ATTEMPT_STARTS:
            found = []
        elif found is not None and kind.failure is not None:
            found.append(kind.failure)
    if found is None:
        return None
    return deciding_failure(found) or FailureClass.UNCERTAIN
