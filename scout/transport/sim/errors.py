"""Errors the simulator raises about a *run* (as opposed to transport errors, which it delivers
into rank programs exactly as a real binding would).

Every one of them carries the line that reproduces the run, because a simulated failure that
cannot be replayed is worth little (TigerBeetle's VOPR prints its seed for the same reason).
"""

from __future__ import annotations

__all__ = ["ProgramFailed", "SimulationError", "SimulationLimitExceeded", "reproduce_line"]


def reproduce_line(seed: int, scenario: str | None = None, ranks: int | None = None) -> str:
    """The sentence a failing run prints so that anyone can replay it exactly."""
    if scenario is not None and ranks is not None:
        return f"reproduce with: scout simulate {scenario} --ranks {ranks} --seed {seed}"
    return f"reproduce with seed={seed}"


class SimulationError(RuntimeError):
    """A simulated run could not go on. ``reproduce`` is the line that replays it."""

    def __init__(self, message: str, reproduce: str) -> None:
        self.reproduce = reproduce
        super().__init__(f"{message}; {reproduce}")


class SimulationLimitExceeded(SimulationError):
    """The run hit a bound (events, virtual time, ops without time passing): most likely a
    program that never finishes or spins without yielding time."""


class ProgramFailed(SimulationError):
    """A rank program raised an exception it did not catch. The original is ``__cause__``."""

    def __init__(self, message: str, reproduce: str, rank: int, program: str) -> None:
        self.rank = rank
        self.program = program
        super().__init__(message, reproduce)
