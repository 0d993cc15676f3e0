"""``scout simulate gate-campaign``: the checkpoint gate driven job-wide over the transport
contract, on the simulated cluster, with SDC, Inconclusive and missing results injected at
random recipes and cycles (docs/design.md §2.3; spec/gate.md).

The job: ranks form peer groups (``--group-size`` consecutive ranks). A catalog of RECIPES is
replayed one recipe per replay, a cycle per catalog pass, ``--rounds`` cycles. Replay *k* starts
at *k* seconds of virtual time:

1. every rank computes the recipe's signature and exchanges it with its peer group
   (:func:`group_vote`: ``Exchange``, bounded by a deadline); each rank takes the group's
   verdict with the one verdict rule over what arrived (``combine_evidence``; a silent peer is
   MISSING evidence);
2. aggregation among the group leaders (position 0) and the gate's writer (rank 0), who
   exchange their groups' verdicts (:func:`aggregate_results`: ``Exchange`` again). A group
   whose leader did not answer is MISSING;
3. the writer steps the gate with one :class:`~scout.gate.model.RecipeVerdicts` (one verdict per
   group), and at the end of each cycle with a boundary and a capture. It checks every
   ``always`` invariant of spec/gate.toml on every step;
4. the writer's view of the gate (version, verified step, quarantined count, tainted) rides on
   its next aggregation payload to the leaders and on their next group payloads to every rank,
   so an SDC in any group is known everywhere within two replays (one extra replay-less round
   at the end finishes the spreading).

Faults, drawn from the run's seed: one rank's signature is corrupted (SDC) at one replay; half a
group disagrees at another (no strict majority: Inconclusive); a group leader is frozen across a
third (its group's result is missing at the writer). The checks compare what the gate did with
an oracle computed from where the faults were put.

Registered with the simulator by importing this module; the simulator lists scenario modules in
``scout.scenarios.registry.SCENARIO_MODULES``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Generator
from typing import Any, Final

import attrs

from scout.core.machine import MachineState
from scout.core.recipes import EvidenceKind, RecipeId, RecipeResult, ReplayStatus, combine_evidence
from scout.core.verdict import MISSING, Status
from scout.gate.model import (
    CheckpointCaptured,
    CycleBoundary,
    GateConfig,
    GateContext,
    GateReport,
    GateReportKind,
    GateState,
    RecipeVerdicts,
    Trust,
    TrustChange,
)
from scout.gate.recorder import GateWriter
from scout.gate.recovery import Choice, FailureClass, recover
from scout.gate.results import recipe_verdicts
from scout.gate.step import gate_machine
from scout.scenarios.exchange import replica_groups
from scout.scenarios.registry import Check, ScenarioOutcome, ScenarioParams, scenario
from scout.transport.base import Group
from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim.cluster import SimCluster
from scout.transport.sim.faults import Corrupt, FlipBit, Freeze
from scout.transport.sim.process import ProgramState, SimContext

__all__ = ["NO_VIEW", "RECIPES", "GateView", "aggregate_results", "gate_campaign", "gate_view", "group_vote"]

RECIPES: Final = ("embedding", "hidden.0", "hidden.1", "output")
PERIOD_S: Final = 1.0  # replay k starts at k * PERIOD_S
EXCHANGE_TIMEOUT_S: Final = 0.2  # each of the two exchanges of a replay
AGGREGATION_START_S: Final = 0.4  # the leaders' exchange starts this long after the replay's start
COMPUTE_S: Final = 0.002
COMPUTE_JITTER_S: Final = 0.003
STEPS_PER_REPLAY: Final = 10
WRITER: Final = 0
ROUND_GROUP: Final = 0  # round ids: 2k for a replay's group exchange, 2k+1 for its aggregation
COLUMNS: Final = ("cycle", "steps", "injected", "gate_after", "checkpoint_at_end", "reports")

GateMachineState = MachineState[GateContext]


# ------------------------------------------------------------------------------------------
# The campaign's own aggregation: partial results and the gate's view (step 4 above). A job's
# step exchanges its results once, all or nothing, through scout.job.aggregate; this campaign
# studies what a deadline-bounded exchange with silent leaders does to the gate.
# ------------------------------------------------------------------------------------------

#: What every rank knows of the gate: (version, newest verified step or -1, quarantined
#: checkpoints, tainted). Versions only grow, so the newest view wins wherever views meet.
GateView = tuple[int, int, int, bool]
View = GateView
NO_VIEW: GateView = (0, -1, 0, False)


def gate_view(state: MachineState[GateContext], version: int) -> GateView:
    context = state.context
    verified = context.verified_step
    quarantined = sum(entry.trust is Trust.QUARANTINED for entry in context.checkpoints)
    return (version, -1 if verified is None else verified, quarantined, state.control is GateState.TAINTED)


def _newer(view: GateView, candidate: object) -> GateView:
    if isinstance(candidate, (tuple, list)) and len(candidate) == 4:
        other = tuple(candidate)
        if other > view:
            return other
    return view


def group_vote(
    recipe: RecipeId, step: int, signature: int, view: GateView, *, group: Group, round_id: int, timeout_s: float
) -> Generator[Any, Any, tuple[RecipeResult, GateView]]:
    """Exchange this rank's replay output signature with its peer group and decide the recipe."""
    answer = yield Exchange((signature, view), round_id=round_id, timeout_s=timeout_s, group=group)
    for payload in answer.answers.values():
        if isinstance(payload, (tuple, list)) and len(payload) == 2:
            view = _newer(view, payload[1])
    present = [rank in answer.answers for rank in group.ranks]
    statuses = [int(ReplayStatus.OK) if here else MISSING for here in present]
    signatures = [answer.answers[rank][0] if here else MISSING for rank, here in zip(group.ranks, present, strict=True)]
    return combine_evidence(recipe, step, statuses, {EvidenceKind.OUTPUT: signatures}), view


def aggregate_results(
    group_index: int,
    result: RecipeResult,
    view: GateView,
    *,
    leaders: Group,
    writer: int,
    round_id: int,
    timeout_s: float,
) -> Generator[Any, Any, tuple[dict[int, RecipeResult], GateView]]:
    """The leaders' exchange: each group leader (and the gate's writer) sends its group's result;
    returns the results that arrived, by group index, and the writer's view if newer."""
    mine = (group_index, result.status.value, result.outliers, result.reason or "", view)
    gathered = yield Exchange(mine, round_id=round_id, timeout_s=timeout_s, group=leaders)
    results: dict[int, RecipeResult] = {}
    for payload in gathered.answers.values():
        index, status, outliers, reason, _view = payload
        results[int(index)] = RecipeResult(result.recipe, result.step, Status(status), tuple(outliers),
                                           reason=str(reason) or None)
    writer_payload = gathered.answers.get(writer)
    if writer_payload is not None:
        view = _newer(view, writer_payload[4])
    return results, view


def _signature(recipe_index: int, replay: int) -> int:
    """What every healthy replica computes for a replay (a stand-in for a tensor signature)."""
    return (recipe_index * 2654435761 + replay * 40503 + 977) % 2**31


@attrs.frozen
class Plan:
    """Where the faults go, drawn from the seed before the run."""

    cycles: int
    sdc_replay: int
    sdc_rank: int
    inconclusive_replay: int
    inconclusive_group: int
    missing_replay: int
    missing_group: int

    def cycle_of(self, replay: int) -> int:
        return (replay - 1) // len(RECIPES) + 1

    def unclean_cycles(self) -> set[int]:
        return {self.cycle_of(r) for r in (self.sdc_replay, self.inconclusive_replay, self.missing_replay)}


@attrs.define
class WriterLog:
    """What the writer saw and did, for the checks."""

    states: list[GateMachineState] = attrs.Factory(list)
    effects: list[tuple[object, ...]] = attrs.Factory(list)
    violations: list[str] = attrs.Factory(list)
    results: dict[int, RecipeVerdicts] = attrs.Factory(dict)
    view: View = NO_VIEW
    writer: GateWriter | None = None


def _check_step(previous: GateMachineState, event: object, new: GateMachineState, effects: tuple[object, ...], log: WriterLog) -> None:
    for prop in gate_machine().properties:
        if prop.kind != "always":
            continue
        ok = prop.predicate(new) if prop.scope == "state" else prop.predicate(previous, event, new, effects)
        if not ok:
            log.violations.append(f"{prop.id} after {event!r}")


def _program(
    groups: list[Group], index_of: list[int], leaders: Group, plan: Plan, config: GateConfig, log: WriterLog
) -> Callable[[SimContext], Generator[Any, Any, View]]:
    replays = plan.cycles * len(RECIPES)

    def program(ctx: SimContext) -> Generator[Any, Any, View]:
        group_index = index_of[ctx.rank]
        group = groups[group_index]
        is_leader = group.ranks[0] == ctx.rank
        view: View = NO_VIEW
        state: GateMachineState | None = None
        if ctx.rank == WRITER:
            state = _writer_step(log, CycleBoundary(0))
        # Two replay-less iterations at the end spread the writer's final view: to the leaders,
        # then to every rank.
        for replay in range(1, replays + 3):
            start_s = replay * PERIOD_S
            now_s = yield Now()
            if now_s < start_s:
                yield Sleep(start_s - now_s)
                now_s = yield Now()
            if now_s > start_s + AGGREGATION_START_S:
                continue  # woke from a freeze too late for this replay
            yield Sleep(COMPUTE_S + ctx.random.random() * COMPUTE_JITTER_S)
            recipe_index = (replay - 1) % len(RECIPES)
            signature = _signature(recipe_index, replay)
            # Step 1: the peer group's verdict; the view rides along.
            recipe = RecipeId.parse(RECIPES[recipe_index])
            result, view = yield from group_vote(
                recipe, replay * STEPS_PER_REPLAY, signature, view, group=group, round_id=2 * replay,
                timeout_s=EXCHANGE_TIMEOUT_S,
            )
            if not is_leader:
                continue
            # Step 2: job-wide aggregation among the leaders and the writer.
            now_s = yield Now()
            aggregation_s = start_s + AGGREGATION_START_S
            if now_s < aggregation_s:
                yield Sleep(aggregation_s - now_s)
            results, view = yield from aggregate_results(
                group_index,
                result,
                view,
                leaders=leaders,
                writer=WRITER,
                round_id=2 * replay + 1,
                timeout_s=EXCHANGE_TIMEOUT_S,
            )
            if ctx.rank != WRITER or replay > replays:
                continue
            # Step 3: the writer steps the gate with one verdict per group.
            assert state is not None
            event = recipe_verdicts(config, RECIPES[recipe_index], plan.cycle_of(replay), replay * STEPS_PER_REPLAY,
                                    {groups[index].name: result for index, result in results.items()})
            log.results[replay] = event
            state = _writer_step(log, event)
            if replay % len(RECIPES) == 0:
                boundary_step = replay * STEPS_PER_REPLAY + STEPS_PER_REPLAY // 2
                state = _writer_step(log, CycleBoundary(boundary_step))
                state = _writer_step(log, CheckpointCaptured(boundary_step))
            view = gate_view(state, len(log.states))
            log.view = view
        return view

    return program


def _writer_step(log: WriterLog, event: Any) -> GateMachineState:
    """The writer steps the gate through the production writer (manifest included) and checks
    every ``always`` invariant of spec/gate.toml on the step."""
    assert log.writer is not None
    previous = log.writer.state
    effects = log.writer.apply(event)
    new = log.writer.state
    _check_step(previous, event, new, effects, log)
    log.states.append(new)
    log.effects.append(effects)
    return new


def _expected_promotions(plan: Plan) -> set[int]:
    """Oracle: the cycle c whose end checkpoint is verified, for every pair of consecutive clean
    complete cycles (c, c+1) that ends before the SDC taints the gate."""
    unclean = plan.unclean_cycles()
    sdc_cycle = plan.cycle_of(plan.sdc_replay)
    return {
        c
        for c in range(1, plan.cycles)
        if c not in unclean and c + 1 not in unclean and c + 1 < sdc_cycle
    }


@scenario(
    "gate-campaign",
    summary="the two-cycle checkpoint gate over the job: SDC, Inconclusive and missing results "
    "at random recipes and cycles; every invariant checked on every gate step",
    min_ranks=9,
    min_rounds=3,
)
def gate_campaign(params: ScenarioParams) -> ScenarioOutcome:
    cluster = SimCluster(params.ranks, seed=params.seed, scenario="gate-campaign")
    groups = replica_groups(params.ranks, params.group_size)
    if len(groups) < 3 or params.group_size < 3:
        # Three groups carry the three faults; a group of two can detect an SDC but never
        # attribute it (VERDICT: n = 2 disagreeing is Inconclusive).
        raise ValueError(
            f"gate-campaign needs at least 3 peer groups of at least 3 ranks; {params.ranks} ranks "
            f"in groups of {params.group_size} make {len(groups)}"
        )
    index_of = [0] * params.ranks
    for index, group in enumerate(groups):
        for rank in group.ranks:
            index_of[rank] = index
    leaders = Group(tuple(group.ranks[0] for group in groups), "gate-leaders")
    config = GateConfig("gate-campaign", RECIPES, tuple(group.name for group in groups))
    rng = cluster.random
    replays = params.rounds * len(RECIPES)
    # Three different replays for the three faults, and three different groups; the missing one
    # is never group 0, whose leader is the writer. The SDC falls in the second half of the run, so that most runs
    # show clean cycles promoting before it and recovery finding a verified checkpoint after it.
    sdc_replay = rng.randrange(replays // 2 + 1, replays + 1)
    inconclusive_replay, missing_replay = rng.sample([r for r in range(1, replays + 1) if r != sdc_replay], 2)
    missing_group = rng.randrange(1, len(groups))
    sdc_group, inconclusive_group = rng.sample([g for g in range(len(groups)) if g != missing_group], 2)
    sdc_members = groups[sdc_group].ranks[1:]  # a non-leader: its leader still reports
    plan = Plan(
        params.rounds,
        sdc_replay,
        sdc_members[rng.randrange(len(sdc_members))],
        inconclusive_replay,
        inconclusive_group,
        missing_replay,
        missing_group,
    )
    manifest_dir = tempfile.mkdtemp(prefix="scout-gate-campaign-")
    writer = GateWriter.open(manifest_dir, config)
    log = WriterLog(writer=writer)
    faults: list[Any] = [
        Corrupt(plan.sdc_rank, FlipBit(bit=3, leaf=0), start_s=sdc_replay * PERIOD_S, duration_s=0.3),
        Freeze(groups[missing_group].ranks[0], start_s=missing_replay * PERIOD_S - 0.05, duration_s=0.6),
    ]
    # Half of one group (its leader among them) disagrees, each member differently: no value
    # holds a strict majority, so the group's verdict is Inconclusive.
    split = groups[inconclusive_group].ranks
    for offset, rank in enumerate(split[: len(split) // 2 + len(split) % 2]):
        faults.append(Corrupt(rank, FlipBit(bit=5 + offset, leaf=0), start_s=inconclusive_replay * PERIOD_S, duration_s=0.3))
    cluster.spawn(_program(groups, index_of, leaders, plan, config, log))
    cluster.inject(*faults)
    try:
        result = cluster.run()
    finally:
        writer.close()
        shutil.rmtree(manifest_dir, ignore_errors=True)
    return _outcome(params, plan, groups, log, result, faults)


def _outcome(
    params: ScenarioParams, plan: Plan, groups: list[Group], log: WriterLog, result: Any, faults: list[Any]
) -> ScenarioOutcome:
    final = log.states[-1]
    context = final.context
    all_effects = [effect for effects in log.effects for effect in effects]
    reports = [e for e in all_effects if isinstance(e, GateReport)]
    promotions = [e for e in all_effects if isinstance(e, TrustChange) and e.after is Trust.RECOVERY_VERIFIED]
    stride = len(RECIPES) * STEPS_PER_REPLAY
    promoted_cycles = {(p.checkpoint.step - STEPS_PER_REPLAY // 2) // stride for p in promotions}
    expected = _expected_promotions(plan)
    injected = {
        plan.sdc_replay: f"SDC rank {plan.sdc_rank}",
        plan.inconclusive_replay: f"inconclusive {groups[plan.inconclusive_group].name}",
        plan.missing_replay: f"missing {groups[plan.missing_group].name}",
    }
    rows = []
    for cycle in range(1, plan.cycles + 1):
        first, last = (cycle - 1) * len(RECIPES) + 1, cycle * len(RECIPES)
        cycle_reports = [r.kind.value for r in reports if r.cycle == cycle]
        rows.append(
            (
                cycle,
                f"{first * STEPS_PER_REPLAY}..{last * STEPS_PER_REPLAY}",
                "; ".join(f"replay {k} ({RECIPES[(k - 1) % len(RECIPES)]}): {what}" for k, what in sorted(injected.items()) if first <= k <= last) or "-",
                _control_after_cycle(log, cycle),
                _trust_at_end(context, cycle),
                ", ".join(cycle_reports) or "-",
            )
        )
    sdc_result = log.results.get(plan.sdc_replay)
    sdc_reports = [r for r in reports if r.kind is GateReportKind.SDC]
    unchecked = [r for r in reports if r.kind is GateReportKind.UNCHECKED]
    sdc_group = next(group.name for group in groups if plan.sdc_rank in group.ranks)
    views = _final_views(result, params.ranks)
    certified_cycles = {
        record.cycle for e in context.checkpoints if e.certificate is not None for record in (e.certificate.before, e.certificate.after)
    }
    decision = recover(final, FailureClass.SDC)
    checks = [
        Check(
            "every always-invariant of spec/gate.toml held on every gate step",
            not log.violations,
            f"{len(log.states)} gate steps checked" if not log.violations else "; ".join(log.violations[:5]),
        ),
        Check(
            "the injected SDC is reported once as SDC, naming exactly the corrupted rank's group",
            len(sdc_reports) == 1 and sdc_reports[0].groups == (sdc_group,) and sdc_result is not None and sdc_result.result_class.value == "sdc",
            f"SDC reports: {[(r.cycle, r.step, r.groups) for r in sdc_reports]}",
        ),
        Check(
            "after the SDC no CAPTURED or CANDIDATE checkpoint remains (quarantined job-wide)",
            final.control is GateState.TAINTED and not any(e.trust in (Trust.CAPTURED, Trust.CANDIDATE) for e in context.checkpoints),
            f"gate {final.control}; trust: {sorted({e.trust.value for e in context.checkpoints})}",
        ),
        Check(
            "the Inconclusive and the missing results are reported unchecked, never SDC",
            {r.step // STEPS_PER_REPLAY for r in unchecked} >= {plan.inconclusive_replay, plan.missing_replay}
            and all(r.step // STEPS_PER_REPLAY != plan.inconclusive_replay and r.step // STEPS_PER_REPLAY != plan.missing_replay for r in sdc_reports),
            f"unchecked at replays {sorted({r.step // STEPS_PER_REPLAY for r in unchecked})}",
        ),
        Check(
            "promotions happen exactly after two consecutive clean cycles before the SDC (oracle)",
            promoted_cycles == expected,
            f"promoted the checkpoints ending cycles {sorted(promoted_cycles)}; expected {sorted(expected)}",
        ),
        Check(
            "no certificate covers a cycle with an injected fault",
            not (certified_cycles & plan.unclean_cycles()),
            f"certified cycles {sorted(certified_cycles)}; faulty cycles {sorted(plan.unclean_cycles())}",
        ),
        Check(
            "every live rank learned the writer's final gate view (quarantine known everywhere)",
            all(v == log.view for v in views if v is not None),
            f"{sum(v == log.view for v in views)} of {len(views)} ranks hold view {log.view}",
        ),
        Check(
            "recovery after the SDC picks the verified checkpoint when there is one, else none",
            decision.choice is (Choice.VERIFIED if context.verified is not None else Choice.NONE),
            f"{decision.choice.value} ({decision.reason}) {decision.checkpoint or ''}",
        ),
    ]
    fault_lines = [fault.describe() for fault in faults]
    return ScenarioOutcome(columns=COLUMNS, rows=rows, checks=checks, faults=fault_lines, result=result)


def _trust_at_end(context: GateContext, cycle: int) -> str:
    """The checkpoint captured at the end of ``cycle`` and its trust when the run ended."""
    step_ = cycle * len(RECIPES) * STEPS_PER_REPLAY + STEPS_PER_REPLAY // 2
    for entry in context.checkpoints:
        if entry.id.step == step_:
            return f"{entry.id} {entry.trust.value}"
    return "-"


def _control_after_cycle(log: WriterLog, cycle: int) -> str:
    for state in log.states:
        if state.context.cycle == cycle + 1 and state.context.cycle_start_step is not None:
            return state.control
    return log.states[-1].control


def _final_views(result: Any, ranks: int) -> list[View | None]:
    views: list[View | None] = []
    for rank in range(ranks):
        outcome = result.outcomes[(rank, "main")]
        views.append(outcome.value if outcome.state is ProgramState.DONE else None)
    return views
