"""mpi binding of the transport contract (see scout.transport.base and docs/transports.md).

Importing this package imports mpi4py, which loads the MPI library; nothing else in scout does.
"""

try:
    from mpi4py import MPI  # noqa: F401  (loads libmpi; fails here if it is missing)
except (ImportError, RuntimeError, OSError) as exc:  # mpi4py absent, or no MPI library found
    raise ImportError(
        "scout.transport.mpi needs mpi4py and an MPI library, and could not load them "
        f"({exc}). Install both with `pip install mpi4py mpich` (or "
        "`pip install 'scout-localize[mpi]'`), or point mpi4py at your cluster's MPI."
    ) from exc

from scout.transport.mpi.transport import MpiTransport

__all__ = ["MpiTransport"]
