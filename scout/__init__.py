"""scout: name the rank, GPU or host at fault in a distributed training job.

A rank whose progress, timing or numerical output disagrees with the strict majority of its
equivalent replicas is the outlier (SCOUT, arXiv 2608.11034). The pure rule lives in
:mod:`scout.core`; transports in :mod:`scout.transport`; the checkpoint gate in :mod:`scout.gate`;
in-situ replay on PyTorch in :mod:`scout.replay`.

``scout.attach(model, optimizer, ...)`` is :func:`scout.replay.attach`; it is resolved lazily so
that ``import scout`` never imports torch (docs/design.md §1).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "attach"]


def __getattr__(name: str) -> Any:
    if name == "attach":
        from scout.replay.api import attach

        return attach
    raise AttributeError(f"module 'scout' has no attribute {name!r}")
