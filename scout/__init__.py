"""scout: name the rank, GPU or host at fault in a distributed training job.

A rank whose progress, timing or numerical output disagrees with the strict majority of its
equivalent replicas is the outlier (SCOUT, arXiv 2608.11034). The pure rule lives in
:mod:`scout.core`; transports in :mod:`scout.transport`; the checkpoint gate in :mod:`scout.gate`.
"""

__version__ = "0.1.0"
