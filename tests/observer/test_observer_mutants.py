"""Mutation follow-up for the observer machine (tests/mutation/survivors.md, "Observer").

Scripted runs of the real machine, with every transition's effects and context pinned, and every
invariant predicate of spec/observer.toml (OBS-1..10) fed a *planted* violation: one real step
with one field changed so that the clause is broken. Each planted step must be refused by its
predicate; each real step must satisfy every ``always`` predicate, and the ``sometimes``
witnesses (OBS-20..30) must hold on exactly the steps that show their case.

Why not rely on the explorations in test_observer_model.py alone: their results are cached
(``functools.cache``) per process, and mutmut tests each mutant in a process forked after the
clean run, so a mutant in a predicate never reaches the explorer. These tests are cheap and
run the predicates themselves.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs
import pytest

from scout.core.machine import MachineState
from scout.core.observer import (
    Answer,
    Assessment,
    Attached,
    Decision,
    Delegate,
    EmitReport,
    Evidence,
    Failed,
    Finding,
    Joined,
    JoinFailed,
    Noted,
    ObserverConfig,
    ObserverContext,
    ObserverState,
    OpenRound,
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
    StallReport,
    Stop,
    Stopped,
    Tick,
    TrainerExit,
    WakeAt,
    assess,
    event_for,
    initial_context,
    reporter_for,
)
from scout.core.observer.model import _count, _positive_finite
from tests.observer.model import OBSERVER

F, G = 0xF00D, 0xBEEF
PROPERTIES = {p.id: p for p in OBSERVER.properties}
ALWAYS = [p for p in OBSERVER.properties if p.kind == "always"]
SOMETIMES = [p for p in OBSERVER.properties if p.kind == "sometimes"]

State = MachineState[ObserverContext]
Step = tuple[State, Any, State, tuple[object, ...]]


def config(n: int = 4, position: int = 0, **kwargs: Any) -> ObserverConfig:
    return ObserverConfig(position, n, stall_threshold_s=2.0, settle_idle_s=1.0, data_stall_threshold_s=5.0,
                          checkpoint_stall_threshold_s=8.0, round_deadline_s=1.0, recheck_interval_s=2.0, **kwargs)


def in_f(idle_s: float = 3.0, fp: int = F) -> Evidence:
    return Evidence(1, 3, fp, Stage.COLLECTIVE, idle_s)


def before(idle_s: float = 3.0) -> Evidence:
    return Evidence(1, 2, 0, Stage.COMPUTE, idle_s)


def watching(n: int = 4, position: int = 0, progress: Progress | None = None, **kwargs: Any) -> State:
    state = OBSERVER.initial_state(initial_context(config(n, position, **kwargs), 100.0))
    state, _ = OBSERVER.step(state, Joined(100.0))
    state, _ = OBSERVER.step(state, Attached(100.0, progress or Progress(1, 3, F, Stage.COLLECTIVE)))
    return state


def step(state: State, event: Any) -> Step:
    after, effects = OBSERVER.step(state, event)
    return state, event, after, effects


def holds(prop_id: str, s: Step) -> bool:
    prop = PROPERTIES[prop_id]
    if prop.scope == "state":
        return bool(prop.predicate(s[2]))
    return bool(prop.predicate(*s))


def with_effects(s: Step, effects: tuple[object, ...]) -> Step:
    return s[0], s[1], s[2], effects


def with_state(s: Step, **changes: Any) -> Step:
    return s[0], s[1], attrs.evolve(s[2], **changes), s[3]


def with_context(s: Step, **changes: Any) -> Step:
    return with_state(s, context=attrs.evolve(s[2].context, **changes))


def reports_of(effects: tuple[object, ...]) -> list[Any]:
    return [e.report for e in effects if isinstance(e, EmitReport)]


# --------------------------------------------------------------------------------------------
# Scripted runs: every step kept
# --------------------------------------------------------------------------------------------


def run_behind() -> dict[str, Step]:
    """Rank 2 behind: a round closes with every answer and observer 0 reports; a late reply;
    the next round is aborted by progress."""
    steps: dict[str, Step] = {}
    state = watching()
    steps["quiet-tick"] = s = step(state, Tick(101.0))
    steps["start"] = s = step(s[2], Tick(102.0))
    steps["reply-1"] = s = step(s[2], Answer(102.1, RoundId(0, 1), 1, in_f(2.1)))
    steps["reply-3"] = s = step(s[2], Answer(102.1, RoundId(0, 1), 3, in_f(2.1)))
    steps["close-all"] = s = step(s[2], Answer(102.2, RoundId(0, 1), 2, before(2.2)))
    steps["stale-holding"] = s = step(s[2], Answer(102.3, RoundId(0, 1), 1, in_f()))
    steps["recheck"] = s = step(s[2], Tick(104.2))
    steps["stale-round"] = s = step(s[2], Answer(104.3, RoundId(0, 1), 1, in_f()))
    steps["abort"] = step(s[2], ProgressSeen(104.5, Progress(1, 4)))
    return steps


def run_deadline() -> dict[str, Step]:
    """Peers 2 and 3 silent: the round closes at its deadline (inconclusive, a streak of 1);
    then progress, which resets the streak."""
    steps: dict[str, Step] = {}
    state = watching()
    s = step(state, Tick(102.0))
    s = step(s[2], Answer(102.1, RoundId(0, 1), 1, in_f()))
    steps["deadline"] = s = step(s[2], Tick(103.0))
    steps["progress"] = step(s[2], ProgressSeen(103.5, Progress(2, 0)))
    return steps


def run_unresponsive() -> dict[str, Step]:
    """Peer 3 silent in two rounds in a row: reported after confirm_rounds = 2."""
    steps: dict[str, Step] = {}
    s = step(watching(), Tick(102.0))
    for sender in (1, 2):
        s = step(s[2], Answer(102.1, RoundId(0, 1), sender, in_f()))
    steps["first-deadline"] = s = step(s[2], Tick(103.0))
    s = step(s[2], Tick(105.0))
    for sender in (1, 2):
        s = step(s[2], Answer(105.1, RoundId(0, 2), sender, in_f()))
    steps["confirmed"] = step(s[2], Tick(106.0))
    return steps


def closing(evidence: dict[int, Evidence], progress: Progress | None = None) -> Step:
    s = step(watching(progress=progress), Tick(102.0))
    items = sorted(evidence.items())
    for sender, item in items[:-1]:
        s = step(s[2], Answer(102.1, RoundId(0, 1), sender, item))
    return step(s[2], Answer(102.2, RoundId(0, 1), items[-1][0], items[-1][1]))


def run_delegation() -> dict[str, Step]:
    """Observer 0's own trainer is behind: it delegates; observer 1 emits."""
    steps: dict[str, Step] = {}
    steps["delegate"] = s = closing({1: in_f(), 2: in_f(), 3: in_f()}, Progress(1, 2, 0, Stage.COMPUTE))
    (send,) = [e for e in s[3] if isinstance(e, Send)]
    steps["decision"] = step(watching(position=1), event_for(send.message, 102.2))
    return steps


def run_requests() -> dict[str, Step]:
    steps: dict[str, Step] = {}
    steps["request-from-lower"] = s = step(watching(position=2), RoundRequest(100.5, RoundId(0, 7)))
    steps["stale-watching"] = s = step(s[2], Answer(100.6, RoundId(2, 1), 0, None))
    steps["request-from-higher"] = s = step(s[2], RoundRequest(100.7, RoundId(3, 1)))
    steps["request-from-itself"] = step(s[2], RoundRequest(100.8, RoundId(2, 1)))
    return steps


def run_stops() -> dict[str, Step]:
    steps: dict[str, Step] = {}
    in_round = step(watching(), Tick(102.0))[2]
    steps["exit-clean"] = s = step(in_round, TrainerExit(102.1, clean=True))
    steps["after-stop"] = step(s[2], Tick(103.0))
    steps["exit-dead"] = step(in_round, TrainerExit(102.1, clean=False))
    steps["stop"] = step(in_round, Stop(102.2))
    return steps


def every_step() -> dict[str, Step]:
    steps = {
        **run_behind(), **run_deadline(), **run_unresponsive(), **run_delegation(), **run_requests(), **run_stops(),
    }
    steps["close-desync"] = closing({1: in_f(fp=G), 2: in_f(), 3: in_f()})
    steps["close-group-stall"] = closing({1: in_f(), 2: in_f(), 3: in_f()})
    return steps


# The sometimes-witnesses (OBS-20..30) true on each scripted step; on every other step, false.
WITNESSES = {
    "start": set(),
    "close-all": {"OBS-20", "OBS-22"},
    "stale-holding": {"OBS-29"},
    "stale-round": {"OBS-29"},
    "abort": {"OBS-28"},
    "deadline": {"OBS-21"},
    "progress": set(),
    "first-deadline": {"OBS-21"},
    "confirmed": {"OBS-21", "OBS-25"},
    "delegate": {"OBS-20", "OBS-22", "OBS-26"},
    "decision": {"OBS-22", "OBS-27"},
    "request-from-lower": {"OBS-30"},
    "stale-watching": {"OBS-29"},
    "request-from-higher": set(),
    "request-from-itself": set(),
    "exit-clean": set(),
    "stop": set(),
    "close-desync": {"OBS-20", "OBS-23"},
    "close-group-stall": {"OBS-20", "OBS-24"},
}


def test_OBS_1_to_10_hold_on_every_step_of_the_scripted_runs() -> None:
    for name, s in every_step().items():
        for prop in ALWAYS:
            assert holds(prop.id, s), (name, prop.id)


def test_OBS_20_to_30_each_witness_holds_on_exactly_the_steps_that_show_its_case() -> None:
    steps = every_step()
    for name, expected in WITNESSES.items():
        found = {p.id for p in SOMETIMES if holds(p.id, steps[name])}
        assert found == expected, name


# --------------------------------------------------------------------------------------------
# Effects and context after each transition
# --------------------------------------------------------------------------------------------


def test_OBS_28_progress_in_a_round_drops_it_records_the_progress_and_rearms_the_timer() -> None:
    _, _, after, effects = run_behind()["abort"]
    assert after.control is ObserverState.WATCHING
    assert effects == (Noted("round_aborted_by_progress"), WakeAt(104.5 + 2.0))
    context = after.context
    assert (context.round, context.now_s, context.progress, context.last_progress_s, context.streak) == (
        None, 104.5, Progress(1, 4), 104.5, None,
    )


def test_OBS_progress_resets_the_confirmation_streak_and_wakes_at_the_new_threshold() -> None:
    steps = run_deadline()
    assert steps["deadline"][2].context.streak is not None  # an inconclusive round, counted
    _, _, after, effects = steps["progress"]
    assert after.control is ObserverState.WATCHING
    assert effects == (WakeAt(103.5 + 2.0),)
    context = after.context
    assert (context.now_s, context.progress, context.last_progress_s, context.streak) == (
        103.5, Progress(2, 0), 103.5, None,
    )


@pytest.mark.parametrize(
    ("name", "reason"), [("exit-clean", "trainer exited cleanly"), ("exit-dead", "trainer died"), ("stop", "stop requested")]
)
def test_OBS_8_stopping_gives_its_reason_and_drops_the_open_round(name: str, reason: str) -> None:
    previous, _, after, effects = run_stops()[name]
    assert previous.context.round is not None
    assert after.control is ObserverState.STOPPED and effects == (Stopped(reason),)
    assert after.context.round is None


def test_OBS_a_delegated_report_is_emitted_with_the_receiver_as_its_reporter() -> None:
    s = run_delegation()["delegate"]
    (send,) = [e for e in s[3] if isinstance(e, Send)]
    report = send.message.report  # type: ignore[union-attr]
    # Whatever reporter the message names, the observer that emits it is the reporter.
    other = watching(position=2)
    _, effects = OBSERVER.step(other, Decision(102.2, report.round, 0, report))
    assert effects == (EmitReport(attrs.evolve(report, reporter=2)),)


def test_OBS_event_for_a_delegation_is_a_decision_with_its_round_sender_and_report() -> None:
    report = reports_of(run_behind()["close-all"][3])[0]
    message = Delegate(RoundId(3, 9), 3, report)
    assert event_for(message, 7.5) == Decision(7.5, RoundId(3, 9), 3, report)
    assert event_for(Reply(RoundId(1, 2), 1, None), 1.0) == Answer(1.0, RoundId(1, 2), 1, None)
    assert event_for(Request(RoundId(1, 2)), 1.0) == RoundRequest(1.0, RoundId(1, 2))


def test_OBS_30_only_a_request_from_a_lower_position_defers_the_own_rounds() -> None:
    steps = run_requests()
    assert steps["request-from-lower"][2].context.deferred_until_s == 100.5 + 3.0
    for name in ("request-from-higher", "request-from-itself"):
        previous, _, after, effects = steps[name]
        assert after.context.deferred_until_s == previous.context.deferred_until_s, name
        assert len(effects) == 1 and isinstance(effects[0], Send) and isinstance(effects[0].message, Reply)


def test_OBS_join_failure_names_the_rendezvous_error() -> None:
    state = OBSERVER.initial_state(initial_context(config(), 0.0))
    after, effects = OBSERVER.step(state, JoinFailed(0.5, "connection refused"))
    assert after.control is ObserverState.FAILED
    assert effects == (Failed("rendezvous failed: connection refused"),)


def test_OBS_join_and_attach_deadlines_count_from_the_start_and_include_the_deadline() -> None:
    # Started at 100 (not 0), so a clock that added the start time would fail early.
    joining = OBSERVER.initial_state(initial_context(config(), 100.0))
    assert OBSERVER.step(joining, Tick(219.9))[0].control is ObserverState.JOINING
    assert OBSERVER.step(joining, Tick(220.0))[0].control is ObserverState.FAILED
    attaching, _ = OBSERVER.step(joining, Joined(100.0))
    assert OBSERVER.step(attaching, Tick(219.9))[0].control is ObserverState.ATTACHING
    assert OBSERVER.step(attaching, Tick(220.0))[0].control is ObserverState.FAILED


def test_OBS_7_no_reporter_is_an_error_naming_the_evidence_and_the_assessment() -> None:
    assessment = Assessment(Finding.BEHIND, (1,), (), (0,), (1, 3), StallKind.HANG, Scope.RANK, "r")
    with pytest.raises(ValueError, match=re.escape(f"no responsive, non-attributed observer in [None, {in_f()!r}] for ")):
        reporter_for(assessment, [None, in_f()])


# --------------------------------------------------------------------------------------------
# Planted violations: one real step, one field changed; the clause's predicate must refuse it
# --------------------------------------------------------------------------------------------


def planted() -> list[tuple[str, str, Step]]:
    """(clause, what was planted, the step)."""
    behind, stops, requests = run_behind(), run_stops(), run_requests()
    delegation = run_delegation()
    start, close, stale = behind["start"], behind["close-all"], behind["stale-holding"]
    report = reports_of(close[3])[0]
    (delegate,) = [e for e in delegation["delegate"][3] if isinstance(e, Send)]
    assert isinstance(delegate.message, Delegate)
    drep = delegate.message.report
    request = requests["request-from-higher"]
    (reply,) = request[3]
    assert isinstance(reply, Send)
    in_round = start[2]
    opened = in_round.context.round
    assert opened is not None
    round_closed = next(e for e in close[3] if isinstance(e, RoundClosed))
    return [
        # OBS-1: a message although the trainer is not idle long enough.
        ("OBS-1", "send while progressing", with_effects(behind["quiet-tick"], (Send((1,), Request(RoundId(0, 5))),))),
        ("OBS-1", "send with no progress record", (
            attrs.evolve(behind["quiet-tick"][0], context=attrs.evolve(behind["quiet-tick"][0].context, progress=None)),
            Tick(101.0), behind["quiet-tick"][2], (Send((1,), Request(RoundId(0, 5))),),
        )),
        # OBS-2: verdicts outside a round, before the threshold, before every answer or the deadline.
        ("OBS-2", "round closed from WATCHING", (behind["quiet-tick"][0], Tick(101.0), behind["quiet-tick"][2], (round_closed,))),
        ("OBS-2", "report from WATCHING", (behind["quiet-tick"][0], Tick(101.0), behind["quiet-tick"][2], (EmitReport(report),))),
        ("OBS-2", "round closed from HOLDING with a round left open", (
            attrs.evolve(in_round, control=ObserverState.HOLDING), Tick(103.5), in_round, (round_closed,),
        )),
        ("OBS-2", "closed while the trainer just moved", (
            attrs.evolve(close[0], context=attrs.evolve(close[0].context, last_progress_s=102.2)), *close[1:],
        )),
        ("OBS-2", "closed early with a peer missing", with_effects(behind["reply-3"], (round_closed,))),
        ("OBS-2", "closed early by a repeated reply", (
            behind["reply-3"][2], Answer(102.15, RoundId(0, 1), 1, in_f()), behind["close-all"][2], (round_closed,),
        )),
        # OBS-3: a round open past (or at) its deadline.
        ("OBS-3", "open past its deadline", with_context(start, now_s=opened.deadline_s + 0.5)),
        ("OBS-3", "open at its deadline", with_context(start, now_s=opened.deadline_s)),
        ("OBS-3", "a round left in WATCHING", with_state(start, control=ObserverState.WATCHING)),
        # OBS-4: no timer at the deadline.
        ("OBS-4", "no wake-up at the deadline", with_effects(start, tuple(e for e in start[3] if not isinstance(e, WakeAt)))),
        # OBS-5: the reply missing, doubled, misaddressed, for another round, or the state changed.
        ("OBS-5", "an extra effect", with_effects(request, (reply, Noted("x")))),
        ("OBS-5", "two replies", with_effects(request, (reply, reply))),
        ("OBS-5", "reply to the wrong peer", with_effects(request, (attrs.evolve(reply, to=(1,)),))),
        ("OBS-5", "reply for another round", with_effects(
            request, (attrs.evolve(reply, message=attrs.evolve(reply.message, round=RoundId(3, 2))),)
        )),
        ("OBS-5", "state changed", with_state(request, control=ObserverState.ROUND)),
        # OBS-6: two reports in a step; a report of a position already reported; one not remembered.
        ("OBS-6", "two reports", with_effects(close, (*close[3], EmitReport(attrs.evolve(report, key=(1, 9)))))),
        ("OBS-6", "already reported", (
            attrs.evolve(close[0], context=attrs.evolve(close[0].context, reported=(report.key,))), *close[1:],
        )),
        ("OBS-6", "not remembered", with_context(close, reported=())),
        # OBS-7: the emitter is not itself, or attributed or missing; a delegation misaddressed,
        # or to an attributed or missing observer.
        ("OBS-7", "emitted under another reporter", with_effects(close, (EmitReport(attrs.evolve(report, reporter=1)),))),
        ("OBS-7", "emitter attributed", with_effects(close, (EmitReport(attrs.evolve(report, attributed=(0,))),))),
        ("OBS-7", "emitter missing", with_effects(close, (EmitReport(attrs.evolve(report, missing=(0,))),))),
        ("OBS-7", "delegated to someone else", with_effects(
            delegation["delegate"], (attrs.evolve(delegate, to=(2,)),)
        )),
        ("OBS-7", "delegated to an attributed reporter", with_effects(
            delegation["delegate"], (Send((0,), attrs.evolve(delegate.message, report=attrs.evolve(drep, reporter=0))),)
        )),
        ("OBS-7", "delegated to a missing reporter", with_effects(
            delegation["delegate"], (attrs.evolve(delegate, message=attrs.evolve(
                delegate.message, report=attrs.evolve(drep, missing=(1,)))),)
        )),
        # OBS-8: exit that does not stop, or stops noisily; a stopped observer that acts.
        ("OBS-8", "exit ignored", with_effects(with_state(stops["exit-clean"], control=ObserverState.ROUND),
                                               (Stopped("trainer exited cleanly"),))),
        ("OBS-8", "exit with two effects", with_effects(stops["exit-clean"], (Stopped("x"), Noted("y")))),
        ("OBS-8", "exit with another effect", with_effects(stops["exit-clean"], (Noted("y"),))),
        ("OBS-8", "stopped observer emits", with_effects(stops["after-stop"], (Noted("y"),))),
        ("OBS-8", "stopped observer changes", with_context(stops["after-stop"], now_s=999.0)),
        # OBS-9: a stale reply that changes state or effects.
        ("OBS-9", "stale reply changes the context (ROUND)", with_context(behind["stale-round"], rounds_started=9)),
        ("OBS-9", "stale reply changes the context (HOLDING)", with_context(stale, rounds_started=9)),
        ("OBS-9", "stale reply changes the state (HOLDING)", with_state(stale, control=ObserverState.WATCHING)),
        ("OBS-9", "stale reply with another effect", with_effects(stale, (Noted("stale_reply_ignored"), WakeAt(1.0)))),
        ("OBS-9", "stale reply not counted", with_effects(stale, ())),
        ("OBS-9", "stale reply changes the context (WATCHING)", with_context(requests["stale-watching"], rounds_started=9)),
        # OBS-10: too many remembered positions; more replies than peers.
        ("OBS-10", "too many remembered", with_context(close, reported=((1, 1), (1, 2)) * 33)),
        ("OBS-10", "more replies than peers", with_context(start, round=attrs.evolve(opened, answered=frozenset(range(5))))),
    ]


@pytest.mark.parametrize(("clause", "what", "planted_step"), planted(), ids=lambda v: v if isinstance(v, str) else "")
def test_OBS_1_to_10_each_clause_refuses_its_planted_violation(clause: str, what: str, planted_step: Step) -> None:
    assert not holds(clause, planted_step), f"{clause} accepted: {what}"


def test_OBS_10_the_bounds_are_inclusive() -> None:
    start = run_behind()["start"]
    opened = start[2].context.round
    assert opened is not None
    full = with_context(start, round=attrs.evolve(opened, answered=frozenset(range(4))))
    assert holds("OBS-10", full)
    one = watching(reported_keys_max=1)
    assert holds("OBS-10", (one, Tick(100.0), attrs.evolve(one, context=attrs.evolve(one.context, reported=((1, 3),))), ()))


def test_OBS_20_21_planted_round_closings_that_are_neither_witness() -> None:
    close = run_behind()["close-all"]
    closed = next(e for e in close[3] if isinstance(e, RoundClosed))
    early_partial = attrs.evolve(closed, answered=(0, 1), by_deadline=False)
    late_full = attrs.evolve(closed, answered=(0, 1, 2, 3), by_deadline=True)
    assert not holds("OBS-20", with_effects(close, (early_partial,)))
    assert not holds("OBS-20", with_effects(close, (late_full,)))
    assert not holds("OBS-21", with_effects(close, (early_partial,)))
    assert not holds("OBS-21", with_effects(close, (late_full,)))


# --------------------------------------------------------------------------------------------
# The configuration's validators, built afresh (ObserverConfig's are built at import)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1.0, 0.0, math.nan, math.inf, -math.inf, True, "1", None])
def test_OBS_positive_finite_refuses_and_names_the_value(value: object) -> None:
    check = _positive_finite("round_deadline_s")
    with pytest.raises(ValueError, match="^" + re.escape(
        f"ObserverConfig.round_deadline_s must be a finite number of seconds > 0, got {value!r}") + "$"):
        check(None, None, value)


@pytest.mark.parametrize("value", [1e-9, 0.5, 1, 2.0, 1e300])
def test_OBS_positive_finite_accepts_positive_numbers(value: object) -> None:
    _positive_finite("round_deadline_s")(None, None, value)


@pytest.mark.parametrize(("minimum", "value"), [(2, 1), (2, -5), (0, -1), (1, True), (0, False), (1, 2.0), (1, "3"), (1, None)])
def test_OBS_count_refuses_and_names_the_value(minimum: int, value: object) -> None:
    check = _count("group_size", minimum)
    with pytest.raises(ValueError, match="^" + re.escape(
        f"ObserverConfig.group_size must be an int >= {minimum}, got {value!r}") + "$"):
        check(None, None, value)


@pytest.mark.parametrize(("minimum", "value"), [(2, 2), (2, 3), (0, 0), (1, 10**20)])
def test_OBS_count_accepts_ints_at_or_above_the_minimum(minimum: int, value: int) -> None:
    _count("group_size", minimum)(None, None, value)


# --------------------------------------------------------------------------------------------
# Second pass (survivors of the full run): reasons, the report's every field, timers, clocks
# --------------------------------------------------------------------------------------------

REASONS = [
    ([in_f(), in_f(), before(), in_f()], "progress differs from the strict majority"),
    ([in_f(), in_f(fp=G), in_f(), in_f()], "collective fingerprint differs from the strict majority"),
    ([in_f()] * 4, "every rank is stuck at the same point in the same collective"),
    ([None, in_f(), in_f(), in_f()], "the answering majority is stuck at one point; the missing peers did not answer"),
    ([None, in_f(), before(), in_f()], "missing-evidence"),
    ([in_f(), in_f(), before(), before()], "no-majority"),
    ([None, None, None, None], "no-evidence"),
    ([in_f(), in_f(), in_f(fp=G), in_f(fp=G)], "same progress, collective fingerprints without a strict majority"),
    ([in_f(), in_f(), before(idle_s=0.2), in_f()], "positions [2] still progressing or within their stage's threshold"),
]


@pytest.mark.parametrize(("evidence", "reason"), REASONS)
def test_OBS_every_assessment_states_its_reason(evidence: list[Evidence | None], reason: str) -> None:
    assert assess(evidence, config(n=len(evidence))).reason == reason


def test_OBS_assess_needs_one_entry_per_position() -> None:
    with pytest.raises(ValueError, match=re.escape("assess needs one entry per position (4), got 3")):
        assess([in_f()] * 3, config())


def test_OBS_2_a_round_closed_by_the_last_answer_pins_every_effect_and_field() -> None:
    _, _, after, effects = run_behind()["close-all"]
    idle = 102.2 - 100.0  # the trainer attached at 100.0; its own evidence is refreshed at close
    evidence = (in_f(idle), in_f(2.1), before(2.2), in_f(2.1))
    assessment = assess(evidence, config())
    report = StallReport(StallKind.HANG, Finding.BEHIND, Scope.RANK, (1, 3), RoundId(0, 1), 0, 0, (2,), (), (),
                         evidence, idle, "progress differs from the strict majority")
    assert effects == (
        RoundClosed(RoundId(0, 1), assessment, (0, 1, 2, 3), False), EmitReport(report), WakeAt(102.2 + 2.0),
    )
    assert after.context.next_round_at_s == 102.2 + 2.0 and after.context.round is None


def test_OBS_7_a_delegation_carries_the_round_the_decider_and_the_whole_report() -> None:
    _, _, _, effects = run_delegation()["delegate"]
    idle = 102.2 - 100.0
    evidence = (Evidence(1, 2, 0, Stage.COMPUTE, idle), in_f(), in_f(), in_f())
    report = StallReport(StallKind.HANG, Finding.BEHIND, Scope.RANK, (1, 3), RoundId(0, 1), 0, 1, (0,), (), (),
                         evidence, idle, "progress differs from the strict majority")
    sends = [e for e in effects if isinstance(e, Send)]
    assert sends == [Send((1,), Delegate(RoundId(0, 1), 0, report))]


def test_OBS_7_an_attributed_rank_ahead_of_the_majority_is_named_in_the_report() -> None:
    _, _, _, effects = closing({1: in_f(), 2: Evidence(1, 5, F, Stage.COLLECTIVE, 3.0), 3: in_f()})
    (report,) = reports_of(effects)
    assert (report.attributed, report.ahead) == ((2,), (2,))


def test_OBS_start_opens_the_round_with_its_own_evidence_and_time() -> None:
    _, _, after, effects = run_behind()["start"]
    own = Evidence(1, 3, F, Stage.COLLECTIVE, 2.0)
    assert after.context.round == OpenRound(RoundId(0, 1), 102.0, 103.0, frozenset({0}), (own, None, None, None))
    assert (after.context.now_s, after.context.rounds_started) == (102.0, 1)


def test_OBS_25_the_confirmation_streak_counts_rounds_one_by_one() -> None:
    steps = run_unresponsive()
    first = steps["first-deadline"][2].context.streak
    second = steps["confirmed"][2].context.streak
    assert first is not None and second is not None and (first[1], second[1]) == (1, 2)


def test_OBS_joined_and_attached_wake_at_the_attach_deadline_and_the_stall_threshold() -> None:
    state = OBSERVER.initial_state(initial_context(config(), 100.0))
    state, effects = OBSERVER.step(state, Joined(100.5))
    assert effects == (WakeAt(100.0 + 120.0),)
    state, effects = OBSERVER.step(state, Attached(101.0, Progress(1, 3, F, Stage.COLLECTIVE)))
    assert effects == (WakeAt(101.0 + 2.0),)


def test_OBS_the_clock_never_runs_back() -> None:
    state = step(watching(), Tick(102.0))[2]
    after, effects = OBSERVER.step(state, ProgressSeen(99.0, Progress(1, 4)))
    assert (after.context.now_s, after.context.last_progress_s) == (102.0, 102.0)
    assert effects == (Noted("round_aborted_by_progress"), WakeAt(104.0))


def test_OBS_9_a_reply_from_outside_the_group_is_stale() -> None:
    state = step(watching(), Tick(102.0))[2]
    for sender in (4, -1):
        after, effects = OBSERVER.step(state, Answer(102.1, RoundId(0, 1), sender, in_f()))
        assert after.control is ObserverState.ROUND and effects == (Noted("stale_reply_ignored"),)


def test_OBS_30_a_deferral_ends_exactly_at_its_time_in_watching_and_in_holding() -> None:
    watching2 = step(watching(position=2), RoundRequest(100.5, RoundId(0, 7)))[2]
    assert watching2.context.deferred_until_s == 103.5
    assert OBSERVER.step(watching2, Tick(103.4))[0].control is ObserverState.WATCHING
    assert OBSERVER.step(watching2, Tick(103.5))[0].control is ObserverState.ROUND
    # Observer 1 closes its own round, then defers to observer 0: the recheck waits for both.
    s = step(watching(position=1), Tick(102.0))
    for sender in (0, 2, 3):
        s = step(s[2], Answer(102.2, RoundId(1, 1), sender, in_f()))
    holding = step(s[2], RoundRequest(102.5, RoundId(0, 1)))[2]
    assert holding.control is ObserverState.HOLDING
    assert (holding.context.next_round_at_s, holding.context.deferred_until_s) == (104.2, 105.5)
    assert OBSERVER.step(holding, Tick(105.4))[0].control is ObserverState.HOLDING
    assert OBSERVER.step(holding, Tick(105.5))[0].control is ObserverState.ROUND


def test_OBS_initial_time_must_be_finite() -> None:
    with pytest.raises(ValueError, match="^" + re.escape("now_s must be a finite monotonic time, got nan") + "$"):
        initial_context(config(), math.nan)


def test_OBS_config_bounds_that_are_equal_are_allowed_and_position_errors_say_the_range() -> None:
    assert ObserverConfig(0, 2, stall_threshold_s=2.0, settle_idle_s=2.0).settle_idle_s == 2.0
    assert ObserverConfig(0, 2, round_deadline_s=2.0, recheck_interval_s=2.0).recheck_interval_s == 2.0
    with pytest.raises(ValueError, match="^" + re.escape(
        "ObserverConfig.position 2 is outside the group of 2; positions run from 0 to group_size - 1") + "$"):
        ObserverConfig(2, 2)


def test_OBS_thresholds_and_settle_floors_by_stage() -> None:
    c = config()
    floors = {stage: c.settle_floor(stage) for stage in Stage}
    assert floors == {Stage.IDLE: 1.0, Stage.COMPUTE: 1.0, Stage.COLLECTIVE: 1.0, Stage.DATA_LOADING: 5.0,
                      Stage.CHECKPOINT_READ: 8.0, Stage.CHECKPOINT_WRITE: 8.0}
    context = initial_context(c, 0.0)
    assert context.own_threshold_s() == 2.0  # no record yet: the compute threshold
    for stage, threshold in ((Stage.DATA_LOADING, 5.0), (Stage.CHECKPOINT_WRITE, 8.0), (Stage.COLLECTIVE, 2.0)):
        assert attrs.evolve(context, progress=Progress(1, 1, 0, stage)).own_threshold_s() == threshold
