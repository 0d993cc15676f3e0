"""Which ``sdc`` findings become reports (spec/gate.md GATE-41). Pure: no I/O, no clock.

A persistent fault -- a corrupt expert, a flipped parameter that no restart has cleared in
``report`` mode -- is attributed again at every check of its recipe. The gate must see every
one of those results (it quarantines, GATE-4), but a person needs one report per rank and recipe
and then word that it goes on: writing every repetition buried ``reports.jsonl`` (18 reports in
90 steps for one expert). So findings are counted per (rank, recipe), and one is written when

* it names a rank that no report of that recipe named before (a new rank, or the first), or
* some rank it names reached at least twice its count at the last report that named it

-- reports at the 1st, 2nd, 4th, 8th, ... repetition: ``1 + floor(log2 n)`` for ``n``. Each
written finding carries, per rank, its count and the step of its first finding.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from scout.core.guards import whole_number

__all__ = ["SdcCount", "SdcReportCounter"]


@attrs.frozen
class SdcCount:
    """What a finding adds to its report: whether to write it, and per rank it names (in its
    order) how many findings of this recipe named that rank so far, and the first one's step."""

    report: bool
    counts: tuple[int, ...]
    first_steps: tuple[int, ...]


@attrs.define
class _Tally:
    count: int = 0
    first_step: int = 0
    reported: int = 0  # the count at the last report that named this rank for this recipe


class SdcReportCounter:
    """GATE-41 over one attempt of a job (module docstring); memory: one tally per (rank,
    recipe) ever named, bounded by ranks x recipes."""

    def __init__(self) -> None:
        self._tallies: dict[tuple[int, str], _Tally] = {}

    def observe(self, recipe: str, ranks: Sequence[int], step: int) -> SdcCount:
        """Count a finding of ``recipe`` naming ``ranks`` at ``step`` and say whether to write it.
        A finding that names no rank is keyed by the recipe alone (rank -1)."""
        if not isinstance(recipe, str) or not recipe:
            raise ValueError(f"an sdc finding needs a recipe id, got {recipe!r}")
        if not whole_number(step) or step < 0:
            raise ValueError(f"an sdc finding needs a step >= 0, got {step!r}")
        keys = [(int(rank), recipe) for rank in ranks] or [(-1, recipe)]
        if len(set(keys)) != len(keys) or any(rank < -1 for rank, _ in keys):
            raise ValueError(f"an sdc finding of {recipe} names ranks {list(ranks)}: distinct ranks >= 0 expected")
        tallies = [self._tallies.setdefault(key, _Tally(first_step=step)) for key in keys]
        for tally in tallies:
            tally.count += 1
        report = any(tally.reported == 0 or tally.count >= 2 * tally.reported for tally in tallies)
        if report:
            for tally in tallies:
                tally.reported = tally.count
        shown = tallies if ranks else []
        return SdcCount(report, tuple(t.count for t in shown), tuple(t.first_step for t in shown))
