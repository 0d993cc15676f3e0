"""Transports: the contract (:mod:`scout.transport.base`) and its bindings.

Actions are imported explicitly by the user (``scout.transport.mpi``, ``scout.transport.nccl``,
``scout.transport.sim``) so that importing the contract never imports torch or mpi4py.
"""

from scout.transport.base import (
    DeadlineExceeded,
    ExchangeResult,
    Group,
    GroupError,
    PayloadTooLarge,
    Transport,
    TransportClosed,
    TransportError,
    TransportStats,
)

__all__ = [
    "DeadlineExceeded",
    "ExchangeResult",
    "Group",
    "GroupError",
    "PayloadTooLarge",
    "Transport",
    "TransportClosed",
    "TransportError",
    "TransportStats",
]
