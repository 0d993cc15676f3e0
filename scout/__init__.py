"""scout: name the rank, GPU or host at fault in a distributed training job.

A rank whose progress, timing or numerical output disagrees with the strict majority of its
equivalent replicas is the outlier (SCOUT, arXiv 2608.11034)::

    import scout
    job = scout.attach(model, optimizer, run_dir="runs/exp1", checkpoint_dir="ckpt/exp1")
    start = job.restore()
    for step in range(start, steps):
        ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
        job.step()
    job.close()

``attach``, ``Job`` and ``FaultDetected`` live in :mod:`scout.job.attach`, ``Config`` in
:mod:`scout.job.config`, ``ParallelLayout`` in :mod:`scout.core.layouts`; they are resolved lazily so that ``import scout`` never imports torch
(docs/design.md §1).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = ["CheckpointSaveFailed", "Config", "ConfigError", "FaultDetected", "Job", "ParallelLayout", "__version__",
           "attach"]

_LAZY = {
    "attach": "scout.job.attach",
    "Job": "scout.job.attach",
    "FaultDetected": "scout.job.attach",
    "CheckpointSaveFailed": "scout.job.attach",
    "Config": "scout.job.config",
    "ConfigError": "scout.job.config",
    "ParallelLayout": "scout.core.layouts",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scout' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
