"""The world the gate lives in, for model checking, and the quotient that makes it finite.

**Environment.** :func:`environment` lists every event the world can deliver in a state: a result
for every recipe with every verdict vector (``every_vector``: all 4 ** groups outcome
combinations; ``class_vectors``: one per result class, for the fast configurations), a capture
at the current step or the next, a cycle boundary, and a restart to every restorable checkpoint
the gate must accept (or from initialization). ``captures_max`` bounds the captures per run.

**Referee.** :class:`Referee` re-derives from the events alone, independently of the gate's
bookkeeping, which cycle is open, whether it has been complete and all-agree, and which replays it
held; ``promotions_match_referee`` checks every promotion and its certificate against it
(GATE-1 and GATE-8 seen from outside the machine).

**Quotient.** The gate's raw state grows without bound (steps, cycle and timeline numbers), so a
breadth-first search would never end. Its behaviour, though, depends on steps only through their
order among the steps of *restorable* checkpoints and open records (all at or below ``now``), on
cycle numbers only relative to the open cycle, on timelines only through their order; QUARANTINED
and SUPERSEDED entries, reason texts and issued certificates never influence a later step (a step
predicate, GATE-3, proves certificates never change). :class:`Canonical` therefore compares states
by a key that relabels steps and timelines densely, makes cycles relative and counts terminal
entries. States with equal keys are bisimilar for every property checked, so exploring one
representative per key is exhaustive, and the search ends: the reports say "not cut: exhaustive".
Step predicates always see raw states of one consistent labelling (the successor is computed from
the stored representative), and traces are real event sequences.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from scout.core.machine import Firing, Machine, Property
from scout.gate.machine import GateMachineState, restorable
from scout.gate.model import (
    RESTORABLE,
    CheckpointCaptured,
    CheckpointId,
    CheckpointLost,
    CycleBoundary,
    CycleRecord,
    GateConfig,
    GateContext,
    GateReport,
    GateReportKind,
    GateState,
    GroupVerdict,
    Outcome,
    RecipeVerdicts,
    Replay,
    Restart,
    ResultClass,
    Trust,
    TrustChange,
)
from scout.gate.step import check_event, gate_machine, initial_state

VerdictVector = tuple[GroupVerdict, ...]


def verdict_of(group: str, outcome: Outcome) -> GroupVerdict:
    if outcome is Outcome.ATTRIBUTED:
        return GroupVerdict(group, outcome, (0,))
    if outcome is Outcome.INCONCLUSIVE:
        return GroupVerdict(group, outcome, (), "no-majority")
    if outcome is Outcome.MISSING:
        return GroupVerdict(group, outcome, (), "no-result")
    return GroupVerdict(group, outcome)


def every_vector(groups: tuple[str, ...]) -> tuple[VerdictVector, ...]:
    """Every outcome for every group: 4 ** len(groups) vectors."""
    return tuple(
        tuple(verdict_of(g, o) for g, o in zip(groups, outcomes, strict=True))
        for outcomes in itertools.product(tuple(Outcome), repeat=len(groups))
    )


def class_vectors(groups: tuple[str, ...]) -> tuple[VerdictVector, ...]:
    """One vector per way a result can be unclean, plus the clean one: the first group gives the
    outcome, the others agree."""
    first, rest = groups[0], groups[1:]
    return tuple(
        (verdict_of(first, outcome), *(verdict_of(g, Outcome.AGREE) for g in rest))
        for outcome in (Outcome.AGREE, Outcome.INCONCLUSIVE, Outcome.MISSING, Outcome.ATTRIBUTED)
    )


def make_config(recipes_count: int, groups_count: int) -> GateConfig:
    return GateConfig(
        "job-mc",
        tuple(f"r{i}" for i in range(recipes_count)),
        tuple(f"g{i}" for i in range(groups_count)),
    )


def configurations(recipes_max: int = 4, groups_max: int = 3) -> Iterator[tuple[int, int]]:
    for recipes_count in range(1, recipes_max + 1):
        for groups_count in range(1, groups_max + 1):
            yield recipes_count, groups_count


def environment(
    vectors_of: Callable[[tuple[str, ...]], tuple[VerdictVector, ...]],
    *,
    captures_max: int = 3,
) -> Callable[[GateMachineState], tuple[object, ...]]:
    """Every event the world can deliver in a gate state, in a fixed order."""
    cache: dict[tuple[str, ...], tuple[VerdictVector, ...]] = {}

    def enabled(state: GateMachineState) -> tuple[object, ...]:
        context = state.context
        config = context.config
        now = context.last_step
        events: list[object] = []
        if context.cycle_start_step is not None:
            for recipe in config.recipe_ids:
                groups = config.groups_of(recipe)
                if groups not in cache:
                    cache[groups] = vectors_of(groups)
                # Replays happen at the cycle's first step: where inside the cycle a replay ran
                # changes no decision (the certificate test varies it), and one step per cycle
                # keeps the state space small.
                events.extend(RecipeVerdicts(recipe, context.cycle, context.cycle_start_step, v) for v in cache[groups])
        if len(context.checkpoints) < captures_max:
            if context.last_capture_step is None or context.last_capture_step < now:
                events.append(CheckpointCaptured(now))
            events.append(CheckpointCaptured(now + 1))
        if context.cycle_start_step is None or now > context.cycle_start_step:
            events.append(CycleBoundary(now))
        else:
            events.append(CycleBoundary(now + 1))
        verified_step = context.verified_step
        for entry in restorable(context):
            if verified_step is None or entry.id.step >= verified_step:
                events.append(Restart(entry.id.step))
        if verified_step is None:
            events.append(Restart(None))
        # GATE-42: restore() finds the files of the checkpoint the recovery decision chose gone:
        # the newest verified one, or the newest restorable one (spec/recovery.md). It looks only
        # after a failure, but the gate accepts the event in every state, so every state tries it.
        chosen = {entry.id for entry in (context.verified, context.latest) if entry is not None}
        events.extend(CheckpointLost(checkpoint, "files gone") for checkpoint in sorted(chosen))
        return tuple(events)

    return enabled


# ------------------------------------------------------------------------------------------
# The referee
# ------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Referee:
    """What the events alone say about the open cycle and the last closed one. ``closed`` is
    the cycle that ended at ``open_start`` if it was complete, all-agree and SDC-free."""

    timeline: int = 0
    open_start: int | None = None
    open_number: int = 0
    open_seen: frozenset[str] = frozenset()
    open_all_agree: bool = True
    open_replays: frozenset[Replay] = frozenset()
    closed: CycleRecord | None = None
    sdc_since_restart: bool = False


def referee_step(config: GateConfig, referee: Referee, event: object) -> Referee:
    if isinstance(event, RecipeVerdicts):
        all_agree = referee.open_all_agree and all(v.outcome is Outcome.AGREE for v in event.verdicts)
        # Only an all-agree cycle can be certified, so only its replays need remembering.
        replays = referee.open_replays | {Replay(event.recipe, event.step, event.verdicts)} if all_agree else frozenset()
        return Referee(
            referee.timeline,
            referee.open_start,
            referee.open_number,
            referee.open_seen | {event.recipe},
            all_agree,
            replays,
            referee.closed,
            referee.sdc_since_restart or any(v.outcome is Outcome.ATTRIBUTED for v in event.verdicts),
        )
    if isinstance(event, CycleBoundary):
        closed = None
        good = (
            referee.open_start is not None
            and referee.open_all_agree
            and referee.open_seen == frozenset(config.recipe_ids)
            and not referee.sdc_since_restart
        )
        if good:
            assert referee.open_start is not None
            order = {r: i for i, r in enumerate(config.recipe_ids)}
            replays = tuple(sorted(referee.open_replays, key=lambda r: (r.step, order[r.recipe])))
            closed = CycleRecord(referee.open_number, referee.open_start, event.step, replays)
        return Referee(
            referee.timeline,
            event.step,
            referee.open_number + 1,
            frozenset(),
            True,
            frozenset(),
            closed,
            referee.sdc_since_restart,
        )
    if isinstance(event, (CheckpointCaptured, CheckpointLost)):
        return referee
    if isinstance(event, Restart):
        return Referee(timeline=referee.timeline + 1, open_number=referee.open_number)
    raise TypeError(f"not a gate event: {event!r}")


RefereedState = tuple[GateMachineState, Referee]


def promotions_match_referee(
    previous: RefereedState, event: object, state: RefereedState, effects: tuple[object, ...]
) -> bool:
    """GATE-1 from outside the machine: a promotion happens only at a boundary closing a cycle
    the referee saw complete and all-agree with no SDC since restart, for the checkpoint captured
    at the start of that cycle, which itself closed a complete clean cycle; the certificate lists
    exactly the replays the referee saw in those two cycles."""
    gate_before, referee = previous
    config = gate_before.context.config
    for effect in effects:
        if not (isinstance(effect, TrustChange) and effect.after is Trust.RECOVERY_VERIFIED):
            continue
        if not isinstance(event, CycleBoundary) or referee.open_start is None or referee.closed is None:
            return False
        if not referee.open_all_agree or referee.open_seen != frozenset(config.recipe_ids):
            return False
        if referee.sdc_since_restart:
            return False
        if effect.checkpoint != CheckpointId(referee.timeline, referee.open_start):
            return False
        certificate = effect.certificate
        if certificate is None or certificate.before != referee.closed:
            return False
        if frozenset(certificate.after.replays) != referee.open_replays:
            return False
        if (certificate.after.start_step, certificate.after.end_step) != (referee.open_start, event.step):
            return False
    return True


# ------------------------------------------------------------------------------------------
# The quotient
# ------------------------------------------------------------------------------------------

_TERMINAL = (Trust.QUARANTINED, Trust.SUPERSEDED, Trust.LOST)


def canonical_key(raw: RefereedState) -> tuple[Any, ...]:
    """Equal keys mean bisimilar states (module docstring)."""
    gate, referee = raw
    context = gate.context
    live = [entry for entry in context.checkpoints if entry.trust in RESTORABLE]
    steps: set[int] = {context.last_step}
    for value in (context.cycle_start_step, context.last_capture_step, referee.open_start):
        if value is not None:
            steps.add(value)
    records = [context.previous_clean, referee.closed, *(entry.before for entry in live)]
    for record in records:
        if record is not None:
            steps.update((record.start_step, record.end_step))
            steps.update(replay.step for replay in record.replays)
    steps.update(replay.step for replay in context.replays)
    steps.update(replay.step for replay in referee.open_replays)
    steps.update(entry.id.step for entry in live)
    step_rank = {step: rank for rank, step in enumerate(sorted(steps))}
    timeline_rank = {
        timeline: rank
        for rank, timeline in enumerate(sorted({context.timeline, referee.timeline, *(e.id.timeline for e in live)}))
    }

    def rank(step: int | None) -> int | None:
        return None if step is None else step_rank[step]

    def replays_key(replays: Any) -> tuple[Any, ...]:
        return tuple(
            sorted(
                (r.recipe, step_rank[r.step], tuple((v.group, v.outcome.value, v.outliers, v.reason) for v in r.verdicts))
                for r in replays
            )
        )

    def record_key(record: CycleRecord | None) -> tuple[Any, ...] | None:
        if record is None:
            return None
        return (
            record.cycle - context.cycle,
            step_rank[record.start_step],
            step_rank[record.end_step],
            replays_key(record.replays),
        )

    live_key = tuple(
        (
            timeline_rank[entry.id.timeline],
            step_rank[entry.id.step],
            entry.trust,
            record_key(entry.before),
            entry.certificate is not None,
        )
        for entry in live
    )
    terminal_key = tuple(sum(entry.trust is trust for entry in context.checkpoints) for trust in _TERMINAL)
    return (
        gate.control,
        timeline_rank[context.timeline],
        rank(context.cycle_start_step),
        context.covered,
        context.unchecked,
        replays_key(context.replays),
        record_key(context.previous_clean),
        live_key,
        terminal_key,
        step_rank[context.last_step],
        rank(context.last_capture_step),
        context.sdc is not None,
        timeline_rank[referee.timeline],
        rank(referee.open_start),
        referee.open_number - context.cycle,
        referee.open_seen,
        referee.open_all_agree,
        replays_key(referee.open_replays),
        record_key(referee.closed),
        referee.sdc_since_restart,
    )


class Canonical:
    """A raw refereed state compared and hashed by its canonical key."""

    __slots__ = ("_hash", "key", "raw")

    def __init__(self, raw: RefereedState) -> None:
        self.raw = raw
        self.key = canonical_key(raw)
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Canonical) and self.key == other.key

    def __repr__(self) -> str:
        gate, _referee = self.raw
        return f"{gate.control} {gate.context!r}"


class GateSystem:
    """The gate as the explorer sees it: validation plus the table's step, so model checking
    also proves that no event the environment offers is refused."""

    def __init__(self, machine: Machine[GateContext] | None = None, extra: Sequence[Property] = ()) -> None:
        # ``machine``: the same table bound to other functions (tests plant bugs this way).
        self.machine = machine if machine is not None else gate_machine()
        self.properties: tuple[Property, ...] = (*self.machine.properties, *extra)
        self.labels: tuple[str, ...] = self.machine.labels

    def fire(self, state: GateMachineState, event: Any) -> Firing[GateMachineState]:
        check_event(state, event)
        return self.machine.fire(state, event)


class CheckedGate:
    """The gate with its referee, explored over canonical states. Properties: every invariant of
    spec/gate.toml (evaluated on raw gate states) plus ``GATE-1-referee``."""

    def __init__(self, inner: GateSystem | None = None) -> None:
        inner = inner if inner is not None else GateSystem()
        self.inner = inner
        self.labels = inner.labels
        lifted: list[Property] = []
        for prop in inner.properties:
            lift = _lift_state if prop.scope == "state" else _lift_step
            lifted.append(attrs.evolve(prop, predicate=lift(prop.predicate)))
        lifted.append(
            Property.always(
                "GATE-1-referee",
                "Every promotion and its certificate agree with an independent account of the cycles.",
                lambda p, e, s, f: promotions_match_referee(p.raw, e, s.raw, f),
                scope="step",
            )
        )
        self.properties = tuple(lifted)

    def fire(self, state: Canonical, event: object) -> Firing[Canonical]:
        gate_state, referee = state.raw
        firing = self.inner.fire(gate_state, event)
        config = gate_state.context.config
        next_raw = (firing.state, referee_step(config, referee, event))
        return Firing(Canonical(next_raw), firing.effects, firing.labels)


def _lift_state(predicate: Callable[[GateMachineState], bool]) -> Callable[[Canonical], bool]:
    def lifted(state: Canonical) -> bool:
        return predicate(state.raw[0])

    return lifted


def _lift_step(
    predicate: Callable[[GateMachineState, object, GateMachineState, tuple[object, ...]], bool],
) -> Callable[[Canonical, object, Canonical, tuple[object, ...]], bool]:
    def lifted(previous: Canonical, event: object, state: Canonical, effects: tuple[object, ...]) -> bool:
        return predicate(previous.raw[0], event, state.raw[0], effects)

    return lifted


def restart_keeps_older_unverified(
    previous: Canonical, event: object, state: Canonical, effects: tuple[object, ...]
) -> bool:
    """A restart to a checkpoint that keeps an older unverified checkpoint CAPTURED: the case
    that tells GATE-18's "newer than the restore point" from "every unverified checkpoint". An
    exploration that never reaches it cannot catch a restart superseding too much."""
    if not (isinstance(event, Restart) and event.step is not None):
        return False
    now = {entry.id: entry.trust for entry in state.raw[0].context.checkpoints}
    return any(
        entry.trust in (Trust.CAPTURED, Trust.CANDIDATE)
        and entry.id.step < event.step
        and now[entry.id] is Trust.CAPTURED
        for entry in previous.raw[0].context.checkpoints
    )


def loss_leaves_older_verified(
    previous: Canonical, event: object, state: Canonical, effects: tuple[object, ...]
) -> bool:
    """GATE-42 with two verified checkpoints: the newer is lost and the older is the newest
    verified one after it -- the case RECOVERY-7's fallback to an older verified checkpoint rests on."""
    before, after = previous.raw[0].context, state.raw[0].context
    return (
        isinstance(event, CheckpointLost)
        and before.verified_step == event.checkpoint.step
        and after.verified_step is not None
        and after.verified_step < event.checkpoint.step
    )


#: Coverage witnesses of the exploration itself (not of the machine): explorations with two or
#: more captures per run pass these as ``extra_properties``.
SEVERAL_CHECKPOINTS_WITNESSES = (
    Property.sometimes(
        "restart-keeps-older-unverified",
        "Some restart to a checkpoint keeps an older unverified checkpoint CAPTURED.",
        restart_keeps_older_unverified,
        scope="step",
    ),
    Property.sometimes(
        "loss-leaves-older-verified",
        "Some loss of the newest verified checkpoint leaves an older verified one to restore.",
        loss_leaves_older_verified,
        scope="step",
    ),
)


def reasons_name_their_cause(
    previous: Canonical, event: object, state: Canonical, effects: tuple[object, ...]
) -> bool:
    """The reason of every trust transition is the entry's recorded reason and names its cause:
    the cycles of a nomination, the SDC of a quarantine, and what an unclean cycle lacked."""
    before, after = previous.raw[0].context, state.raw[0].context
    open_cycle = previous.raw[0].control in (GateState.CHECKING, GateState.UNCLEAN)
    unchecked = isinstance(event, RecipeVerdicts) and event.result_class is ResultClass.UNCHECKED
    # The cycle remembers which recipes it could not check: the withheld promotion names them.
    if open_cycle and unchecked and event.recipe not in after.unchecked:
        return False
    entries = {entry.id: entry for entry in after.checkpoints}
    for change in effects:
        if not isinstance(change, TrustChange):
            continue
        entry = entries[change.checkpoint]
        if change.reason != entry.reason:
            return False
        if change.after is Trust.CANDIDATE:
            if entry.before is None:
                return False
            cycle = entry.before.cycle
            expected = f"candidate: captured at the end of complete clean cycle {cycle}; verified if cycle {cycle + 1} completes clean"
            if change.reason != expected:
                return False
        if change.after is Trust.QUARANTINED and (after.sdc is None or after.sdc.describe() not in change.reason):
            return False
        if change.before is Trust.CANDIDATE and change.after is Trust.CAPTURED and isinstance(event, CycleBoundary):
            missing = [recipe for recipe in before.config.recipe_ids if recipe not in before.covered]
            problems = [f"no result for {', '.join(missing)}"] if missing else []
            if before.unchecked:
                problems.append(f"unchecked results for {', '.join(before.unchecked)}")
            expected = (
                f"not verified: cycle {before.cycle} after its capture was not complete and clean "
                f"({'; '.join(problems)})"
            )
            if change.reason != expected:
                return False
        if change.after is Trust.LOST and not (
            isinstance(event, CheckpointLost)
            and change.reason == f"lost: {event.detail} (was {change.before.value if change.before else None}); never restored"
        ):
            return False
        if change.after is Trust.SUPERSEDED and isinstance(event, Restart):
            where = "initialization" if event.step is None else f"step {event.step}"
            if f"restarted from {where} (timeline {after.timeline})" not in change.reason:
                return False
    return reports_name_their_subject(previous, event, state, effects)


def reports_name_their_subject(
    previous: Canonical, event: object, state: Canonical, effects: tuple[object, ...]
) -> bool:
    """An unchecked report carries the result's cycle, step and recipe and says, group by group,
    what was wrong; a missing-recipe report names the cycle, the boundary step and the recipes."""
    before = previous.raw[0].context
    for report in effects:
        if not (isinstance(report, GateReport) and report.kind is GateReportKind.UNCHECKED):
            continue
        if isinstance(event, RecipeVerdicts):
            if (report.cycle, report.step, report.recipes) != (event.cycle, event.step, (event.recipe,)):
                return False
            parts = []
            for verdict in event.verdicts:
                if verdict.outcome is Outcome.INCONCLUSIVE:
                    parts.append(f"group {verdict.group} inconclusive ({verdict.reason or 'no reason given'})")
                elif verdict.outcome is Outcome.MISSING:
                    parts.append(f"group {verdict.group} gave no verdict")
            if f"could not be checked: {'; '.join(parts)}." not in report.detail:
                return False
        elif isinstance(event, CycleBoundary):
            missing = ", ".join(report.recipes)
            expected = f"cycle {before.cycle} closed at step {event.step} without results for recipe(s) {missing}"
            if (report.cycle, report.step) != (before.cycle, event.step) or not report.detail.startswith(expected):
                return False
    return True


REASON_CHECKS = (
    Property.always(
        "reasons-name-their-cause",
        "Every trust transition's reason is the entry's and names the cycles, SDC, restart or gaps "
        "behind it; every unchecked report names its cycle, step, recipes and what each group said.",
        reasons_name_their_cause,
        scope="step",
    ),
)


def checked_environment(
    vectors_of: Callable[[tuple[str, ...]], tuple[VerdictVector, ...]],
    *,
    captures_max: int = 3,
) -> Callable[[Canonical], tuple[object, ...]]:
    inner = environment(vectors_of, captures_max=captures_max)

    def enabled(state: Canonical) -> tuple[object, ...]:
        return inner(state.raw[0])

    return enabled


def initial(config: GateConfig) -> Canonical:
    return Canonical((initial_state(config), Referee()))
