"""How long a simulated message takes: a base latency plus seeded jitter.

Jitter is drawn from the cluster's single ``random.Random(seed)``, so two runs with the same
seed see the same latencies and two seeds usually see different message orders -- which is the
point of running many seeds.
"""

from __future__ import annotations

import math
import random

import attrs

__all__ = ["LatencyModel"]


def _finite_non_negative(instance: object, attribute: attrs.Attribute, value: float) -> None:  # type: ignore[type-arg]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be finite and >= 0, got {value!r}")


@attrs.frozen
class LatencyModel:
    """Per-message latency ``base_latency_s + uniform(0, jitter_s)``.

    A collective (all-gather, broadcast, barrier) among n ranks takes ``ceil(log2 n)`` steps of
    ``collective_step_latency_s + uniform(0, jitter_s)`` after its last member arrives: the cost
    of a tree or recursive-doubling algorithm, without simulating its n log n messages.
    """

    base_latency_s: float = attrs.field(default=50e-6, validator=_finite_non_negative)
    jitter_s: float = attrs.field(default=20e-6, validator=_finite_non_negative)
    collective_step_latency_s: float = attrs.field(default=50e-6, validator=_finite_non_negative)

    def collective_latency_s(self, rng: random.Random, group_size: int) -> float:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        steps = math.ceil(math.log2(group_size)) if group_size > 1 else 0
        total_s = 0.0
        for _ in range(steps):
            total_s += self.collective_step_latency_s + rng.random() * self.jitter_s
        return total_s
