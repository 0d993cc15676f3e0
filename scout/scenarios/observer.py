"""The observer on the simulator: every simulated rank runs the production observer driver
(:func:`scout.observer.driver.drive`, the same function object the observer process runs) as its
``observer`` program, beside a simulated ``trainer`` program.

The trainer publishes its progress -- step, op counter, the fingerprint of the collective in
flight, the stage -- into its rank's ``ctx.shared`` (the simulator's stand-in for the
shared-memory progress record) and all-gathers with its replica group once per step. The
driver's world here is the virtual clock, that record and the trainer program's state; its ops
are answered with the simulator's messaging ops (datagrams carry the same bytes as on UDP). It
stops when the record says "closed" or the trainer program is gone (crashed), as the process
stops at its trainer's exit.

The scenarios registered here (``scout simulate observer-...``) run at any size; the peer group
of each observer is its replica group (``--group-size``, default 8), so traffic is bounded by the
group size, not the world.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any, Final

import attrs

from scout.core.drive import SimHandler, drive_sim
from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.core.observer import ObserverConfig, Progress, Stage, StallReport
from scout.observer import driver, wire
from scout.observer.driver import ObserverRun, Pause, Receive, Transmit
from scout.reports import record_line
from scout.scenarios.exchange import replica_groups
from scout.scenarios.registry import Check, ScenarioOutcome, ScenarioParams, scenario
from scout.transport.base import DeadlineExceeded, Group
from scout.transport.program import AllGather, Barrier, Now, Sleep
from scout.transport.sim import ops as sim_ops
from scout.transport.sim.cluster import SimCluster
from scout.transport.sim.faults import Crash, Freeze
from scout.transport.sim.process import ProgramState, SimContext

__all__ = ["OBSERVER_CONFIG", "ObserverRun", "SimJob", "faulty_rank", "run_job", "single_rank_outcome",
           "unresponsive_latency_max_s"]

# The thresholds of the real-process tests (tests/observer/test_observer_runtime.py FAST).
OBSERVER_CONFIG: Final[dict[str, Any]] = dict(
    stall_threshold_s=1.0, settle_idle_s=0.5, round_deadline_s=0.5, recheck_interval_s=1.0,
    join_deadline_s=30.0, attach_deadline_s=30.0,
)
POLL_INTERVAL_S: Final = 0.05  # as the observer process polls while it joins and attaches
WATCH_INTERVAL_S: Final = 5.0  # as it reads its record while it watches (DRIVER-6, launch.WATCH_INTERVAL_S)
STEPS: Final = 6
HEALTHY_STEPS: Final = 40  # the healthy job runs several thresholds long
LAYERS: Final = 3  # forward publishes per step
LAYER_S: Final = 0.02  # compute per layer, plus up to LAYER_JITTER_S drawn from the seed
LAYER_JITTER_S: Final = 0.01
FAULT_STEP: Final = 3
HOLD_S: Final = 4.0  # how long the faulty rank (or group) holds back
COLLECTIVE_TIMEOUT_S: Final = 8.0  # the trainers' collective timeout (NCCL's is minutes)
STUCK_S: Final = 1.0  # a trainer whose collective failed stays stuck this long, then exits
SLOW_STEP_S: Final = 0.7  # healthy scenario: some steps this much slower, under the threshold
DETECTION_LATENCY_MAX_S: Final = 1.0  # OBS-2: within about a second of the threshold
OBSERVER_STOP_MAX_S: Final = 2.0  # OBS-8: an observer exits within 2 s of its trainer

FP_ALL_REDUCE: Final = fingerprint(CollectiveCall("all_reduce", None, (TensorMeta("torch.float32", (4,)),),
                                                  reduce_op="SUM"))
FP_BARRIER: Final = fingerprint(CollectiveCall("barrier"))

_NOW: Final = Now()
_RECORD: Final = "scout.progress"  # ctx.shared keys: the record, its closed flag, the stall start
_CLOSED: Final = "scout.progress.closed"
_PUBLISHED: Final = "scout.progress.published_s"
_STALLED_AT: Final = "scout.stall_started_s"


@attrs.define
class SimJob:
    """One simulated training job with observers: the cluster, the groups, and what the
    observers reported (``(virtual time, record)``, record as in docs/observer.md)."""

    cluster: SimCluster
    groups: list[Group]
    group_of: list[int]
    reports: list[tuple[float, dict[str, Any]]] = attrs.field(factory=list)
    failures: list[tuple[int, str]] = attrs.field(factory=list)
    trainer_ended_s: dict[int, float] = attrs.field(factory=dict)


def _publish(shared: dict[str, Any], step: int, op: int, fp: int = 0, stage: Stage = Stage.COMPUTE,
             *, at_s: float) -> None:
    shared[_RECORD] = Progress(step, op, fp, stage)
    shared[_PUBLISHED] = at_s  # DRIVER-4: the record carries its publish time


def _trainer(job: SimJob, behaviour: Callable[[int, int], str], steps: int) -> Callable[[SimContext], Generator[Any, Any, None]]:
    """``behaviour(rank, step)`` says what the rank does before its step's collective:
    ``"normal"``, ``"hold"`` (sleeps with no publish: behind), ``"other"`` (enters a barrier where
    the others all-gather: desync), ``"fabric"`` (enters the collective, which makes no progress
    for HOLD_S: the whole group stalls in it), ``"slow"`` (a slow step under the threshold)."""

    def program(ctx: SimContext) -> Generator[Any, Any, None]:
        shared = ctx.shared
        group = job.groups[job.group_of[ctx.rank]]
        try:
            for step in range(1, steps + 1):
                _publish(shared, step, 0, at_s=job.cluster.now_s)
                for layer in range(1, LAYERS + 1):
                    yield Sleep(LAYER_S + ctx.random.random() * LAYER_JITTER_S)
                    _publish(shared, step, layer, at_s=job.cluster.now_s)
                what = behaviour(ctx.rank, step)
                if what in ("hold", "slow"):
                    if what == "hold":
                        shared[_STALLED_AT] = yield _NOW
                    yield Sleep(HOLD_S if what == "hold" else SLOW_STEP_S)
                fp = FP_BARRIER if what == "other" else FP_ALL_REDUCE
                _publish(shared, step, LAYERS + 1, fp, Stage.COLLECTIVE, at_s=job.cluster.now_s)
                if what in ("other", "fabric"):
                    shared[_STALLED_AT] = yield _NOW
                if what == "fabric":
                    yield Sleep(HOLD_S)
                try:
                    if what == "other":
                        yield Barrier(COLLECTIVE_TIMEOUT_S, group)
                    else:
                        yield AllGather(step, COLLECTIVE_TIMEOUT_S, group)
                except DeadlineExceeded:
                    yield Sleep(STUCK_S)  # stuck, as a rank waiting on a dead peer would be
                    return
                _publish(shared, step, LAYERS + 2, at_s=job.cluster.now_s)
        finally:
            shared[_CLOSED] = True
            job.trainer_ended_s[ctx.rank] = job.cluster.now_s

    return program


class _SimWorld:
    """The simulated rank's side of :class:`~scout.observer.driver.ObserverWorld`: the virtual
    clock, the trainer program's state and its ``ctx.shared`` record, reports into the job."""

    def __init__(self, job: SimJob, ctx: SimContext, group: tuple[int, ...]) -> None:
        self.job = job
        self.ctx = ctx
        self.group = group

    def now(self) -> float:
        return self.job.cluster.now_s

    def trainer_exit(self) -> bool | None:
        if self.job.cluster.state(self.ctx.rank, "trainer") is ProgramState.CRASHED:
            return False
        return True if self.ctx.shared.get(_CLOSED) else None

    def read_progress(self) -> Progress | None:
        progress: Progress | None = self.ctx.shared.get(_RECORD)
        return progress

    def published_s(self) -> float | None:
        published: float | None = self.ctx.shared.get(_PUBLISHED)
        return published

    def join(self) -> bool | str:
        return True  # the simulator has no rendezvous to wait for: the group is known at spawn

    def emit(self, report: StallReport) -> None:
        record = wire.report_record(report, group_ranks=self.group, job_id="sim", generation=0)
        self.job.reports.append((self.job.cluster.now_s, record))

    def fail(self, reason: str) -> None:
        self.job.failures.append((self.ctx.rank, reason))


def _answers(group: tuple[int, ...]) -> dict[type, SimHandler]:
    """The driver's ops (``DriverOp``) answered with the simulator's: the sim's executor of the
    one driver."""

    def receive(op: Receive) -> Generator[Any, Any, list[tuple[int, bytes]]]:
        delivered = yield sim_ops.Receive(op.timeout_s)
        return [] if delivered is None or delivered.src not in group else [(group.index(delivered.src), delivered.payload)]

    def transmit(op: Transmit) -> Generator[Any, Any, None]:
        yield sim_ops.Send(group[op.to], op.body)

    def pause(op: Pause) -> Generator[Any, Any, None]:
        yield Sleep(op.timeout_s)

    return {Receive: receive, Transmit: transmit, Pause: pause}


def _observer(job: SimJob, config_fields: dict[str, Any]) -> Callable[[SimContext], Generator[Any, Any, ObserverRun]]:
    machine = driver.load_observer_machine()

    def program(ctx: SimContext) -> Generator[Any, Any, ObserverRun]:
        group = job.groups[job.group_of[ctx.rank]].ranks
        config = ObserverConfig(group.index(ctx.rank), len(group), **config_fields)
        world = _SimWorld(job, ctx, group)
        # The production driver, looked up at run time (a test replaces it to prove it runs here).
        watch_s = min(WATCH_INTERVAL_S, config.stall_threshold_s)
        run: ObserverRun = yield from drive_sim(driver.drive(config, world, poll_interval_s=POLL_INTERVAL_S,
                                                             watch_interval_s=watch_s, machine=machine),
                                                _answers(group), who="the simulated observer")
        run.rank = ctx.rank
        return run

    return program


def run_job(
    params: ScenarioParams,
    name: str,
    behaviour: Callable[[int, int], str],
    *,
    faults: tuple[Any, ...] = (),
    config: dict[str, Any] | None = None,
    steps: int = STEPS,
) -> SimJob:
    cluster = SimCluster(params.ranks, seed=params.seed, scenario=name)
    groups = replica_groups(params.ranks, params.group_size)
    group_of = [0] * params.ranks
    for index, group in enumerate(groups):
        for rank in group.ranks:
            group_of[rank] = index
    job = SimJob(cluster, groups, group_of)
    cluster.spawn(_trainer(job, behaviour, steps), name="trainer")
    cluster.spawn(_observer(job, {**OBSERVER_CONFIG, **(config or {})}), name="observer")
    cluster.inject(*faults)
    cluster.run()
    return job


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------

COLUMNS: Final = ("t_virtual_s", "kind", "scope", "outcome", "attributed", "missing", "stuck_at", "reporter",
                  "idle_s", "latency_s")


def _threshold_s() -> float:
    return float(OBSERVER_CONFIG["stall_threshold_s"])


def _runs(job: SimJob) -> list[ObserverRun]:
    return [outcome.value for outcome in job.cluster.result().outcomes.values()
            if outcome.program == "observer" and isinstance(outcome.value, ObserverRun)]


def _rows(job: SimJob, stall_s: float | None) -> list[tuple[Any, ...]]:
    rows = []
    for time_s, record in job.reports:
        latency = "-" if stall_s is None else round(time_s - stall_s - _threshold_s(), 3)
        found = record["evidence"]
        where = found["stuck_position"]
        rows.append((round(time_s, 3), record["kind"], found["scope"], found["finding"],
                     tuple(found["attributed_ranks"]), tuple(found["missing_ranks"]),
                     f"{where['step']}/{where['op']}", record["reporter_rank"], found["idle_s"], latency))
    return rows


def _common_checks(job: SimJob, faulty_group: int | None, *, dead_observer: int | None = None,
                   isolated: int | None = None) -> list[Check]:
    """Every observer stopped after its trainer; observers of healthy groups sent nothing; one
    report per stuck position (OBS-6). ``dead_observer``: that rank's observer was killed, so it
    never stops; ``isolated``: that rank's observer was cut off, so its own view does not count
    towards OBS-6 (it cannot coordinate with its group)."""
    runs = _runs(job)
    checks = []
    expected = job.cluster.size - (dead_observer is not None)
    stopped = [r for r in runs if r.stopped_s is not None]
    checks.append(Check("every observer stopped with its trainer", len(stopped) == expected,
                        f"{len(stopped)} of {expected} observers stopped"))
    late = [r.rank for r in stopped if r.rank in job.trainer_ended_s
            and r.stopped_s is not None and r.stopped_s - job.trainer_ended_s[r.rank] > OBSERVER_STOP_MAX_S]
    checks.append(Check(f"each observer stopped within {OBSERVER_STOP_MAX_S} s of its trainer's exit", not late,
                        f"late: {late[:10]}"))
    noisy = [r.rank for r in runs if r.messages_sent and job.group_of[r.rank] != faulty_group]
    checks.append(Check("OBS-1 quiet while healthy: no message from observers of healthy groups", not noisy,
                        f"{len(noisy)} observers of healthy groups sent messages: {noisy[:10]}"))
    keys = [(tuple(record["evidence"]["group_ranks"]), record["evidence"]["stuck_position"]["step"],
             record["evidence"]["stuck_position"]["op"])
            for _, record in job.reports if record["reporter_rank"] != isolated]
    checks.append(Check("OBS-6 one report per stuck position", len(keys) == len(set(keys)),
                        f"{len(keys)} reports, {len(set(keys))} distinct stuck positions"))
    return checks


def _fault_checks(job: SimJob, rank: int, outcome: str, scope: str, stall_s: float | None,
                  latency_max_s: float, isolated: int | None = None) -> list[Check]:
    group = job.groups[job.group_of[rank]]
    own = [(time_s, record) for time_s, record in job.reports if record["reporter_rank"] == isolated]
    reports = [record for _, record in job.reports if record["reporter_rank"] != isolated]
    checks = [Check("exactly one report, from the faulty rank's group", len(reports) == 1 and
                    reports[0]["evidence"]["group_ranks"] == list(group.ranks),
                    f"{len(reports)} reports: {[record_line(r) for r in reports][:3]}")]
    if isolated is not None:
        checks.append(Check(f"the cut-off observer of rank {isolated} names nobody",
                            all(record["ranks"] == [] and record["evidence"]["attributed_ranks"] == []
                                for _, record in own), f"{[record_line(r) for _, r in own][:3]}"))
    if not reports:
        return checks
    time_s, record = next((t, r) for t, r in job.reports if r["reporter_rank"] != isolated)
    found = record["evidence"]
    checks.append(Check(f"outcome {outcome}, {scope}-scoped", (found["finding"], found["scope"]) == (outcome, scope),
                        record_line(record)))
    if outcome == "group_stall":
        named_ok = record["ranks"] == [] and found["attributed_ranks"] == [] and found["missing_ranks"] == []
    elif outcome == "unresponsive":
        named_ok = record["ranks"] == found["missing_ranks"] == [rank] and found["attributed_ranks"] == []
    else:
        named_ok = record["ranks"] == found["attributed_ranks"] == [rank]
    checks.append(Check(f"names rank {rank}" if outcome != "group_stall" else "names no single rank", named_ok,
                        f"ranks {record['ranks']}, attributed {found['attributed_ranks']}, missing {found['missing_ranks']}"))
    reporter = record["reporter_rank"]
    checks.append(Check("OBS-7 reported by a surviving, non-attributed peer",
                        reporter in group.ranks and reporter != rank or outcome == "group_stall",
                        f"reporter rank {reporter}"))
    if stall_s is not None:
        latency = time_s - stall_s - _threshold_s()
        checks.append(Check(f"detected within {latency_max_s} s of the threshold",
                            -0.05 <= latency <= latency_max_s, f"latency {latency:.3f} s (stall at {stall_s:.3f} s)"))
    return checks
    record = reports[0]
    checks.append(Check(f"outcome {outcome}, {scope}-scoped", (record["outcome"], record["scope"]) == (outcome, scope),
                        wire.report_line(record)))
    if outcome == "group_stall":
        named_ok = record["attributed_ranks"] == [] and record["missing_ranks"] == []
    elif outcome == "unresponsive":
        named_ok = record["missing_ranks"] == [rank] and record["attributed_ranks"] == []
    else:
        named_ok = record["attributed_ranks"] == [rank]
    checks.append(Check(f"names rank {rank}" if outcome != "group_stall" else "names no single rank", named_ok,
                        f"attributed {record['attributed_ranks']}, missing {record['missing_ranks']}"))
    reporter = record["reporter_rank"]
    checks.append(Check("OBS-7 reported by a surviving, non-attributed peer",
                        reporter in group.ranks and reporter != rank or outcome == "group_stall",
                        f"reporter rank {reporter}"))
    if stall_s is not None:
        latency = record["time_virtual_s"] - stall_s - _threshold_s()
        checks.append(Check(f"detected within {latency_max_s} s of the threshold",
                            -0.05 <= latency <= latency_max_s, f"latency {latency:.3f} s (stall at {stall_s:.3f} s)"))
    return checks


def _outcome(job: SimJob, checks: list[Check], faults: list[str], stall_s: float | None) -> ScenarioOutcome:
    return ScenarioOutcome(columns=COLUMNS, rows=_rows(job, stall_s), checks=checks, faults=faults,
                           result=job.cluster.result())


def faulty_rank(params: ScenarioParams, name: str) -> int:
    """The rank scenario ``name`` injects its fault into: drawn from the seed, before the run,
    with a generator of its own (the run's stays as is), so a campaign knows it too."""
    import random

    return random.Random(f"{name}:{params.seed}").randrange(params.ranks)


def unresponsive_latency_max_s() -> float:
    """Unresponsive needs confirm_rounds rounds that agree, one recheck interval apart."""
    config = ObserverConfig(0, 2, **OBSERVER_CONFIG)
    return DETECTION_LATENCY_MAX_S + config.confirm_rounds * (config.recheck_interval_s + config.round_deadline_s)


def _stall_of(job: SimJob, ranks: tuple[int, ...]) -> float | None:
    times = [job.cluster.shared(r).get(_STALLED_AT) for r in ranks]
    found = [t for t in times if t is not None]
    return min(found) if found else None


@scenario("observer-healthy", summary="observers beside a healthy job with slow steps under the threshold: no report, "
          "no observer message", min_ranks=2)
def observer_healthy(params: ScenarioParams) -> ScenarioOutcome:
    slow = {r for r in range(params.ranks) if r % 3 == 0}
    job = run_job(params, "observer-healthy", steps=HEALTHY_STEPS,
                  behaviour=lambda rank, step: "slow" if rank in slow and step % 5 == FAULT_STEP else "normal")
    runs = _runs(job)
    sent = sum(r.messages_sent for r in runs)
    checks = _common_checks(job, None) + [
        Check("no report", not job.reports, f"{len(job.reports)} reports"),
        Check("zero observer messages", sent == 0, f"{sent} messages"),
    ]
    return _outcome(job, checks, [f"ranks {sorted(slow)[:8]}... take {SLOW_STEP_S} s longer every 5th step"], None)


def single_rank_outcome(params: ScenarioParams, name: str, rank: int, injected: tuple[Any, ...], outcome: str, *,
                        behaviour: Callable[[int, int], str] | None = None,
                        latency_max_s: float = DETECTION_LATENCY_MAX_S, described: list[str] | None = None,
                        quiet_rank: int | None = None, isolated: int | None = None,
                        stall_s: float | None = None) -> ScenarioOutcome:
    """Run a job with one faulty ``rank`` (the sim ``injected`` faults and/or a ``behaviour``)
    and check that the observers name it with ``outcome``. ``quiet_rank``: that rank's observer
    is dead; ``isolated``: that rank's observer is cut off (see :func:`_common_checks`)."""
    job = run_job(params, name, behaviour or (lambda r, step: "normal"), faults=injected)
    if stall_s is None:
        first = injected[0] if injected else None
        stall_s = (first.start_s if isinstance(first, Freeze) else first.at_s if isinstance(first, Crash)
                   else _stall_of(job, (rank,)))
        if behaviour is not None:
            stall_s = _stall_of(job, (rank,))
    checks = _common_checks(job, job.group_of[rank], dead_observer=quiet_rank, isolated=isolated) + _fault_checks(
        job, rank, outcome, "rank", stall_s, latency_max_s, isolated)
    return _outcome(job, checks, described or [repr(f) for f in injected], stall_s)


def _single_rank_scenario(params: ScenarioParams, name: str, what: str, outcome: str, *,
                          faults: Callable[[int], tuple[Any, ...]] = lambda rank: (),
                          latency_max_s: float = DETECTION_LATENCY_MAX_S) -> ScenarioOutcome:
    rank = faulty_rank(params, name)
    injected = faults(rank)
    return single_rank_outcome(
        params, name, rank, injected, outcome,
        behaviour=(lambda r, step: what if r == rank and step == FAULT_STEP else "normal") if not injected else None,
        latency_max_s=latency_max_s,
        described=[repr(f) for f in injected] or [f"rank {rank}: {what} at step {FAULT_STEP}"])


@scenario("observer-behind", summary="one rank sleeps before its step's collective: its peers' observers name it "
          "behind", min_ranks=3)
def observer_behind(params: ScenarioParams) -> ScenarioOutcome:
    return _single_rank_scenario(params, "observer-behind", "hold", "behind")


@scenario("observer-desync", summary="one rank enters a barrier where its peers all-gather: a desync naming it",
          min_ranks=3)
def observer_desync(params: ScenarioParams) -> ScenarioOutcome:
    return _single_rank_scenario(params, "observer-desync", "other", "desync")


# The trainer is stopped (SIGSTOP) mid-step, its observer process keeps running.
FREEZE_AT_S: Final = 0.25


@scenario("observer-frozen", summary="one trainer is frozen (SIGSTOP) mid-step; its observer keeps answering: "
          "the rank is named behind", min_ranks=3)
def observer_frozen(params: ScenarioParams) -> ScenarioOutcome:
    return _single_rank_scenario(
        params, "observer-frozen", "normal", "behind",
        faults=lambda rank: (Freeze(rank, start_s=FREEZE_AT_S, duration_s=HOLD_S, programs=("trainer",)),))


@scenario("observer-trainer-dead", summary="one trainer dies mid-step: its observer stops, its peers report it "
          "unresponsive after confirm_rounds rounds", min_ranks=3)
def observer_trainer_dead(params: ScenarioParams) -> ScenarioOutcome:
    return _single_rank_scenario(
        params, "observer-trainer-dead", "normal", "unresponsive",
        faults=lambda rank: (Crash(rank, at_s=FREEZE_AT_S, programs=("trainer",)),),
        latency_max_s=unresponsive_latency_max_s())


@scenario("observer-process-frozen", summary="one rank's whole process is frozen (SIGSTOP), observer included, "
          "as with an observer thread inside an MPI rank: its peers report it unresponsive", min_ranks=3)
def observer_process_frozen(params: ScenarioParams) -> ScenarioOutcome:
    return _single_rank_scenario(
        params, "observer-process-frozen", "normal", "unresponsive",
        faults=lambda rank: (Freeze(rank, start_s=FREEZE_AT_S, duration_s=HOLD_S),),
        latency_max_s=unresponsive_latency_max_s())


@scenario("observer-group-stall", summary="a whole replica group stalls inside one collective: one group-scoped "
          "report", min_ranks=3)
def observer_group_stall(params: ScenarioParams) -> ScenarioOutcome:
    rank = faulty_rank(params, "observer-group-stall")
    groups = replica_groups(params.ranks, params.group_size)
    members = next(g.ranks for g in groups if rank in g.ranks)
    job = run_job(params, "observer-group-stall",
                  lambda r, step: "fabric" if r in members and step == FAULT_STEP else "normal")
    stall_s = _stall_of(job, members)
    # Each member's idle starts when it entered the collective; the last one to get there decides.
    latest = max((job.cluster.shared(r).get(_STALLED_AT) or 0.0) for r in members)
    checks = _common_checks(job, job.group_of[rank]) + _fault_checks(
        job, rank, "group_stall", "group", latest, DETECTION_LATENCY_MAX_S)
    return _outcome(job, checks, [f"ranks {members[0]}..{members[-1]}: the collective of step {FAULT_STEP} "
                                  f"makes no progress for {HOLD_S} s"], stall_s if math.isfinite(latest) else None)
