"""mpi binding of the transport contract (see scout.transport.base)."""
