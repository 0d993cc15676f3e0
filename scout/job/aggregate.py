"""A check step's results, job-wide: exchanged once, merged alike on every rank (docs/design.md
§7.4; spec/gate.md GATE-4, GATE-5). No torch.

Every check of a step (``scout.job.pipeline.Check``) leaves each rank with its peer group's
results and straggler reports -- every member of a group decided them from the same rows. The
gate's writer needs every group's, and the fault policy must stop every rank at the same step,
so the step ends with one exchange over the whole job:

1. :func:`exchange_outputs` -- one ``AllGather`` (a rank-program op: the simulator, MPI and
   torch.distributed each run it; ``scout.attach`` over its gloo control group). A group's
   leader (position 0) carries its group's results and reports as plain values; the others
   carry nothing. When every check has one group, every rank already holds the job-wide view
   and nothing is exchanged;
2. :func:`merge` -- pure: one :class:`~scout.job.pipeline.GateFeed` per recipe, with one result
   per group that answered (``scout.gate.results.recipe_verdicts`` makes the others MISSING:
   unchecked, never SDC) and an SDC finding, in global ranks, for every group that attributed;
   job-wide feeds (the canary's) after the check's own; the straggler reports and timing records
   (LOOP-6) of every group.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from scout.core.recipes import EvidenceKind, RecipeId, RecipeResult
from scout.core.verdict import Status
from scout.reports.kinds import ReportKind, SdcReason
from scout.transport.program import AllGather

if TYPE_CHECKING:
    from scout.job.pipeline import CheckOutput, GateFeed

__all__ = ["Merged", "exchange_outputs", "finding_reason", "merge", "result_from_plain", "result_to_plain"]

#: A RecipeResult as the exchange carries it: (recipe, step, status, outliers, sources, reason,
#: self_checked).
PlainResult = tuple[str, int, str, tuple[int, ...], tuple[str, ...], str | None, bool]
#: A leader's part of one check's output: (group index, results, straggler report arguments,
#: timing record arguments).
PlainOutput = tuple[int, tuple[PlainResult, ...], tuple[Mapping[str, Any], ...], tuple[Mapping[str, Any], ...]]


def result_to_plain(result: RecipeResult) -> PlainResult:
    return (str(result.recipe), result.step, result.status.value, tuple(result.outliers), tuple(result.sources),
            result.reason, result.self_checked)


def result_from_plain(value: Sequence[Any]) -> RecipeResult:
    recipe, step, status, outliers, sources, reason, self_checked = value
    return RecipeResult(RecipeId.parse(recipe), int(step), Status(status), tuple(int(p) for p in outliers),
                        tuple(str(s) for s in sources), None if reason is None else str(reason), bool(self_checked))


def finding_reason(result: RecipeResult) -> str:
    """The reason code of an attributed result's ``sdc`` report: ``live-mismatch`` when only
    the live path's self-check named its ranks (SELF-4: a transient fault of the live call),
    ``replay-mismatch`` when a replay's evidence did."""
    live_only = tuple(result.sources) == (EvidenceKind.LIVE.value,)
    return SdcReason.LIVE_MISMATCH if live_only else SdcReason.REPLAY_MISMATCH


def _plain(output: CheckOutput) -> PlainOutput:
    return (output.layout.index, tuple(result_to_plain(r) for r in output.results), tuple(output.stragglers),
            tuple(output.timing))


def exchange_outputs(
    outputs: Sequence[CheckOutput], *, world_size: int, timeout_s: float
) -> Generator[AllGather, Any, list[Any] | None]:
    """The step's one exchange (module docstring): every rank's payload by rank, or None when
    every check has a single group (nothing to learn from the others)."""
    if all(len(output.layout.groups) == 1 for output in outputs):
        return None
    payload = tuple(_plain(output) if output.layout.leader else None for output in outputs)
    gathered = yield AllGather(payload, timeout_s=timeout_s)
    if len(gathered) != world_size:
        raise ValueError(f"the step's exchange returned {len(gathered)} payloads for a job of {world_size} ranks")
    return list(gathered)


@attrs.frozen
class Merged:
    feeds: tuple[GateFeed, ...]
    stragglers: tuple[Mapping[str, Any], ...]
    timing: tuple[Mapping[str, Any], ...] = ()  # LOOP-6: every group's timing records (the writer's)


def merge(outputs: Sequence[CheckOutput], gathered: Sequence[Any] | None, *, for_gate: bool = True) -> Merged:
    """Job-wide feeds and straggler reports from what the exchange returned. The findings (and
    so the fault policy) are alike on every rank; ``for_gate`` False leaves out what only the
    gate's writer uses -- the results of clean and unchecked groups, the straggler reports --
    which in a job of thousands of ranks every other rank would decode for nothing."""
    from scout.job.pipeline import Finding, GateFeed

    feeds: list[GateFeed] = []
    stragglers: list[Mapping[str, Any]] = []
    timing: list[Mapping[str, Any]] = []
    for index, output in enumerate(outputs):
        layout = output.layout
        if gathered is None:
            parts: list[PlainOutput] = [_plain(output)]
        else:
            parts = [payload[index] for payload in gathered if payload is not None and payload[index] is not None]
        by_recipe: dict[str, dict[str, RecipeResult]] = {}
        findings: dict[str, list[Finding]] = {}
        for group_index, plains, reports, timings in sorted(parts, key=lambda part: int(part[0])):
            name, members = layout.names[group_index], layout.groups[group_index]
            if for_gate:
                stragglers.extend(reports)
                timing.extend(timings)
            for plain in plains:
                if not for_gate and plain[2] != Status.ATTRIBUTED.value:
                    continue
                result = result_from_plain(plain)
                recipe = str(result.recipe)
                by_recipe.setdefault(recipe, {})[name] = result
                if result.status is Status.ATTRIBUTED:
                    findings.setdefault(recipe, []).append(Finding(
                        ReportKind.SDC, finding_reason(result), tuple(members[p] for p in result.outliers), result.step,
                        {"recipe": recipe, "group": name, "sources": list(result.sources),
                         "group_ranks": list(members)}))
        for recipe, results in by_recipe.items():
            step = min(result.step for result in results.values())
            feeds.append(GateFeed(recipe, step, results, tuple(findings.get(recipe, ()))))
        feeds.extend(output.feeds if for_gate else (feed for feed in output.feeds if feed.findings))
    return Merged(tuple(feeds), tuple(stragglers), tuple(timing))
