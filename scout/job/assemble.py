"""What ``scout.attach`` starts on a rank, assembled from the configuration (docs/attach.md):
scout's control group and the hosts, the progress record and its instrumentation, the
observer side (``scout.observer.startup``), the checks (``scout.job.checks``), the gate's
writer on rank 0 (``scout.job.gate_driver``) and the pipeline that runs them each step.
Collective over the world; ``Job`` drives what this returns.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import nn

from scout.core.observer import Stage
from scout.gate.model import GateConfig
from scout.gate.recorder import GateWriter
from scout.job import bench_switches
from scout.job.calibration import Calibration
from scout.job.checks import Cycle, ReplayCheck, build_checks
from scout.job.config import Config
from scout.job.control import ControlGroup
from scout.job.gate_driver import GateDriver, Reporter, restarts_left
from scout.job.hooks import publish_ddp_buckets
from scout.job.idle_loops import IdleLoops
from scout.job.layouts import JobLayout, resolve_layout
from scout.job.pipeline import Pipeline
from scout.job.run_dir import RunDir
from scout.observer import instrument
from scout.observer.completion import module_device
from scout.observer.launch import ObserverHandle
from scout.observer.progress import (
    ProgressPublisher,
    RecordIdentity,
    reclaim_stale_records,
    remove_dead_records,
)
from scout.observer.startup import start_job_observer
from scout.ops.launch import NodeOps, observer_rounds_path
from scout.ops.slurm import host_name
from scout.replay.collectives import TorchPeerGroup
from scout.replay.mesh import check_not_sharded_over_replicas
from scout.transport import gloo_groups

__all__ = ["Assembly", "assemble"]

logger = logging.getLogger("scout")


@attrs.define
class Assembly:
    rank: int
    world_size: int
    run_dir: RunDir
    checkpoint_dir: Path | None
    control: ControlGroup
    hosts: tuple[str, ...]
    identity: RecordIdentity
    publisher: ProgressPublisher
    observer: ObserverHandle | None
    pipeline: Pipeline
    ops: NodeOps | None
    #: WAIT-5: the event loops of scout's own gloo groups, idle except inside scout's calls.
    idle_loops: IdleLoops
    #: LAYOUT-1: the replica groups, their names, the stage (checkpoint namespace).
    layout: JobLayout
    #: spec/budget.md: the replay cadence the overhead budget chooses (None without replay).
    calibration: Calibration | None = None


def _rendezvous_backend(parent: int) -> str | None:
    """torchrun's rendezvous backend, read from the agent's command line (the trainer's parent);
    None when the parent is not torchrun or cannot be read."""
    try:
        arguments = [a.decode(errors="replace") for a in Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return None
    if not any(a.endswith("torchrun") or a == "torch.distributed.run" for a in arguments):
        return None
    if "--standalone" in arguments:
        return "c10d"
    for index, argument in enumerate(arguments):
        for flag in ("--rdzv-backend", "--rdzv_backend"):
            if argument.startswith(flag + "="):
                return argument.split("=", 1)[1]
            if argument == flag and index + 1 < len(arguments):
                return arguments[index + 1]
    return "static"  # torchrun's default


def _warn_about_the_launcher(rank: int) -> None:
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0
    if rank == 0 and restarts and _rendezvous_backend(os.getppid()) == "static":
        logger.warning("scout: torchrun's static rendezvous (--master-port without --rdzv-backend) fails to restart "
                       "in most runs on torch 2.13 (gloo cannot connect in the restarted attempt); for restarts launch "
                       "with --standalone or --rdzv-backend c10d --rdzv-endpoint HOST:PORT (docs/attach.md)")
    if (rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and restarts):
        logger.warning("scout: torchrun shares its rendezvous store with the workers, and torch 2.13's "
                       "restarted attempts can then read the previous attempt's addresses and fail to connect "
                       "(pytorch issue 135712); launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for restarts")


def _instrument(model: nn.Module, identity: RecordIdentity,
                started: list[Callable[[], object]]) -> tuple[ProgressPublisher, Callable[..., None]]:
    """The progress record and the instrumentation that publishes into it (docs/observer.md);
    returns the publisher and how to listen to every collective of a step (LOOP-1: the
    instrumented ones and DDP's gradient buckets)."""
    reclaim_stale_records(identity)
    remove_dead_records()  # PROGRESS-12: whatever crashed trainers of any job left on this host
    publisher = ProgressPublisher(identity)
    started.append(publisher.close)  # FRAME-2
    started.append(instrument.uninstrument)
    # Start-up is published as a checkpoint read (its long threshold): a slow start is never a hang report.
    publisher.begin_stage(Stage.CHECKPOINT_READ)
    # Parts a benchmark may switch off to measure them (bench_switches: not settings).
    off = bench_switches.parts_off()
    instrument.instrument(publisher, collectives="instrumentation" not in off, completion="completion" not in off,
                          device=module_device(model))  # INSTR-10: the marks go on the model's GPU
    # LOOP-5: a listener is told a collective started and returns what to call at its completion.
    bucket_listeners: list[Callable[[], Callable[[], None] | None]] = []
    buckets = "ddp_hook" not in off and publish_ddp_buckets(model, publisher, bucket_listeners)
    if "instrumentation" not in off:
        instrument.instrument_module(model)

    def listen(listener: Callable[..., Callable[[], None] | None]) -> None:
        instrument.add_collective_listener(listener)
        if buckets:
            bucket_listeners.append(listener)

    return publisher, listen


def _verification_impossible(peers: TorchPeerGroup, config: Config, checks: Sequence[Any]) -> list[str]:
    """Settings under which the gate can never promote a checkpoint (GATE-1)."""
    problems = []
    if peers.size < 2:
        problems.append("the replay peer group has one member, so no replay can agree with anyone")
    if config.max_capture_bytes == 0:
        problems.append("max_capture_bytes is 0, so no replay input can be captured")
    for check in checks:
        if isinstance(check, ReplayCheck):
            if check.runner.schedule.uncovered():
                problems.append(f"recipes {[str(r) for r in check.runner.schedule.uncovered()]} are never replayed")
            if check.runner.disabled_reason is not None:
                problems.append(f"{check.name} is disabled: {check.runner.disabled_reason}")
    return problems


def _never_replayed(checks: Sequence[Any]) -> str | None:
    """spec/replay.md CAP-7: the recipes FSDP2 shards over tensor-parallel blocks are never ready;
    the line rank 0 says at attach about them, or None."""
    never = sorted({str(r) for check in checks if isinstance(check, ReplayCheck)
                    for r in getattr(check.runner.executor, "never_ready_recipes", ())})
    if not never:
        return None
    return (f"scout: NOT COVERED: recipes {never} are sharded by FSDP2 and by tensor parallel, so their parameters "
            "are still sharded at every call and they are never replayed (not_ready): an SDC in them is not found, "
            "and no checkpoint can become recovery-verified; replay does not cover FSDP2 over tensor-parallel "
            "blocks yet (docs/layouts.md)")


def _cycle_line(cycle: Cycle, config: Config, checkpoints: bool) -> str:
    """spec/replay.md REC-8: what rank 0 says at attach about the cycle and the checkpoints."""
    line = f"scout: replay cycle {cycle.steps} steps (set by {cycle.set_by}{'; ' + cycle.note if cycle.note else ''})"
    if config.replay_interval_steps is None:  # BUDGET-5: the calibration window
        return (line + f": calibrating -- at its end scout chooses the cadence that keeps its work within "
                f"overhead_budget={100 * config.overhead_budget:g} % of a step, and says what it buys (spec/budget.md)")
    if checkpoints:
        line += (f"; a checkpoint every {cycle.steps * config.checkpoint_every_cycles} steps "
                 f"(checkpoint_every_cycles={config.checkpoint_every_cycles}), verified one cycle later")
    return line


def assemble(model: nn.Module, optimizer: torch.optim.Optimizer | None, *, run_dir: str | os.PathLike[str],
             checkpoint_dir: str | os.PathLike[str] | None, peers: TorchPeerGroup | None, config: Config,
             layout: Any = None) -> Assembly:
    """Start every part on this rank. FRAME-2: if anything raises on the way, what was started
    is stopped again, newest first -- the observer process, the metrics sidecar, the checks'
    hooks, the instrumentation and the progress record -- before the error goes on."""
    started: list[Callable[[], object]] = []
    try:
        return _assemble(model, optimizer, run_dir=run_dir, checkpoint_dir=checkpoint_dir, peers=peers,
                         config=config, started=started, layout=layout)
    except BaseException:
        for stop in reversed(started):
            try:
                stop()
            except Exception as error:  # the first error is the one to see; this one is logged
                logger.warning("scout: cleaning up a failed attach: %s: %s", type(error).__name__, error)
        raise


def _assemble(model: nn.Module, optimizer: torch.optim.Optimizer | None, *, run_dir: str | os.PathLike[str],
              checkpoint_dir: str | os.PathLike[str] | None, peers: TorchPeerGroup | None, config: Config,
              started: list[Callable[[], object]], layout: Any = None) -> Assembly:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout.attach needs torch.distributed: call init_process_group first")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # LAYOUT-1: the replicas (and from them the replay groups, their names, the observer's
    # peers) follow from the layout when one is given, else from the peers as before.
    job_layout = resolve_layout(layout, None if peers is None else peers.partition, rank=rank, world_size=world_size)
    if job_layout.layout is not None:  # LAYOUT-1: replicas hold equal state, never FSDP2's shards
        check_not_sharded_over_replicas(model, job_layout.layout.replicate)
    sink = RunDir(run_dir)
    _warn_about_the_launcher(rank)
    control = ControlGroup(config.collective_timeout_s)
    hostname = host_name()  # Slurm's node name under Slurm (spec/ops.md OPS-7)
    hosts = tuple(control.all_gather(hostname))
    identity = RecordIdentity.from_environment(rank, job_id=config.job_id)
    publisher, listen = _instrument(model, identity, started)
    if (peers is None and layout is None and rank == 0
            and any(type(p).__name__ == "DTensor" for p in model.parameters())):
        logger.warning("scout: the model's parameters are sharded (FSDP2 or tensor parallel), so the whole world "
                       "is not one group of replicas: pass layout=mesh (the root DeviceMesh, docs/layouts.md) or "
                       "peers=scout.replay.TorchPeerGroup.from_mesh(mesh, ('replicate',)) naming the replicas, or "
                       "every replay will be Inconclusive")
    if rank == 0:
        for line in job_layout.said():  # LAYOUT-5: once, on the console, in words
            logger.info("%s", line)
            print(line, file=sys.stderr, flush=True)
    peers = peers if peers is not None else TorchPeerGroup(partition=job_layout.partition,
                                                           timeout_s=config.collective_timeout_s)
    group_index = job_layout.index
    observer = None
    if config.observer:
        observer = start_job_observer(
            publisher, group_ranks=job_layout.observer_peers, group_index=group_index, control=control.group,
            observer_config=config.observer_fields(), rendezvous_dir=config.rendezvous_dir,
            observer_host=config.observer_host, report_path=sink.reports_path,
            exclude_hosts_path=sink.exclude_hosts_path, hostname=hostname, on_hang=config.on_hang,
            kill_grace_s=config.kill_grace_s, timeout_s=config.collective_timeout_s,
            rounds_path=observer_rounds_path(config, sink.path, rank), restarts_left=restarts_left())
        if observer is not None:
            started.append(observer.close)
    if rank == 0:  # LOOP-6: count an earlier attempt's timing lines now, not in a training step
        sink.timing_log.count_existing()
    reporter = Reporter(sink if rank == 0 else None, job_id=identity.job_id, generation=identity.generation,
                        hosts=hosts, rank=rank, restarts_left=restarts_left(), earlier_records=sink.records)
    checks: list[Any] = []
    cycle_steps, gate, ckpt = 0, None, None if checkpoint_dir is None else Path(checkpoint_dir)
    # LAYOUT-4: groups of one replica compare nothing; replay is off there (attach said so once)
    # rather than an Inconclusive result at every check.
    if config.replay and not job_layout.uncovered:
        checks, cycle = build_checks(model, optimizer, peers, config, rank=rank, hosts=hosts,
                                     exchange=control.all_gather, run_dir=str(sink.path),
                                     add_collective_listener=listen, names=job_layout.names,
                                     loop_check=job_layout.loop_check_off is None)
        started.extend(check.close for check in checks)
        cycle_steps, said = cycle.steps, _cycle_line(cycle, config, ckpt is not None)
        logger.info("%s", said)
        if rank == 0:
            print(said, file=sys.stderr, flush=True)  # REC-8: on the console, not only in a log
        if rank == 0 and "gate" not in bench_switches.parts_off():
            notes = [note for check in checks for note in getattr(check, "notes", ())]
            names = tuple(dict.fromkeys(n for check in checks for n in check.layout.names))
            gate_config = GateConfig(sink.path.resolve().name or "run",
                                     [r for check in checks for r in check.gate_recipes()], names, notes)
            two = tuple(name for name, group in zip(job_layout.names, job_layout.partition, strict=True)
                        if len(group) == 2)
            gate = GateDriver(GateWriter.open(sink.gate_path, gate_config), reporter, two_replica_groups=two)
            started.append(gate.close)
        never = _never_replayed(checks)
        if never is not None and rank == 0:  # CAP-7: said once (info: the print is the console's)
            logger.info("%s", never)
            print(never, file=sys.stderr, flush=True)
        if ckpt is not None:
            for problem in _verification_impossible(peers, config, checks):
                logger.warning("scout: no checkpoint can ever become recovery-verified: %s", problem)
    elif ckpt is not None:
        if rank == 0:
            logger.warning("scout: replay is off, so no checkpoint can be verified; scout saves no checkpoints "
                           "(checkpoint_dir is ignored)")
        ckpt = None
    pipeline = Pipeline(checks, rank=rank, world_size=world_size, hosts=hosts, groups=peers.partition,
                        on_sdc=config.on_sdc, cycle_steps=cycle_steps,
                        checkpoint_every_cycles=config.checkpoint_every_cycles, reporter=reporter, gate=gate,
                        timeout_s=config.collective_timeout_s)
    pipeline.loop_check_off = job_layout.loop_check_off if checks else None  # LAYOUT-3, for scout report
    calibration = None if not checks else Calibration(checks, pipeline, config=config, all_gather=control.all_gather,
                                                      reporter=reporter, rank=rank, checkpoints=ckpt is not None)
    if observer is not None:
        observer.wait_ready(config.collective_timeout_s)
        instrument.check_at_each_step(observer.check)
    ops = NodeOps.start(config, run_dir=sink.path, publisher=publisher, group=control.group, rank=rank,
                        host=hostname)  # metrics and on_report (docs/metrics.md)
    if ops is not None:
        started.append(ops.close)
    control.barrier()
    return Assembly(rank, world_size, sink, ckpt, control, hosts, identity, publisher, observer, pipeline, ops,
                    IdleLoops(gloo_groups.own_loop_threads()),  # WAIT-5, WAIT-6: none on a gloo job
                    job_layout, calibration=calibration)
