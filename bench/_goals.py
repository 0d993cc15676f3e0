"""What every benchmark in bench/ writes, so that ``./dev bench`` can print one table.

Each benchmark measures its figures, then records one :class:`Goal` per goal it checks: the
measured figure (a median over repeats, never a best time), the target, the ratio
figure/target and whether the goal is met. ``write_results`` stores them in the benchmark's
JSON under ``"goals"`` beside its detailed rows, with the host's load average at the end of the
run: on a shared machine a figure means little without it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@attrs.frozen
class Goal:
    """One goal: ``measured`` must be ``<=`` (at_most) or ``>=`` (at least) ``target``."""

    name: str
    measured: float
    target: float
    unit: str
    at_most: bool
    detail: str = ""

    @property
    def met(self) -> bool:
        return self.measured <= self.target if self.at_most else self.measured >= self.target

    @property
    def ratio(self) -> float:
        """measured / target: <= 1 meets an at-most goal, >= 1 an at-least goal."""
        return self.measured / self.target if self.target else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": self.measured,
            "target": self.target,
            "unit": self.unit,
            "comparison": "<=" if self.at_most else ">=",
            "ratio": round(self.ratio, 4),
            "met": self.met,
            "detail": self.detail,
        }


def at_most(name: str, measured: float, target: float, unit: str, detail: str = "") -> Goal:
    return Goal(name, float(measured), float(target), unit, True, detail)


def at_least(name: str, measured: float, target: float, unit: str, detail: str = "") -> Goal:
    return Goal(name, float(measured), float(target), unit, False, detail)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the count of a list of measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def load_average() -> list[float]:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return []


def write_results(name: str, payload: dict[str, Any], goals: Sequence[Goal], output: Path | None = None) -> Path:
    """Write ``payload`` plus the goals and the host facts to bench/results/<name>.json."""
    path = output if output is not None else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "goals": [goal.to_json() for goal in goals],
        "all_goals_met": all(goal.met for goal in goals),
        "load_average_1_5_15_min": load_average(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        **payload,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path


def print_goals(goals: Sequence[Goal]) -> None:
    for goal in goals:
        comparison = "<=" if goal.at_most else ">="
        verdict = "met" if goal.met else "NOT MET"
        print(
            f"goal {goal.name}: {goal.measured:.4g} {goal.unit} ({comparison} {goal.target:g}; "
            f"ratio {goal.ratio:.2f}) {verdict}"
        )
