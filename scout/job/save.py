"""A checkpoint save at a cycle end, as a rank program (spec/gate.md GATE-40, spec/guard.md
GUARD-6): what stands in the way is said before anything is written, every rank writes its part,
the ranks agree on the outcome, the gate records the capture, and a save that failed is reported
and handled alike on every rank. No torch here: ``scout.attach``'s ``Job`` runs :func:`run_save`
on its control group with DCP (``scout.job.attach``), the simulated job with simulated files
(``scout.scenarios.replay_job``), after ``scout.job.pipeline.run_step`` said a checkpoint is due.

Theory of operation, one collective at a time:

1. rank 0 broadcasts what stands in the way: ``{"skip": why}`` when its gate's writer stopped
   since the step began (GUARD-6: the gate could not record the capture, so no rank saves), the
   free-space problem (GATE-40: nothing is written), or None;
2. every rank writes its part (:attr:`SaveFiles.save`; DCP's save is itself collective) and one
   all-gather tells every rank which ranks failed;
3. the gate's writer records the capture, and a broadcast of rank 0's outcome tells every rank
   whether the record failed (GATE-40; GUARD-3: the writer stops at once);
4. a save that failed is one ``checkpoint`` report ``save-failed`` (rank 0 writes it), and
   ``on_checkpoint_error`` decides alike on every rank: ``stop`` raises
   :class:`~scout.job.pipeline.CheckpointSaveFailed`, ``continue`` goes on without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, Final

import attrs

from scout.gate.model import CheckpointId
from scout.job.config import CHECKPOINT_ERROR_POLICIES
from scout.job.pipeline import CheckpointSaveFailed, Pipeline
from scout.reports import guard
from scout.reports.guard import Part
from scout.reports.kinds import SAVE_FAILED, ReportKind
from scout.transport.program import AllGather, Broadcast, Op

__all__ = ["ERROR_CHARS_MAX", "SaveFiles", "Saved", "error_text", "run_save", "save_error_text"]

logger = logging.getLogger("scout")

#: A report's error text is cut to this many characters (a traceback is on stderr).
ERROR_CHARS_MAX: Final = 500


@attrs.frozen
class SaveFiles:
    """The disk work of a save, passed in: DCP under ``checkpoint_dir`` in a job, a table of files
    in the simulator."""

    #: Where a checkpoint's files go, and where the gate's manifest is (for the reports).
    where: Callable[[CheckpointId], str]
    manifest: str
    #: GATE-40, on rank 0 before every save: why the save of this checkpoint cannot succeed (too
    #: little free space), or None.
    free_space: Callable[[CheckpointId], str | None]
    #: Write this rank's part of the checkpoint; raises what the write met.
    save: Callable[[CheckpointId], None]


@attrs.frozen
class Saved:
    """How a save ended, alike on every rank: recorded by the gate (``error`` and ``skipped``
    None), not attempted (``skipped``: GUARD-6), or failed (``error``; ``manifest``: the gate's
    record failed, the files were written) under ``on_checkpoint_error = "continue"``."""

    checkpoint: CheckpointId
    error: str | None = None
    manifest: bool = False
    skipped: str | None = None

    @property
    def recorded(self) -> bool:
        return self.error is None and self.skipped is None


def run_save(pipeline: Pipeline, checkpoint: CheckpointId, files: SaveFiles, *, on_checkpoint_error: str,
             timeout_s: float) -> Generator[Op, Any, Saved]:
    """Save ``checkpoint`` and tell the gate it is complete (module docstring). Collective; alike
    on every rank. Raises ``CheckpointSaveFailed`` on every rank when the save failed and
    ``on_checkpoint_error = "stop"``."""
    if on_checkpoint_error not in CHECKPOINT_ERROR_POLICIES:
        raise ValueError(f"on_checkpoint_error={on_checkpoint_error!r}: expected one of {CHECKPOINT_ERROR_POLICIES}")
    started = pipeline.clock() if pipeline.clock else 0.0
    saved = yield from _save(pipeline, checkpoint, files, on_checkpoint_error, timeout_s)
    if pipeline.clock:  # what the save cost this rank, as run_step counts its parts
        pipeline._cost("cycle_end_s", pipeline.clock() - started)
    return saved


def _save(pipeline: Pipeline, checkpoint: CheckpointId, files: SaveFiles, on_checkpoint_error: str,
          timeout_s: float) -> Generator[Op, Any, Saved]:
    step = checkpoint.step
    first = yield Broadcast(_before_save(pipeline, files, checkpoint) if pipeline.rank == 0 else None, 0, timeout_s)
    if isinstance(first, dict):
        if pipeline.rank == 0:
            logger.warning("scout: the checkpoint of step %d is not saved: %s (spec/guard.md GUARD-6)", step,
                           first["skip"])
        return Saved(checkpoint, skipped=str(first["skip"]))
    error: str | None = first
    failed: list[int] = []
    if error is None:
        local: str | None = None
        try:
            files.save(checkpoint)
        except BaseException as raised:  # DCP's CheckpointException is a BaseException
            if isinstance(raised, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            local = save_error_text(raised)
        errors: list[str | None] = yield AllGather(local, timeout_s)
        failed = [rank for rank, text in enumerate(errors) if text]
        error = next((text for text in errors if text), None)
    manifest = False
    if error is None:
        local, manifest = None, False
        try:
            if guard.INJECTING:
                guard.inject("gate.capture")
            pipeline.captured(step)  # rank 0 records it in the manifest
        except Exception as raised:  # GATE-40: the record failed; GUARD-3: the gate cannot go on
            local, manifest = error_text(raised), True
            guard.failed(Part.GATE, raised, "gate capture")
            pipeline.stop_gate()
        error, manifest = yield Broadcast((local, manifest), 0, timeout_s)
        failed = [0] if error else []
    if error is None:
        return Saved(checkpoint)
    _failed(pipeline, checkpoint, files.manifest if manifest else files.where(checkpoint), error, failed,
            manifest=manifest, on_checkpoint_error=on_checkpoint_error)
    return Saved(checkpoint, error=error, manifest=manifest)


def _before_save(pipeline: Pipeline, files: SaveFiles, checkpoint: CheckpointId) -> dict[str, str] | str | None:
    """Rank 0, before every save: ``{"skip": why}`` when its gate's writer stopped (GUARD-6),
    else the free-space problem (GATE-40) or None. A failure of the free-space check itself is
    the checkpoint part's, and the save goes ahead without it (GUARD-3)."""
    if pipeline.gate_stopped:
        return {"skip": "the gate's writer stopped after a failure, so it could not record it"}
    try:
        if guard.INJECTING:
            guard.inject("checkpoint.space")
        return files.free_space(checkpoint)
    except Exception as raised:
        guard.failed(Part.CHECKPOINT, raised, "job.step")
        return None


def _failed(pipeline: Pipeline, checkpoint: CheckpointId, where: str, error: str, failed: list[int], *,
            manifest: bool, on_checkpoint_error: str) -> None:
    """GATE-40: the ``save-failed`` report and the policy, alike on every rank."""
    stop = on_checkpoint_error == "stop"
    then = ("the job stops" if stop else
            "training goes on without the gate: no checkpoint is saved or certified any more" if manifest else
            "training goes on without it")
    pipeline.reporter.record(ReportKind.CHECKPOINT, SAVE_FAILED, ranks=failed, step=checkpoint.step, evidence={
        "checkpoint": str(checkpoint), "path": where, "error": error,
        "policy": f"on_checkpoint_error={on_checkpoint_error}", "manifest": manifest})
    message = (f"scout: the checkpoint of step {checkpoint.step} could not be saved to {where}: {error}; {then} "
               "(GATE-40)")
    if pipeline.rank == 0:
        logger.error("%s", message)
    if stop:
        raise CheckpointSaveFailed(message)


def error_text(error: BaseException) -> str:
    """An error in one line, as the reports carry it."""
    return f"{type(error).__name__}: {error}"[:ERROR_CHARS_MAX]


def save_error_text(error: BaseException) -> str:
    """A failed save in one line: DCP's CheckpointException holds every failing rank's error
    with its traceback; the first rank's error and the list of ranks say it."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = min(failures)
        cause = failures[first][0] if isinstance(failures[first], tuple) else failures[first]
        return error_text(cause)[:ERROR_CHARS_MAX - 40] + f" (DCP: ranks {sorted(failures)} failed)"
    return error_text(error)

