"""torch.distributed binding of the transport contract (see scout.transport.base and
docs/transports.md): tensors through the process group's backend (NCCL on GPU, gloo on CPU),
evidence and deadlines through a torch.distributed Store.

Importing this package imports torch; nothing else in scout's contract does.
"""

try:
    import torch.distributed as _dist
except ImportError as exc:
    raise ImportError(
        f"scout.transport.nccl needs torch and could not import it ({exc}). Install it with "
        "`pip install 'scout-localize[torch]'` (for a CPU-only build: `pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu`)."
    ) from exc

if not _dist.is_available():
    raise ImportError(
        "scout.transport.nccl needs torch.distributed, which this torch build lacks; install a "
        "torch build with distributed support (the PyPI wheels for Linux have it)"
    )

from scout.transport.nccl.transport import TorchTransport

__all__ = ["TorchTransport"]
