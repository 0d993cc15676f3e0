"""Virtual time for the simulated cluster.

Nothing in the simulator reads a real clock: time is a float number of seconds that only the
scheduler moves, and only forward. That is what makes a run a pure function of its seed.
"""

from __future__ import annotations

import math

__all__ = ["VirtualClock"]


class VirtualClock:
    """Seconds since the simulation began. Monotone: moving it backwards is a simulator bug."""

    __slots__ = ("now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        if not math.isfinite(start_s) or start_s < 0:
            raise ValueError(f"start_s must be finite and >= 0, got {start_s!r}")
        self.now_s = float(start_s)

    def __repr__(self) -> str:
        return f"VirtualClock(now_s={self.now_s!r})"
