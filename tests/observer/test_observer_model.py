"""Model checking of the observer lifecycle (spec/observer.toml) with the explorer, over the
real step function: one observer in an adversarial world, and groups of 3, 4 and 5 observers
over a network that loses or delays messages. CI runs bounded versions (well under a minute in
all); ``-m slow`` runs every mix of 4 and 5 observers and larger worlds."""

from __future__ import annotations

import functools
import itertools
import random
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout.core.machine import ExplorationResult, conformance_problems, explore
from scout.core.observer import Finding
from tests import processes
from tests.observer import REPO
from tests.observer import model as m
from tests.observer.model import OBSERVER, Behaviour, Budget, LoneObserver, ObserverGroup

pytestmark = pytest.mark.spawns

B = Behaviour
GROUP_HORIZON_S = 6  # two rounds and a confirmation at the model's thresholds
DEPTH_MAX = 500
STATES_MAX = 2_000_000

ANSWERS_AND_VERDICTS = ("OBS-20", "OBS-21", "OBS-22", "OBS-23", "OBS-24", "OBS-25", "OBS-26", "OBS-28")
INTERFERENCE = ("OBS-27", "OBS-29", "OBS-30")
COMPLETION = ("OBS-22", "OBS-23", "OBS-24", "OBS-31")


def test_OBS_table_conforms_and_its_document_is_current(tmp_path: Path) -> None:
    assert conformance_problems(OBSERVER) == []
    assert {p.id for p in OBSERVER.properties if p.kind == "sometimes"} == {*ANSWERS_AND_VERDICTS, *INTERFERENCE,
                                                                            *COMPLETION}
    # Only this machine's document: copy it aside so other machines' documents do not matter here.
    for name in ("observer.toml", "observer.md"):
        shutil.copy(REPO / "spec" / name, tmp_path / name)
    result = processes.run(
        [sys.executable, "-m", "scout.cli", "spec", "--check", "--spec-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "observer.md: current" in result.stdout


def run_lone(world: LoneObserver, depth_max: int = 80) -> ExplorationResult[m.LoneState, object]:
    return explore(world, [world.initial()], world.enabled, depth_max=depth_max, states_max=STATES_MAX,
                   require_exhaustive=True)


LONE_ANSWERS = dict(horizon_s=8, budget=Budget(progress=1), sometimes=ANSWERS_AND_VERDICTS)
LONE_INTERFERENCE = dict(
    horizon_s=5, menu=(m.SAME, None), budget=Budget(progress=1, requests=2, decisions=1, stale=1), sometimes=INTERFERENCE
)


LONE_COMPLETION = dict(horizon_s=6, menu=m.DEVICE_EVIDENCE, budget=Budget(progress=1), sometimes=COMPLETION)


@functools.cache
def lone_result(world: str) -> ExplorationResult[m.LoneState, object]:
    kwargs = {"answers": LONE_ANSWERS, "interference": LONE_INTERFERENCE, "completion": LONE_COMPLETION}[world]
    return run_lone(LoneObserver(1, 3, **kwargs))  # type: ignore[arg-type]


def test_OBS_1_to_10_hold_for_one_observer_whatever_its_peers_answer() -> None:
    """Peers answer with any evidence (same collective, behind, another collective, still
    moving, no record) or never; the trainer may move once, exit, or the driver stop it."""
    result = lone_result("answers")
    assert set(result.witnesses) == set(ANSWERS_AND_VERDICTS)
    assert result.states_count > 5_000


def test_OBS_1_to_10_hold_while_peers_ask_delegate_and_answer_late() -> None:
    result = lone_result("interference")
    assert set(result.witnesses) == set(INTERFERENCE)


def test_OBS_31_and_COMPLETION_1_to_5_hold_for_one_observer_whose_peers_answer_with_completion() -> None:
    """Peers answer with completion evidence (waiting in b, past b, b never started, b never
    enqueued while the host waits at the sync point, b with another fingerprint) or never: every
    invariant holds, and ranks are named behind (not enqueued, not started), desync and group
    stall by completion."""
    result = lone_result("completion")
    assert set(result.witnesses) == set(COMPLETION)


def test_OBS_every_row_of_the_table_fires_in_the_explored_worlds() -> None:
    unfired = set(lone_result("answers").labels_unfired) & set(lone_result("interference").labels_unfired)
    assert unfired == set()


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("position", "size"), [(0, 3), (2, 3), (1, 4), (3, 4)])
def test_OBS_1_to_10_hold_for_every_position_slow(position: int, size: int) -> None:
    menu = m.EVERY_EVIDENCE if size == 3 else (m.SAME, m.BEHIND, None)
    world = LoneObserver(position, size, horizon_s=8 if size == 3 else 6, menu=menu,
                         budget=Budget(progress=1, requests=1, decisions=1, stale=1))
    run_lone(world)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_OBS_1_to_10_hold_in_the_large_interference_world_slow() -> None:
    run_lone(LoneObserver(1, 3, horizon_s=8, menu=(m.SAME, None),
                          budget=Budget(progress=1, requests=2, decisions=1, stale=1), sometimes=INTERFERENCE))


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


def run_group(mix: tuple[Behaviour, ...], faults_max: int = 1) -> ExplorationResult[m.GroupState, object]:
    group = ObserverGroup(mix, horizon_s=GROUP_HORIZON_S, faults_max=faults_max)
    return explore(group, [group.initial()], group.enabled, depth_max=DEPTH_MAX, states_max=STATES_MAX,
                   require_exhaustive=True)


def check_mixes(mixes: list[tuple[Behaviour, ...]]) -> dict[tuple[Behaviour, ...], int]:
    states = {}
    for mix in mixes:
        states[mix] = run_group(mix).states_count
    return states


def test_OBS_40_to_45_every_mix_of_3_observers_with_a_lost_or_delayed_message() -> None:
    states = check_mixes(list(m.every_mix(3)))
    assert len(states) == 6**3


NAMED_MIXES = [
    (B.IN_F, B.IN_F, B.BEFORE_K, B.IN_F),  # rank 2 sleeps before the all-reduce
    (B.IN_F, B.IN_F_PRIME, B.IN_F, B.IN_F),  # rank 1 calls it with another shape
    (B.IN_F, B.IN_F, B.IN_F, B.FROZEN),  # rank 3 stopped with SIGSTOP
    (B.IN_F, B.IN_F, B.IN_F, B.IN_F),  # everyone blocked in the same collective
    (B.PROGRESSING,) * 4,  # healthy
    (B.DEAD, B.IN_F, B.IN_F, B.IN_F),  # rank 0 killed: no fixed reporter
    (B.BEFORE_K, B.IN_F, B.IN_F, B.IN_F, B.IN_F),
    (B.IN_F, B.IN_F, B.IN_F_PRIME, B.IN_F_PRIME, B.IN_F),
    (B.DEAD, B.DEAD, B.IN_F, B.IN_F, B.IN_F),
    (B.IN_F, B.BEFORE_K, B.FROZEN, B.IN_F_PRIME, B.PROGRESSING),
]


def sampled_mixes(size: int, count: int, seed: int) -> list[tuple[Behaviour, ...]]:
    return random.Random(seed).sample(list(m.every_mix(size)), count)


def test_OBS_40_to_45_named_and_sampled_mixes_of_4_and_5_observers() -> None:
    states = check_mixes(NAMED_MIXES + sampled_mixes(4, 40, seed=4) + sampled_mixes(5, 15, seed=5))
    assert len(states) == len(NAMED_MIXES) + 55


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("size", [4, 5])
def test_OBS_40_to_45_every_mix_of_4_and_5_observers_slow(size: int) -> None:
    states = check_mixes(list(m.every_mix(size)))
    assert len(states) == 6**size


# Under NCCL semantics: every trainer publishes a completion coordinate (COMPLETION-1..8).
NAMED_DEVICE_MIXES = [
    (B.GPU_HANG, B.DEVICE_WAITING, B.DEVICE_WAITING, B.DEVICE_WAITING),  # rank 0's stream never reaches b
    (B.DEVICE_WAITING, B.DEVICE_WAITING, B.GPU_HANG, B.DEVICE_WAITING),  # a middle rank
    (B.DEVICE_WAITING, B.DEVICE_WAITING, B.DEVICE_WAITING, B.GPU_HANG),  # the last rank
    (B.DEVICE_WAITING, B.HOST_LATE, B.DEVICE_WAITING, B.DEVICE_WAITING),  # host asleep before enqueue
    (B.DEVICE_WAITING, B.DEVICE_WAITING, B.THREAD_LATE, B.DEVICE_WAITING),  # backward thread never issues b
    (B.DEVICE_WAITING, B.DEVICE_OTHER, B.DEVICE_WAITING, B.DEVICE_WAITING),  # mismatched pending fingerprints
    (B.DEVICE_WAITING,) * 4,  # stuck collective everyone started: group stall
    (B.DEVICE_PROGRESSING,) * 4,  # healthy
    (B.DEVICE_PAST, B.DEVICE_WAITING, B.HOST_LATE, B.DEVICE_PAST),  # DDP's buffer broadcast, one rank asleep
    (B.DEVICE_PAST, B.DEVICE_WAITING, B.DEVICE_OTHER),  # a broadcast let rank 0 through; rank 2 differs
    (B.DEAD, B.DEVICE_WAITING, B.DEVICE_WAITING, B.GPU_HANG, B.DEVICE_WAITING),
    (B.HOST_LATE, B.HOST_LATE, B.DEVICE_WAITING),  # the majority never enqueued b: rank 2 is not named
    (B.DEVICE_WAITING, B.DEVICE_FROZEN, B.DEVICE_WAITING, B.DEVICE_WAITING),  # PROGRESS-10: host rules
]
#: Hosts running ahead of their devices (COMPLETION-9..12).
NAMED_RUN_AHEAD_MIXES = [
    (B.DRAINED_WAITING, B.GPU_HANG, B.DEVICE_WAITING),  # the run-ahead hang, its group tracked
    (B.UNTRACKED_DRAINED, B.UNTRACKED_STALLED, B.UNTRACKED_AHEAD),  # the same, untracked: nobody named
    (B.UNTRACKED_DRAINED, B.UNTRACKED_AHEAD, B.UNTRACKED_AHEAD),  # a healthy drain is never a hang
    (B.DEVICE_WAITING, B.SUB_WAITING, B.DEVICE_WAITING, B.DEVICE_WAITING),  # waits in a sub-group: not named
    (B.DEVICE_WAITING, B.SUB_WAITING, B.SUB_HANG, B.DEVICE_WAITING),  # the sub-group has 2 voters
    (B.DRAINED_WAITING, B.DRAINED_WAITING, B.GPU_HANG, B.DEVICE_WAITING),
]


def expected_device(mix: tuple[Behaviour, ...]) -> tuple[str, tuple[int, ...]] | None:
    found = ObserverGroup(mix, horizon_s=GROUP_HORIZON_S).expected_report()
    return None if found is None else (found[0].value, found[1])


def test_COMPLETION_3_to_7_the_named_device_mixes_are_judged_as_the_spec_says() -> None:
    """The findings the explorer then checks are delivered: COMPLETION-5 (GPU-side hang on rank 0,
    a middle rank, the last), COMPLETION-3 (host late; another thread late while the host waits
    at the sync point; DDP's buffer broadcast), COMPLETION-4 (mismatched pending fingerprints,
    also when a broadcast let a rank past b), COMPLETION-7 (everyone started b), COMPLETION-8
    (the rank that enqueued b while the majority did not is never named)."""
    found = [expected_device(mix) for mix in NAMED_DEVICE_MIXES]
    assert found == [
        ("behind", (0,)), ("behind", (2,)), ("behind", (3,)), ("behind", (1,)), ("behind", (2,)),
        ("desync", (1,)), ("group_stall", ()), None, ("behind", (2,)), ("desync", (2,)), ("behind", (3,)),
        ("inconclusive", ()), ("behind", (1,)),
    ]


def test_COMPLETION_9_to_12_the_named_run_ahead_mixes_are_judged_as_the_spec_says() -> None:
    """The run-ahead hang names the stalled rank where its group is tracked and nobody where it is
    not; a healthy drain names nobody; a rank waiting in a sub-group's collective is never named."""
    found = [expected_device(mix) for mix in NAMED_RUN_AHEAD_MIXES]
    assert found == [
        ("behind", (1,)), ("inconclusive", ()), ("inconclusive", ()), ("inconclusive", ()), ("inconclusive", ()),
        ("behind", (2,)),
    ]


def test_OBS_46_47_and_COMPLETION_9_to_12_named_and_sampled_run_ahead_mixes_with_a_lost_or_delayed_message() -> None:
    """OBS-40..47 over the named run-ahead mixes and a seeded sample of 3 and 4 observers (every
    mix of 3 runs under ``-m slow``): no healthy rank is named, through loss."""
    sample = (random.Random(5).sample(list(m.every_run_ahead_mix(3)), 16)
              + random.Random(6).sample(list(m.every_run_ahead_mix(4)), 4))
    states = check_mixes(NAMED_RUN_AHEAD_MIXES + sample)
    assert len(states) == len(NAMED_RUN_AHEAD_MIXES) + 20


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_OBS_46_47_every_run_ahead_mix_of_3_observers_slow() -> None:
    states = check_mixes(list(m.every_run_ahead_mix(3)))
    assert len(states) == len(m.RUN_AHEAD_BEHAVIOURS) ** 3


def test_OBS_46_47_and_COMPLETION_1_to_8_named_and_sampled_device_mixes_with_a_lost_or_delayed_message() -> None:
    """OBS-40..47 over the named device mixes and a seeded sample of 3 and 4 observers (every
    mix of 3 and 4 runs under ``-m slow``): reports match the trainers' truth through loss, and
    no healthy rank is ever named."""
    sample = (random.Random(3).sample(list(m.every_device_mix(3)), 24)
              + random.Random(4).sample(list(m.every_device_mix(4)), 6))
    states = check_mixes(NAMED_DEVICE_MIXES + sample)
    assert len(states) == len(NAMED_DEVICE_MIXES) + 30


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("size", [3, 4])
def test_OBS_46_47_every_device_mix_of_3_and_4_observers_slow(size: int) -> None:
    states = check_mixes(list(m.every_device_mix(size)))
    assert len(states) == len(m.DEVICE_BEHAVIOURS) ** size


def final_reports(mix: tuple[Behaviour, ...], *, order: random.Random | None = None) -> tuple[object, ...]:
    """Run one fault-free execution to the horizon, delivering each second's messages in FIFO
    order or, with ``order``, in a random order. Returns what the group reported."""
    group = ObserverGroup(mix, horizon_s=GROUP_HORIZON_S, faults_max=0)
    state = group.initial()
    while True:
        if state.network:
            if order is not None:
                shuffled = list(state.network)
                order.shuffle(shuffled)
                state = m.GroupState(state.observers, state.now, tuple(shuffled), state.delayed,
                                     state.faults_left, state.reports, state.faults_max)
            state = group.fire(state, m.Deliver()).state
        elif state.now < GROUP_HORIZON_S:
            state = group.fire(state, m.Second()).state
        else:
            return tuple(sorted((emitter, r.outcome.value, r.attributed, r.missing, r.key) for emitter, r in state.reports))


@pytest.mark.parametrize("mix", NAMED_MIXES)
def test_OBS_41_the_delivery_order_within_a_second_does_not_change_what_is_reported(
    mix: tuple[Behaviour, ...],
) -> None:
    """The group model delivers each second's messages in FIFO order (model.py); this checks
    that any other order gives the same reports, so FIFO loses no behaviour."""
    fifo = final_reports(mix)
    for seed in range(25):
        assert final_reports(mix, order=random.Random(seed)) == fifo


def test_OBS_44_reports_come_from_the_lowest_live_unattributed_observer_not_rank_0() -> None:
    cases = {
        (B.IN_F, B.IN_F, B.BEFORE_K, B.IN_F): (0, "behind", (2,)),
        (B.BEFORE_K, B.IN_F, B.IN_F, B.IN_F): (1, "behind", (0,)),  # rank 0 is the culprit
        (B.DEAD, B.IN_F, B.IN_F, B.IN_F): (1, "unresponsive", ()),  # rank 0 is gone
        (B.DEAD, B.DEAD, B.IN_F, B.IN_F, B.IN_F): (2, "unresponsive", ()),
        (B.IN_F, B.IN_F_PRIME, B.IN_F, B.IN_F): (0, "desync", (1,)),
        (B.IN_F, B.IN_F, B.IN_F, B.IN_F): (0, "group_stall", ()),
        (B.IN_F, B.IN_F, B.IN_F, B.FROZEN): (0, "behind", (3,)),
    }
    for mix, (emitter, outcome, attributed) in cases.items():
        reports = final_reports(mix)
        assert [(r[0], r[1], r[2]) for r in reports] == [(emitter, outcome, attributed)], mix


def test_OBS_1_a_healthy_group_sends_no_message_at_all() -> None:
    group = ObserverGroup((B.PROGRESSING,) * 4, horizon_s=GROUP_HORIZON_S, faults_max=0)
    state = group.initial()
    for _ in range(GROUP_HORIZON_S):
        state = group.fire(state, m.Second()).state
        assert state.network == () and state.reports == ()


def test_OBS_model_behaviours_cover_every_outcome() -> None:
    outcomes = {ObserverGroup(mix, horizon_s=GROUP_HORIZON_S).expected_report() is None for mix in m.every_mix(3)}
    assert outcomes == {True, False}
    found = {
        finding[0]
        for mix in itertools.product(m.ALL_BEHAVIOURS, repeat=3)
        if (finding := ObserverGroup(mix, horizon_s=GROUP_HORIZON_S).expected_report()) is not None
    }
    assert found == {Finding.BEHIND, Finding.DESYNC, Finding.GROUP_STALL, Finding.UNRESPONSIVE, Finding.INCONCLUSIVE}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mix=st.lists(st.sampled_from(m.ALL_BEHAVIOURS), min_size=3, max_size=6).map(tuple),
    choices=st.lists(st.integers(0, 10_000), min_size=50, max_size=400),
)
def test_OBS_1_to_45_hold_on_long_random_runs(mix: tuple[Behaviour, ...], choices: list[int]) -> None:
    """Beyond the explorer's horizon: 20 seconds (ten rounds and rechecks), 3 to 6 observers,
    one lost or delayed message anywhere. Every property is checked after every event."""
    long_random_run(mix, choices)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mix=st.lists(st.sampled_from(m.DEVICE_BEHAVIOURS), min_size=3, max_size=6).map(tuple),
    choices=st.lists(st.integers(0, 10_000), min_size=50, max_size=400),
)
def test_OBS_46_47_and_COMPLETION_1_to_8_hold_on_long_random_runs_under_nccl_semantics(
    mix: tuple[Behaviour, ...], choices: list[int]
) -> None:
    long_random_run(mix, choices)


def long_random_run(mix: tuple[Behaviour, ...], choices: list[int]) -> None:
    group = ObserverGroup(mix, horizon_s=20, faults_max=1)
    state_properties = [p for p in group.properties if p.scope == "state"]
    step_properties = [p for p in group.properties if p.scope == "step"]
    state = group.initial()
    moves = iter(choices)
    while True:
        events = group.enabled(state)
        if not events:
            break
        choice = next(moves, 0)
        # Mostly deliver (index 0); a fault now and then.
        event = events[0] if choice % 10 else events[choice % len(events)]
        firing = group.fire(state, event)
        for prop in step_properties:
            assert prop.predicate(state, event, firing.state, firing.effects), prop.describe()
        state = firing.state
        for prop in state_properties:
            assert prop.predicate(state), prop.describe()
    assert state.now == 20
