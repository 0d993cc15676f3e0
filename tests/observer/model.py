"""Environments in which the explorer runs the real observer machine (spec/observer.toml).

Two of them, both :class:`~scout.core.machine.Explorable`:

* :class:`LoneObserver` -- one observer and a world that may do anything a driver can deliver:
  peers ask, answer with any evidence (or not at all), answer late, delegate reports; the
  trainer progresses or not, exits; rendezvous and attach fail or succeed. Checks every
  invariant of the table, including every ``sometimes`` witness.
* :class:`ObserverGroup` -- 3 to 5 observers whose trainers follow fixed behaviours (progressing,
  stuck before collective k, stuck inside collective k with fingerprint F or F', frozen, dead),
  connected by a network that delivers in order, and may lose or delay up to a budget of
  messages. Checks the table's ``always`` invariants for every observer in every state, plus
  the group properties (OBS-40..): reports are correct, one per stuck position in the group,
  never from an attributed or dead observer. Under NCCL semantics (``DEVICE_BEHAVIOURS``) the
  trainers also publish completion coordinates (COMPLETION-1..8): waiting in the blocking
  collective b with the device started, past b, b enqueued but never started (a GPU-side hang),
  b never enqueued (by the host, or by another thread while the host waits at the sync point),
  b with another fingerprint; and OBS-46/47 check the reports against which trainers are really
  faulty, independently of the rule that made them.

Time is discrete: a Tick advances the clock by one second. Within one second the network
delivers in FIFO order; a delivery only touches its receiver, and everything a receiver does
depends on its own state and the (second-constant) trainer state, so the order of deliveries
within a second does not change what the group concludes -- FIFO is one representative order.
``test_observer_model.py`` checks that claim on random permutations.
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from scout.core.machine import Firing, Machine, MachineState, Property, load_machine
from scout.core.observer import (
    Answer,
    Attached,
    Completion,
    Decision,
    EmitReport,
    Evidence,
    Finding,
    HostContract,
    Joined,
    JoinFailed,
    ObserverConfig,
    ObserverContext,
    ObserverState,
    PendingState,
    Progress,
    ProgressSeen,
    RoundId,
    RoundRequest,
    Scope,
    Send,
    Stage,
    StallKind,
    StallReport,
    Stop,
    Tick,
    TrainerExit,
    assess,
    event_for,
    initial_context,
)
from tests.observer import SPEC_PATH

OBSERVER: Machine[ObserverContext] = load_machine(SPEC_PATH)

F = 0xF00D
F_PRIME = 0xBEEF
G = 0x600D  # the collective after b

# Small numbers so that a few seconds cover two rounds and a confirmation.
MODEL_CONFIG = dict(
    stall_threshold_s=2.0,
    data_stall_threshold_s=3.0,
    checkpoint_stall_threshold_s=3.0,
    round_deadline_s=1.0,
    recheck_interval_s=2.0,
    settle_idle_s=1.0,
    join_deadline_s=2.0,
    attach_deadline_s=3.0,
    confirm_rounds=2,
)


def model_config(position: int, group_size: int) -> ObserverConfig:
    return ObserverConfig(position, group_size, **MODEL_CONFIG)  # type: ignore[arg-type]


def lift(properties: Sequence[Property], *, include_sometimes: bool) -> list[Property]:
    """The machine's properties, applied to the machine part of an environment state."""
    lifted: list[Property] = []
    for prop in properties:
        if prop.kind == "sometimes" and not include_sometimes:
            continue
        predicate = prop.predicate
        if prop.scope == "state":
            def check(state: Any, predicate: Any = predicate) -> bool:
                return bool(predicate(state.machine))
        else:
            def check(previous: Any, event: Any, state: Any, effects: Any, predicate: Any = predicate) -> bool:
                return bool(predicate(previous.machine, event, state.machine, effects))
        lifted.append(Property(prop.id, prop.kind, prop.scope, prop.text, check))
    return lifted


# --------------------------------------------------------------------------------------------
# One observer, any world
# --------------------------------------------------------------------------------------------


@attrs.frozen
class LoneState:
    machine: MachineState[ObserverContext]
    now: float
    progress_left: int
    requests_left: int
    decisions_left: int
    stale_left: int


SAME = Evidence(1, 3, F, Stage.COLLECTIVE, 2.0)  # stuck in the same collective as the observer's trainer
BEHIND = Evidence(1, 2, 0, Stage.COMPUTE, 2.0)  # stuck before that collective
OTHER_COLLECTIVE = Evidence(1, 3, F_PRIME, Stage.COLLECTIVE, 2.0)  # same point, another collective
MOVING = Evidence(1, 9, 0, Stage.COMPUTE, 0.0)  # still progressing
EVERY_EVIDENCE: tuple[Evidence | None, ...] = (SAME, BEHIND, OTHER_COLLECTIVE, MOVING, None)


@attrs.frozen
class Budget:
    """How many of the world's rarer events one run may contain."""

    progress: int = 1
    requests: int = 0
    decisions: int = 0
    stale: int = 0


def _tracked(progress: Progress, idle_s: float = 2.0) -> Evidence:
    return Evidence(progress.step, progress.op, progress.fingerprint, progress.stage, idle_s, progress.completions,
                    idle_s, progress.contract, progress.completion_stale)


class LoneObserver:
    """One observer whose world can deliver anything a driver can, bounded by a budget: the
    trainer may progress, exit or freeze; peers answer rounds with any evidence from ``menu``
    (or never), ask for evidence, delegate reports (acceptable ones and ones that attribute
    this observer), and send stale replies. Integer seconds; ``round_deadline_s`` = 1.5 so that
    a round sees a tick before its deadline and one after."""

    def __init__(
        self,
        position: int,
        group_size: int,
        horizon_s: int,
        *,
        menu: Sequence[Evidence | None] = EVERY_EVIDENCE,
        budget: Budget = Budget(),
        sometimes: Iterable[str] = (),
    ) -> None:
        self.config = attrs.evolve(model_config(position, group_size), round_deadline_s=1.5)
        self.horizon_s = horizon_s
        self.menu = tuple(menu)
        # With completion evidence in the menu, the observer's own trainer tracks completion too.
        self.own = _STUCK_AT[Behaviour.DEVICE_WAITING] if any(
            e is not None and e.completion is not None for e in self.menu) else Progress(1, 3, F, Stage.COLLECTIVE)
        self.budget = budget
        wanted = set(sometimes)
        self.properties = [
            p for p in lift(OBSERVER.properties, include_sometimes=True) if p.kind == "always" or p.id in wanted
        ]
        self.labels = OBSERVER.labels
        peer = self.config.peers[0]
        acceptable = StallReport(
            StallKind.HANG, Finding.BEHIND, Scope.RANK, (1, 2), RoundId(peer, 1), peer, position,
            (peer,), (), (), (None,) * group_size, 2.0, "delegated in the model",
        )
        self.delegations = (acceptable, attrs.evolve(acceptable, key=(1, 3), attributed=(position,)))

    def initial(self) -> LoneState:
        b = self.budget
        return LoneState(
            OBSERVER.initial_state(initial_context(self.config, 0.0)), 0.0, b.progress, b.requests, b.decisions, b.stale
        )

    def fire(self, state: LoneState, event: Any) -> Firing[LoneState]:
        firing = OBSERVER.fire(state.machine, event)
        if state.machine.control in (ObserverState.STOPPED, ObserverState.FAILED):
            # The machine ignores everything here (OBS-8 checks it); the world's clock and
            # budgets no longer matter, so they stay put and the state space stays small.
            return Firing(attrs.evolve(state, machine=firing.state), firing.effects, firing.labels)
        nxt = attrs.evolve(
            state,
            machine=firing.state,
            now=event.now_s,
            progress_left=state.progress_left - isinstance(event, ProgressSeen),
            requests_left=state.requests_left - isinstance(event, RoundRequest),
            decisions_left=state.decisions_left - isinstance(event, Decision),
            stale_left=state.stale_left - (isinstance(event, Answer) and event.round.number == 0),
        )
        return Firing(nxt, firing.effects, firing.labels)

    def enabled(self, state: LoneState) -> list[Any]:
        control = state.machine.control
        now = state.now
        peer = self.config.peers[0]
        events: list[Any] = []
        if now < self.horizon_s:
            events.append(Tick(now + 1))
        if control in ("STOPPED", "FAILED"):
            # Whatever still arrives is ignored; offer one of each.
            return events + [
                ProgressSeen(now, Progress(1, 4)), RoundRequest(now, RoundId(peer, 1)),
                Answer(now, RoundId(peer, 1), peer, None),
                Decision(now, self.delegations[0].round, peer, self.delegations[0]),
                TrainerExit(now, clean=True), Stop(now),
            ]
        events += [TrainerExit(now, clean=False), Stop(now)]
        if control == "JOINING":
            return events + [Joined(now), JoinFailed(now, "peer 2 unreachable")]
        if control == "ATTACHING":
            events.append(Attached(now, self.own))
        if control in ("WATCHING", "ROUND", "HOLDING") and state.progress_left:
            events.append(ProgressSeen(now, Progress(1, 4, 0, Stage.COMPUTE)))
        if state.requests_left:
            events += [RoundRequest(now, RoundId(p, 1)) for p in self.config.peers]
        if state.decisions_left:
            events += [Decision(now, report.round, report.decided_by, report) for report in self.delegations]
        if state.stale_left:
            events.append(Answer(now, RoundId(self.config.position, 0), peer, None))
        opened = state.machine.context.round
        if control == "ROUND" and opened is not None:
            for p in self.config.peers:
                if p not in opened.answered:
                    events += [Answer(now, opened.round, p, evidence) for evidence in self.menu]
        return events


#: Peers' answers under NCCL semantics: waiting in b with the device started, past b, b only
#: enqueued (GPU-side hang), b never enqueued, b with another fingerprint, no answer.
DEVICE_EVIDENCE: tuple[Evidence | None, ...] = None  # type: ignore[assignment]  # set below, after _STUCK_AT


# --------------------------------------------------------------------------------------------
# A group of observers over a lossy network
# --------------------------------------------------------------------------------------------


class Behaviour(enum.Enum):
    """What a trainer does, from its observer's point of view."""

    PROGRESSING = "progressing"  # a new coordinate every second
    BEFORE_K = "stuck before collective k"
    IN_F = "stuck inside collective k, fingerprint F"
    IN_F_PRIME = "stuck inside collective k, fingerprint F'"
    FROZEN = "frozen (SIGSTOP) mid-step"
    DEAD = "dead at t=1"
    # Under NCCL semantics, with completion tracking (COMPLETION-1..8). The blocking collective
    # b is number 5 of the tracked group; the host's sync point is op 3 of step 1.
    DEVICE_PROGRESSING = "progressing, collectives completing"
    DEVICE_WAITING = "host at the sync point; b enqueued and started, waiting for a peer"
    DEVICE_PAST = "completed b (a broadcast let it through), waiting in b + 1"
    GPU_HANG = "host at the sync point; b enqueued, its stream never reaches it"
    HOST_LATE = "host asleep before enqueueing b"
    THREAD_LATE = "host at the sync point; the thread that issues b never does"
    DEVICE_OTHER = "host at the sync point; b enqueued and started with fingerprint F'"
    DEVICE_FROZEN = "stopped (SIGSTOP) before b: its watcher stopped too, its completion reads absent"
    # Hosts that run ahead of their devices (COMPLETION-9..12): where a host stands is no
    # evidence of where its device stands.
    DRAINED_WAITING = "host drained for logging (behind the others); b enqueued and started, waiting"
    UNTRACKED_AHEAD = "host ran ahead; its group publishes no completion evidence"
    UNTRACKED_DRAINED = "host drained for logging, behind; no completion evidence"
    UNTRACKED_STALLED = "host ran ahead; its stream stalled before b; no completion evidence"
    SUB_WAITING = "host at a sync point before b; its device waits in a started collective of a sub-group"
    SUB_HANG = "host at a sync point before b; its stream stalled before a sub-group's collective"


SOURCE = 0x5C0
SUB_SOURCE = 0x5B0
_B = 5


def _completion(enqueued: int, completed: int, fp: int = 0, state: PendingState = PendingState.NONE,
                done_fp: int = 0) -> Completion:
    return Completion(SOURCE, enqueued, completed, fp, state, done_fp)


def _device(step: int, op: int, *completions: Completion, stale: bool = False) -> Progress:
    """A trainer under NCCL's contract (PROGRESS-13): its host runs ahead of its device."""
    return Progress(step, op, 0, Stage.COMPUTE, completions, contract=HostContract.ENQUEUE, completion_stale=stale)


# Where each stuck behaviour stops. Collective k is op 3 of step 1; "before" is op 2.
_STUCK_AT = {
    Behaviour.BEFORE_K: Progress(1, 2, 0, Stage.COMPUTE),
    Behaviour.IN_F: Progress(1, 3, F, Stage.COLLECTIVE),
    Behaviour.IN_F_PRIME: Progress(1, 3, F_PRIME, Stage.COLLECTIVE),
    Behaviour.FROZEN: Progress(1, 1, 0, Stage.COMPUTE),
    Behaviour.DEAD: Progress(1, 1, 0, Stage.COMPUTE),
    Behaviour.DEVICE_WAITING: _device(1, 3, _completion(_B, _B - 1, F, PendingState.STARTED)),
    Behaviour.DEVICE_PAST: _device(1, 4, _completion(_B + 1, _B, G, PendingState.STARTED, F)),
    Behaviour.GPU_HANG: _device(1, 3, _completion(_B, _B - 1, F, PendingState.ENQUEUED)),
    Behaviour.HOST_LATE: _device(1, 2, _completion(_B - 1, _B - 1)),
    Behaviour.THREAD_LATE: _device(1, 3, _completion(_B - 1, _B - 1)),
    Behaviour.DEVICE_OTHER: _device(1, 3, _completion(_B, _B - 1, F_PRIME, PendingState.STARTED)),
    Behaviour.DEVICE_FROZEN: _device(1, 2, stale=True),  # PROGRESS-10: a stale section reads absent
    Behaviour.DRAINED_WAITING: _device(1, 2, _completion(_B, _B - 1, F, PendingState.STARTED)),
    Behaviour.UNTRACKED_AHEAD: _device(1, 5),
    Behaviour.UNTRACKED_DRAINED: _device(1, 2),
    Behaviour.UNTRACKED_STALLED: _device(1, 5),
    Behaviour.SUB_WAITING: _device(1, 2, _completion(_B - 1, _B - 1), Completion(SUB_SOURCE, 3, 2, G, PendingState.STARTED)),
    Behaviour.SUB_HANG: _device(1, 2, _completion(_B - 1, _B - 1), Completion(SUB_SOURCE, 3, 2, G, PendingState.ENQUEUED)),
}
DEATH_S = 1
DEVICE_EVIDENCE = (
    _tracked(_STUCK_AT[Behaviour.DEVICE_WAITING]), _tracked(_STUCK_AT[Behaviour.DEVICE_PAST]),
    _tracked(_STUCK_AT[Behaviour.GPU_HANG]), _tracked(_STUCK_AT[Behaviour.THREAD_LATE]),
    _tracked(_STUCK_AT[Behaviour.DEVICE_OTHER]), None,
)

#: Trainers that do nothing wrong: they progress, or they wait for a peer. OBS-46 and OBS-47
#: judge reports against this, not against the assessment rule.
HEALTHY = frozenset({Behaviour.PROGRESSING, Behaviour.IN_F, Behaviour.DEVICE_PROGRESSING, Behaviour.DEVICE_WAITING,
                     Behaviour.DEVICE_PAST, Behaviour.DRAINED_WAITING, Behaviour.UNTRACKED_AHEAD,
                     Behaviour.UNTRACKED_DRAINED, Behaviour.SUB_WAITING})
#: Trainers whose presence leaves no sound rule able to name a culprit (COMPLETION-9..11): a rank
#: without completion evidence under the enqueue contract (its vote is missing, and host
#: coordinates are no evidence), or a stall in a sub-group too small to vote. OBS-47 does not ask
#: for a name in such a mix; OBS-46 still forbids a wrong one.
UNNAMEABLE = frozenset({Behaviour.UNTRACKED_STALLED, Behaviour.UNTRACKED_AHEAD, Behaviour.UNTRACKED_DRAINED,
                        Behaviour.SUB_WAITING, Behaviour.SUB_HANG})
_PROGRESSING = frozenset({Behaviour.PROGRESSING, Behaviour.DEVICE_PROGRESSING})


def trainer_progress(behaviour: Behaviour, now: int) -> Progress:
    if behaviour is Behaviour.PROGRESSING:
        return Progress(1, 10 + now, 0, Stage.COMPUTE)
    if behaviour is Behaviour.DEVICE_PROGRESSING:
        return _device(1, 10 + now, _completion(_B + now, _B + now - 1, F, PendingState.STARTED))
    if behaviour is Behaviour.DEAD:
        return _STUCK_AT[behaviour]
    return _STUCK_AT[behaviour]


@attrs.frozen(order=True)
class Packet:
    source: int
    destination: int
    message: Any = attrs.field(order=False)


@attrs.frozen
class GroupState:
    observers: tuple[MachineState[ObserverContext], ...]
    now: int
    network: tuple[Packet, ...]  # due now, FIFO
    delayed: tuple[Packet, ...]  # due at the next second
    faults_left: int  # messages the network may still lose or delay
    reports: tuple[tuple[int, StallReport], ...]  # (emitter, report), in emission order

    @property
    def faulty(self) -> bool:
        return self.faults_left < self.faults_max

    faults_max: int = 0


@attrs.frozen
class Deliver:
    """Deliver the head of the queue."""


@attrs.frozen
class Lose:
    index: int


@attrs.frozen
class Delay:
    index: int


@attrs.frozen
class Second:
    """One second passes: trainers publish or die, every observer ticks."""


class ObserverGroup:
    """``len(behaviours)`` observers, one per trainer, over a FIFO network that may lose or
    delay (by one second) up to ``faults_max`` messages. Events: Deliver, Lose(i), Delay(i),
    Second. Reports are only required to be correct with fewer faults than ``confirm_rounds``:
    k lost messages can make k consecutive rounds miss the same peer, which is exactly what a
    dead peer looks like."""

    def __init__(self, behaviours: Sequence[Behaviour], *, horizon_s: int, faults_max: int = 1) -> None:
        self.behaviours = tuple(behaviours)
        self.size = len(self.behaviours)
        self.horizon_s = horizon_s
        self.faults_max = faults_max
        self.configs = tuple(model_config(p, self.size) for p in range(self.size))
        self.labels = OBSERVER.labels
        self.properties = [*self._lifted_always(), *group_properties(self)]

    # -- the machines -----------------------------------------------------------------------

    def _lifted_always(self) -> list[Property]:
        lifted: list[Property] = []
        for prop in OBSERVER.properties:
            if prop.kind != "always":
                continue
            predicate = prop.predicate
            if prop.scope == "state":
                def check_state(state: GroupState, predicate: Any = predicate) -> bool:
                    return all(predicate(observer) for observer in state.observers)
                lifted.append(Property(prop.id, "always", "state", prop.text, check_state))
            else:
                def check_step(previous: GroupState, event: Any, state: GroupState, effects: Any,
                               predicate: Any = predicate) -> bool:
                    # effects: per-observer steps taken, ((position, machine event, effects), ...)
                    return all(
                        predicate(previous_machine, machine_event, next_machine, machine_effects)
                        for previous_machine, machine_event, next_machine, machine_effects in effects
                    )
                lifted.append(Property(prop.id, "always", "step", prop.text, check_step))
        return lifted

    def initial(self) -> GroupState:
        observers = []
        for position, config in enumerate(self.configs):
            state = OBSERVER.initial_state(initial_context(config, 0.0))
            state, _ = OBSERVER.step(state, Joined(0.0))
            state, _ = OBSERVER.step(state, Attached(0.0, trainer_progress(self.behaviours[position], 0)))
            observers.append(state)
        return GroupState(tuple(observers), 0, (), (), self.faults_max, (), self.faults_max)

    def enabled(self, state: GroupState) -> list[Any]:
        if state.network:
            events: list[Any] = [Deliver()]
            if state.faults_left:
                events += [Lose(i) for i in range(len(state.network))]
                events += [Delay(i) for i in range(len(state.network))]
            return events
        if state.now < self.horizon_s:
            return [Second()]
        return []

    def fire(self, state: GroupState, event: Any) -> Firing[GroupState]:
        observers = list(state.observers)
        network = list(state.network)
        delayed = list(state.delayed)
        reports = list(state.reports)
        steps: list[tuple[Any, Any, Any, tuple[object, ...]]] = []
        labels: list[str] = []

        def step(position: int, machine_event: Any) -> None:
            firing = OBSERVER.fire(observers[position], machine_event)
            steps.append((observers[position], machine_event, firing.state, firing.effects))
            labels.extend(firing.labels)
            observers[position] = firing.state
            for effect in firing.effects:
                if isinstance(effect, Send):
                    network.extend(Packet(position, to, effect.message) for to in effect.to)
                elif isinstance(effect, EmitReport):
                    reports.append((position, effect.report))

        now = state.now
        faults_left = state.faults_left
        if isinstance(event, Deliver):
            packet = network.pop(0)
            step(packet.destination, event_for(packet.message, float(now)))
        elif isinstance(event, Lose):
            network.pop(event.index)
            faults_left -= 1
        elif isinstance(event, Delay):
            delayed.append(network.pop(event.index))
            faults_left -= 1
        else:
            now += 1
            network, delayed = delayed, []
            for position, behaviour in enumerate(self.behaviours):
                if observers[position].control in (ObserverState.STOPPED, ObserverState.FAILED):
                    continue
                if behaviour is Behaviour.DEAD and now >= DEATH_S:
                    step(position, TrainerExit(float(now), clean=False))
                    continue
                if behaviour in _PROGRESSING:
                    step(position, ProgressSeen(float(now), trainer_progress(behaviour, now)))
                step(position, Tick(float(now)))
        nxt = GroupState(tuple(observers), now, tuple(network), tuple(delayed), faults_left, tuple(reports),
                         self.faults_max)
        return Firing(nxt, tuple(steps), tuple(labels))

    # -- ground truth -----------------------------------------------------------------------

    def true_evidence(self) -> list[Evidence | None]:
        """What a round sees when every live observer answers, once the stall has settled."""
        evidence: list[Evidence | None] = []
        for behaviour in self.behaviours:
            if behaviour is Behaviour.DEAD:
                evidence.append(None)
            elif behaviour in _PROGRESSING:
                p = trainer_progress(behaviour, 0)
                evidence.append(Evidence(p.step, p.op, p.fingerprint, p.stage, 0.0, p.completions, (), p.contract,
                                         p.completion_stale))
            else:
                p = _STUCK_AT[behaviour]
                evidence.append(Evidence(p.step, p.op, p.fingerprint, p.stage, 9.0, p.completions, (), p.contract,
                                         p.completion_stale))
        return evidence

    def expected_report(self) -> Finding | None:
        """The finding a fault-free group reports: (outcome, attributed, missing, key)."""
        return _finding(assess(self.true_evidence(), self.configs[0]))

    def acceptable(self, report: StallReport, faults: int) -> bool:
        """Is ``report`` what the trainers really did, seen through at most ``faults`` lost or
        delayed messages? Each fault can hide at most one live peer from one round, so a
        decisive finding must equal the assessment of the true evidence with at most ``faults``
        live peers hidden. A confirmed finding (unresponsive, inconclusive) needs
        ``confirm_rounds`` identical rounds, which fewer faults cannot fake: it must be the truth."""
        found = (report.outcome, report.attributed, report.missing, report.key)
        if report.outcome in (Finding.UNRESPONSIVE, Finding.INCONCLUSIVE):
            return found == self.expected_report()
        return found in self._findings_with_hidden(faults)

    @functools.cache  # noqa: B019 - one group object per exploration
    def _findings_with_hidden(self, faults: int) -> frozenset[ModelFinding]:
        truth = self.true_evidence()
        live = [p for p, e in enumerate(truth) if e is not None]
        findings: set[ModelFinding] = set()
        for count in range(faults + 1):
            for hidden in itertools.combinations(live, count):
                evidence = [None if p in hidden else e for p, e in enumerate(truth)]
                finding = _finding(assess(evidence, self.configs[0]))
                if finding is not None:
                    findings.add(finding)
        return frozenset(findings)


ModelFinding = tuple[Finding, tuple[int, ...], tuple[int, ...], tuple[int, int]]


def _finding(assessment: Any) -> ModelFinding | None:
    if assessment.outcome is Finding.UNSETTLED or assessment.key is None:
        return None
    return assessment.outcome, assessment.attributed, assessment.missing, assessment.key


def group_properties(group: ObserverGroup) -> list[Property]:
    expected = group.expected_report()

    def matches(report: StallReport) -> bool:
        return (report.outcome, report.attributed, report.missing, report.key) == expected

    def correct(state: GroupState) -> bool:
        faults = state.faults_max - state.faults_left
        return all(group.acceptable(r, faults) for _, r in state.reports)

    def one_per_position_without_loss(state: GroupState) -> bool:
        if state.faulty:
            return True
        keys = [r.key for _, r in state.reports]
        return len(keys) == len(set(keys))

    def duplicates_bounded_by_loss(state: GroupState) -> bool:
        keys = [r.key for _, r in state.reports]
        return len(keys) - len(set(keys)) <= state.faults_max - state.faults_left

    def emitter_alive_and_not_attributed(state: GroupState) -> bool:
        return all(
            group.behaviours[emitter] is not Behaviour.DEAD and emitter not in r.attributed and emitter == r.reporter
            for emitter, r in state.reports
        )

    def reporter_is_lowest_eligible(state: GroupState) -> bool:
        # Without loss, the emitter is the lowest live position the report does not attribute.
        if state.faulty:
            return True
        for emitter, r in state.reports:
            eligible = [p for p in range(group.size) if p not in r.attributed and p not in r.missing]
            if emitter != eligible[0]:
                return False
        return True

    def reported_by_the_horizon_without_faults(state: GroupState) -> bool:
        if expected is None or state.faulty or state.now < group.horizon_s or state.network:
            return True
        return any(matches(r) for _, r in state.reports)

    healthy = [behaviour in HEALTHY for behaviour in group.behaviours]
    healthy_majority = 2 * sum(healthy) > group.size

    def no_innocent_named(state: GroupState) -> bool:
        if not healthy_majority:
            return True
        return all(not healthy[p] for _, r in state.reports for p in r.attributed)

    def a_culprit_named_by_the_horizon(state: GroupState) -> bool:
        stuck = not any(b in _PROGRESSING for b in group.behaviours)
        culprits = [p for p, b in enumerate(group.behaviours) if not healthy[p] and b is not Behaviour.DEAD]
        unnameable = any(b in UNNAMEABLE for b in group.behaviours)
        if (not healthy_majority or not stuck or not culprits or unnameable or state.faulty
                or state.now < group.horizon_s or state.network):
            return True
        return any(r.attributed and set(r.attributed) <= set(culprits) for _, r in state.reports)

    return [
        Property.always("OBS-46", "Whenever a strict majority of the trainers is healthy (progressing, or waiting "
                        "for a peer: in the collective, or with the device started in or past the blocking "
                        "collective), no report attributes a healthy rank -- judged by what the trainers did, not "
                        "by the assessment rule.", no_innocent_named),
        Property.always("OBS-47", "Without loss or delay, when a strict majority of the trainers is healthy, none "
                        "progresses, and a live trainer is faulty (in a way sound evidence can show), a report by "
                        "the horizon attributes faulty ranks only, at least one.", a_culprit_named_by_the_horizon),
        Property.always("OBS-45", "Without loss or delay, the true finding is reported by the horizon "
                        "(two rounds and a confirmation).", reported_by_the_horizon_without_faults),
        Property.always("OBS-40", "Every report names what the trainers really did (outcome, attributed, "
                        "missing, position), as seen through the lost or delayed messages, whenever fewer "
                        "messages than confirm_rounds were lost or delayed.", correct),
        Property.always("OBS-41", "Without loss or delay, each stuck position is reported once in the whole "
                        "group.", one_per_position_without_loss),
        Property.always("OBS-42", "Duplicate reports of one position never outnumber lost and delayed "
                        "messages.", duplicates_bounded_by_loss),
        Property.always("OBS-43", "Every report is emitted by a live observer the report does not attribute.",
                        emitter_alive_and_not_attributed),
        Property.always("OBS-44", "Without loss or delay, the emitter is the lowest-positioned live observer "
                        "the report does not attribute (never a fixed rank 0).", reporter_is_lowest_eligible),
    ]


#: Host progress only (gloo before completion tracking, MPI): the first six behaviours.
ALL_BEHAVIOURS = (Behaviour.PROGRESSING, Behaviour.BEFORE_K, Behaviour.IN_F, Behaviour.IN_F_PRIME, Behaviour.FROZEN,
                  Behaviour.DEAD)
#: NCCL semantics with completion tracking: every trainer publishes a completion coordinate.
DEVICE_BEHAVIOURS = (Behaviour.DEVICE_PROGRESSING, Behaviour.DEVICE_WAITING, Behaviour.DEVICE_PAST,
                     Behaviour.GPU_HANG, Behaviour.HOST_LATE, Behaviour.THREAD_LATE, Behaviour.DEVICE_OTHER,
                     Behaviour.DEAD)


def every_mix(size: int) -> Iterable[tuple[Behaviour, ...]]:
    return itertools.product(ALL_BEHAVIOURS, repeat=size)


#: Hosts running ahead of their devices (COMPLETION-9..12): drained hosts, groups without
#: completion evidence, ranks waiting in another group's collective.
RUN_AHEAD_BEHAVIOURS = (Behaviour.DEVICE_WAITING, Behaviour.DRAINED_WAITING, Behaviour.GPU_HANG,
                        Behaviour.UNTRACKED_AHEAD, Behaviour.UNTRACKED_DRAINED, Behaviour.UNTRACKED_STALLED,
                        Behaviour.SUB_WAITING, Behaviour.SUB_HANG)


def every_device_mix(size: int) -> Iterable[tuple[Behaviour, ...]]:
    return itertools.product(DEVICE_BEHAVIOURS, repeat=size)


def every_run_ahead_mix(size: int) -> Iterable[tuple[Behaviour, ...]]:
    return itertools.product(RUN_AHEAD_BEHAVIOURS, repeat=size)
