"""A simulated training job that runs the product's check pipeline (docs/design.md §7.4): the
same replay round, straggler tests, exchange, merge, gate driver, reports and fault policy that
``scout.attach`` runs on every rank, with simulated executors giving the evidence -- as the
observer scenarios run the observer's production driver (DRIVER-1) -- and the same restore and
save programs (``scout.job.restore``, ``scout.job.save``) at each attempt's start and each due
checkpoint, with simulated files; an attempt a policy stops is restarted.

What is simulated and nothing else:

* the recipe executor (:class:`SimExecutor`): each replay computes for a jittered while of
  virtual time and signs its output with a value every healthy replica computes alike; a rank
  with an SDC fault flips one bit of its OUTPUT signature from a step on, a straggler computes
  ``factor`` times longer, and a rank with a transient fault in its live path answers DIFFER to
  the self-check (SELF-1) of the one step it struck, MATCH otherwise;
* the collectives: the round's gathers and the step's exchange are the simulator's
  ``AllGather`` (``scout.transport.sim``);
* the manifest's storage (``scout.gate.recorder.MemoryRecorder``): the gate's writer commits
  every state it is asked to persist (GATE-9) into memory instead of files -- as the simulator
  replaces the network, it replaces the disk -- and every rank's checkpoint files
  (``scout.scenarios.sim_storage``), both kept across attempts, with their storage faults;
* the run directory: rank 0's reports go to a list;
* the launcher: an attempt that ends by a policy (``FaultDetected``, ``CheckpointSaveFailed``) is
  followed, on every rank, by the next one while ``max_restarts`` allows; rank 0 writes the
  ``finished`` reports that ``Job`` writes at its end.

:func:`run_replay_job` runs a job and returns every rank's attempts and rank 0's reports;
``scout.scenarios.localization`` builds the ``sdc-in-evidence`` and ``straggler-timing``
scenarios on it, ``scout.scenarios.restarts`` the restarts with storage faults.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Final

import attrs

from scout.core.drive import SimHandler, drive_sim
from scout.core.guards import whole_number
from scout.core.recipes import (
    Catalog,
    DueRecipe,
    EvidenceKind,
    Intervals,
    ReplayStatus,
    Schedule,
)
from scout.core.replay_round import (
    EVIDENCE_OF,
    Execute,
    Executed,
    GatherEvidence,
    GatherReadiness,
    Prepared,
    RoundOutcome,
    communication_slot,
    lanes,
    merge_outcomes,
    replay_round,
)
from scout.core.self_check import LiveCheck
from scout.core.straggler import DEFAULT_SEQUENTIAL_CONFIG
from scout.core.straggler.tracking import ReplayStragglers
from scout.core.verdict import DEFAULT_TIMING_CONFIG
from scout.gate.model import CheckpointId, GateConfig, Recipe
from scout.gate.recorder import GateWriter, MemoryRecorder
from scout.gate.step import initial_state
from scout.job.gate_driver import GateDriver, Reporter
from scout.job.pipeline import (
    CheckOutput,
    CheckpointSaveFailed,
    Layout,
    Pipeline,
    StepOutcome,
    replay_output,
    run_step,
)
from scout.job.restore import Restored, run_restore
from scout.job.save import Saved, error_text, run_save
from scout.reports.kinds import FinishedReason, ReportKind, attempt_failure
from scout.scenarios.sim_storage import AttemptRecorder, SimFiles, StorageFault
from scout.transport.base import Group
from scout.transport.program import AllGather, Now, Sleep
from scout.transport.sim.cluster import SimCluster, SimulationResult
from scout.transport.sim.process import ProgramState, SimContext

__all__ = ["Attempt", "AttemptEnd", "Faults", "JobRun", "SimExecutor", "SimReplayCheck", "run_replay_job"]

TIMEOUT_S: Final = 5.0  # every gather's and exchange's deadline (virtual seconds)
STEP_S: Final = 1.0  # the training part of a step, before its checks
RESTART_S: Final = 2.0  # the launcher's restart of every rank between two attempts
DEVICE_FLOOR_MS: Final = 0.1  # the replay's default (ReplayConfig.device_floor_ms)


@attrs.frozen
class Faults:
    """What goes wrong in the simulated job (None: nothing)."""

    sdc_rank: int | None = None
    sdc_step: int = 0
    sdc_bit: int = 0
    straggler_rank: int | None = None
    straggler_step: int = 0
    straggler_factor: float = 1.0
    live_rank: int | None = None  # SELF-1: a transient fault in this rank's live call at live_step
    live_step: int = 0
    #: The attempt these faults strike (None: every attempt). A fault of one attempt is gone after
    #: the restart, as a host the scheduler excluded is.
    attempt: int | None = None


class SimExecutor:
    """A recipe executor in virtual time: computes for ``compute_ms`` (1 % Gaussian jitter from
    the run's seed), times itself on the virtual clock, signs alike on every healthy replica."""

    def __init__(self, rank: int, group_index: int, faults: Faults, compute_ms: float, jitter: float) -> None:
        self.rank = rank
        self.group_index = group_index
        self.faults = faults
        self.compute_ms = compute_ms
        self.jitter = jitter

    def execute(self, ctx: SimContext, due: DueRecipe) -> Generator[Any, Any, Executed]:
        faults = self.faults
        scale = faults.straggler_factor if self.rank == faults.straggler_rank and due.step >= faults.straggler_step \
            else 1.0
        duration_ms = self.compute_ms * scale * max(0.5, 1.0 + ctx.random.gauss(0.0, self.jitter))
        began = yield Now()
        yield Sleep(duration_ms / 1e3)
        ended = yield Now()
        evidence: dict[EvidenceKind, int] = {kind: _signature(self.group_index, str(due.recipe), due.step, kind)
                    for kind in EVIDENCE_OF[due.recipe.recipe_class] if kind is not EvidenceKind.LIVE}
        if self.rank == faults.sdc_rank and due.step >= faults.sdc_step:
            evidence[EvidenceKind.OUTPUT] ^= 1 << faults.sdc_bit
        if EvidenceKind.LIVE in EVIDENCE_OF[due.recipe.recipe_class]:  # SELF-1: a code, not a signature
            struck = self.rank == faults.live_rank and due.step == faults.live_step
            evidence[EvidenceKind.LIVE] = int(LiveCheck.DIFFER if struck else LiveCheck.MATCH)
        compute_s = round(ended - began, 9)
        return Executed(ReplayStatus.OK, compute_s, (compute_s,), evidence)


def _signature(group_index: int, recipe: str, step: int, kind: EvidenceKind) -> int:
    """Evidence every healthy replica of a group computes alike (a stand-in for a signature)."""
    return random.Random(f"{group_index}:{recipe}:{step}:{kind.value}").getrandbits(62)


class SimReplayCheck:
    """Dense replay on the simulator: the one replay round, driven by simulated collectives and
    a :class:`SimExecutor`, then the device straggler test -- what ``ReplayCheck`` does on torch."""

    name = "replay"

    def __init__(self, ctx: SimContext, layout: Layout, schedule: Schedule, executor: SimExecutor,
                 hosts: Sequence[str]) -> None:
        self.ctx = ctx
        self.layout = layout
        self.group = Group(layout.groups[layout.index], layout.names[layout.index])
        self.schedule = schedule
        self.executor = executor
        self.hosts = tuple(hosts)
        self.stragglers = ReplayStragglers(self.group.ranks, DEFAULT_SEQUENTIAL_CONFIG, 16,
                                           device_floor_ms=DEVICE_FLOOR_MS, communication_timing=DEFAULT_TIMING_CONFIG)
        self.schedule_digest = random.Random(f"schedule:{schedule.describe()}").getrandbits(62)

    def gate_recipes(self) -> list[Recipe]:
        return [Recipe(str(recipe), self.layout.names) for recipe in self.schedule.catalog.recipes()]

    def due(self, step: int) -> bool:
        return bool(self.schedule.due(step))

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        due = self.schedule.due(step)
        if not due:
            return None
        outcomes = []
        for lane in lanes(due):  # REC-3: one round per lane, as the runner does (REPLAY-9)
            prepared = [Prepared(d, ReplayStatus.OK, random.Random(f"describe:{d.recipe}:{step}").getrandbits(62))
                        for d in lane]
            outcomes.append((yield from self._drive(replay_round(
                step, prepared, schedule_digest=self.schedule_digest, group_size=len(self.group.ranks),
                timing=DEFAULT_TIMING_CONFIG))))
        outcome = merge_outcomes(outcomes)
        timing = self.stragglers.observe(step, outcome.peer_compute_ms, outcome.timing, outcome.communication_ms)
        return replay_output(self.name, self.layout, outcome.results, timing.events,
                             self.stragglers.performance_ratios(), self.hosts)

    def _drive(self, round_: Generator[Any, Any, RoundOutcome]) -> Generator[Any, Any, RoundOutcome]:
        return (yield from drive_sim(round_, _round_answers(self), who="the simulated replay check"))

    def resume_at(self, step: int) -> None:
        pass

    def step_begins(self) -> None:
        pass

    def close(self) -> None:
        pass


def _round_answers(check: SimReplayCheck) -> dict[type, SimHandler]:
    """The round's ops (``RoundOp``) answered with simulated collectives on the check's group and
    its :class:`SimExecutor` (no communication timing on the simulator)."""

    def gather_readiness(op: GatherReadiness) -> Generator[Any, Any, Any]:
        return (yield AllGather(op.row, timeout_s=TIMEOUT_S, group=check.group))

    def execute(op: Execute) -> Generator[Any, Any, Executed]:
        return (yield from check.executor.execute(check.ctx, op.due))

    def gather_evidence(op: GatherEvidence) -> Generator[Any, Any, Any]:
        return (yield AllGather((*op.row, *communication_slot(())), timeout_s=TIMEOUT_S, group=check.group))

    return {GatherReadiness: gather_readiness, Execute: execute, GatherEvidence: gather_evidence}


class _Reports:
    """Rank 0's run directory: the reports and the hosts to exclude, in memory."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.excluded: list[str] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def exclude_hosts(self, hosts: Sequence[str]) -> None:
        self.excluded += [host for host in hosts if host not in self.excluded]

    def timing(self, record: Mapping[str, Any]) -> None:
        pass  # LOOP-6: the simulated checks time no loop


class AttemptEnd(enum.Enum):
    """How one attempt of one rank ended."""

    FINISHED = "finished"  # it ran its last step
    STOPPED = "stopped"  # the fault policy stopped it (FaultDetected)
    SAVE_FAILED = "save-failed"  # a save failed under on_checkpoint_error = "stop" (CheckpointSaveFailed)
    #: The restore refused a checkpoint without files under on_missing_checkpoint = "stop"
    #: (FileNotFoundError on every rank). The job ends there: the files are as missing at any
    #: restart, so the simulated launcher does not restart it.
    REFUSED = "refused"


@attrs.frozen
class Attempt:
    """One attempt of one rank: where the restore program started it (and what it lost on the
    way; None: it refused), every save it ran, its last step's outcome (None: it ran none) and how
    it ended."""

    restored: Restored | None
    saves: tuple[Saved, ...]
    outcome: StepOutcome | None
    ended: AttemptEnd


@attrs.frozen
class JobRun:
    """What a simulated job did: every rank's last step and stop in its last attempt (None: it
    did not finish), rank 0's reports and excluded hosts, the gate's committed states (every
    attempt's), and every rank's attempts."""

    outcomes: tuple[StepOutcome | None, ...]
    records: tuple[dict[str, Any], ...]
    excluded_hosts: tuple[str, ...]
    storage: MemoryRecorder
    groups: tuple[Group, ...]
    simulation: SimulationResult
    pipelines: int  # how many pipelines ran (one per rank and attempt that started)
    attempts: tuple[tuple[Attempt, ...], ...] = ()
    files: SimFiles | None = None


def run_replay_job(
    *,
    ranks: int,
    group_size: int,
    seed: int,
    steps: int,
    faults: Faults,
    scenario: str,
    hidden_layers: int = 2,
    compute_ms: float = 40.0,
    jitter: float = 0.01,
    on_sdc: str = "restart",
    make_check: Callable[..., Any] = SimReplayCheck,
    storage_faults: Sequence[StorageFault] = (),
    max_restarts: int | None = None,
    on_checkpoint_error: str = "stop",
    on_missing_checkpoint: str = "fallback",
) -> JobRun:
    """Run the job: every rank replays one hidden layer per step (a cycle is ``hidden_layers``
    steps, a checkpoint at every cycle end) through the product's pipeline, and each attempt
    starts with the product's restore program and saves with its save program, on simulated
    files (``scout.scenarios.sim_storage``) with ``storage_faults``. An attempt that a policy
    stops (an SDC under ``on_sdc = "restart"``, a failed save under ``on_checkpoint_error =
    "stop"``) is restarted, as torchrun does, while ``max_restarts`` allows (None: one attempt,
    and the launcher does not say how many restarts it has, RECOVERY-5)."""
    from scout.scenarios.exchange import replica_groups

    if max_restarts is not None and not (whole_number(max_restarts) and max_restarts >= 0):
        raise ValueError(f"max_restarts must be an int >= 0 or None, got {max_restarts!r}")
    cluster = SimCluster(ranks, seed=seed, scenario=scenario)
    groups = replica_groups(ranks, group_size)
    partition = tuple(group.ranks for group in groups)
    names = tuple(f"dp{i}" for i in range(len(groups)))
    hosts = tuple(f"host{r // 4}" for r in range(ranks))  # four ranks per host
    schedule = Schedule(Catalog(hidden_layer_count=hidden_layers, has_embedding=False, has_output=False,
                                optimizer_slice_count=0), Intervals(hidden_steps=1))
    reports = _Reports()
    storage = MemoryRecorder()
    files = SimFiles(ranks, storage_faults)
    attempts_max = 1 + (max_restarts or 0)
    started: list[int] = []

    def attempt(ctx: SimContext, number: int) -> Generator[Any, Any, Attempt]:
        """One attempt of this rank: a new process, as after torchrun's restart."""
        layout = Layout.of(partition, names, ctx.rank)
        executor = SimExecutor(ctx.rank, layout.index, faults if faults.attempt in (None, number) else Faults(),
                               compute_ms, jitter)
        check = make_check(ctx, layout, schedule, executor, hosts)
        reporter = Reporter(reports if ctx.rank == 0 else None, job_id=scenario, generation=number, hosts=hosts,
                            rank=ctx.rank, restarts_left=None if max_restarts is None else max_restarts - number,
                            earlier_records=lambda: reports.records)
        gate = None
        if ctx.rank == 0:  # the gate's writer reads the manifest the earlier attempts committed
            config = GateConfig(scenario, check.gate_recipes(), names)
            state = storage.generations[-1] if storage.generations else initial_state(config)
            gate = GateDriver(GateWriter(AttemptRecorder(storage, files.manifest_fails(number)), state), reporter)
        pipeline = Pipeline([check], rank=ctx.rank, world_size=ranks, hosts=hosts, groups=partition, on_sdc=on_sdc,
                            cycle_steps=schedule.cycle_length_steps(), checkpoint_every_cycles=1, reporter=reporter,
                            gate=gate, timeout_s=TIMEOUT_S)
        started.append(ctx.rank)
        failure = attempt_failure(reports.records) if ctx.rank == 0 else None  # RECOVERY-6: one job's reports
        try:
            restored = yield from run_restore(pipeline, failure, checkpoints=True,
                                              files=files.restore_files(ctx.rank, number),
                                              on_missing_checkpoint=on_missing_checkpoint, timeout_s=TIMEOUT_S)
        except FileNotFoundError as error:  # on_missing_checkpoint = "stop": restore() raises, Job.leave reports
            reporter.record(ReportKind.FINISHED, FinishedReason.EXCEPTION, step=0, evidence={"error": error_text(error)})
            pipeline.close()
            return Attempt(None, (), None, AttemptEnd.REFUSED)
        pipeline.begin(restored.decision, lost=restored.lost)
        saves: list[Saved] = []
        outcome: StepOutcome | None = None
        ended = AttemptEnd.FINISHED
        try:
            for step in range(restored.decision.step + 1, steps + 1):
                yield Sleep(STEP_S)  # the training step
                outcome = yield from run_step(pipeline, step)
                if outcome.checkpoint_due:
                    saves.append((yield from run_save(
                        pipeline, CheckpointId(restored.decision.timeline, step), files.save_files(ctx.rank, number),
                        on_checkpoint_error=on_checkpoint_error, timeout_s=TIMEOUT_S)))
                if outcome.stop is not None:
                    ended = AttemptEnd.STOPPED  # FaultDetected: the rank's process ends here
                    break
        except CheckpointSaveFailed as error:  # the process ends; rank 0 says why, as Job.leave does
            ended = AttemptEnd.SAVE_FAILED
            reporter.record(ReportKind.FINISHED, FinishedReason.EXCEPTION, step=outcome.step if outcome else None,
                            evidence={"error": error_text(error)})
        else:
            if ended is AttemptEnd.FINISHED:
                reporter.record(ReportKind.FINISHED, FinishedReason.CLOSED, step=steps)
        pipeline.close()
        return Attempt(restored, tuple(saves), outcome, ended)

    def program(ctx: SimContext) -> Generator[Any, Any, tuple[Attempt, ...]]:
        done: list[Attempt] = []
        for number in range(attempts_max):
            if number:
                yield Sleep(RESTART_S)  # the launcher restarts every rank
            done.append((yield from attempt(ctx, number)))
            if done[-1].ended in (AttemptEnd.FINISHED, AttemptEnd.REFUSED):
                break
        return tuple(done)

    cluster.spawn(program)
    result = cluster.run()
    attempts = tuple(result.outcomes[(rank, "main")].value if result.outcomes[(rank, "main")].state is ProgramState.DONE
                     else () for rank in range(ranks))
    outcomes = tuple(ran[-1].outcome if ran else None for ran in attempts)
    return JobRun(outcomes, tuple(reports.records), tuple(reports.excluded), storage, tuple(groups), result,
                  len(started), attempts, files)
