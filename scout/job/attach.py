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
import shutil
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout.core.failure import FailureClass
from scout.gate import dcp
from scout.gate.model import CheckpointId
from scout.job import leaving
from scout.job.assemble import assemble
from scout.job.boundary import Agreement, GuardedJob
from scout.job.config import Config, ConfigError, load_config, unknown_variables
from scout.job.gate_driver import RestoreDecision
from scout.job.inputs import checked_state, unwrap_model, unwrap_optimizer
from scout.job.pipeline import CheckpointSaveFailed, FaultDetected, run_step
from scout.job.run_dir import ADOPT_VARIABLE, bind, bound_jobs, check_binding
from scout.job.startup import check_directory, checked_on_every_rank
from scout.observer import instrument
from scout.observer.progress import launcher_job_id
from scout.replay.collectives import TorchPeerGroup
from scout.reports import guard
from scout.reports.guard import Part
from scout.reports.kinds import SAVE_FAILED, FinishedReason, ReportKind, attempt_failure

__all__ = ["CheckpointSaveFailed", "FaultDetected", "Job", "attach"]

logger = logging.getLogger("scout")
#: A ``finished`` report's error text is cut to this many characters (a traceback is on stderr).
ERROR_CHARS_MAX = 500
#: RECOVERY-7: chosen checkpoints found without files, one after another, before restore() gives
#: up (each is marked lost, so a real manifest runs out of restorable checkpoints long before).
LOSS_ROUNDS_MAX = 10_000


class Job:
    """scout attached to one rank of a training job. Made by :func:`attach`."""

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
        self.pipeline.clock = time.perf_counter
        self.pipeline.boundary = self.boundary
        self._ops_on = True
        self.guarded = GuardedJob(self.boundary, Agreement(self.parts.control, self.boundary,
                                                           config.collective_timeout_s),
                                  self.pipeline, self.pipeline.reporter, rank=self.rank, stop_ops=self._stop_ops)
        #: Seconds this rank spent in each part of scout inside job.step() (bench/attach_overhead.py).
        self.costs = self.pipeline.costs
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
                                          evidence={"error": f"{type(error).__name__}: {error}"[:ERROR_CHARS_MAX],
                                                    **self._parts_off()})

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
        try:
            failure = attempt_failure(self._our_records()) if self.rank == 0 else None
            with self.parts.idle_loops.awake():  # WAIT-5: scout's groups work now
                self._begin(failure, checkpoints=self.parts.checkpoint_dir is not None)
        except BaseException as error:  # PROGRESS-11: say "exiting" before anything else
            self.leave(error)
            raise
        return self._step

    def _our_records(self) -> list[dict[str, Any]]:
        """RECOVERY-6: the run's reports written by the jobs the run directory is bound to."""
        jobs = bound_jobs(self.parts.run_dir.path)
        return [r for r in self.parts.run_dir.records() if jobs is None or r["job_id"] in jobs]

    def _begin(self, failure: FailureClass | None, *, checkpoints: bool) -> None:
        """Start the step loop where the gate's writer decides (every rank; collective)."""
        decision, lost = self._decide(failure, checkpoints=checkpoints)
        if decision.checkpoint is not None and self.parts.checkpoint_dir is not None:
            with self.checkpoint_io("read", str(decision.checkpoint)):
                loaded = dcp.load_checkpoint(self.parts.checkpoint_dir, decision.checkpoint, self.model,
                                             self._optimizer_for_dcp(), registered=self.registered,
                                             namespace=self.parts.layout.checkpoint_namespace)
            if loaded != decision.step:
                raise RuntimeError(f"checkpoint {decision.checkpoint} held step {loaded}")
        self.begin_at(decision, lost)

    def begin_at(self, decision: RestoreDecision, lost: list[str] | None = None) -> None:
        """Start the step loop at ``decision.step`` (every rank; collective): the state of that
        checkpoint is loaded already -- by restore(), or by the framework's own resume
        (spec/frameworks.md FRAME-10, scout.job.framework)."""
        if self._started:
            raise RuntimeError("the step loop has begun already: restore() or begin_at() once, before job.step()")
        lost = lost or []
        self._started = True
        self._step, self.timeline = decision.step, decision.timeline
        self.boundary.step = decision.step + 1
        self.pipeline.begin(decision, lost=lost)
        if self.parts.calibration is not None:  # spec/budget.md BUDGET-5, BUDGET-9
            self.parts.calibration.begin(decision.step)
        self.publisher.end_stage()  # start-up (or the restore) is over
        self.publisher.begin_step(self._step + 1)

    def _decide(self, failure: FailureClass | None, *, checkpoints: bool) -> tuple[RestoreDecision, list[str]]:
        """The recovery decision (the gate's writer decides, every rank gets it) with RECOVERY-7's
        fallback: a chosen checkpoint whose files any rank lacks is marked LOST (GATE-42) and the
        decision is made again, until the choice is there on every rank or nothing is chosen.
        Returns the decision and the checkpoints lost on the way."""
        control = self.parts.control
        lost: list[str] = []
        # Each round takes one restorable checkpoint away (GATE-42), so the rounds end; the bound
        # is the gate's own (a manifest holds fewer checkpoints than this).
        for _round in range(LOSS_ROUNDS_MAX):
            decision: RestoreDecision = control.broadcast(self.pipeline.decide_restore(failure, checkpoints=checkpoints))
            if decision.checkpoint is None or self.parts.checkpoint_dir is None:
                break
            found = control.all_gather(missing_checkpoint(decision, self.parts.checkpoint_dir))
            lacking = [rank for rank, problem in enumerate(found) if problem is not None]
            if not lacking:
                break
            problem = found[lacking[0]]
            assert problem is not None
            if self.config.on_missing_checkpoint == "stop":
                raise FileNotFoundError(f"{problem} (rank(s) {lacking} lack it; on_missing_checkpoint=stop)")
            path = dcp.checkpoint_path(self.parts.checkpoint_dir, decision.checkpoint)
            self.pipeline.lost(decision.checkpoint, f"no complete checkpoint at {path} on rank(s) {lacking}")
            lost.append(str(decision.checkpoint))
        else:
            raise RuntimeError(f"restore(): {LOSS_ROUNDS_MAX} chosen checkpoints in a row had no files; the gate's "
                               "manifest is not what this job saved (spec/recovery.md RECOVERY-7)")
        if lost and self.rank == 0:
            instead = "initialization (nothing left that the recovery rules allow)" if decision.checkpoint is None else (
                f"{decision.choice.value if decision.choice else ''} checkpoint {decision.checkpoint}".strip())
            logger.warning("scout: restore(): checkpoint(s) %s have no files under checkpoint_dir %r; marked lost "
                           "(never restored again; spec/gate.md GATE-42) -- this attempt starts from %s "
                           "(spec/recovery.md RECOVERY-7; on_missing_checkpoint=stop refuses instead)",
                           ", ".join(lost), str(self.parts.checkpoint_dir), instead)
        return decision, lost

    def _optimizer_for_dcp(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("scout saves and restores checkpoints of the model and its optimizer: pass the optimizer")
        return self.optimizer

    def step(self) -> None:
        """Once per training step, after ``optimizer.step()``: the checks, the gate, a checkpoint
        at cycle ends. Raises :class:`FaultDetected` on every rank at the same step when a
        fault's policy is ``restart``, and :class:`CheckpointSaveFailed` when a save failed and
        ``on_checkpoint_error = "stop"``; an error of scout's own is a report and the part that
        failed is switched off on every rank, and training goes on (spec/guard.md)."""
        if self._closed:
            raise RuntimeError("this scout job was closed")
        if self._leaving and not self._said_left:
            self._said_left = True
            logger.warning("scout: job.step() after an exception left rank %d: its observer no longer watches it "
                           "(spec/observer.md PROGRESS-11); let the exception end the process", self.rank)
        try:
            with self.parts.idle_loops.awake():  # WAIT-5: checks, the exchange, a checkpoint save
                self._run_step()
        except BaseException as error:  # PROGRESS-11: say "exiting" before anything else
            self.leave(error)
            raise

    def _run_step(self) -> None:
        if not self._started:  # no restore(): a fresh start at step 0, whatever the manifest holds
            self._begin(None, checkpoints=False)
        began = time.perf_counter()
        self._step += 1
        step = self.boundary.step = self._step
        started, entry_ns = time.perf_counter(), time.monotonic_ns()
        self.guarded.agree(step)  # GUARD-4: what failed anywhere at the last step is off from here
        agreement_s = time.perf_counter() - started
        self.pipeline.waited(entry_ns, time.monotonic_ns())  # LOOP-1: a wait for the peers, not loop work
        stop = None
        try:
            if guard.INJECTING:
                guard.inject("control.exchange")
            outcome = self.parts.control.run(run_step(self.pipeline, step))
            stop = outcome.stop
            self.checkpoint_due = outcome.checkpoint_due
            checkpoint_s = 0.0
            if outcome.checkpoint_due and self.parts.checkpoint_dir is not None:
                started = time.perf_counter()
                self._checkpoint(step)
                checkpoint_s = time.perf_counter() - started
                self.costs["cycle_end_s"] = self.costs.get("cycle_end_s", 0.0) + checkpoint_s
            if self.parts.calibration is not None:  # spec/budget.md BUDGET-3: what scout cost this step
                self.parts.calibration.step_ended(step, time.perf_counter() - began - checkpoint_s, checkpoint_s)
        except CheckpointSaveFailed:  # on_checkpoint_error = "stop": a policy the user chose
            raise
        except Exception as error:  # GUARD-7: this rank's sequence of control collectives is broken
            self.guarded.control_failed(error, step)
        try:
            instrument.mark_step(step + 1)
        except Exception as error:  # GUARD-1: the observer's step check, the step's publish
            guard.failed(Part.INSTRUMENTATION, error, "job.step")
        if self.parts.ops is not None and self._ops_on:  # metrics and on_report's per-rank stats (docs/metrics.md)
            try:
                if guard.INJECTING:
                    guard.inject("ops.after_step")
                self.parts.ops.after_step(step, self.costs, self.pipeline.straggler_trackers())
            except Exception as error:
                guard.failed(Part.OPS, error, "job.step")
        started = time.perf_counter()
        try:
            self.guarded.agreement.launch()  # GUARD-4: what failed here since the last launch
        except Exception as error:
            self.guarded.control_failed(error, step)
        self.costs["agreement_s"] = self.costs.get("agreement_s", 0.0) + agreement_s + time.perf_counter() - started
        self.boundary.step = step + 1  # the next step's training phase begins
        self.pipeline.step_begins()
        if stop is not None:
            raise FaultDetected.of(stop)

    def _stop_ops(self) -> None:
        self._ops_on = False

    def _parts_off(self) -> dict[str, Any]:
        """GUARD-8: the parts that are off on this rank, with their off steps (empty: none)."""
        off = self.guarded.parts_off()
        return {"parts_off": off} if off else {}

    def _checkpoint(self, step: int) -> None:
        """Save the checkpoint of ``step`` (collective, DCP) and tell the gate it is complete; a
        save that fails is reported and handled by ``on_checkpoint_error`` alike on every rank
        (GATE-40)."""
        assert self.parts.checkpoint_dir is not None
        checkpoint = CheckpointId(self.timeline, step)
        path = dcp.checkpoint_path(self.parts.checkpoint_dir, checkpoint)
        control = self.parts.control
        failed: list[int] = []
        # GUARD-6: rank 0 says whether its gate's writer stopped since the step's start (then no
        # rank saves: the gate could not record the capture), or what stands in the way (GATE-40).
        first = control.broadcast(self._before_save() if self.rank == 0 else None)
        if isinstance(first, dict):
            if self.rank == 0:
                logger.warning("scout: the checkpoint of step %d is not saved: %s (spec/guard.md GUARD-6)", step,
                               first["skip"])
            return
        error = first
        if error is None:
            local: str | None = None
            try:
                with self.checkpoint_io("write", str(checkpoint)):
                    dcp.save_checkpoint(self.parts.checkpoint_dir, checkpoint, self.model,
                                        self._optimizer_for_dcp(), process_group=control.group,
                                        registered=self.registered,
                                        namespace=self.parts.layout.checkpoint_namespace)
            except BaseException as raised:  # DCP's CheckpointException is a BaseException
                if isinstance(raised, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                    raise
                local = _save_error_text(raised)
            errors = control.all_gather(local)
            failed = [rank for rank, text in enumerate(errors) if text]
            error = next((text for text in errors if text), None)
        manifest = False
        if error is None:
            try:
                if guard.INJECTING:
                    guard.inject("gate.capture")
                self.pipeline.captured(step)  # rank 0 records it in the manifest
            except Exception as raised:  # GATE-40: the record failed; GUARD-3: the gate cannot go on
                local, manifest = _error_text(raised), True
                guard.failed(Part.GATE, raised, "gate capture")
                self.pipeline.stop_gate()
            else:
                local = None
            error = control.broadcast(local)
            manifest = bool(control.broadcast(manifest))
            failed = [0] if error else []
        if error is None:
            return
        stop = self.config.on_checkpoint_error == "stop"
        then = ("the job stops" if stop else
                "training goes on without the gate: no checkpoint is saved or certified any more" if manifest else
                "training goes on without it")
        where = str(self.parts.run_dir.path / "gate") if manifest else str(path)
        self.pipeline.reporter.record(ReportKind.CHECKPOINT, SAVE_FAILED, ranks=failed, step=step, evidence={
            "checkpoint": str(checkpoint), "path": where, "error": error,
            "policy": f"on_checkpoint_error={self.config.on_checkpoint_error}", "manifest": manifest})
        message = f"scout: the checkpoint of step {step} could not be saved to {where}: {error}; {then} (GATE-40)"
        if self.rank == 0:
            logger.error("%s", message)
        if stop:
            raise CheckpointSaveFailed(message)

    def _before_save(self) -> dict[str, str] | str | None:
        """Rank 0, before every save: ``{"skip": why}`` when its gate's writer stopped (GUARD-6),
        else the free-space problem (GATE-40) or None. A failure of the free-space check itself is
        the checkpoint part's, and the save goes ahead without it (GUARD-3)."""
        if self.pipeline.gate_stopped:
            return {"skip": "the gate's writer stopped after a failure, so it could not record it"}
        try:
            if guard.INJECTING:
                guard.inject("checkpoint.space")
            return self._free_space_problem()
        except Exception as raised:
            guard.failed(Part.CHECKPOINT, raised, "job.step")
            return None

    def _free_space_problem(self) -> str | None:
        """GATE-40: why a save cannot succeed before it starts (rank 0): less free space in
        checkpoint_dir than this rank's share of the state."""
        assert self.parts.checkpoint_dir is not None
        needed = sum(t.numel() * t.element_size() for t in _tensors((self.model.state_dict(),
                                                                     self._optimizer_for_dcp().state_dict())))
        try:
            free = shutil.disk_usage(self.parts.checkpoint_dir).free
        except OSError as error:
            return _error_text(error)
        if free >= needed:
            return None
        return (f"not enough free space: {free} bytes free in {self.parts.checkpoint_dir}, and this rank's share of "
                f"the state alone is {needed} bytes; free space, then restart")

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

    def self_check_before(self, optimizer: torch.optim.Optimizer) -> None:
        """SELF-9: run the live self-check at ``optimizer``'s pre-step hook. For an optimizer that
        steps the model without being given to ``attach`` (DeepSpeed's inner optimizer under
        ZeRO, whose parameter writes no version counter shows); with the optimizer given to
        ``attach`` scout does this itself."""
        for check in self.pipeline.checks:
            hook = getattr(getattr(check, "runner", None), "self_check_before", None)
            if callable(hook):
                hook(optimizer)

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
                                              evidence=self._parts_off() or None)
        with _logged("removing the instrumentation"):
            instrument.uninstrument()
        with self.parts.idle_loops.awake():
            with _logged("the last agreement"):
                self.guarded.agreement.close()
            with _logged("closing the checks and the gate"):
                self.pipeline.close()
        with _logged("closing the progress record"):
            self.publisher.close()
        if self.observer is not None:
            with _logged("stopping the observer"):
                self.observer.close()
        if self.parts.ops is not None:
            with _logged("stopping the ops sidecar"):
                self.parts.ops.close()
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


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:ERROR_CHARS_MAX]


def _save_error_text(error: BaseException) -> str:
    """A failed save in one line: DCP's CheckpointException holds every failing rank's error
    with its traceback; the first rank's error and the list of ranks say it."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = min(failures)
        cause = failures[first][0] if isinstance(failures[first], tuple) else failures[first]
        return _error_text(cause)[:ERROR_CHARS_MAX - 40] + f" (DCP: ranks {sorted(failures)} failed)"
    return _error_text(error)


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
