"""From replay results to the gate's ``result`` event: the one conversion (spec/gate.md GATE-4,
GATE-5; spec/replay.md EVID-5).

Replay decides each recipe per peer group as a :class:`scout.core.recipes.RecipeResult` (AGREE,
ATTRIBUTED with outliers, or INCONCLUSIVE with a reason). The gate takes one job-wide
:class:`~scout.gate.model.RecipeVerdicts` per replay: one :class:`~scout.gate.model.GroupVerdict`
per peer group the recipe applies to, MISSING for a group whose result never arrived. Every
caller -- ``scout.attach``'s gate writer, the simulated gate campaign and the tests -- goes
through :func:`recipe_verdicts`; nothing else builds a ``RecipeVerdicts`` from replay output.
"""

from __future__ import annotations

from collections.abc import Mapping

from scout.core.recipes import RecipeResult
from scout.core.verdict import MISSING, MissingType, Status
from scout.gate.model import GateConfig, GroupVerdict, Outcome, RecipeVerdicts

__all__ = ["group_verdict", "recipe_verdicts"]

_OUTCOMES = {Status.AGREE: Outcome.AGREE, Status.ATTRIBUTED: Outcome.ATTRIBUTED,
             Status.INCONCLUSIVE: Outcome.INCONCLUSIVE}


def group_verdict(group: str, result: RecipeResult | MissingType) -> GroupVerdict:
    """One peer group's replay result as the gate sees it; ``MISSING``: it never arrived."""
    if result is MISSING:
        return GroupVerdict(group, Outcome.MISSING, (), "no-result")
    if not isinstance(result, RecipeResult):
        raise TypeError(
            f"group {group!r}: expected a scout.core.recipes.RecipeResult or MISSING, got "
            f"{type(result).__name__} {result!r}"
        )
    outcome = _OUTCOMES.get(result.status)
    if outcome is None:
        raise TypeError(f"group {group!r}: result status {result.status!r} is not a scout.core.verdict.Status")
    if outcome is Outcome.ATTRIBUTED:
        return GroupVerdict(group, outcome, tuple(result.outliers))
    if outcome is Outcome.INCONCLUSIVE:
        return GroupVerdict(group, outcome, (), result.reason or "inconclusive")
    return GroupVerdict(group, outcome, self_checked=result.self_checked)


def recipe_verdicts(
    config: GateConfig,
    recipe: str,
    cycle: int,
    step: int,
    results: Mapping[str, RecipeResult | MissingType],
) -> RecipeVerdicts:
    """The gate event for one replay of ``recipe``: a verdict for every peer group the recipe
    applies to, in the job's group order; a group absent from ``results`` is MISSING (unchecked,
    never SDC). A result for a group the recipe does not apply to is refused."""
    applicable = config.groups_of(recipe)
    foreign = sorted(set(results) - set(applicable))
    if foreign:
        raise ValueError(
            f"results for recipe {recipe!r} name groups {foreign} it does not apply to; its groups "
            f"are {list(applicable)}"
        )
    return RecipeVerdicts(
        recipe, cycle, step, tuple(group_verdict(group, results.get(group, MISSING)) for group in applicable)
    )
