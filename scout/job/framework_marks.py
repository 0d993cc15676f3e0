"""FRAME-9: a quarantined framework checkpoint is marked where the framework and the operator
look -- a ``SCOUT_QUARANTINED`` file in (or beside) it -- by the gate's writer, after the
quarantine is committed to the manifest (GATE-9). A mark that cannot be written is a warning:
the manifest, not the mark, is what scout's own resume trusts."""

from __future__ import annotations

import logging

from scout.gate.artifact import mark_quarantined
from scout.gate.model import Artifact, TrustChange

__all__ = ["mark_framework_checkpoint"]

logger = logging.getLogger("scout")


def mark_framework_checkpoint(artifact: Artifact, change: TrustChange, job_id: str) -> None:
    try:
        mark = mark_quarantined(artifact.path, {
            "checkpoint": str(change.checkpoint), "step": change.checkpoint.step, "job_id": job_id,
            "reason": change.reason, "digest": artifact.digest,
            "do": "do not resume from this checkpoint: training after an SDC wrote it (scout certificate RUN_DIR "
                  "--list shows every checkpoint's trust; spec/frameworks.md FRAME-9)"})
    except OSError as error:
        logger.warning("scout: could not mark the quarantined checkpoint %s (%s): %s", change.checkpoint,
                       artifact.path, error)
        return
    if mark is not None:
        logger.warning("scout: checkpoint %s at %s is QUARANTINED (%s); marked with %s", change.checkpoint,
                       artifact.path, change.reason, mark)
