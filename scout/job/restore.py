"""Where an attempt starts, as a rank program (spec/recovery.md RECOVERY-7, spec/gate.md GATE-42):
the recovery decision with its fallback over checkpoints whose files are gone, then the load. No
torch here: ``scout.attach``'s ``Job`` runs :func:`run_restore` on its control group with DCP's
files (``scout.job.attach``), and the simulated job runs it with simulated files
(``scout.scenarios.replay_job``), as both run ``scout.job.pipeline.run_step``.

Theory of operation. The gate's writer (rank 0) decides; one broadcast gives every rank the
decision. Every rank looks for the chosen checkpoint's files (:attr:`RestoreFiles.missing`) and
one all-gather tells every rank what each found, so all of them go on alike. When a rank lacks
them, ``on_missing_checkpoint = "stop"`` raises on every rank; ``"fallback"`` marks the checkpoint
``LOST`` on the writer (every rank calls :meth:`Pipeline.lost`; the others have no gate) and the
decision is made again, until the chosen checkpoint is there everywhere or nothing is chosen. Each
round takes one restorable checkpoint away (GATE-42), so the rounds end. Then every rank loads the
chosen checkpoint (:attr:`RestoreFiles.load`), and the caller begins the step loop there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, Final

import attrs

from scout.core.failure import FailureClass
from scout.gate.model import CheckpointId
from scout.job.config import MISSING_CHECKPOINT_POLICIES
from scout.job.gate_driver import RestoreDecision
from scout.job.pipeline import Pipeline
from scout.transport.program import AllGather, Broadcast, Op

__all__ = ["LOSS_ROUNDS_MAX", "RestoreFiles", "Restored", "run_restore"]

logger = logging.getLogger("scout")

#: RECOVERY-7: chosen checkpoints found without files, one after another, before the restore gives
#: up (each is marked lost, so a real manifest runs out of restorable checkpoints long before).
LOSS_ROUNDS_MAX: Final = 10_000


@attrs.frozen
class RestoreFiles:
    """The disk work of a restore, passed in: DCP under ``checkpoint_dir`` in a job, a table of
    files in the simulator. Each runs on the calling rank only."""

    #: The directory the checkpoints are under, and where one checkpoint's files are (for the
    #: warning and the ``lost`` report's detail).
    root: str
    where: Callable[[CheckpointId], str]
    #: RECOVERY-7: why this rank cannot load the chosen checkpoint (its files are not here), in
    #: one line that says how to go on; None when they are.
    missing: Callable[[RestoreDecision], str | None]
    #: Load the chosen checkpoint on this rank; returns the step it held.
    load: Callable[[CheckpointId], int]


@attrs.frozen
class Restored:
    """Where the attempt starts, and the checkpoints found without files on the way (by name,
    ``t0/s16``, in the order they were chosen)."""

    decision: RestoreDecision
    lost: tuple[str, ...] = ()


def run_restore(pipeline: Pipeline, failure: FailureClass | None, *, checkpoints: bool, files: RestoreFiles | None,
                on_missing_checkpoint: str, timeout_s: float) -> Generator[Op, Any, Restored]:
    """The recovery decision for an attempt whose predecessor ended with ``failure`` (rank 0's
    reading of the reports; None on the other ranks, which have no gate), with RECOVERY-7's
    fallback, and the load. ``checkpoints``: the attempt may restore one; ``files``: None when
    the job keeps no checkpoints of scout's own. Collective; alike on every rank."""
    if on_missing_checkpoint not in MISSING_CHECKPOINT_POLICIES:
        raise ValueError(f"on_missing_checkpoint={on_missing_checkpoint!r}: expected one of {MISSING_CHECKPOINT_POLICIES}")
    lost: list[str] = []
    for _round in range(LOSS_ROUNDS_MAX):
        chosen = pipeline.decide_restore(failure, checkpoints=checkpoints).to_plain()
        decision = RestoreDecision.from_plain((yield Broadcast(chosen, 0, timeout_s)))
        if decision.checkpoint is None or files is None:
            break
        found: list[str | None] = yield AllGather(files.missing(decision), timeout_s)
        lacking = [rank for rank, problem in enumerate(found) if problem is not None]
        if not lacking:
            break
        if on_missing_checkpoint == "stop":
            raise FileNotFoundError(f"{found[lacking[0]]} (rank(s) {lacking} lack it; on_missing_checkpoint=stop)")
        pipeline.lost(decision.checkpoint,
                      f"no complete checkpoint at {files.where(decision.checkpoint)} on rank(s) {lacking}")
        lost.append(str(decision.checkpoint))
    else:
        raise RuntimeError(f"restore(): {LOSS_ROUNDS_MAX} chosen checkpoints in a row had no files; the gate's "
                           "manifest is not what this job saved (spec/recovery.md RECOVERY-7)")
    if lost and pipeline.rank == 0:
        assert files is not None  # a checkpoint is lost only where its files were looked for
        instead = "initialization (nothing left that the recovery rules allow)" if decision.checkpoint is None else (
            f"{decision.choice.value if decision.choice else ''} checkpoint {decision.checkpoint}".strip())
        logger.warning("scout: restore(): checkpoint(s) %s have no files under checkpoint_dir %r; marked lost "
                       "(never restored again; spec/gate.md GATE-42) -- this attempt starts from %s "
                       "(spec/recovery.md RECOVERY-7; on_missing_checkpoint=stop refuses instead)",
                       ", ".join(lost), files.root, instead)
    if decision.checkpoint is not None and files is not None:
        loaded = files.load(decision.checkpoint)
        if loaded != decision.step:
            raise RuntimeError(f"checkpoint {decision.checkpoint} held step {loaded}")
    return Restored(decision, tuple(lost))

