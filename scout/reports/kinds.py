"""Report kinds and reason codes: one home for the vocabulary of ``scout.report/1`` records.

Every module that asks what a kind is -- which process writes it (its ``source``), whether it is
a fault, which failure class a restart recovers from after it (``scout.attach``'s restore and
the recovery table, spec/recovery.md), whether ``on_hang = "restart"`` acts on it (the observer
process), whether the trainer logs it as a warning, how ``scout report`` draws it -- asks
:class:`ReportKind`; no other module keeps a list of kinds.

This module also owns every translation into that vocabulary, by explicit tables rather than by
an enum's value (a renamed member of a machine's enum must not silently change a stable kind
that dashboards key on): an observer finding to its kind and reason (:func:`observer_kind`,
:func:`observer_reason`), a straggler event to its record (:func:`straggler_record_arguments`),
a checkpoint's trust to its reason (:func:`trust_reason`). Reason codes are enums with
:meth:`Reason.parse`, so a reader parses a code back instead of taking a string apart.
``tests/unit/test_report_kinds.py`` fails when another module spells a kind or a reason code
where a report's kind or reason is meant.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs

from scout.core.failure import FailureClass, deciding_failure
from scout.core.observer.model import Finding, FindingCode, StallKind

if TYPE_CHECKING:  # imported where used: the observer process imports this module and needs neither
    from scout.core.straggler.localize import GroupTiming, Localization
    from scout.core.straggler.tracking import StragglerEvent, StragglerKind
    from scout.gate.model import Trust

__all__ = [
    "ATTEMPT_STARTS",
    "EXHAUSTED",
    "SAVE_FAILED",
    "STRAGGLER_KINDS",
    "CheckpointReason",
    "FinishedReason",
    "Mark",
    "MarkStyle",
    "ObserverReason",
    "Reason",
    "ReportKind",
    "RestartReason",
    "SdcReason",
    "Source",
    "StragglerReason",
    "UncheckedReason",
    "at_fault_in_every_attempt",
    "attempt_failure",
    "localization_record_arguments",
    "observer_kind",
    "observer_reason",
    "straggler_reason",
    "straggler_record_arguments",
    "trust_reason",
]


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
    INTERNAL_ERROR = "internal_error"  # scout's own code failed: the part is off, training goes on (GUARD-5)
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
    # GUARD-5: not a fault of the training job (nothing to exclude or recover from), but said on stderr.
    ReportKind.INTERNAL_ERROR: _Traits(Source.JOB, False, None, False, True, Mark(MarkStyle.RANKS, "P", "#8c510a")),
    ReportKind.CADENCE: _Traits(Source.JOB, False, None, False, False, Mark(MarkStyle.NONE)),
}
assert set(_TRAITS) == set(ReportKind), "every report kind has its traits"

_BY_VALUE: Final = {kind.value: kind for kind in ReportKind}

_R = TypeVar("_R", bound="Reason")


class Reason(str, enum.Enum):
    """The stable reason codes of one kind of report (dashboards key on the values)."""

    @classmethod
    def parse(cls: type[_R], text: object) -> _R | None:
        """The code ``text`` names; None for any other text (a code of a newer schema revision,
        or of another kind)."""
        try:
            return cls(text)
        except ValueError:
            return None


class ObserverReason(Reason):
    """Why the observers wrote a report (docs/observer.md, "Report schema")."""

    BEHIND_MAJORITY = "behind-majority"  # hang, data_stall, checkpoint_stall
    AHEAD_OF_MAJORITY = "ahead-of-majority"  # the same kinds: the rank skipped a collective
    COLLECTIVE_DIFFERS = "collective-differs"  # desync
    SAME_POINT_SAME_COLLECTIVE = "same-point-same-collective"  # group_stall
    NO_ANSWER = "no-answer"  # unresponsive
    NO_MAJORITY = "no-majority"  # inconclusive
    HOST_PROGRESS_ONLY = "host-progress-only"  # inconclusive: host coordinates were no evidence (COMPLETION-9)
    WAITING_ELSEWHERE = "waiting-elsewhere"  # inconclusive: the candidate waits in another group (COMPLETION-10)
    DETECT_ONLY = "detect-only"  # inconclusive in a group of two replicas (spec/replay.md LAYOUT-4)
    OBSERVER_FAILED = "observer-failed"  # observer_failure


class RestartReason(Reason):
    """``restart`` reasons of an attempt's start or of the end of restarts. A fault policy's stop
    has the failure that stopped the job as its reason (``on_<failure>=restart``)."""

    STARTED = "started"  # an attempt began with nothing to restore
    RESTORED = "restored"  # an attempt began from a restored checkpoint
    EXHAUSTED = "exhausted"  # a stop with no restart left (spec/recovery.md RECOVERY-5)


class FinishedReason(Reason):
    """How the job's loop ended (``finished``)."""

    CLOSED = "closed"  # the job closed scout at the end of its loop
    INTERRUPTED = "interrupted"  # a KeyboardInterrupt left the loop
    EXCEPTION = "exception"  # another exception left the loop


class CheckpointReason(Reason):
    """A checkpoint's trust changed to the state its reason names (GATE-20), or its save failed."""

    CAPTURED = "captured"
    CANDIDATE = "candidate"
    RECOVERY_VERIFIED = "recovery-verified"
    QUARANTINED = "quarantined"
    SUPERSEDED = "superseded"
    LOST = "lost"
    SAVE_FAILED = "save-failed"  # the save failed or was not attempted (spec/gate.md GATE-40)


class SdcReason(Reason):
    """Who named the corruption of an ``sdc`` report."""

    REPLAY_MISMATCH = "replay-mismatch"  # a replay's evidence named the ranks
    LIVE_MISMATCH = "live-mismatch"  # only the live path's self-check did (SELF-4)
    CANARY_COMMON_MODE = "canary-common-mode"  # the canary's classes changed on every rank alike
    CANARY_CHANGED = "canary-changed"  # the canary's class of some ranks changed
    GATE_SDC = "gate-sdc"  # the gate saw SDC that no check named ranks for


class UncheckedReason(Reason):
    REPLAY_INCONCLUSIVE = "replay-inconclusive"  # some group was Inconclusive or missing (GATE-3)
    REPLAY_DETECT_ONLY = "replay-detect-only"  # every unchecked group is a disagreeing pair (LAYOUT-4)


#: The kinds of straggler (``evidence.straggler`` of a ``straggler`` report, the kinds of
#: ``timing.jsonl`` lines, the ops page's keys): ``StragglerKind``'s members, in its order.
STRAGGLER_KINDS: Final = ("device", "communication", "loop", "forward")
_CHANGES: Final = ("confirmed", "recovered", "localized")


class StragglerReason(Reason):
    """STRAG-21: a straggler confirmed, recovered, or localized (named across groups)."""

    DEVICE_SLOW = "device-slow"
    COMMUNICATION_SLOW = "communication-slow"
    LOOP_SLOW = "loop-slow"
    FORWARD_SLOW = "forward-slow"
    RECOVERED_DEVICE_SLOW = "recovered-device-slow"
    RECOVERED_COMMUNICATION_SLOW = "recovered-communication-slow"
    RECOVERED_LOOP_SLOW = "recovered-loop-slow"
    RECOVERED_FORWARD_SLOW = "recovered-forward-slow"
    LOCALIZED_DEVICE_SLOW = "localized-device-slow"
    LOCALIZED_COMMUNICATION_SLOW = "localized-communication-slow"
    LOCALIZED_LOOP_SLOW = "localized-loop-slow"
    LOCALIZED_FORWARD_SLOW = "localized-forward-slow"

    @property
    def straggler(self) -> str:
        """The kind of straggler (one of :data:`STRAGGLER_KINDS`)."""
        return _STRAGGLER_PARTS[self][0]

    @property
    def change(self) -> str:
        """``confirmed``, ``recovered`` or ``localized``."""
        return _STRAGGLER_PARTS[self][1]

    @classmethod
    def of(cls, straggler: str, change: str) -> StragglerReason:
        """The reason of a ``change`` of a ``straggler`` kind; a pair it has none for raises."""
        try:
            return _STRAGGLER_REASONS[(straggler, change)]
        except KeyError:
            raise ValueError(f"no straggler reason for kind {straggler!r} and change {change!r}: kinds are "
                             f"{STRAGGLER_KINDS}, changes {_CHANGES}") from None


_STRAGGLER_REASONS: Final[Mapping[tuple[str, str], StragglerReason]] = {
    (straggler, change): reason
    for reason, (straggler, change) in zip(
        StragglerReason,
        [(straggler, change) for change in _CHANGES for straggler in STRAGGLER_KINDS],
        strict=True,
    )
}
_STRAGGLER_PARTS: Final = {reason: pair for pair, reason in _STRAGGLER_REASONS.items()}
assert all(reason.value.endswith(f"{straggler}-slow") for (straggler, _), reason in _STRAGGLER_REASONS.items())

#: The ``restart`` reasons that mark the start of an attempt (``scout.attach``'s restore writes them).
ATTEMPT_STARTS: Final = frozenset({RestartReason.STARTED, RestartReason.RESTORED})
#: The ``checkpoint`` reason of a save that failed or was not attempted (spec/gate.md GATE-40).
SAVE_FAILED: Final = CheckpointReason.SAVE_FAILED
#: The ``restart`` reason of a stop with no restart left (spec/recovery.md RECOVERY-5).
EXHAUSTED: Final = RestartReason.EXHAUSTED

# ---------------------------------------------------------------- translations

#: An observer finding of a rank behind (or ahead of) its peers is reported by what it waits in.
_BEHIND_KINDS: Final[Mapping[StallKind, ReportKind]] = {
    StallKind.HANG: ReportKind.HANG,
    StallKind.DATA_STALL: ReportKind.DATA_STALL,
    StallKind.CHECKPOINT_STALL: ReportKind.CHECKPOINT_STALL,
    StallKind.DESYNC: ReportKind.DESYNC,
}
#: The other reported findings, with their reasons. UNSETTLED is never reported.
_FINDINGS: Final[Mapping[Finding, tuple[ReportKind, ObserverReason]]] = {
    Finding.DESYNC: (ReportKind.DESYNC, ObserverReason.COLLECTIVE_DIFFERS),
    Finding.GROUP_STALL: (ReportKind.GROUP_STALL, ObserverReason.SAME_POINT_SAME_COLLECTIVE),
    Finding.UNRESPONSIVE: (ReportKind.UNRESPONSIVE, ObserverReason.NO_ANSWER),
    Finding.INCONCLUSIVE: (ReportKind.INCONCLUSIVE, ObserverReason.NO_MAJORITY),
}


def observer_kind(outcome: Finding, stall: StallKind) -> ReportKind:
    """The ``kind`` of an observer report of ``outcome`` (``stall``: what a rank found behind
    waits in)."""
    if outcome is Finding.BEHIND:
        return _BEHIND_KINDS[stall]
    if outcome not in _FINDINGS:
        raise ValueError(f"observer finding {outcome!r} is never reported")
    return _FINDINGS[outcome][0]


def observer_reason(outcome: Finding, attributed: Iterable[int], ahead: Iterable[int], *,
                    code: FindingCode | None = None, group_size: int = 0) -> ObserverReason:
    """The reason of an observer report: for a rank found behind, whether every rank it names
    is ahead of the majority instead (it skipped a collective); a finding that names nobody
    because the evidence could not (``code``, COMPLETION-9, COMPLETION-10) says so; an
    inconclusive finding in a group of two replicas only detects (LAYOUT-4)."""
    if code is not None and code is not FindingCode.NONE:
        return _CODE_REASONS[code]
    if outcome is Finding.BEHIND:
        return ObserverReason.AHEAD_OF_MAJORITY if set(attributed) == set(ahead) else ObserverReason.BEHIND_MAJORITY
    if outcome is Finding.INCONCLUSIVE and group_size == 2:
        return ObserverReason.DETECT_ONLY
    if outcome not in _FINDINGS:
        raise ValueError(f"observer finding {outcome!r} is never reported")
    return _FINDINGS[outcome][1]


_CODE_REASONS: Final = {
    FindingCode.HOST_PROGRESS_ONLY: ObserverReason.HOST_PROGRESS_ONLY,
    FindingCode.WAITING_ELSEWHERE: ObserverReason.WAITING_ELSEWHERE,
}


@functools.cache
def _trust_reasons() -> Mapping[Trust, CheckpointReason]:
    from scout.gate.model import Trust

    return {
        Trust.CAPTURED: CheckpointReason.CAPTURED,
        Trust.CANDIDATE: CheckpointReason.CANDIDATE,
        Trust.RECOVERY_VERIFIED: CheckpointReason.RECOVERY_VERIFIED,
        Trust.QUARANTINED: CheckpointReason.QUARANTINED,
        Trust.SUPERSEDED: CheckpointReason.SUPERSEDED,
        Trust.LOST: CheckpointReason.LOST,
    }


def trust_reason(trust: Trust) -> CheckpointReason:
    """The reason of a ``checkpoint`` report that a checkpoint entered ``trust`` (GATE-20)."""
    return _trust_reasons()[trust]


def _straggler_kind(kind: StragglerKind) -> str:
    from scout.core.straggler.tracking import StragglerKind

    return dict(zip(StragglerKind, STRAGGLER_KINDS, strict=True))[StragglerKind(kind)]


def straggler_reason(event: StragglerEvent) -> StragglerReason:
    """The report reason of one straggler event (a confirmation or a recovery of its kind)."""
    return StragglerReason.of(_straggler_kind(event.kind), event.change)


def straggler_record_arguments(
    event: StragglerEvent,
    *,
    hosts: Mapping[int, str] | None = None,
    group_ratios: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """STRAG-21: the arguments of ``scout.reports.make_record`` for one straggler confirmation or
    recovery, without the job's own (``job_id``, ``generation``, ``reporter_rank``)::

        record = make_record(**straggler_record_arguments(event), job_id=..., generation=...)

    ``hosts`` maps global ranks to host names; ``group_ratios`` are the performance ratios of
    every peer of the group (``StragglerTracker.performance_ratios()``), by position.
    """
    host = hosts.get(event.rank) if hosts is not None else None
    config = event.config
    straggler = _straggler_kind(event.kind)
    evidence: dict[str, Any] = {
        "straggler": straggler,
        "change": event.change,
        "performance_ratio": event.performance_ratio,
        "peer_position": event.peer,
        "group_ranks": list(event.group_ranks),
        "checks": event.checks,
        "trail": [
            {"step": entry.step, "ratio": entry.time_ratio, "score_mnp": entry.score_mnp}
            for entry in event.trail
        ],
        "test": {
            "slow_ratio": config.slow_ratio,
            "confirm_evidence": config.confirm_evidence,
            "recovery_ratio": config.recovery_ratio,
            "recovery_evidence": config.recovery_evidence,
            "clip_ratio": config.clip_ratio,
            "fast_ratio": config.fast_ratio,
        },
    }
    if group_ratios is not None:
        evidence["group_ratios"] = {
            str(rank): ratio for rank, ratio in zip(event.group_ranks, group_ratios, strict=True)
        }
    return {
        "kind": ReportKind.STRAGGLER.value,
        "source": ReportKind.STRAGGLER.source.value,
        "reason": StragglerReason.of(straggler, event.change).value,
        "ranks": [event.rank],
        "hosts": [host] if host is not None else [],
        "step": event.step,
        "evidence": evidence,
    }


def localization_record_arguments(
    found: Localization, kind: StragglerKind, step: int, groups: Sequence[GroupTiming] = ()
) -> dict[str, Any] | None:
    """STRAG-21: the arguments of ``scout.reports.make_record`` for a LOCALIZED result of
    ``localize_live`` over one kind's group timings (reason ``localized-<kind>-slow``; the
    ranks are the named rank, or every rank of the named host); None for any other result,
    which names nobody."""
    from scout.core.straggler.localize import LocalizationStatus

    if found.status is not LocalizationStatus.LOCALIZED:
        return None
    straggler = _straggler_kind(kind)
    ranks = [found.rank] if found.rank is not None else list(found.host_ranks)
    evidence: dict[str, Any] = {
        "straggler": straggler,
        "localized": "rank" if found.rank is not None else "host",
        "candidates": list(found.candidates),
        "groups": [
            {"family": g.family, "members": sorted(g.members), "centre_ms": g.centre_ms}
            for g in groups
        ],
    }
    return {
        "kind": ReportKind.STRAGGLER.value,
        "source": ReportKind.STRAGGLER.source.value,
        "reason": StragglerReason.of(straggler, "localized").value,
        "ranks": ranks,
        "hosts": [found.host] if found.host is not None else [],
        "step": step,
        "evidence": evidence,
    }


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
