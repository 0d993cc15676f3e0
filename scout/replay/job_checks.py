"""Checks beyond dense replay that a job runs alongside it: expert replay (spec/moe.md) and
the golden canary (spec/canary.md). ``scout.attach`` drives one :class:`JobChecks` per rank:

    checks = JobChecks.build(model, rank=..., exchange=..., dense_partition=..., dense_names=...,
                             moe_catalog="moe.json", canary=True, ...)
    recipes, groups = checks.gate_catalog(dense_recipes)      # the gate's catalog and groups
    ...
    for feed in checks.after_step(step): ...                  # every step, after dense replay
    for feed in checks.at_cycle_end(step): ...                # every cycle end, before the boundary

Each :class:`GateFeed` is one recipe's job-wide result: one ``RecipeResult`` per peer group
(for ``scout.gate.results.recipe_verdicts``, the one conversion) and the findings to report.
Every method is collective over the world (``exchange`` is an all-gather of Python objects on
a group that spans it), and every rank takes the same branches: the expert schedule is a
function of the step, the canary runs at every cycle end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from scout.core.canary import CanaryOutcome
from scout.core.moe import RegimeCatalog
from scout.core.recipes import RecipeResult
from scout.core.verdict import Status
from scout.replay.canary import CANARY_RECIPE, Canary, CanaryMonitor
from scout.replay.collectives import TorchPeerGroup
from scout.replay.moe import ExpertLayers, ExpertReplayConfig, ExpertReplayer

__all__ = ["Finding", "GateFeed", "JobChecks"]


@attrs.frozen
class Finding:
    """A report to write (``scout.report/1``): kind ``sdc``, the global ranks, a reason code."""

    reason: str
    ranks: tuple[int, ...]
    step: int
    evidence: dict[str, Any]


@attrs.frozen
class GateFeed:
    recipe: str
    step: int
    results: dict[str, RecipeResult]  # peer group name -> this recipe's result in that group
    findings: tuple[Finding, ...] = ()


class JobChecks:
    """Expert replay among the replicas of each expert, and the canary, for one rank."""

    def __init__(
        self,
        *,
        exchange: Callable[[Any], list[Any]],
        dense_partition: Sequence[Sequence[int]],
        dense_names: Sequence[str],
        experts: ExpertReplayer | None = None,
        expert_partition: Sequence[Sequence[int]] = (),
        canary: CanaryMonitor | None = None,
        catalog: RegimeCatalog | None = None,
    ) -> None:
        self.catalog = catalog
        self.exchange = exchange
        self.dense_partition = tuple(tuple(g) for g in dense_partition)
        self.dense_names = tuple(dense_names)
        self.experts = experts
        self.expert_partition = tuple(tuple(g) for g in expert_partition)
        self.expert_names = tuple(f"ep{i}" for i in range(len(self.expert_partition)))
        self.canary = canary

    @classmethod
    def build(
        cls,
        model: nn.Module,
        *,
        rank: int,
        exchange: Callable[[Any], list[Any]],
        dense_partition: Sequence[Sequence[int]],
        dense_names: Sequence[str],
        run_dir: str,
        moe_catalog: str | None = None,
        expert_partition: Sequence[Sequence[int]] | None = None,
        expert_steps: int = 50,
        canary: bool = False,
        timeout_s: float = 120.0,
    ) -> JobChecks | None:
        """None when neither is asked for. ``expert_partition``: the expert replica groups
        (default: the dense ones -- experts replicated like the dense layers, EP = 1)."""
        if moe_catalog is None and not canary:
            return None
        experts = None
        catalog = None
        partition = tuple(tuple(g) for g in (expert_partition or dense_partition))
        if moe_catalog is not None:
            from scout.replay.moe_catalog import load_catalog

            layers = ExpertLayers.discover(model)
            catalog = load_catalog(moe_catalog, layers)
            peers = TorchPeerGroup(partition=partition, timeout_s=timeout_s)
            experts = ExpertReplayer(layers, peers, catalog.expert_keys(), ExpertReplayConfig(expert_steps=expert_steps))
        monitor = None
        if canary:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
            monitor = CanaryMonitor(Canary(device=device), exchange, rank=rank,
                                    golden_path=f"{run_dir}/gate/canary.json")
        return cls(exchange=exchange, dense_partition=dense_partition, dense_names=dense_names, experts=experts,
                   expert_partition=partition if experts is not None else (), canary=monitor, catalog=catalog)

    def coverage_notes(self) -> tuple[str, ...]:
        """MOE-6: what heterogeneous routing the expert recipes cover, for certificates."""
        if self.experts is None or self.catalog is None:
            return ()
        qualified = self.catalog.qualified_templates()
        if not qualified:
            return ("heterogeneous MoE routing: no template qualified; only the replayed per-expert regimes "
                    "are covered",)
        return (f"heterogeneous MoE routing: covered only for the qualified templates {', '.join(qualified)}",)

    def gate_catalog(self, dense_recipes: Sequence[str]) -> tuple[list[tuple[str, tuple[str, ...]]], tuple[str, ...]]:
        """The gate's catalog as ``(recipe id, groups it applies to)`` and every group name:
        dense recipes and the canary apply to the dense groups, expert recipes to the expert
        groups (MOE-1, CANARY-7)."""
        recipes = [(r, self.dense_names) for r in dense_recipes]
        if self.experts is not None:
            recipes += [(str(r), self.expert_names) for r in self.experts.catalog.recipes()]
        if self.canary is not None:
            recipes.append((str(CANARY_RECIPE), self.dense_names))
        return recipes, self.dense_names + self.expert_names

    def resume_at(self, step: int) -> None:
        if self.experts is not None:
            self.experts.resume_at(step)

    def after_step(self, step: int) -> list[GateFeed]:
        """Expert replay of this step (collective when an expert recipe is due)."""
        if self.experts is None:
            return []
        due = bool(self.experts.schedule.due(step))
        report = self.experts.step()
        if not due:
            return []
        peers = self.experts.peers
        group_index = next(i for i, g in enumerate(self.expert_partition) if peers.ranks == g)
        gathered = self.exchange((group_index, peers.position, report.results))
        by_recipe: dict[str, dict[str, RecipeResult]] = {}
        findings: dict[str, list[Finding]] = {}
        for index, position, results in gathered:
            if position != 0:
                continue
            for result in results:
                name = self.expert_names[index]
                by_recipe.setdefault(str(result.recipe), {})[name] = result
                if result.status is Status.ATTRIBUTED:
                    ranks = tuple(self.expert_partition[index][p] for p in result.outliers)
                    findings.setdefault(str(result.recipe), []).append(Finding(
                        "replay-mismatch", ranks, step,
                        {"recipe": str(result.recipe), "group": name, "sources": list(result.sources),
                         "group_ranks": list(self.expert_partition[index])}))
        return [GateFeed(recipe, step, results, tuple(findings.get(recipe, ())))
                for recipe, results in sorted(by_recipe.items())]

    def at_cycle_end(self, step: int) -> list[GateFeed]:
        """The canary check (collective) and its result per dense group (CANARY-7)."""
        if self.canary is None:
            return []
        decision = self.canary.check(step)
        results = CanaryMonitor.gate_results(decision, step, self.dense_partition)
        findings: tuple[Finding, ...] = ()
        if decision.ranks:
            reason = "canary-common-mode" if decision.outcome is CanaryOutcome.COMMON_MODE else "canary-changed"
            findings = (Finding(reason, decision.ranks, step, {
                "recipe": str(CANARY_RECIPE), "outcome": decision.outcome.value, "classes": list(decision.classes),
                "detail": decision.reason}),)
        return [GateFeed(str(CANARY_RECIPE), step, dict(zip(self.dense_names, results, strict=True)), findings)]

    def close(self) -> None:
        if self.experts is not None:
            self.experts.close()
