"""``scout.attach``: all of scout on a training job, in one call (docs/attach.md).

    import scout
    job = scout.attach(model, optimizer, run_dir="runs/exp1", checkpoint_dir="ckpt/exp1")
    start = job.restore()        # 0 on a fresh run, else the step restored
    for step in range(start, steps):
        ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
        job.step()
    job.close()

``attach`` is collective over the world (after ``init_process_group``). On every rank it starts:
the progress record and its instrumentation (torch.distributed collectives, the repeated
blocks' forwards, DDP's gradient buckets), one out-of-band observer process per rank (hangs,
desyncs, stalls), in-situ replay (SDC and stragglers), and the two-cycle checkpoint gate -- rank
0 is the gate's one writer and keeps its manifest in ``run_dir``; every rank learns the gate's
decisions from rank 0. With ``checkpoint_dir``, ``step()`` saves DCP checkpoints at replay-cycle
boundaries (every ``checkpoint_every_cycles``) and feeds them to the gate.

Everything scout finds lands in ``run_dir``: ``reports.jsonl`` (one ``scout.report/1`` object
per line), the gate manifest (``gate/``), ``exclude_hosts.txt`` (the hosts at fault, for the
scheduler); ``scout report RUN_DIR`` turns it into a summary and a picture.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import nn

from scout import reports
from scout.core.observer import Stage
from scout.core.recipes import Intervals, RecipeResult
from scout.core.verdict import Status
from scout.gate import dcp
from scout.gate.model import (
    CheckpointCaptured,
    CheckpointId,
    CycleBoundary,
    GateConfig,
    GateReport,
    GateReportKind,
    Recipe,
    Restart,
    TrustChange,
)
from scout.gate.recorder import GateWriter
from scout.gate.recovery import FailureClass, recover
from scout.gate.results import recipe_verdicts
from scout.job import bench_switches
from scout.job.config import Config, load_config, unknown_variables
from scout.job.hooks import publish_ddp_buckets
from scout.job.startup import check_directory, checked_on_every_rank
from scout.observer import instrument
from scout.observer.launch import ObserverHandle, start_observer
from scout.observer.progress import ProgressPublisher, RecordIdentity, reclaim_stale_records
from scout.observer.rendezvous import DirectoryRendezvous, StoreRendezvous, shared_secret
from scout.replay.arrival import LoopConfig, LoopTimer
from scout.replay.collectives import TorchPeerGroup
from scout.replay.job_checks import GateFeed, JobChecks
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer, StepReport
from scout.replay.stragglers import StragglerEvent, straggler_record_arguments

__all__ = ["FaultDetected", "Job", "attach"]

logger = logging.getLogger("scout")

GATE_DIR: Final = "gate"
EXCLUDE_HOSTS_FILE: Final = "exclude_hosts.txt"
#: Report kinds that name the failure a restart recovers from (restore(): the recovery table).
_FAILURE_OF_KIND: Final = {
    "sdc": FailureClass.SDC,
    "hang": FailureClass.HANG,
    "desync": FailureClass.HANG,
    "group_stall": FailureClass.HANG,
    "inconclusive": FailureClass.HANG,
    "unresponsive": FailureClass.INACCESSIBLE,
    "data_stall": FailureClass.DATA_STALL,
    "checkpoint_stall": FailureClass.CHECKPOINT_STALL,
    "straggler": FailureClass.STRAGGLER,
}
#: When a previous attempt reported several failures, the one that rules out the most decides.
_FAILURE_ORDER: Final = (FailureClass.SDC, FailureClass.HANG, FailureClass.INACCESSIBLE, FailureClass.UNCERTAIN,
                         FailureClass.CHECKPOINT_STALL, FailureClass.DATA_STALL, FailureClass.STRAGGLER)


class FaultDetected(RuntimeError):
    """Raised by ``job.step()`` on every rank at the same step when a fault's policy is
    ``restart``: let it end the process, and the launcher (``torchrun --max-restarts``)
    restarts the job; ``job.restore()`` then resumes from the checkpoint the recovery table
    picks."""

    def __init__(self, kind: str, step: int, ranks: Sequence[int], hosts: Sequence[str], reason: str) -> None:
        self.kind = kind
        self.step = step
        self.ranks = tuple(ranks)
        self.hosts = tuple(hosts)
        self.reason = reason
        where = f" on {', '.join(hosts)}" if hosts else ""
        super().__init__(f"scout: {kind} at step {step}: rank(s) {list(ranks)}{where} ({reason}); the job stops so "
                         "that the launcher restarts it from a trusted checkpoint")


def _single_host() -> bool:
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if local and world:
        return local == world
    return True


def _routable_address() -> str:
    """The address of this host's interface that reaches MASTER_ADDR (no packet is sent)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
            address: str = probe.getsockname()[0]
        except OSError:
            address = socket.gethostbyname(socket.gethostname())
    return address


class _GroupRendezvous:
    """The observers' rendezvous over scout's own gloo group (when no launcher store is known):
    every trainer is alive at attach, so an all-gather of the records suffices."""

    def __init__(self, group: Any, group_index: int) -> None:
        self.group = group
        self.group_index = group_index

    def exchange(self, position: int, size: int, record: str, timeout_s: float) -> list[str]:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (self.group_index, position, record), group=self.group)
        mine = sorted((p, r) for g, p, r in gathered if g == self.group_index)
        return [r for _, r in mine]


class _Costs(dict[str, float]):
    """Cumulative seconds per component of ``job.step()``: where scout's overhead goes."""

    def add(self, name: str, seconds: float) -> None:
        self[name] = self.get(name, 0.0) + seconds


class Job:
    """scout attached to one rank of a training job. Made by :func:`attach`."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        run_dir: str | os.PathLike[str],
        checkpoint_dir: str | os.PathLike[str] | None,
        peers: TorchPeerGroup | None,
        config: Config,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("scout.attach needs torch.distributed: call init_process_group first")
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.run_dir = Path(run_dir)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.reports_path = self.run_dir / reports.REPORTS_FILE
        self.identity = RecordIdentity.from_environment(self.rank, job_id=config.job_id)
        self.hostname = socket.gethostname()
        self._closed = False
        self._started = False
        self._step = 0
        self._fault: FaultDetected | None = None
        #: Seconds this rank spent in each part of scout inside job.step() (bench/attach_overhead.py).
        self.costs = _Costs()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if (self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
                and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0):
            logger.warning("scout: torchrun shares its rendezvous store with the workers, and torch 2.13's "
                           "restarted attempts can then read the previous attempt's addresses and fail to connect "
                           "(pytorch issue 135712); launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for restarts")
        timeout = timedelta(seconds=config.collective_timeout_s)
        # scout's own gloo group: small control traffic (hosts, results, decisions), bounded,
        # apart from the job's own process group and backend.
        self._control = dist.new_group(backend="gloo", timeout=timeout)
        self.hosts: list[str] = [""] * self.world_size
        dist.all_gather_object(self.hosts, self.hostname, group=self._control)

        reclaim_stale_records(self.identity)
        self.publisher = ProgressPublisher(self.identity)
        # Start-up is published as a checkpoint read (its long threshold): a slow start is
        # never a hang report.
        self.publisher.begin_stage(Stage.CHECKPOINT_READ)
        # Parts a benchmark may switch off to measure them (bench_switches: not settings).
        off = bench_switches.parts_off()
        instrument.instrument(self.publisher, collectives="instrumentation" not in off)
        self._bucket_listener: list[Callable[[int, int], None]] = []
        self._ddp_buckets = "ddp_hook" not in off and publish_ddp_buckets(model, self.publisher, self._bucket_listener)
        if "instrumentation" not in off:
            instrument.instrument_module(model)

        if peers is None and any(type(p).__name__ == "DTensor" for p in model.parameters()):
            logger.warning("scout: the model's parameters are sharded (FSDP2 or tensor parallel), so the whole world "
                           "is not one group of replicas: pass peers=scout.replay.TorchPeerGroup.from_mesh(mesh, "
                           "('replicate',)) naming the replicas, or every replay will be Inconclusive")
        self.peers = peers if peers is not None else TorchPeerGroup(timeout_s=config.collective_timeout_s)
        self.partition = self.peers.partition
        self.group_index = next(i for i, g in enumerate(self.partition) if self.rank in g)
        self.group_names = tuple("dp" if len(self.partition) == 1 else f"dp{i}" for i in range(len(self.partition)))

        self.observer: ObserverHandle | None = None
        if config.observer:
            self._start_observer()

        self.replayer: Replayer | None = None
        self.loop: LoopTimer | None = None
        self.checks: JobChecks | None = None
        self.writer: GateWriter | None = None
        self.cycle_steps = 0
        if config.replay:
            modules = RecipeModules.discover(model)
            layers = len(modules.hidden)
            k = config.replay_interval_steps
            intervals = Intervals(embedding_steps=k * layers, hidden_steps=k, output_steps=k * layers,
                                  optimizer_steps=k * layers)
            # STRAG-1: with straggler_repetitions = 0 the run that gives the SDC evidence is also the
            # one timed (no extra replay); n > 0 times n repetitions after it.
            repetitions = config.straggler_repetitions
            replay_config = ReplayConfig(intervals=intervals, max_capture_bytes=config.max_capture_bytes,
                                         replay_rows=config.replay_rows, timing_warmup_runs=1 if repetitions else 0,
                                         timing_repetitions=max(1, repetitions))
            self.replayer = Replayer(model, optimizer, self.peers, replay_config, modules)
            self.cycle_steps = self.replayer.schedule.cycle_length_steps()
            # Loop stragglers (LOOP-1..4): arrival at the step's collectives, timed by the
            # instrumentation and DDP's bucket hook, checked every loop_check_steps.
            if "loop_timer" not in off:
                self.loop = LoopTimer(self.peers, LoopConfig(check_every_steps=config.loop_check_steps))
                instrument.add_collective_listener(self.loop.collective)
                if self._ddp_buckets:
                    self._bucket_listener.append(self.loop.collective)
            # Expert replay and the canary (spec/moe.md, spec/canary.md): None unless configured.
            self.checks = JobChecks.build(
                model, rank=self.rank, exchange=self._exchange, dense_partition=self.partition,
                dense_names=self.group_names, run_dir=str(self.run_dir), moe_catalog=config.moe_catalog,
                expert_steps=k, canary=config.canary, timeout_s=config.collective_timeout_s)
            if self.checks is not None and self.checks.experts is not None:
                self.cycle_steps = max(self.cycle_steps, self.checks.experts.schedule.cycle_length_steps())
            if self.rank == 0 and "gate" not in off:
                catalog = tuple(str(recipe) for recipe in self.replayer.catalog.recipes())
                gate_config = GateConfig(self.run_dir.resolve().name or "run", catalog, self.group_names)
                if self.checks is not None:
                    recipes, groups = self.checks.gate_catalog(catalog)
                    gate_config = GateConfig(gate_config.job_id, [Recipe(r, g) for r, g in recipes], groups,
                                             self.checks.coverage_notes())
                self.writer = GateWriter.open(self.run_dir / GATE_DIR, gate_config)
            if self.checkpoint_dir is not None:
                logger.info("scout: replay cycle %d steps; a checkpoint every %d steps, verified one cycle later",
                            self.cycle_steps, self.cycle_steps * config.checkpoint_every_cycles)
                for problem in self._verification_impossible():
                    logger.warning("scout: no checkpoint can ever become recovery-verified: %s", problem)
        elif self.checkpoint_dir is not None:
            logger.warning("scout: replay is off, so no checkpoint can be verified; scout saves no checkpoints "
                           "(checkpoint_dir is ignored)")
            self.checkpoint_dir = None
        if self.observer is not None:
            self.observer.wait_ready(config.collective_timeout_s)
            instrument.check_at_each_step(self.observer.check)
        dist.barrier(group=self._control)

    # -- start-up -------------------------------------------------------------------------

    def _verification_impossible(self) -> list[str]:
        """Settings under which the gate can never promote a checkpoint (GATE-1: a complete,
        clean cycle before and after its capture)."""
        assert self.replayer is not None
        problems = []
        if self.peers.size < 2:
            problems.append("the replay peer group has one member, so no replay can agree with anyone")
        if self.config.max_capture_bytes == 0:
            problems.append("max_capture_bytes is 0, so no replay input can be captured")
        if self.replayer.schedule.uncovered():
            problems.append(f"recipes {[str(r) for r in self.replayer.schedule.uncovered()]} are never replayed")
        if self.replayer.disabled_reason is not None:
            problems.append(f"replay is disabled: {self.replayer.disabled_reason}")
        return problems

    def _start_observer(self) -> None:
        config = self.config
        group = self.partition[self.group_index] if len(self.partition) > 1 else tuple(range(self.world_size))
        if len(group) < 2:
            logger.warning("scout: rank %d has no peer to compare progress with; its observer is off", self.rank)
            return
        prefix = f"scout/{self.identity.job_id}/{self.identity.generation}"
        store = None
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
            # torchrun's agent serves the store outside the trainers: it survives any of them.
            store = dist.TCPStore(  # type: ignore[attr-defined]
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                timeout=timedelta(seconds=config.collective_timeout_s))
        if store is not None:
            secret = shared_secret(self.rank, store=store, key=f"{prefix}/secret", timeout_s=config.collective_timeout_s)
        else:
            box = [os.urandom(32) if self.rank == 0 else None]
            dist.broadcast_object_list(box, src=0, group=self._control)
            secret = bytes(box[0])  # type: ignore[arg-type]
        rendezvous: Any
        if config.rendezvous_dir is not None:
            rendezvous = DirectoryRendezvous(Path(config.rendezvous_dir) / prefix.replace("/", "_") / str(self.group_index))
        elif store is not None:
            rendezvous = StoreRendezvous(store, f"{prefix}/observers/{self.group_index}")
        else:
            rendezvous = _GroupRendezvous(self._control, self.group_index)
        bind_host = config.observer_host or ("127.0.0.1" if _single_host() else _routable_address())
        self.observer = start_observer(
            self.publisher, group_ranks=group, rendezvous=rendezvous, secret=secret,
            config=config.observer_fields(), report_path=self.reports_path, on_failure="report",
            on_hang=config.on_hang, exclude_hosts_path=self.run_dir / EXCLUDE_HOSTS_FILE, bind_host=bind_host,
            hostname=self.hostname, kill_grace_s=config.kill_grace_s, timeout_s=config.collective_timeout_s,
        )

    # -- restore ------------------------------------------------------------------------------

    def restore(self) -> int:
        """Collective. On a fresh run: 0. After a restart: restore (with DCP) the checkpoint the
        recovery decision picks for the failure the previous attempt recorded, and return its
        step. A quarantined checkpoint is never loaded."""
        if self._started:
            raise RuntimeError("restore() must come before the first job.step(), once")
        decision: list[Any] = [None]
        if self.rank == 0:
            decision[0] = self._decide_restore()
        dist.broadcast_object_list(decision, src=0, group=self._control)
        step, checkpoint, failure, choice = decision[0]
        if checkpoint is not None and self.checkpoint_dir is not None:
            timeline, at = checkpoint
            with self.checkpoint_io("read", f"t{timeline}-s{at}"):
                loaded = dcp.load_checkpoint(self.checkpoint_dir, CheckpointId(timeline, at), self.model,
                                             self._optimizer_for_dcp())
            if loaded != at:
                raise RuntimeError(f"checkpoint t{timeline}/s{at} held step {loaded}")
        self._begin(int(step), restored=checkpoint is not None, failure=failure, choice=choice)
        return int(step)

    def _optimizer_for_dcp(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("scout saves and restores checkpoints of the model and its optimizer: pass the optimizer")
        return self.optimizer

    def _previous_failure(self) -> FailureClass | None:
        """The failure the previous attempt of this run recorded: fault reports written after
        the last attempt's start. None when no attempt ran before."""
        records = reports.read_records(self.reports_path)
        starts = [i for i, r in enumerate(records) if r["kind"] == "restart" and r["reason"] in ("started", "restored")]
        if not starts:
            return None
        found = {_FAILURE_OF_KIND[r["kind"]] for r in records[starts[-1] + 1:] if r["kind"] in _FAILURE_OF_KIND}
        if not found:
            return FailureClass.UNCERTAIN  # the job stopped, and nobody saw why
        return next(f for f in _FAILURE_ORDER if f in found)

    def _decide_restore(self) -> tuple[int, tuple[int, int] | None, str | None, str | None]:
        if self.writer is None or self.checkpoint_dir is None:
            return 0, None, None, None
        failure = self._previous_failure()
        state = self.writer.state
        if failure is None and not state.context.checkpoints:
            return 0, None, None, None
        decision = recover(state, failure or FailureClass.UNCERTAIN)
        if decision.checkpoint is None:
            return 0, None, (failure or FailureClass.UNCERTAIN).value, decision.choice.value
        checkpoint = decision.checkpoint
        return checkpoint.step, (checkpoint.timeline, checkpoint.step), (failure or FailureClass.UNCERTAIN).value, \
            decision.choice.value

    def _begin(self, step: int, *, restored: bool, failure: str | None, choice: str | None) -> None:
        """Start the step loop at ``step``: the gate's timeline, the replay schedule, the record."""
        self._started = True
        self._step = step
        if self.replayer is not None:
            self.replayer.resume_at(step)
        if self.checks is not None:
            self.checks.resume_at(step)
        if self.writer is not None:
            context = self.writer.state.context
            if context.checkpoints or context.cycle_start_step is not None or context.timeline:
                self._apply(Restart(step if restored else None))
            self._apply(CycleBoundary(step))
        if self.rank == 0:
            evidence = {"failure": failure, "choice": choice, "cycle_steps": self.cycle_steps,
                        "checkpoint_every_steps": self.cycle_steps * self.config.checkpoint_every_cycles,
                        "world_size": self.world_size, "hosts": self.hosts,
                        "groups": [list(g) for g in self.partition]}
            if self.writer is not None and self.writer.recorder.fail_closed is not None:
                # GATE-31/32: the manifest lost its newest generation; only verified checkpoints
                # were restorable, and the report says why.
                evidence["fail_closed"] = self.writer.recorder.fail_closed
            self._report("restart", "restored" if restored else "started", step=step, evidence=evidence)
        self.publisher.end_stage()  # start-up (or the restore) is over
        self.publisher.begin_step(step + 1)
        if self.loop is not None:
            self.loop.begin_step()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> None:
        """Once per training step, after ``optimizer.step()``: replay checks, straggler timing,
        the gate, a checkpoint at cycle ends. Raises :class:`FaultDetected` on every rank at the
        same step when a fault's policy is ``restart``."""
        if self._closed:
            raise RuntimeError("this scout job was closed")
        if not self._started:
            self._begin(0, restored=False, failure=None, choice=None)
        self._step += 1
        step = self._step
        clock = time.perf_counter
        if self.replayer is not None:
            started = clock()
            # The loop body of this step ends here (LOOP-1): a check step's loop check is
            # collective, and comes before replay's exchanges on every rank.
            loop_check = self.loop.end_step(step) if self.loop is not None else None
            report = self.replayer.after_optimizer_step()
            judged = clock()
            self.costs.add("replay_s", judged - started)
            self.costs.add("replay_compute_s", sum(report.compute_ms.values()) / 1e3)
            self.costs.add("replay_collectives_s", report.collective_ms / 1e3)
            loop_events = loop_check.events if loop_check is not None else ()
            if report.results or report.straggler_events or loop_events:
                self._judge(step, report, tuple(loop_events))
            if self.checks is not None:
                self._feed(self.checks.after_step(step))
            checkpointed = clock()
            self.costs.add("gate_and_reports_s", checkpointed - judged)
            if self.cycle_steps and step % self.cycle_steps == 0:
                self._cycle_end(step)
                self.costs.add("cycle_end_s", clock() - checkpointed)
        instrument.mark_step(step + 1)
        if self.loop is not None:
            self.loop.begin_step()
        if self._fault is not None:
            fault, self._fault = self._fault, None
            raise fault

    def _judge(self, step: int, report: StepReport, loop_events: tuple[StragglerEvent, ...] = ()) -> None:
        """Job-wide results of this step's checks: to the gate (rank 0), to reports, and the
        SDC policy -- decided alike on every rank from the same gathered results."""
        mine = (self.group_index, self.peers.position, report.results, (*report.straggler_events, *loop_events),
                dict(report.performance_ratios))
        if len(self.partition) > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine, group=self._control)
        else:
            gathered = [(0, 0, *mine[2:])]  # one group: every rank decided the same from the same rows
        by_group: dict[int, tuple[RecipeResult, ...]] = {}
        stragglers: list[tuple[StragglerEvent, Any]] = []
        for group_index, position, results, events, ratios in gathered:
            if position == 0:
                by_group[group_index] = tuple(results)
                stragglers += [(event, ratios.get(event.kind.value)) for event in events]
        sdc: list[tuple[str, RecipeResult, int]] = []
        for group_index, results in sorted(by_group.items()):
            for result in results:
                if result.status is Status.ATTRIBUTED:
                    sdc.append((self.group_names[group_index], result, group_index))
        if self.writer is not None:
            recipes = sorted({str(r.recipe) for results in by_group.values() for r in results})
            for recipe in recipes:
                per_group = {self.group_names[g]: r for g, results in by_group.items() for r in results
                             if str(r.recipe) == recipe}
                self._apply(recipe_verdicts(self.writer.state.context.config, recipe,
                                            self.writer.state.context.cycle, step, per_group))
        if self.rank == 0:
            for event, ratios in stragglers:
                self._append(reports.make_record(
                    **straggler_record_arguments(event, hosts=dict(enumerate(self.hosts)), group_ratios=ratios),
                    job_id=self.identity.job_id, generation=self.identity.generation, reporter_rank=self.rank))
            for group, result, group_index in sdc:
                ranks = [self.partition[group_index][p] for p in result.outliers]
                self._report("sdc", "replay-mismatch", ranks=ranks, step=step, evidence={
                    "recipe": str(result.recipe), "group": group, "sources": list(result.sources),
                    "group_ranks": list(self.partition[group_index])})
        if sdc:
            ranks = sorted({self.partition[g][p] for _, result, g in sdc for p in result.outliers})
            self._on_sdc(step, ranks, "replay outputs differ from the strict majority")

    def _on_sdc(self, step: int, ranks: Sequence[int], reason: str) -> None:
        """The SDC policy, decided alike on every rank: ``restart`` names the hosts at fault for
        the scheduler (rank 0) and makes this step's ``job.step()`` raise FaultDetected."""
        if self.config.on_sdc != "restart" or self._fault is not None:
            return
        hosts = sorted({self.hosts[r] for r in ranks})
        if self.rank == 0:
            reports.append_hosts(self.run_dir / EXCLUDE_HOSTS_FILE, hosts)
            self._report("restart", "sdc", ranks=ranks, step=step, evidence={"policy": "on_sdc=restart"})
        self._fault = FaultDetected("sdc", step, ranks, hosts, reason)

    def _cycle_end(self, step: int) -> None:
        """A replay cycle ends at ``step``: close it at the gate and, every
        ``checkpoint_every_cycles``, save a checkpoint (collective) and capture it."""
        if self.checks is not None:  # the canary belongs to the cycle it closes (CANARY-7)
            self._feed(self.checks.at_cycle_end(step))
        if self.writer is not None:
            self._apply(CycleBoundary(step))
        every = self.cycle_steps * self.config.checkpoint_every_cycles
        if self.checkpoint_dir is None or step % every or self._fault is not None:
            return
        timeline = [self.writer.state.context.timeline if self.writer is not None else 0]
        dist.broadcast_object_list(timeline, src=0, group=self._control)
        checkpoint = CheckpointId(int(timeline[0]), step)
        with self.checkpoint_io("write", str(checkpoint)):
            dcp.save_checkpoint(self.checkpoint_dir, checkpoint, self.model, self._optimizer_for_dcp(),
                                process_group=self._control)
        if self.writer is not None:
            self._apply(CheckpointCaptured(step))

    def _exchange(self, value: Any) -> list[Any]:
        """Every rank's ``value``, by rank, over scout's control group (JobChecks)."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self._control)
        return gathered

    def _feed(self, feeds: Sequence[GateFeed]) -> None:
        """Expert-replay and canary results: to the gate (rank 0), to reports, and the SDC policy."""
        for feed in feeds:
            if self.writer is not None:
                context = self.writer.state.context
                self._apply(recipe_verdicts(context.config, feed.recipe, context.cycle, feed.step, feed.results))
            for finding in feed.findings:
                if self.rank == 0:
                    self._report("sdc", finding.reason, ranks=finding.ranks, step=finding.step, evidence=finding.evidence)
                self._on_sdc(finding.step, finding.ranks, finding.reason)

    def _apply(self, event: Any) -> None:
        """Rank 0: step the gate (durably) and report what it decided."""
        assert self.writer is not None
        effects = self.writer.apply(event)
        for effect in effects:
            if isinstance(effect, TrustChange):
                self._report("checkpoint", effect.after.value.lower().replace("_", "-"), step=effect.checkpoint.step,
                             evidence={"checkpoint": str(effect.checkpoint),
                                       "before": None if effect.before is None else effect.before.value,
                                       "after": effect.after.value, "detail": effect.reason})
            elif isinstance(effect, GateReport) and effect.kind is GateReportKind.UNCHECKED:
                self._report("unchecked", "replay-inconclusive", step=effect.step, evidence={
                    "cycle": effect.cycle, "recipes": list(effect.recipes), "groups": list(effect.groups),
                    "detail": effect.detail})

    def _report(self, kind: str, reason: str, *, ranks: Sequence[int] = (), step: int | None = None,
                evidence: Mapping[str, Any] | None = None) -> None:
        source = {"checkpoint": "gate", "unchecked": "gate", "restart": "job", "finished": "job"}.get(kind, "replay")
        record = reports.make_record(kind, source=source, reason=reason, job_id=self.identity.job_id,
                                     generation=self.identity.generation, ranks=ranks,
                                     hosts=[self.hosts[r] for r in ranks], step=step, evidence=evidence,
                                     reporter_rank=self.rank)
        self._append(record)

    def _append(self, record: dict[str, Any]) -> None:
        try:
            reports.append_record(self.reports_path, record)
        except OSError as error:
            logger.warning("scout: could not append to %s: %s", self.reports_path, error)
        if record["kind"] in ("sdc", "straggler", "unchecked") or record["reason"] == "quarantined":
            logger.warning("%s", reports.record_line(record))

    # -- the user's other hooks -----------------------------------------------------------

    def loader(self, loader: Any, name: str = "train") -> Any:
        """Wrap a data loader so that waiting for a batch is published as data loading (a slow
        data path is then a data stall with its own threshold, not a hang)."""
        return instrument.instrument_dataloader(loader, name)

    @contextlib.contextmanager
    def checkpoint_io(self, operation: str, name: str = "checkpoint") -> Iterator[None]:
        """Mark other checkpoint reads (``"read"``) and writes (``"write"``) of the job."""
        with instrument.checkpoint_io(operation, name):
            yield

    # -- the end ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop everything scout started on this rank; the model and optimizer are as they were."""
        if self._closed:
            return
        self._closed = True
        if self.rank == 0 and self._started:
            self._report("finished", "closed", step=self._step)
        instrument.uninstrument()
        if self.replayer is not None:
            self.replayer.close()
        if self.checks is not None:
            self.checks.close()
        self.publisher.close()
        if self.observer is not None:
            self.observer.close()
        if self.writer is not None:
            self.writer.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    run_dir: str | os.PathLike[str],
    checkpoint_dir: str | os.PathLike[str] | None = None,
    peers: TorchPeerGroup | None = None,
    config: str | os.PathLike[str] | Config | Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Job:
    """Attach scout to ``model`` (a plain module, DDP or FSDP2) and ``optimizer`` on every rank;
    collective over the world. ``peers``: the replay peer groups (default: the whole world as
    one group of data-parallel replicas; ``TorchPeerGroup.from_mesh`` for HSDP or 2-D meshes).
    ``config``: a TOML file, a mapping or a :class:`Config`; keyword ``overrides`` win over it,
    and ``SCOUT_<KEY>`` environment variables over the file (docs/attach.md)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout.attach needs torch.distributed: call init_process_group first")

    def checked() -> Config:
        resolved = load_config(config, overrides)
        check_directory(run_dir, "run_dir")
        if checkpoint_dir is not None:
            check_directory(checkpoint_dir, "checkpoint_dir")
        return resolved

    # Every rank checks; rank 0 says what is wrong, once (scout/job/startup.py).
    resolved = checked_on_every_rank(checked)
    if dist.get_rank() == 0 and (ignored := unknown_variables()):
        logger.warning("scout: environment variable(s) %s are not scout settings and are ignored "
                       "(the settings are in docs/attach.md)", ", ".join(ignored))
    started = time.monotonic()
    job = Job(model, optimizer, run_dir=run_dir, checkpoint_dir=checkpoint_dir, peers=peers, config=resolved)
    logger.info("scout: attached on rank %d in %.2f s", job.rank, time.monotonic() - started)
    return job
