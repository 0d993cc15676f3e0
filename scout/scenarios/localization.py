"""Simulated scenarios whose checks are the fault campaign's localization criteria (``scout
campaign``, :mod:`scout.scenarios.campaign`), beside those of :mod:`.observer` and :mod:`.exchange`.

* ``sdc-in-evidence``: from round ``SDC_ROUND`` on, one rank computes a wrong signature (one bit
  flipped: SDC in its own computation, so it sends and holds the wrong value). Every rank
  exchanges its signature with its replica group each round and votes with the one verdict rule
  (:func:`scout.core.verdict.classify_exact`); every member of the faulty group must attribute
  exactly that rank, every other vote must agree.
* ``straggler-timing`` / ``straggler-healthy``: every rank times a replay compute each round
  (1 % Gaussian jitter around ``COMPUTE_MS``; the straggler ``factor`` times slower from round
  ``STRAGGLER_ROUND`` on), exchanges the durations with its group, votes with
  :func:`~scout.core.verdict.classify_timing` and steps the sequential straggler test with each
  peer's log ratio (spec/straggler.md STRAG-2, STRAG-4, at its defaults: ``CONFIRM_ROUNDS``
  checks for a straggler 1.5x or slower): the straggler is confirmed by every
  member of its group within ``CONFIRM_ROUNDS`` rounds of the fault, nobody else ever; healthy,
  nobody is ever attributed or confirmed.
* ``observer-observer-dead``: one rank's *observer* dies, then its trainer hangs: the peers'
  observers must still name it (unresponsive: it no longer answers rounds).
* ``observer-partition``: one rank's host is cut off from the network (every message to and from
  it is lost) mid-step: the trainers of its group block, the reachable observers name it
  unresponsive; the cut-off observer, which cannot tell who is at fault, may only report
  inconclusive without naming anyone.

Every run is a pure function of the scenario, ranks and seed (``scout simulate NAME --ranks N
--seed S`` replays it).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any, Final

import attrs

from scout.core.straggler import (
    DEFAULT_SEQUENTIAL_CONFIG,
    Confirmed,
    check_evidence,
    confirmation_start,
    confirmation_step,
)
from scout.core.verdict import MISSING, Status, classify_exact, classify_timing
from scout.scenarios import observer as observer_scenarios
from scout.scenarios.exchange import replica_groups
from scout.scenarios.registry import Check, ScenarioOutcome, ScenarioParams, scenario
from scout.transport.base import Group
from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim.cluster import SimCluster
from scout.transport.sim.faults import Crash, Partition
from scout.transport.sim.process import ProgramState, SimContext

__all__ = ["VoteRecord", "faulty_rank", "straggler_factor"]

PERIOD_S: Final = 1.0  # round k starts at k * PERIOD_S of virtual time
TIMEOUT_S: Final = 0.25  # each exchange's deadline
SDC_ROUND: Final = 3
COMPUTE_MS: Final = 40.0  # replay compute per round, before jitter
JITTER: Final = 0.01  # relative standard deviation of a healthy compute time
STRAGGLER_ROUND: Final = 2
#: The sequential test at its defaults (spec/straggler.md STRAG-4, the replay's default) confirms
#: a straggler 1.5x or slower in this many checks: each adds ln(clip 1.5) - ln(allowance 1.1) =
#: 0.31 nepers towards the bound of 1.0, so 4 checks; the noise guard (STRAG-2) scales down the
#: second slow check, whose spread estimate over three values still spans the change of level, so
#: it takes a fifth (measured: round 6 at every seed and factor).
CONFIRM_ROUNDS: Final = 5
FLOOR_MS: Final = 0.1  # the replay's device floor: no ratio of times below it
STRAGGLER_FACTORS: Final = (1.5, 2.0, 3.0)
_NOW: Final = Now()


def faulty_rank(params: ScenarioParams, name: str) -> int:
    """The rank a scenario injects its fault into: drawn from the seed with a generator of its
    own (so the run's generator is untouched), the same way as :mod:`.observer`'s scenarios."""
    return random.Random(f"{name}:{params.seed}").randrange(params.ranks)


def straggler_factor(params: ScenarioParams) -> float:
    return random.Random(f"straggler-factor:{params.seed}").choice(STRAGGLER_FACTORS)


@attrs.frozen
class VoteRecord:
    """One rank's vote in one round: the verdict's status and the *ranks* it named."""

    round_id: int
    status: Status
    named: tuple[int, ...]
    confirmed: tuple[int, ...] = ()  # stragglers confirmed in this round (ranks)


def _voting_program(
    groups: list[Group],
    index_of: list[int],
    rounds: int,
    evidence: Callable[[SimContext, int, int], Any],
    vote: Callable[[list[Any]], Any],
    confirm: bool,
) -> Callable[[SimContext], Generator[Any, Any, list[VoteRecord]]]:
    """Each round: compute (``evidence`` may sleep and returns the value), exchange it with the
    group under the deadline, vote over the group's values in position order (MISSING for a
    silent peer), and, for timing, step the confirmation machine."""

    def program(ctx: SimContext) -> Generator[Any, Any, list[VoteRecord]]:
        group = groups[index_of[ctx.rank]]
        confirmation = confirmation_start(len(group.ranks), DEFAULT_SEQUENTIAL_CONFIG)
        records: list[VoteRecord] = []
        for round_id in range(1, rounds + 1):
            now_s = yield _NOW
            if now_s < round_id * PERIOD_S:
                yield Sleep(round_id * PERIOD_S - now_s)
            value = yield from evidence(ctx, index_of[ctx.rank], round_id)
            result = yield Exchange(value, round_id=round_id, timeout_s=TIMEOUT_S, group=group)
            values = result.by_position(MISSING)
            verdict = vote(values)
            named = tuple(group.ranks[position] for position in verdict.outliers)
            confirmed: tuple[int, ...] = ()
            if confirm:
                evidence_nepers = check_evidence({"compute": values}, {"compute": verdict}, FLOOR_MS,
                                                 len(group.ranks))
                confirmation, effects = confirmation_step(confirmation, evidence_nepers)
                confirmed = tuple(group.ranks[e.peer] for e in effects if isinstance(e, Confirmed))
            records.append(VoteRecord(round_id, verdict.status, named, confirmed))
        return records

    return program


def _signature(group_index: int, round_id: int) -> int:
    return (group_index * 2654435761 + round_id * 40503 + 12345) % 2**32


def _run(params: ScenarioParams, name: str, evidence: Callable[[SimContext, int, int], Any],
         vote: Callable[[list[Any]], Any], confirm: bool) -> tuple[SimCluster, list[Group], list[list[VoteRecord] | None]]:
    cluster = SimCluster(params.ranks, seed=params.seed, scenario=name)
    groups = replica_groups(params.ranks, params.group_size)
    index_of = [0] * params.ranks
    for index, group in enumerate(groups):
        for rank in group.ranks:
            index_of[rank] = index
    cluster.spawn(_voting_program(groups, index_of, params.rounds, evidence, vote, confirm))
    result = cluster.run()
    records: list[list[VoteRecord] | None] = []
    for rank in range(params.ranks):
        outcome = result.outcomes[(rank, "main")]
        records.append(outcome.value if outcome.state is ProgramState.DONE else None)
    return cluster, groups, records


def _group_of(groups: list[Group], rank: int) -> Group:
    return next(group for group in groups if rank in group.ranks)


def _vote_rows(records: list[list[VoteRecord] | None], rounds: int) -> list[tuple[Any, ...]]:
    rows = []
    for round_id in range(1, rounds + 1):
        statuses: dict[str, int] = {}
        named: set[int] = set()
        confirmed: set[int] = set()
        for mine in records:
            if mine is None or len(mine) < round_id:
                continue
            record = mine[round_id - 1]
            statuses[record.status.value] = statuses.get(record.status.value, 0) + 1
            named.update(record.named)
            confirmed.update(record.confirmed)
        rows.append((round_id, " ".join(f"{k}={v}" for k, v in sorted(statuses.items())),
                     tuple(sorted(named)), tuple(sorted(confirmed))))
    return rows


VOTE_COLUMNS: Final = ("round", "votes", "named", "confirmed")


def _finished(records: list[list[VoteRecord] | None]) -> Check:
    crashed = [rank for rank, mine in enumerate(records) if mine is None]
    return Check("every rank finished every round", not crashed, f"unfinished ranks: {crashed[:8]}")


@scenario("sdc-in-evidence", summary="one rank computes a wrong signature (one bit flipped) from round "
          f"{SDC_ROUND} on; its replica group's votes attribute exactly it, every other vote agrees",
          min_ranks=3, min_rounds=SDC_ROUND)
def sdc_in_evidence(params: ScenarioParams) -> ScenarioOutcome:
    victim = faulty_rank(params, "sdc-in-evidence")
    bit = random.Random(f"sdc-bit:{params.seed}").randrange(32)

    def evidence(ctx: SimContext, group_index: int, round_id: int) -> Generator[Any, Any, int]:
        yield Sleep(0.002 + ctx.random.random() * 0.003)
        value = _signature(group_index, round_id)
        return value ^ (1 << bit) if ctx.rank == victim and round_id >= SDC_ROUND else value

    cluster, groups, records = _run(params, "sdc-in-evidence", evidence, classify_exact, confirm=False)
    faulty_group = _group_of(groups, victim)
    wrong: list[tuple[Any, ...]] = []
    for rank, mine in enumerate(records):
        for record in mine or []:
            in_group = rank in faulty_group.ranks
            if record.round_id >= SDC_ROUND and in_group and len(faulty_group.ranks) >= 3:
                expected: tuple[Status, tuple[int, ...]] = (Status.ATTRIBUTED, (victim,))
            else:
                expected = (Status.AGREE, ())
            if (record.status, record.named) != expected:
                wrong.append((rank, record.round_id, record.status.value, record.named))
    checks = [
        _finished(records),
        Check(f"every vote of rank {victim}'s group from round {SDC_ROUND} attributes exactly rank {victim}; "
              "every other vote agrees", not wrong, f"unexpected votes (rank, round, status, named): {wrong[:6]}"),
    ]
    faults = [f"rank {victim}: bit {bit} of its signature flipped from round {SDC_ROUND} on"]
    return ScenarioOutcome(VOTE_COLUMNS, _vote_rows(records, params.rounds), checks, faults, cluster.result())


def _timing_scenario(params: ScenarioParams, name: str, straggler: int | None, factor: float) -> ScenarioOutcome:
    def evidence(ctx: SimContext, group_index: int, round_id: int) -> Generator[Any, Any, float]:
        scale = factor if ctx.rank == straggler and round_id >= STRAGGLER_ROUND else 1.0
        duration_ms = COMPUTE_MS * scale * max(0.5, 1.0 + ctx.random.gauss(0.0, JITTER))
        began = yield _NOW
        yield Sleep(duration_ms / 1000.0)
        ended = yield _NOW
        return float(round((ended - began) * 1000.0, 6))

    cluster, groups, records = _run(params, name, evidence, classify_timing, confirm=True)
    checks = [_finished(records)]
    confirmed_by: dict[int, list[tuple[int, int]]] = {}
    attributed_other: list[tuple[int, int, tuple[int, ...]]] = []
    for rank, mine in enumerate(records):
        for record in mine or []:
            for who in record.confirmed:
                confirmed_by.setdefault(who, []).append((rank, record.round_id))
            if any(named != straggler for named in record.named):
                attributed_other.append((rank, record.round_id, record.named))
    others = sorted(set(confirmed_by) - {straggler})
    checks.append(Check("no healthy rank is ever named slow or confirmed", not attributed_other and not others,
                        f"named: {attributed_other[:6]}; confirmed: {others[:8]}"))
    faults: list[str] = []
    if straggler is not None:
        group = _group_of(groups, straggler)
        deadline_round = STRAGGLER_ROUND + CONFIRM_ROUNDS - 1
        confirmers = {rank for rank, round_id in confirmed_by.get(straggler, []) if round_id <= deadline_round}
        checks.append(Check(
            f"every member of rank {straggler}'s group confirms it by round {deadline_round} "
            f"({CONFIRM_ROUNDS} checks after the slowdown, the sequential test's bound at its defaults)",
            confirmers == set(group.ranks) or len(group.ranks) < 3,
            f"confirmed by {sorted(confirmers)[:8]} of {len(group.ranks)} peers"))
        faults.append(f"rank {straggler}: replay compute {factor}x slower from round {STRAGGLER_ROUND} on")
    else:
        faults.append(f"none: every rank computes {COMPUTE_MS} ms with {JITTER:.0%} jitter")
    return ScenarioOutcome(VOTE_COLUMNS, _vote_rows(records, params.rounds), checks, faults, cluster.result())


@scenario("straggler-timing", summary="one rank's replay compute is 1.5-3x slower from round "
          f"{STRAGGLER_ROUND} on; its group's timing votes confirm exactly it within {CONFIRM_ROUNDS} rounds",
          min_ranks=3, min_rounds=STRAGGLER_ROUND + CONFIRM_ROUNDS - 1)
def straggler_timing(params: ScenarioParams) -> ScenarioOutcome:
    return _timing_scenario(params, "straggler-timing", faulty_rank(params, "straggler-timing"),
                            straggler_factor(params))


def straggler_confirmation_round(params: ScenarioParams, factor: float) -> tuple[int, int | None]:
    """The straggler-timing scenario with a chosen slowdown ``factor`` (bench/evaluate.py: the
    checks the sequential test needs at 1.2x, 1.5x, 2x): the straggler's rank and the first round
    at which every member of its group had confirmed it (None if that never happened within
    ``params.rounds``). The straggler is slow from round ``STRAGGLER_ROUND`` on."""
    if not factor >= 1.0:
        raise ValueError(f"factor must be >= 1.0 (a slowdown), got {factor!r}")
    straggler = faulty_rank(params, "straggler-timing")
    outcome = _timing_scenario(params, "straggler-timing", straggler, factor)
    group = next(g for g in replica_groups(params.ranks, params.group_size) if straggler in g.ranks)
    # The rows say who was confirmed in a round, not by whom: each member's own votes do.
    confirmed: set[int] = set()
    records = outcome.result.outcomes
    for round_id in range(1, params.rounds + 1):
        for rank in group.ranks:
            program = records.get((rank, "main"))
            votes = program.value if program is not None else None
            if votes and len(votes) >= round_id and straggler in votes[round_id - 1].confirmed:
                confirmed.add(rank)
        if confirmed == set(group.ranks):
            return straggler, round_id
    return straggler, None


@scenario("straggler-healthy", summary=f"every rank's replay compute has {JITTER:.0%} jitter and no straggler: "
          "no timing vote names anyone, nobody is confirmed", min_ranks=2)
def straggler_healthy(params: ScenarioParams) -> ScenarioOutcome:
    return _timing_scenario(params, "straggler-healthy", None, 1.0)


@scenario("observer-observer-dead", summary="one rank's observer dies, then its trainer hangs: the peers' "
          "observers name it unresponsive", min_ranks=3)
def observer_observer_dead(params: ScenarioParams) -> ScenarioOutcome:
    name = "observer-observer-dead"
    rank = observer_scenarios.faulty_rank(params, name)
    crash = Crash(rank, at_s=observer_scenarios.FREEZE_AT_S, programs=("observer",))
    return observer_scenarios.single_rank_outcome(
        params, name, rank, (crash,), "unresponsive",
        behaviour=lambda r, step: "hold" if r == rank and step == observer_scenarios.FAULT_STEP else "normal",
        latency_max_s=observer_scenarios.unresponsive_latency_max_s(),
        described=[crash.describe(), f"rank {rank}: hold at step {observer_scenarios.FAULT_STEP}"],
        quiet_rank=rank)


@scenario("observer-partition", summary="one rank's host is cut off from the network mid-step: its group's "
          "reachable observers name it unresponsive; the cut-off one names nobody", min_ranks=3)
def observer_partition(params: ScenarioParams) -> ScenarioOutcome:
    name = "observer-partition"
    rank = observer_scenarios.faulty_rank(params, name)
    cut = Partition({rank}, frozenset(range(params.ranks)) - {rank}, start_s=observer_scenarios.FREEZE_AT_S,
                    duration_s=observer_scenarios.HOLD_S)
    return observer_scenarios.single_rank_outcome(
        params, name, rank, (cut,), "unresponsive", latency_max_s=observer_scenarios.unresponsive_latency_max_s(),
        described=[cut.describe()], isolated=rank, stall_s=cut.start_s)
