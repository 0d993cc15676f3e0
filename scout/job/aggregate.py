"""Job-wide replay results for the gate, over the transport contract (spec/gate.md GATE-4).

Rank-program steps: they yield transport ops, so the same code runs on the simulator, under MPI
and under torch.distributed.

1. :func:`group_vote` -- every member of a peer group exchanges its replay evidence with the
   group (deadline-bounded) and decides the recipe with :func:`~scout.core.recipes.combine_evidence`
   (the one verdict rule; a silent peer is MISSING evidence, so the result is unchecked);
2. :func:`aggregate_results` -- the group leaders and the gate's writer exchange their groups'
   results; a group whose leader was silent is simply absent, and
   :func:`scout.gate.results.recipe_verdicts` makes it MISSING (unchecked, never SDC, never a hang).

Both exchanges carry the gate's *view* -- (version, newest verified step or -1, quarantined
checkpoints, tainted) -- and the newest view wins wherever views meet, so what the writer
decided reaches every rank within two replays.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from scout.core.machine import MachineState
from scout.core.recipes import EvidenceKind, RecipeId, RecipeResult, ReplayStatus, combine_evidence
from scout.core.verdict import MISSING, Status
from scout.gate.model import GateContext, GateState, Trust
from scout.transport.base import Group
from scout.transport.program import Exchange

__all__ = ["NO_VIEW", "GateView", "aggregate_results", "gate_view", "group_vote"]

#: What every rank knows of the gate: (version, newest verified step or -1, quarantined
#: checkpoints, tainted). Versions only grow, so the newest view wins wherever views meet.
GateView = tuple[int, int, int, bool]
NO_VIEW: GateView = (0, -1, 0, False)


def gate_view(state: MachineState[GateContext], version: int) -> GateView:
    context = state.context
    verified = context.verified_step
    quarantined = sum(entry.trust is Trust.QUARANTINED for entry in context.checkpoints)
    return (version, -1 if verified is None else verified, quarantined, state.control is GateState.TAINTED)


def _newer(view: GateView, candidate: object) -> GateView:
    if isinstance(candidate, (tuple, list)) and len(candidate) == 4:
        other = tuple(candidate)
        if other > view:
            return other
    return view


def group_vote(
    recipe: RecipeId, step: int, signature: int, view: GateView, *, group: Group, round_id: int, timeout_s: float
) -> Generator[Any, Any, tuple[RecipeResult, GateView]]:
    """Exchange this rank's replay output signature with its peer group and decide the recipe."""
    answer = yield Exchange((signature, view), round_id=round_id, timeout_s=timeout_s, group=group)
    for payload in answer.answers.values():
        if isinstance(payload, (tuple, list)) and len(payload) == 2:
            view = _newer(view, payload[1])
    present = [rank in answer.answers for rank in group.ranks]
    statuses = [int(ReplayStatus.OK) if here else MISSING for here in present]
    signatures = [answer.answers[rank][0] if here else MISSING for rank, here in zip(group.ranks, present, strict=True)]
    return combine_evidence(recipe, step, statuses, {EvidenceKind.OUTPUT: signatures}), view


def aggregate_results(
    group_index: int,
    result: RecipeResult,
    view: GateView,
    *,
    leaders: Group,
    writer: int,
    round_id: int,
    timeout_s: float,
) -> Generator[Any, Any, tuple[dict[int, RecipeResult], GateView]]:
    """The leaders' exchange: each group leader (and the gate's writer) sends its group's result;
    returns the results that arrived, by group index, and the writer's view if newer."""
    mine = (group_index, result.status.value, result.outliers, result.reason or "", view)
    gathered = yield Exchange(mine, round_id=round_id, timeout_s=timeout_s, group=leaders)
    results: dict[int, RecipeResult] = {}
    for payload in gathered.answers.values():
        index, status, outliers, reason, _view = payload
        results[int(index)] = RecipeResult(result.recipe, result.step, Status(status), tuple(outliers),
                                           reason=str(reason) or None)
    writer_payload = gathered.answers.get(writer)
    if writer_payload is not None:
        view = _newer(view, writer_payload[4])
    return results, view
