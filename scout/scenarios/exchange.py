"""Built-in scenarios of ``scout simulate``: the transport contract under faults, at any size.

Every scenario runs the same shape of job. Ranks are split into replica groups (the peers that
compare evidence, ``--group-size``). Round ``k`` starts at ``k * PERIOD_S`` of virtual time: each
rank computes for a few jittered milliseconds, then exchanges (or all-gathers) one piece of
evidence with its group under ``TIMEOUT_S``. A rank that comes back from a freeze after a round's
start has passed skips that round, as a periodic observer would. Faults are placed between rounds
2 and 3 and heal before round 5 (``AFFECTED_ROUNDS``), so each run shows healthy rounds, faulty
rounds and recovery. The faulty rank is drawn from the run's seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import attrs

from scout.scenarios.registry import Check, ScenarioOutcome, ScenarioParams, scenario
from scout.transport.base import DeadlineExceeded, Group
from scout.transport.program import AllGather, Exchange, Now, Sleep
from scout.transport.sim.cluster import SimCluster, SimulationResult
from scout.transport.sim.faults import Corrupt, Crash, Delay, FlipBit, Freeze, Partition
from scout.transport.sim.process import ProgramState, SimContext

__all__ = ["RoundRecord", "replica_groups"]

PERIOD_S = 1.0  # round k starts at k * PERIOD_S
TIMEOUT_S = 0.25  # deadline of every exchange and collective
COMPUTE_S = 0.002  # work before each round, plus up to COMPUTE_JITTER_S drawn from the seed
COMPUTE_JITTER_S = 0.003
FAULT_START_S = 2.5  # after round 2 ...
FAULT_DURATION_S = 2.1  # ... until 4.6 s: rounds 3 and 4 are affected, round 5 is not
AFFECTED_ROUNDS = (3, 4)
STRAGGLER_DELAY_S = 0.4  # longer than TIMEOUT_S: the straggler's answers arrive late
_DEADLINE_SLACK_S = 1e-9  # float rounding of start + timeout

_NOW = Now()  # ops are frozen values: one instance serves every yield

COLUMNS = ("round", "answered", "missing", "partial", "t_virtual_s")


@attrs.frozen
class RoundRecord:
    """What one rank saw in one round."""

    round_id: int
    # "complete"; "partial" (an exchange at its deadline); "deadline" (a collective); "skipped"
    outcome: str
    op: str  # "exchange" or "all_gather"
    began_s: float
    ended_s: float
    missing: tuple[int, ...] = ()
    received: dict[int, Any] = attrs.field(factory=dict, eq=False)


def replica_groups(ranks: int, group_size: int) -> list[Group]:
    """Consecutive groups of ``group_size`` ranks; a remainder joins the last group."""
    count = max(1, ranks // group_size)
    groups = []
    for index in range(count):
        first = index * group_size
        last = ranks if index == count - 1 else first + group_size
        groups.append(Group(tuple(range(first, last)), f"replicas-{index}"))
    return groups


def _group_index(groups: list[Group], ranks: int) -> list[int]:
    index_of = [0] * ranks
    for index, group in enumerate(groups):
        for rank in group.ranks:
            index_of[rank] = index
    return index_of


def _signature(group_index: int, round_id: int) -> int:
    """Evidence every healthy member of a group computes alike (a stand-in for a checksum)."""
    return (group_index * 2654435761 + round_id * 40503 + 12345) % 2**32


Evidence = Callable[[int, int, int], Any]  # (group index, round, rank) -> payload


def _rank_evidence(group_index: int, round_id: int, rank: int) -> Any:
    return (rank, round_id)


def _group_evidence(group_index: int, round_id: int, rank: int) -> Any:
    return _signature(group_index, round_id)


def _paced_program(
    groups: list[Group], index_of: list[int], rounds: int, evidence: Evidence, op: str
) -> Callable[[SimContext], Generator[Any, Any, list[RoundRecord]]]:
    def program(ctx: SimContext) -> Generator[Any, Any, list[RoundRecord]]:
        group_index = index_of[ctx.rank]
        group = groups[group_index]
        use_exchange = op == "exchange"
        records: list[RoundRecord] = []
        for round_id in range(1, rounds + 1):
            start_s = round_id * PERIOD_S
            now_s = yield _NOW
            if now_s < start_s:
                yield Sleep(start_s - now_s)
                now_s = yield _NOW  # later than start_s if the rank was frozen meanwhile
            if now_s > start_s + PERIOD_S / 2:
                records.append(RoundRecord(round_id, "skipped", "-", now_s, now_s))
                continue
            yield Sleep(COMPUTE_S + ctx.random.random() * COMPUTE_JITTER_S)
            began_s = yield _NOW
            payload = evidence(group_index, round_id, ctx.rank)
            if use_exchange:
                result = yield Exchange(
                    payload, round_id=round_id, timeout_s=TIMEOUT_S, group=group
                )
                ended_s = yield _NOW
                outcome = "complete" if result.complete else "partial"
                records.append(
                    RoundRecord(
                        round_id,
                        outcome,
                        "exchange",
                        began_s,
                        ended_s,
                        result.missing,
                        dict(result.answers),
                    )
                )
                continue
            try:
                values = yield AllGather(payload, timeout_s=TIMEOUT_S, group=group)
            except DeadlineExceeded as exc:
                ended_s = yield _NOW
                records.append(
                    RoundRecord(round_id, "deadline", "all_gather", began_s, ended_s, exc.missing)
                )
                # Contract guarantee 3: after a collective deadline the group may be unusable
                # for collectives; the exchange keeps working.
                use_exchange = True
            else:
                ended_s = yield _NOW
                records.append(
                    RoundRecord(
                        round_id,
                        "complete",
                        "all_gather",
                        began_s,
                        ended_s,
                        (),
                        dict(zip(group.ranks, values, strict=True)),
                    )
                )
        return records

    return program


@attrs.define
class _Job:
    """One built scenario: the cluster, its groups, and helpers to read what happened."""

    params: ScenarioParams
    cluster: SimCluster
    groups: list[Group]
    index_of: list[int]
    faults: list[str] = attrs.field(factory=list)

    @classmethod
    def build(cls, name: str, params: ScenarioParams, evidence: Evidence, op: str) -> _Job:
        cluster = SimCluster(params.ranks, seed=params.seed, scenario=name)
        groups = replica_groups(params.ranks, params.group_size)
        index_of = _group_index(groups, params.ranks)
        cluster.spawn(_paced_program(groups, index_of, params.rounds, evidence, op))
        return cls(params, cluster, groups, index_of)

    def pick_rank(self) -> int:
        return int(self.cluster.random.randrange(self.params.ranks))

    def peers(self, rank: int) -> list[int]:
        return [peer for peer in self.groups[self.index_of[rank]].ranks if peer != rank]

    def inject(self, *faults: Any) -> None:
        self.cluster.inject(*faults)
        self.faults.extend(fault.describe() for fault in faults)

    def run(self) -> SimulationResult:
        return self.cluster.run()


def _records(result: SimulationResult, ranks: int) -> list[list[RoundRecord] | None]:
    """Each rank's round records; None for a rank whose program did not finish (crashed)."""
    out: list[list[RoundRecord] | None] = []
    for rank in range(ranks):
        outcome = result.outcomes[(rank, "main")]
        out.append(outcome.value if outcome.state is ProgramState.DONE else None)
    return out


def _round_rows(records: list[list[RoundRecord] | None], rounds: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for round_id in range(1, rounds + 1):
        took_part: list[int] = []
        named: set[int] = set()
        partial = 0
        latest_s = 0.0
        for rank, mine in enumerate(records):
            if mine is None or len(mine) < round_id:
                named.add(rank)
                continue
            record = mine[round_id - 1]
            if record.outcome == "skipped":
                continue
            took_part.append(rank)
            named.update(record.missing)
            partial += record.outcome != "complete"
            latest_s = max(latest_s, record.ended_s)
        answered = sum(1 for rank in took_part if rank not in named)
        rows.append((round_id, answered, tuple(sorted(named)), partial, round(latest_s, 6)))
    return rows


def _check_deadlines(
    records: list[list[RoundRecord] | None], exempt: frozenset[int] = frozenset()
) -> Check:
    late = []
    for rank, mine in enumerate(records):
        if mine is None or rank in exempt:
            continue
        for record in mine:
            if record.ended_s - record.began_s > TIMEOUT_S + _DEADLINE_SLACK_S:
                late.append((rank, record.round_id, round(record.ended_s - record.began_s, 6)))
    return Check(
        "nobody waits past its deadline",
        not late,
        f"every op returned within timeout_s={TIMEOUT_S}"
        if not late
        else f"(rank, round, waited_s) past the deadline: {late[:8]}",
    )


def _check_complete_rounds(
    records: list[list[RoundRecord] | None], rounds: list[int], ranks: list[int], name: str
) -> Check:
    bad: list[tuple[Any, ...]] = []
    for rank in ranks:
        mine = records[rank]
        if mine is None:
            bad.append((rank, "crashed"))
            continue
        for round_id in rounds:
            if round_id <= len(mine) and mine[round_id - 1].outcome != "complete":
                record = mine[round_id - 1]
                bad.append((rank, round_id, record.outcome, record.missing))
    return Check(
        name,
        not bad,
        f"{len(ranks)} ranks, rounds {rounds[:1] + rounds[-1:] if rounds else []} complete"
        if not bad
        else f"not complete: {bad[:8]}",
    )


def _check_named_missing(
    records: list[list[RoundRecord] | None],
    expected: dict[int, tuple[int, ...]],
    rounds: tuple[int, ...],
    name: str,
    outcome: str = "partial",
) -> Check:
    """Each rank in ``expected`` named exactly ``expected[rank]`` missing in ``rounds``."""
    wrong: list[tuple[Any, ...]] = []
    for rank, missing in expected.items():
        mine = records[rank]
        for round_id in rounds:
            if mine is None or round_id > len(mine):
                wrong.append((rank, round_id, "no record"))
                continue
            record = mine[round_id - 1]
            if record.outcome != outcome or record.missing != missing:
                wrong.append((rank, round_id, record.outcome, record.missing, "expected", missing))
    return Check(
        name,
        not wrong,
        f"{len(expected)} ranks named the expected missing peers in rounds {list(rounds)}"
        if not wrong
        else f"unexpected: {wrong[:6]}",
    )


def _later_rounds(params: ScenarioParams) -> list[int]:
    return list(range(AFFECTED_ROUNDS[-1] + 1, params.rounds + 1))


def _outcome(
    job: _Job,
    result: SimulationResult,
    checks: list[Check],
    rows: list[tuple[Any, ...]] | None = None,
    columns: tuple[str, ...] = COLUMNS,
) -> ScenarioOutcome:
    records = _records(result, job.params.ranks)
    return ScenarioOutcome(
        columns=columns,
        rows=rows if rows is not None else _round_rows(records, job.params.rounds),
        checks=checks,
        faults=job.faults,
        result=result,
    )


@scenario(
    "exchange-healthy",
    summary="every rank exchanges evidence with its replica group each round; all answer",
)
def exchange_healthy(params: ScenarioParams) -> ScenarioOutcome:
    job = _Job.build("exchange-healthy", params, _rank_evidence, "exchange")
    result = job.run()
    records = _records(result, params.ranks)
    wrong_values = []
    for rank, mine in enumerate(records):
        for record in mine or []:
            for peer, value in record.received.items():
                if value != (peer, record.round_id):
                    wrong_values.append((rank, record.round_id, peer, value))
    checks = [
        _check_complete_rounds(
            records,
            list(range(1, params.rounds + 1)),
            list(range(params.ranks)),
            "every exchange is complete",
        ),
        Check(
            "every answer is the value its peer sent",
            not wrong_values,
            "all answers match" if not wrong_values else f"wrong: {wrong_values[:6]}",
        ),
        _check_deadlines(records),
    ]
    return _outcome(job, result, checks)


@scenario(
    "exchange-silent-peer",
    summary="one rank is frozen (SIGSTOP) for two rounds; its peers name it missing at the "
    "deadline, nobody hangs, it rejoins after",
    min_ranks=2,
    min_rounds=AFFECTED_ROUNDS[-1],
)
def exchange_silent_peer(params: ScenarioParams) -> ScenarioOutcome:
    job = _Job.build("exchange-silent-peer", params, _rank_evidence, "exchange")
    victim = job.pick_rank()
    job.inject(Freeze(rank=victim, start_s=FAULT_START_S, duration_s=FAULT_DURATION_S))
    result = job.run()
    records = _records(result, params.ranks)
    peers = job.peers(victim)
    victim_records = records[victim] or []
    skipped = [r.round_id for r in victim_records if r.outcome == "skipped"]
    stale = result.outcomes[(victim, "main")].stats.late_or_wrong_round_dropped
    checks = [
        _check_named_missing(
            records,
            {peer: (victim,) for peer in peers},
            AFFECTED_ROUNDS,
            f"peers of frozen rank {victim} name it missing at the deadline",
        ),
        Check(
            f"frozen rank {victim} skips the rounds it slept through",
            skipped == list(AFFECTED_ROUNDS),
            f"skipped rounds {skipped}",
        ),
        _check_complete_rounds(
            records,
            _later_rounds(params),
            list(range(params.ranks)),
            "every exchange is complete again after the thaw",
        ),
        Check(
            "the thawed rank drops and counts the answers of rounds it skipped",
            stale == len(peers) * len(AFFECTED_ROUNDS) or params.rounds == AFFECTED_ROUNDS[-1],
            f"late_or_wrong_round_dropped={stale} (expected {len(peers) * len(AFFECTED_ROUNDS)})",
        ),
        _check_deadlines(records),
    ]
    return _outcome(job, result, checks)


@scenario(
    "exchange-partition",
    summary="even and odd ranks are partitioned for two rounds; each side names the other "
    "missing, then the exchange heals",
    min_ranks=2,
    min_rounds=AFFECTED_ROUNDS[-1],
)
def exchange_partition(params: ScenarioParams) -> ScenarioOutcome:
    job = _Job.build("exchange-partition", params, _rank_evidence, "exchange")
    even = frozenset(range(0, params.ranks, 2))
    odd = frozenset(range(1, params.ranks, 2))
    job.inject(
        Partition(side_a=even, side_b=odd, start_s=FAULT_START_S, duration_s=FAULT_DURATION_S)
    )
    result = job.run()
    records = _records(result, params.ranks)
    expected = {}
    for rank in range(params.ranks):
        across = tuple(peer for peer in job.peers(rank) if peer % 2 != rank % 2)
        if across:
            expected[rank] = across
    checks = [
        _check_named_missing(
            records,
            expected,
            AFFECTED_ROUNDS,
            "each rank names exactly its peers across the partition missing",
        ),
        _check_complete_rounds(
            records,
            _later_rounds(params),
            list(range(params.ranks)),
            "every exchange is complete again after the partition heals",
        ),
        _check_deadlines(records),
    ]
    return _outcome(job, result, checks)


@scenario(
    "exchange-straggler",
    summary="one rank's messages are delayed past the deadline for two rounds; its peers name "
    "it missing and count its late answers",
    min_ranks=2,
    min_rounds=AFFECTED_ROUNDS[-1],
)
def exchange_straggler(params: ScenarioParams) -> ScenarioOutcome:
    job = _Job.build("exchange-straggler", params, _rank_evidence, "exchange")
    victim = job.pick_rank()
    job.inject(
        Delay(
            ranks={victim},
            extra_latency_s=STRAGGLER_DELAY_S,
            direction="from",
            start_s=FAULT_START_S,
            duration_s=FAULT_DURATION_S,
        )
    )
    result = job.run()
    records = _records(result, params.ranks)
    peers = job.peers(victim)
    late = {
        peer: result.outcomes[(peer, "main")].stats.late_or_wrong_round_dropped for peer in peers
    }
    expected_late = len(AFFECTED_ROUNDS)
    checks = [
        _check_named_missing(
            records,
            {peer: (victim,) for peer in peers},
            AFFECTED_ROUNDS,
            f"peers of straggler {victim} name it missing at the deadline",
        ),
        Check(
            "each peer drops and counts the straggler's late answers",
            all(count == expected_late for count in late.values()),
            f"late_or_wrong_round_dropped by peer: {dict(list(late.items())[:8])} "
            f"(expected {expected_late} each)",
        ),
        _check_complete_rounds(
            records,
            list(range(1, params.rounds + 1)),
            [victim],
            f"straggler {victim} itself hears everyone (only its sends are slow)",
        ),
        _check_deadlines(records),
    ]
    return _outcome(job, result, checks)


@scenario(
    "crash-during-allgather",
    summary="ranks all-gather evidence in their replica group; one rank crashes while its peers "
    "wait in the all-gather: DeadlineExceeded names it, then the exchange carries on",
    min_ranks=2,
    min_rounds=AFFECTED_ROUNDS[0],
)
def crash_during_allgather(params: ScenarioParams) -> ScenarioOutcome:
    job = _Job.build("crash-during-allgather", params, _rank_evidence, "all_gather")
    victim = job.pick_rank()
    crash_round = AFFECTED_ROUNDS[0]
    # Half-way through the victim's compute: its peers are already inside the all-gather.
    job.inject(Crash(rank=victim, at_s=crash_round * PERIOD_S + COMPUTE_S / 2))
    result = job.run()
    records = _records(result, params.ranks)
    peers = job.peers(victim)
    after = tuple(range(crash_round + 1, params.rounds + 1))
    others = [rank for rank in range(params.ranks) if rank != victim and rank not in peers]
    order_wrong = []
    for rank in others:
        for record in records[rank] or []:
            group = job.groups[job.index_of[rank]]
            expected_values = {peer: (peer, record.round_id) for peer in group.ranks}
            if record.received != expected_values:
                order_wrong.append((rank, record.round_id))
    checks = [
        _check_named_missing(
            records,
            {peer: (victim,) for peer in peers},
            (crash_round,),
            f"peers of crashed rank {victim} get DeadlineExceeded naming it",
            outcome="deadline",
        ),
        _check_named_missing(
            records,
            {peer: (victim,) for peer in peers},
            after,
            "then they fall back to the exchange, which names it missing",
        ),
        _check_complete_rounds(
            records,
            list(range(1, params.rounds + 1)),
            others,
            "other groups complete every all-gather",
        ),
        Check(
            "all-gather results are ordered by peer position",
            not order_wrong,
            "every result matches its group's order" if not order_wrong else f"{order_wrong[:6]}",
        ),
        Check(
            f"rank {victim} crashed, every other rank finished",
            result.outcomes[(victim, "main")].state is ProgramState.CRASHED
            and len(result.unfinished()) == 1,
            f"unfinished: {[(o.rank, o.state.value) for o in result.unfinished()][:8]}",
        ),
        _check_deadlines(records),
    ]
    rows = []
    for round_id in range(1, params.rounds + 1):
        completed = deadline = 0
        named: set[int] = set()
        latest_s = 0.0
        for rank, mine in enumerate(records):
            if mine is None:  # the crashed rank: it completed the rounds before its crash
                if round_id >= crash_round:
                    named.add(rank)
                else:
                    completed += 1
                continue
            record = mine[round_id - 1]
            completed += record.outcome == "complete"
            deadline += record.outcome in ("deadline", "partial")
            named.update(record.missing)
            latest_s = max(latest_s, record.ended_s)
        op = "all_gather" if round_id <= crash_round else "mixed"
        rows.append((round_id, op, completed, deadline, tuple(sorted(named)), round(latest_s, 6)))
    columns = ("round", "op", "completed", "deadline", "missing", "t_virtual_s")
    return _outcome(job, result, checks, rows, columns)


@scenario(
    "corrupt-evidence",
    summary="one rank's evidence has a bit flipped from round 3 on (silent data corruption); "
    "every peer receives the corrupted value",
    min_ranks=2,
    min_rounds=AFFECTED_ROUNDS[0],
)
def corrupt_evidence(params: ScenarioParams) -> ScenarioOutcome:
    job = _Job.build("corrupt-evidence", params, _group_evidence, "exchange")
    victim = job.pick_rank()
    bit = int(job.cluster.random.randrange(32))
    job.inject(Corrupt(rank=victim, rewrite=FlipBit(bit=bit), start_s=FAULT_START_S))
    result = job.run()
    records = _records(result, params.ranks)
    first_bad = AFFECTED_ROUNDS[0]
    wrong = []
    rows = []
    for round_id in range(1, params.rounds + 1):
        corrupted_from: set[int] = set()
        named: set[int] = set()
        answered = 0
        latest_s = 0.0
        for rank, mine in enumerate(records):
            record = (mine or [])[round_id - 1]
            truth = _signature(job.index_of[rank], round_id)
            named.update(record.missing)
            answered += record.outcome == "complete"
            latest_s = max(latest_s, record.ended_s)
            for peer, value in record.received.items():
                corrupted = peer == victim and round_id >= first_bad
                expected = truth ^ (1 << bit) if corrupted else truth
                if value != truth:
                    corrupted_from.add(peer)
                if value != expected:
                    wrong.append((rank, round_id, peer, value, expected))
        rows.append(
            (
                round_id,
                answered,
                tuple(sorted(named)),
                tuple(sorted(corrupted_from)),
                round(latest_s, 6),
            )
        )
    checks = [
        Check(
            f"every peer of rank {victim} receives its evidence with bit {bit} flipped from "
            f"round {first_bad} on, and everyone else's intact",
            not wrong,
            "received values are exactly as injected" if not wrong else f"unexpected: {wrong[:4]}",
        ),
        Check(
            "the corruption is visible only in the victim's group",
            all(row[3] == ((victim,) if row[0] >= first_bad else ()) for row in rows),
            f"ranks whose value was wrong, by round: {[row[3] for row in rows]}",
        ),
        _check_deadlines(records),
    ]
    columns = ("round", "answered", "missing", "corrupted_from", "t_virtual_s")
    return _outcome(job, result, checks, rows, columns)
