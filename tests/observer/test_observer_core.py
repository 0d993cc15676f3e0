"""The observer's pure core: the assessment table of spec/observer.md ("Lifecycle"), the
configuration's bad inputs, and scripted runs of the machine that read like the spec."""

from __future__ import annotations

import math

import attrs
import pytest

from scout.core.observer import (
    Answer,
    Attached,
    Decision,
    Delegate,
    EmitReport,
    Evidence,
    Finding,
    Joined,
    Noted,
    ObserverConfig,
    ObserverState,
    Progress,
    ProgressSeen,
    Reply,
    Request,
    RoundClosed,
    RoundId,
    RoundRequest,
    Scope,
    Send,
    Stage,
    StallKind,
    Stopped,
    Tick,
    TrainerExit,
    WakeAt,
    assess,
    event_for,
    initial_context,
    reporter_for,
)
from tests.observer.model import OBSERVER

F, G = 0xF00D, 0xBEEF


def config(n: int = 4, position: int = 0) -> ObserverConfig:
    return ObserverConfig(position, n, stall_threshold_s=2.0, settle_idle_s=1.0, data_stall_threshold_s=5.0,
                          checkpoint_stall_threshold_s=8.0, round_deadline_s=1.0, recheck_interval_s=2.0)


def in_f(idle_s: float = 3.0, fp: int = F, op: int = 3) -> Evidence:
    return Evidence(1, op, fp, Stage.COLLECTIVE, idle_s)


def before(idle_s: float = 3.0, stage: Stage = Stage.COMPUTE) -> Evidence:
    return Evidence(1, 2, 0, stage, idle_s)


ASSESSMENTS = [
    # (evidence by position, outcome, attributed, ahead, missing, key, kind, scope)
    ([in_f(), in_f(), before(), in_f()], Finding.BEHIND, (2,), (), (), (1, 3), StallKind.HANG, Scope.RANK),
    ([in_f(), in_f(), in_f(op=5), in_f()], Finding.BEHIND, (2,), (2,), (), (1, 3), StallKind.HANG, Scope.RANK),
    ([in_f(), in_f(fp=G), in_f(), in_f()], Finding.DESYNC, (1,), (), (), (1, 3), StallKind.DESYNC, Scope.RANK),
    ([in_f()] * 4, Finding.GROUP_STALL, (), (), (), (1, 3), StallKind.HANG, Scope.GROUP),
    ([None, in_f(), in_f(), in_f()], Finding.UNRESPONSIVE, (), (), (0,), (1, 3), StallKind.HANG, Scope.RANK),
    ([None, in_f(), before(), in_f()], Finding.INCONCLUSIVE, (), (), (0,), (1, 2), StallKind.HANG, Scope.GROUP),
    ([in_f(), in_f(), before(), before()], Finding.INCONCLUSIVE, (), (), (), (1, 2), StallKind.HANG, Scope.GROUP),
    ([in_f(), in_f(), in_f(fp=G), in_f(fp=G)], Finding.INCONCLUSIVE, (), (), (), (1, 3), StallKind.HANG, Scope.GROUP),
    # A rank that still moves makes the round unsettled: a straggler, not a hang.
    ([in_f(), in_f(), before(idle_s=0.2), in_f()], Finding.UNSETTLED, (), (), (), None, StallKind.HANG, Scope.GROUP),
    # Data loading: attributed only once it has lasted its own (longer) threshold.
    ([in_f(), in_f(), before(4.0, Stage.DATA_LOADING), in_f()], Finding.UNSETTLED, (), (), (), None,
     StallKind.HANG, Scope.GROUP),
    ([in_f(), in_f(), before(5.0, Stage.DATA_LOADING), in_f()], Finding.BEHIND, (2,), (), (), (1, 3),
     StallKind.DATA_STALL, Scope.RANK),
    ([in_f(), before(9.0, Stage.CHECKPOINT_WRITE), in_f(), in_f()], Finding.BEHIND, (1,), (), (), (1, 3),
     StallKind.CHECKPOINT_STALL, Scope.RANK),
    ([before(6.0, Stage.DATA_LOADING)] * 4, Finding.GROUP_STALL, (), (), (), (1, 2), StallKind.DATA_STALL,
     Scope.GROUP),
    # Two of four: detectable, never attributable (VERDICT: no strict majority).
    ([in_f(), in_f(fp=G)], Finding.INCONCLUSIVE, (), (), (), (1, 3), StallKind.HANG, Scope.GROUP),
]


@pytest.mark.parametrize(("evidence", "outcome", "attributed", "ahead", "missing", "key", "kind", "scope"), ASSESSMENTS)
def test_OBS_assessment_table(
    evidence: list[Evidence | None], outcome: Finding, attributed: tuple[int, ...], ahead: tuple[int, ...],
    missing: tuple[int, ...], key: tuple[int, int] | None, kind: StallKind, scope: Scope,
) -> None:
    found = assess(evidence, config(n=len(evidence)))
    assert (found.outcome, found.attributed, found.ahead, found.missing, found.key, found.kind, found.scope) == (
        outcome, attributed, ahead, missing, key, kind, scope,
    )


def test_OBS_7_the_reporter_is_the_lowest_responsive_unattributed_position() -> None:
    evidence = [before(), None, in_f(), in_f(), in_f()]
    found = assess(evidence, config(n=5))
    assert found.outcome is Finding.BEHIND and found.attributed == (0,)
    assert reporter_for(found, evidence) == 2  # 0 is the culprit, 1 did not answer


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(position=4, group_size=4), "position 4 is outside the group of 4"),
        (dict(position=0, group_size=1), "group_size must be an int >= 2, got 1"),
        (dict(position=0, group_size=3, stall_threshold_s=0), "stall_threshold_s must be a finite number of seconds > 0, got 0"),
        (dict(position=0, group_size=3, round_deadline_s=math.nan), "round_deadline_s must be a finite number"),
        (dict(position=0, group_size=3, recheck_interval_s=math.inf), "recheck_interval_s must be a finite number"),
        (dict(position=0, group_size=3, data_stall_threshold_s=True), "data_stall_threshold_s must be a finite number"),
        (dict(position=0, group_size=3, stall_threshold_s=2.0, settle_idle_s=3.0),
         r"settle_idle_s \(3.0\) must not exceed stall_threshold_s \(2.0\)"),
        (dict(position=0, group_size=3, round_deadline_s=5.0, recheck_interval_s=1.0),
         r"recheck_interval_s \(1.0\) must be >= round_deadline_s \(5.0\)"),
        (dict(position=-1, group_size=3), "position must be an int >= 0, got -1"),
        (dict(position=0, group_size=3, confirm_rounds=0), "confirm_rounds must be an int >= 1, got 0"),
    ],
)
def test_OBS_invalid_thresholds_are_refused_naming_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ObserverConfig(**kwargs)  # type: ignore[arg-type]


def test_OBS_default_settle_is_half_the_stall_threshold() -> None:
    assert ObserverConfig(0, 2, stall_threshold_s=10.0).settle_idle_s == 5.0


def watching(n: int = 4, position: int = 0, progress: Progress | None = None) -> object:
    state = OBSERVER.initial_state(initial_context(config(n, position), 100.0))
    state, _ = OBSERVER.step(state, Joined(100.0))
    state, _ = OBSERVER.step(state, Attached(100.0, progress or Progress(1, 3, F, Stage.COLLECTIVE)))
    return state


def test_OBS_1_and_2_a_scripted_hang_rank_2_behind() -> None:
    """Rank 2 sleeps before the all-reduce; observer 0 sees its trainer idle in the all-reduce."""
    state = watching()
    # Below the threshold: silent.
    state, effects = OBSERVER.step(state, Tick(101.0))
    assert state.control is ObserverState.WATCHING and effects == ()
    state, effects = OBSERVER.step(state, Tick(102.0))
    assert state.control is ObserverState.ROUND
    assert effects == (Send((1, 2, 3), Request(RoundId(0, 1))), WakeAt(103.0))
    state, _ = OBSERVER.step(state, Answer(102.1, RoundId(0, 1), 1, in_f(2.1)))
    state, _ = OBSERVER.step(state, Answer(102.1, RoundId(0, 1), 3, in_f(2.1)))
    state, effects = OBSERVER.step(state, Answer(102.2, RoundId(0, 1), 2, before(2.2)))
    assert state.control is ObserverState.HOLDING
    closed = [e for e in effects if isinstance(e, RoundClosed)]
    reports = [e.report for e in effects if isinstance(e, EmitReport)]
    assert len(closed) == 1 and not closed[0].by_deadline
    assert len(reports) == 1
    report = reports[0]
    assert (report.outcome, report.attributed, report.reporter, report.key, report.kind) == (
        Finding.BEHIND, (2,), 0, (1, 3), StallKind.HANG,
    )
    # A recheck finds the same: no second report for the same stuck position (OBS-6).
    state, effects = OBSERVER.step(state, Tick(104.2))
    assert state.control is ObserverState.ROUND
    for sender, evidence in ((1, in_f()), (2, before()), (3, in_f())):
        state, effects = OBSERVER.step(state, Answer(104.3, RoundId(0, 2), sender, evidence))
    assert not [e for e in effects if isinstance(e, EmitReport)]
    # Progress ends the stall.
    state, effects = OBSERVER.step(state, ProgressSeen(110.0, Progress(1, 4)))
    assert state.control is ObserverState.WATCHING and not [e for e in effects if isinstance(e, Send)]


def test_OBS_3_a_silent_peer_is_missing_evidence_at_the_deadline() -> None:
    state = watching()
    state, _ = OBSERVER.step(state, Tick(102.0))
    state, _ = OBSERVER.step(state, Answer(102.1, RoundId(0, 1), 1, in_f()))
    state, effects = OBSERVER.step(state, Tick(102.5))
    assert state.control is ObserverState.ROUND and effects == ()
    state, effects = OBSERVER.step(state, Tick(103.0))
    assert state.control is ObserverState.HOLDING
    (closed,) = [e for e in effects if isinstance(e, RoundClosed)]
    assert closed.by_deadline and closed.answered == (0, 1)
    assert closed.assessment.outcome is Finding.INCONCLUSIVE and closed.assessment.missing == (2, 3)


def test_OBS_7_a_culprit_delegates_its_report() -> None:
    """Observer 0's own trainer is the one behind: it decides, and rank 1 reports."""
    state = watching(progress=Progress(1, 2, 0, Stage.COMPUTE))
    state, _ = OBSERVER.step(state, Tick(102.0))
    for sender in (1, 2, 3):
        state, effects = OBSERVER.step(state, Answer(102.1, RoundId(0, 1), sender, in_f()))
    (delegation,) = [e for e in effects if isinstance(e, Send)]
    assert delegation.to == (1,) and isinstance(delegation.message, Delegate)
    assert not [e for e in effects if isinstance(e, EmitReport)]
    report = delegation.message.report
    # On observer 1, the delegated report is emitted once.
    other = watching(position=1)
    other, effects = OBSERVER.step(other, event_for(delegation.message, 102.2))
    assert effects == (EmitReport(attrs.evolve(report, reporter=1)),)
    assert (report.outcome, report.attributed, report.decided_by) == (Finding.BEHIND, (0,), 0)
    other, effects = OBSERVER.step(other, Decision(102.3, report.round, 0, report))
    assert effects == ()


def test_OBS_5_and_9_requests_answered_and_late_replies_counted() -> None:
    state = watching(position=2)
    state, effects = OBSERVER.step(state, RoundRequest(100.5, RoundId(0, 7)))
    assert effects == (Send((0,), Reply(RoundId(0, 7), 2, Evidence(1, 3, F, Stage.COLLECTIVE, 0.5))),)
    assert state.context.deferred_until_s == 100.5 + 3.0  # a lower peer coordinates
    state, effects = OBSERVER.step(state, Answer(100.6, RoundId(2, 1), 0, None))
    assert effects == (Noted("stale_reply_ignored"),)


def test_OBS_8_trainer_exit_stops_at_once_and_for_good() -> None:
    state = watching()
    state, _ = OBSERVER.step(state, Tick(102.0))
    state, effects = OBSERVER.step(state, TrainerExit(102.1, clean=False))
    assert state.control is ObserverState.STOPPED and effects == (Stopped("trainer died"),)
    for event in (Tick(200.0), RoundRequest(200.0, RoundId(1, 1)), ProgressSeen(200.0, Progress(2, 0))):
        after, effects = OBSERVER.step(state, event)
        assert after == state and effects == ()


def test_OBS_attach_and_join_deadlines_fail_with_a_reason() -> None:
    state = OBSERVER.initial_state(initial_context(config(), 0.0))
    state, effects = OBSERVER.step(state, Tick(1.0))
    assert state.control is ObserverState.JOINING
    joined, _ = OBSERVER.step(state, Joined(1.0))
    failed, effects = OBSERVER.step(joined, Tick(200.0))
    assert failed.control is ObserverState.FAILED
    assert "did not appear within attach_deadline_s=120.0" in effects[0].reason  # type: ignore[attr-defined]
    failed, effects = OBSERVER.step(state, Tick(121.0))
    assert failed.control is ObserverState.FAILED and "join_deadline_s=120.0" in effects[0].reason  # type: ignore[attr-defined]
