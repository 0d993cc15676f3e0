"""``scout.attach``: all of scout on a training job, in one call (docs/attach.md).

    import scout
    job = scout.attach(model, optimizer, run_dir="runs/exp1", checkpoint_dir="ckpt/exp1")
    start = job.restore()        # 0 on a fresh run, else the step restored
    for step in range(start, steps):
        ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
        job.step()
    job.close()

``attach`` is collective over the world (after ``init_process_group``): it assembles
(``scout.job.assemble``) the progress record and its instrumentation, one out-of-band observer
per rank (hangs, desyncs, stalls), the checks (replay for SDC and stragglers, loop stragglers,
experts, the canary) and the two-cycle checkpoint gate, whose one writer is rank 0. ``Job``
drives them: each ``step()`` runs the pipeline (``scout.job.pipeline``: checks, one exchange,
the gate, reports, the fault policy) on scout's control group and, at a cycle end where one is
due, saves a DCP checkpoint and reports its capture. Everything scout finds lands in ``run_dir``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout.core.failure import FailureClass
from scout.gate import dcp
from scout.gate.model import CheckpointId
from scout.job.assemble import assemble
from scout.job.config import Config, load_config, unknown_variables
from scout.job.gate_driver import RestoreDecision
from scout.job.pipeline import FaultDetected, run_step
from scout.job.startup import check_directory, checked_on_every_rank
from scout.observer import instrument
from scout.replay.collectives import TorchPeerGroup
from scout.reports.kinds import ReportKind, attempt_failure

__all__ = ["FaultDetected", "Job", "attach"]

logger = logging.getLogger("scout")


class Job:
    """scout attached to one rank of a training job. Made by :func:`attach`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 run_dir: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str] | None,
                 peers: TorchPeerGroup | None, config: Config) -> None:
        self.model, self.optimizer, self.config = model, optimizer, config
        self.parts = assemble(model, optimizer, run_dir=run_dir, checkpoint_dir=checkpoint_dir, peers=peers,
                              config=config)
        self.rank, self.world_size = self.parts.rank, self.parts.world_size
        self.publisher, self.observer, self.pipeline = self.parts.publisher, self.parts.observer, self.parts.pipeline
        self.pipeline.clock = time.perf_counter
        #: Seconds this rank spent in each part of scout inside job.step() (bench/attach_overhead.py).
        self.costs = self.pipeline.costs
        self.timeline = self._step = 0
        self._started = self._closed = False

    def restore(self) -> int:
        """Collective. On a fresh run: 0. After a restart: restore (with DCP) the checkpoint the
        recovery decision picks for the failure the previous attempt recorded, and return its
        step. A quarantined checkpoint is never loaded."""
        if self._started:
            raise RuntimeError("restore() must come before the first job.step(), once")
        failure = attempt_failure(self.parts.run_dir.records()) if self.rank == 0 else None
        self._begin(failure, checkpoints=self.parts.checkpoint_dir is not None)
        return self._step

    def _begin(self, failure: FailureClass | None, *, checkpoints: bool) -> None:
        """Start the step loop where the gate's writer decides (every rank; collective)."""
        decision: RestoreDecision = self.parts.control.broadcast(
            self.pipeline.decide_restore(failure, checkpoints=checkpoints))
        if decision.checkpoint is not None and self.parts.checkpoint_dir is not None:
            with self.checkpoint_io("read", str(decision.checkpoint)):
                loaded = dcp.load_checkpoint(self.parts.checkpoint_dir, decision.checkpoint, self.model,
                                             self._optimizer_for_dcp())
            if loaded != decision.step:
                raise RuntimeError(f"checkpoint {decision.checkpoint} held step {loaded}")
        self._started = True
        self._step, self.timeline = decision.step, decision.timeline
        self.pipeline.begin(decision)
        self.publisher.end_stage()  # start-up (or the restore) is over
        self.publisher.begin_step(self._step + 1)

    def _optimizer_for_dcp(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("scout saves and restores checkpoints of the model and its optimizer: pass the optimizer")
        return self.optimizer

    def step(self) -> None:
        """Once per training step, after ``optimizer.step()``: the checks, the gate, a checkpoint
        at cycle ends. Raises :class:`FaultDetected` on every rank at the same step when a
        fault's policy is ``restart``."""
        if self._closed:
            raise RuntimeError("this scout job was closed")
        if not self._started:  # no restore(): a fresh start at step 0, whatever the manifest holds
            self._begin(None, checkpoints=False)
        self._step += 1
        outcome = self.parts.control.run(run_step(self.pipeline, self._step))
        if outcome.checkpoint_due and self.parts.checkpoint_dir is not None:
            started = time.perf_counter()
            self._checkpoint(self._step)
            self.costs["cycle_end_s"] = self.costs.get("cycle_end_s", 0.0) + time.perf_counter() - started
        instrument.mark_step(self._step + 1)
        if self.parts.ops is not None:  # metrics and on_report's per-rank stats (docs/metrics.md)
            self.parts.ops.after_step(self._step, self.costs, self.pipeline.straggler_trackers())
        self.pipeline.step_begins()
        if outcome.stop is not None:
            raise FaultDetected.of(outcome.stop)

    def _checkpoint(self, step: int) -> None:
        """Save the checkpoint of ``step`` (collective, DCP) and tell the gate it is complete."""
        assert self.parts.checkpoint_dir is not None
        checkpoint = CheckpointId(self.timeline, step)
        with self.checkpoint_io("write", str(checkpoint)):
            dcp.save_checkpoint(self.parts.checkpoint_dir, checkpoint, self.model, self._optimizer_for_dcp(),
                                process_group=self.parts.control.group)
        self.pipeline.captured(step)

    def loader(self, loader: Any, name: str = "train") -> Any:
        """Wrap a data loader so that waiting for a batch is published as data loading (a slow
        data path is then a data stall with its own threshold, not a hang)."""
        return instrument.instrument_dataloader(loader, name)

    @contextlib.contextmanager
    def checkpoint_io(self, operation: str, name: str = "checkpoint") -> Iterator[None]:
        """Mark other checkpoint reads (``"read"``) and writes (``"write"``) of the job."""
        with instrument.checkpoint_io(operation, name):
            yield

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop everything scout started on this rank; the model and optimizer are as they were."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self.pipeline.reporter.record(ReportKind.FINISHED, "closed", step=self._step)
        instrument.uninstrument()
        self.pipeline.close()
        self.publisher.close()
        if self.observer is not None:
            self.observer.close()
        if self.parts.ops is not None:
            self.parts.ops.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach(model: nn.Module, optimizer: torch.optim.Optimizer | None, *, run_dir: str | os.PathLike[str],
           checkpoint_dir: str | os.PathLike[str] | None = None, peers: TorchPeerGroup | None = None,
           config: str | os.PathLike[str] | Config | Mapping[str, Any] | None = None, **overrides: Any) -> Job:
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
