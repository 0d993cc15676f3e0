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
drives them: ``restore()`` runs the restore program (``scout.job.restore``: the recovery decision,
RECOVERY-7's fallback, the load) and each ``step()`` (``scout.job.stepping``) the pipeline
(``scout.job.pipeline``: checks, one exchange, the gate, reports, the fault policy) on scout's
control group -- at a quiet step only its bookkeeping (spec/budget.md BUDGET-14) -- and, at a cycle end
where one is due, the save program (``scout.job.save``: a DCP checkpoint and its capture,
GATE-40). Everything scout finds lands in ``run_dir``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout.core.failure import FailureClass
from scout.gate import dcp
from scout.gate.model import CheckpointId
from scout.job import leaving, stepping
from scout.job.assemble import Assembly, assemble
from scout.job.boundary import Agreement, GuardedJob
from scout.job.config import Config, ConfigError, load_config, unknown_variables
from scout.job.gate_driver import RestoreDecision
from scout.job.inputs import checked_state, unwrap_model, unwrap_optimizer
from scout.job.pipeline import CheckpointSaveFailed, FaultDetected
from scout.job.restore import RestoreFiles, run_restore
from scout.job.run_dir import ADOPT_VARIABLE, bind, check_binding, our_records
from scout.job.save import SaveFiles, error_text
from scout.job.startup import check_directory, checked_on_every_rank
from scout.observer import instrument
from scout.observer.progress import launcher_job_id
from scout.replay.collectives import TorchPeerGroup
from scout.reports import guard
from scout.reports.kinds import FinishedReason, ReportKind, attempt_failure

__all__ = ["CheckpointSaveFailed", "FaultDetected", "Job", "attach"]

logger = logging.getLogger("scout")


class Job:
    """scout attached to one rank of a training job (made by :func:`attach`): its lifecycle, DCP and
    the exception boundary; it runs the restore, step and save programs on scout's control group."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 run_dir: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str] | None,
                 peers: TorchPeerGroup | None, config: Config, state: Mapping[str, Any] | None = None,
                 layout: Any = None) -> None:
        self.model, self.optimizer, self.config = model, optimizer, config
        #: FRAME-3: the other training state saved and restored with the model (attach(state=...)).
        self.registered: dict[str, Any] = dict(state or {})
        # spec/guard.md: the rank's record of scout's own failures, before any hook is installed.
        self.boundary = guard.activate(dist.get_rank())
        try:
            self.parts = assemble(model, optimizer, run_dir=run_dir, checkpoint_dir=checkpoint_dir, peers=peers,
                                  config=config, layout=layout)
        except BaseException:
            guard.deactivate(self.boundary)
            raise
        self.rank, self.world_size = self.parts.rank, self.parts.world_size
        self.publisher, self.observer, self.pipeline = self.parts.publisher, self.parts.observer, self.parts.pipeline
        self.pipeline.clock, self.pipeline.boundary = time.perf_counter, self.boundary
        self.guarded = GuardedJob(self.boundary, _agreement(self.parts, self.boundary, config), self.pipeline,
                                  rank=self.rank, ops=self.parts.ops)
        self.files = _dcp_files(self)  # the restore and save programs' disk work (None: no checkpoint_dir)
        self.costs = self.pipeline.costs  # seconds in each part of scout inside job.step() (bench/attach_overhead.py)
        self.timeline = self._step = 0
        #: The last step asked for a checkpoint (a cycle end, every checkpoint_every_cycles): scout
        #: saves its own with checkpoint_dir; an integration asks the framework to save (FRAME-11).
        self.checkpoint_due = False
        self._started = self._closed = self._leaving = self._said_left = False
        leaving.watch(self)  # PROGRESS-11/12: the user's exceptions and the interpreter's exit

    def leave(self, error: BaseException) -> None:
        """PROGRESS-11: this rank leaves by ``error``. Before anything else, the progress record
        says "exiting" (its observer stops judging it); then rank 0 writes a ``finished`` report
        with the last step and the error (not for ``FaultDetected``: its ``restart`` report says
        why). Idempotent; never raises (the caller is on its way out with ``error``)."""
        if self._leaving or self._closed:
            return
        self._leaving = True
        with contextlib.suppress(Exception):
            self.publisher.mark_exiting()
        if isinstance(error, FaultDetected):
            return
        reason = FinishedReason.INTERRUPTED if isinstance(error, KeyboardInterrupt) else FinishedReason.EXCEPTION
        with contextlib.suppress(Exception):
            self.pipeline.reporter.record(ReportKind.FINISHED, reason, step=self._step,
                                          evidence={"error": error_text(error), **self.guarded.parts_off_evidence()})

    def remove_record(self) -> None:
        """PROGRESS-12: at interpreter exit, remove this rank's progress record (closing it)."""
        with contextlib.suppress(Exception):
            self.publisher.close()

    def restore(self) -> int:
        """Collective. On a fresh run: 0. After a restart: restore (with DCP) the checkpoint the
        recovery decision picks for the failure the previous attempt recorded, and return its
        step. A quarantined checkpoint is never loaded."""
        if self._started:
            raise RuntimeError("restore() must come before the first job.step(), once")
        with leaving.on_error(self):  # PROGRESS-11: an error says "exiting" before anything else
            failure = attempt_failure(our_records(self.parts.run_dir.path)) if self.rank == 0 else None  # RECOVERY-6
            with self.parts.idle_loops.awake():  # WAIT-5: scout's groups work now
                self._begin(failure, checkpoints=self.parts.checkpoint_dir is not None)
        return self._step

    def _begin(self, failure: FailureClass | None, *, checkpoints: bool) -> None:
        """Start the step loop where the restore program decides (every rank; collective)."""
        restored = self.parts.control.run(run_restore(
            self.pipeline, failure, checkpoints=checkpoints, files=self.files and self.files[0],
            on_missing_checkpoint=self.config.on_missing_checkpoint, timeout_s=self.config.collective_timeout_s))
        self.begin_at(restored.decision, list(restored.lost))

    def begin_at(self, decision: RestoreDecision, lost: list[str] | None = None) -> None:
        """Start the step loop at ``decision.step`` (every rank; collective): the state of that
        checkpoint is loaded already -- by restore(), or by the framework's own resume
        (spec/frameworks.md FRAME-10, scout.job.framework)."""
        if self._started:
            raise RuntimeError("the step loop has begun already: restore() or begin_at() once, before job.step()")
        self._started = True
        self._step, self.timeline = decision.step, decision.timeline
        self.boundary.step = decision.step + 1
        self.pipeline.begin(decision, lost=lost or [])
        if self.parts.calibration is not None:  # spec/budget.md BUDGET-5, BUDGET-9
            self.parts.calibration.begin(decision.step)
        self.publisher.end_stage()  # start-up (or the restore) is over
        self.publisher.begin_step(self._step + 1)

    def _load(self, root: str | os.PathLike[str], checkpoint: CheckpointId) -> int:
        """DCP: load ``checkpoint`` from ``root`` on this rank (RestoreFiles.load); the step it held."""
        with self.checkpoint_io("read", str(checkpoint)):
            return dcp.load_checkpoint(root, checkpoint, self.model, _optimizer(self), registered=self.registered,
                                       namespace=self.parts.layout.checkpoint_namespace)

    def _save(self, root: str | os.PathLike[str], checkpoint: CheckpointId) -> None:
        """DCP: this rank's part of ``checkpoint`` under ``root`` (SaveFiles.save; collective)."""
        with self.checkpoint_io("write", str(checkpoint)):
            dcp.save_checkpoint(root, checkpoint, self.model, _optimizer(self), process_group=self.parts.control.group,
                                registered=self.registered, namespace=self.parts.layout.checkpoint_namespace)

    def step(self) -> None:
        """Once per training step, after ``optimizer.step()``: the checks, the gate, a checkpoint at
        cycle ends. Raises :class:`FaultDetected` on every rank at one step when a fault's policy is
        ``restart``, :class:`CheckpointSaveFailed` when a save failed and ``on_checkpoint_error =
        "stop"``; an error of scout's own is a report, its part goes off on every rank, training goes
        on (spec/guard.md)."""
        if self._closed:
            raise RuntimeError("this scout job was closed")
        if self._leaving and not self._said_left:
            self._said_left = True
            logger.warning("scout: job.step() after an exception left rank %d: its observer no longer watches it "
                           "(spec/observer.md PROGRESS-11); let the exception end the process", self.rank)
        try:
            stepping.step(self)  # the quiet path (spec/budget.md BUDGET-14) or the full one
        except BaseException as error:  # PROGRESS-11: the way out is marked before anything else
            self.leave(error)
            raise

    def loader(self, loader: Any, name: str = "train") -> Any:
        """Wrap a data loader so that waiting for a batch is published as data loading (a slow
        data path is then a data stall with its own threshold, not a hang)."""
        return instrument.instrument_dataloader(loader, name)

    def checkpoint_io(self, operation: str, name: str = "checkpoint") -> contextlib.AbstractContextManager[None]:
        """Mark other checkpoint reads (``"read"``) and writes (``"write"``) of the job."""
        return instrument.checkpoint_io(operation, name)

    @property
    def closed(self) -> bool:
        return self._closed

    def self_check_before(self, optimizer: torch.optim.Optimizer) -> None:
        """SELF-9: the live self-check at the pre-step hook of an optimizer not given to ``attach``
        (DeepSpeed's inner optimizer under ZeRO; ``Pipeline.self_check_before``)."""
        self.pipeline.self_check_before(optimizer)

    @property
    def parts_off(self) -> dict[str, int]:
        """The parts of scout switched off after a failure of their own, with the step each is
        off from (spec/guard.md GUARD-8); empty while everything runs."""
        return self.guarded.parts_off()

    def close(self) -> None:
        """Stop everything scout started on this rank; the model and optimizer are as they were.
        Never raises for scout's own errors (spec/guard.md GUARD-1): each one is logged."""
        if self._closed:
            return
        self._closed = True
        leaving.unwatch(self)
        with _logged("the finished report"):
            if self._started and not self._leaving:
                self.pipeline.reporter.record(ReportKind.FINISHED, FinishedReason.CLOSED, step=self._step,
                                              evidence=self.guarded.parts_off_evidence() or None)
        with _logged("removing the instrumentation"):
            instrument.uninstrument()
        with self.parts.idle_loops.awake():
            with _logged("the last agreement"):
                self.guarded.agreement.close()
            with _logged("closing the checks and the gate"):
                self.pipeline.close()
        for what, part in (("closing the progress record", self.publisher), ("stopping the observer", self.observer),
                           ("stopping the ops sidecar", self.parts.ops)):
            if part is not None:
                with _logged(what):
                    part.close()
        guard.deactivate(self.boundary)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if error is not None:
            self.leave(error)
        self.close()


def attach(model: nn.Module, optimizer: torch.optim.Optimizer | None, *, run_dir: str | os.PathLike[str],
           checkpoint_dir: str | os.PathLike[str] | None = None, peers: TorchPeerGroup | None = None,
           config: str | os.PathLike[str] | Config | Mapping[str, Any] | None = None, adopt_run_dir: bool = False,
           layout: Any = None, state: Mapping[str, Any] | None = None, **overrides: Any) -> Job:
    """Attach scout to ``model`` (a plain module, DDP, FSDP2, a tensor-parallel module or a
    pipeline stage's module) and ``optimizer`` on every rank; collective over the world.
    ``layout``: the job's root ``DeviceMesh`` (dimensions named ``pp``, ``dp``/``replicate``,
    ``tp``, ...) or a :class:`scout.ParallelLayout`; replay groups, the observer's peers and the
    checkpoints of pipeline stages follow from it (docs/layouts.md). ``peers`` instead: the replay
    peer groups (default: the whole world as one group of data-parallel replicas).
    ``config``: a TOML file, a mapping or a :class:`Config`; keyword ``overrides`` win over it,
    and ``SCOUT_<KEY>`` environment variables over the file (docs/attach.md). ``adopt_run_dir``
    (or ``SCOUT_ADOPT_RUN_DIR=1``): continue a run directory bound to another job (RECOVERY-6).
    ``state``: the other training state, by name (``{"lr": scheduler, "data": sampler}``), each
    with ``state_dict()``/``load_state_dict()``; saved in scout's checkpoints and brought back by
    ``restore()`` (spec/frameworks.md FRAME-3..5). Known framework wrappers of the model, the
    optimizer and the state are unwrapped; anything else is a ConfigError (FRAME-1)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scout.attach needs torch.distributed: call init_process_group first")

    jobs: tuple[str, ...] = ()

    inputs: dict[str, Any] = {}

    def checked() -> Config:
        nonlocal jobs
        # FRAME-1, FRAME-3: the objects first, before anything is started or written.
        inputs.update(model=unwrap_model(model), optimizer=unwrap_optimizer(optimizer), state=checked_state(state))
        resolved = load_config(config, overrides)
        check_directory(run_dir, "run_dir")
        if checkpoint_dir is not None:
            check_directory(checkpoint_dir, "checkpoint_dir")
        if dist.get_rank() == 0:  # the run directory is rank 0's (its reports, its gate)
            try:
                jobs = check_binding(run_dir, resolved.job_id or launcher_job_id(os.environ),
                                     adopt=adopt_run_dir or _adopt_from_environment())
            except ValueError as error:
                raise ConfigError(str(error)) from None
        return resolved

    # Every rank checks; rank 0 says what is wrong, once (scout/job/startup.py).
    resolved = checked_on_every_rank(checked)
    if dist.get_rank() == 0:
        bind(run_dir, jobs)
    if dist.get_rank() == 0 and (ignored := unknown_variables()):
        logger.warning("scout: environment variable(s) %s are not scout settings and are ignored "
                       "(the settings are in docs/attach.md)", ", ".join(ignored))
    started = time.monotonic()
    job = Job(inputs["model"], inputs["optimizer"], run_dir=run_dir, checkpoint_dir=checkpoint_dir, peers=peers,
              config=resolved, state=inputs["state"], layout=layout)
    logger.info("scout: attached on rank %d in %.2f s", job.rank, time.monotonic() - started)
    return job


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    """GUARD-1 at ``close()``: a failure of scout's own is logged, never raised."""
    try:
        yield
    except Exception:
        logger.exception("scout: %s failed at close(); the job goes on", what)


def _adopt_from_environment() -> bool:
    value = os.environ.get(ADOPT_VARIABLE, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ConfigError(f"environment variable {ADOPT_VARIABLE}={value!r}: expected 1 (adopt) or 0")


def _optimizer(job: Job) -> torch.optim.Optimizer:
    if job.optimizer is None:
        raise RuntimeError("scout saves and restores checkpoints of the model and its optimizer: pass the optimizer")
    return job.optimizer


def _agreement(parts: Assembly, boundary: guard.Boundary, config: Config) -> Agreement:
    """GUARD-4's agreement on scout's own failures, every ``agreement_interval_steps`` until the
    overhead budget's decisions space it by the step time (spec/budget.md BUDGET-13)."""
    agreement = Agreement(parts.control, boundary, config.collective_timeout_s, config.agreement_interval_steps)
    if parts.calibration is not None:
        parts.calibration.agreement = agreement
    return agreement


def _dcp_files(job: Job) -> tuple[RestoreFiles, SaveFiles] | None:
    """The disk work the restore and save programs are passed (``scout.job.restore``,
    ``scout.job.save``): DCP under checkpoint_dir (``Job._load``, ``Job._save``); None without
    checkpoint_dir."""
    root = job.parts.checkpoint_dir
    if root is None:
        return None

    def where(checkpoint: CheckpointId) -> str:
        return str(dcp.checkpoint_path(root, checkpoint))

    return (RestoreFiles(str(root), where, partial(missing_checkpoint, checkpoint_dir=root), partial(job._load, root)),
            SaveFiles(where, str(job.parts.run_dir.gate_path), partial(free_space_problem, job),
                      partial(job._save, root)))


def free_space_problem(job: Job, checkpoint: CheckpointId) -> str | None:
    """GATE-40: why the save of ``checkpoint`` cannot succeed before it starts (rank 0): less free
    space in checkpoint_dir than this rank's share of the state."""
    assert job.parts.checkpoint_dir is not None
    needed = sum(t.numel() * t.element_size() for t in _tensors((job.model.state_dict(),
                                                                 _optimizer(job).state_dict())))
    try:
        free = shutil.disk_usage(job.parts.checkpoint_dir).free
    except OSError as error:
        return error_text(error)
    if free >= needed:
        return None
    return (f"not enough free space: {free} bytes free in {job.parts.checkpoint_dir}, and this rank's share of "
            f"the state alone is {needed} bytes; free space, then restart")


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples (a state dict)."""
    if isinstance(value, torch.Tensor):
        # A DTensor (FSDP2) counts its local shard: the bytes this rank writes.
        to_local = getattr(value, "to_local", None)
        yield to_local() if callable(to_local) else value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def missing_checkpoint(decision: RestoreDecision, checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """RECOVERY-7: why the chosen checkpoint cannot be loaded (its files are not there), in one
    line that says how to go on; None when it is there."""
    if decision.checkpoint is None:
        return None
    path = dcp.checkpoint_path(checkpoint_dir, decision.checkpoint)
    if (path / ".metadata").exists():
        return None
    choice = "" if decision.choice is None else f"{decision.choice.value} "
    failure = "" if decision.failure is None else f" for a {decision.failure.value} failure"
    return (f"scout: restore() chose the {choice}checkpoint {decision.checkpoint} (step {decision.step}){failure}, but "
            f"{path} holds no complete checkpoint: checkpoint_dir {str(checkpoint_dir)!r} was moved, deleted or is "
            "not mounted here; put it back, or let scout mark it lost and fall back (on_missing_checkpoint=fallback), "
            "or start afresh with another run_dir (spec/recovery.md RECOVERY-7)")
