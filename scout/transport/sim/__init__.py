"""sim binding of the transport contract: a deterministic simulated cluster.

N ranks run rank programs (``scout.transport.program``) -- several named programs per rank if
wanted, e.g. ``trainer`` and ``observer`` -- under a virtual clock and a seeded scheduler, with
injected faults. Same seed and scenario, same trace. See ``docs/simulator.md``.

Modules, one job each: ``clock`` (virtual time), ``scheduler`` (event heap, bounds, the one
seeded random generator), ``latency`` (message and collective latency), ``faults`` (fault
values), ``trace`` (event records), ``process`` (per-program state), ``ops`` (simulator-only
messaging ops), ``runner`` (programs stepped through their ops, waits and deadlines),
``network`` (payload encoding, links, link faults), ``groups`` (interned groups), ``messaging``
(exchange, send, receive), ``collectives`` (the collectives engine), ``fault_engine`` (fault
effects), ``cluster`` (wires the parts; the public API). Named scenarios (``scout simulate``)
and their pytest helpers live in :mod:`scout.scenarios`.
"""

from scout.transport.sim.cluster import ProgramOutcome, SimCluster, SimulationResult, simulate
from scout.transport.sim.errors import (
    ProgramFailed,
    SimulationError,
    SimulationLimitExceeded,
    reproduce_line,
)
from scout.transport.sim.faults import (
    Corrupt,
    Crash,
    Delay,
    Drop,
    Fault,
    FlipBit,
    Freeze,
    Partition,
)
from scout.transport.sim.latency import LatencyModel
from scout.transport.sim.ops import Delivered, Receive, Send
from scout.transport.sim.process import ProgramState, SimContext
from scout.transport.sim.trace import Trace

__all__ = [
    "Corrupt",
    "Crash",
    "Delay",
    "Delivered",
    "Drop",
    "Fault",
    "FlipBit",
    "Freeze",
    "LatencyModel",
    "Partition",
    "ProgramFailed",
    "ProgramOutcome",
    "ProgramState",
    "Receive",
    "Send",
    "SimCluster",
    "SimContext",
    "SimulationError",
    "SimulationLimitExceeded",
    "SimulationResult",
    "Trace",
    "reproduce_line",
    "simulate",
]
