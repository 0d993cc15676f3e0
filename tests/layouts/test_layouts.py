"""Parallel layouts, pure (spec/replay.md LAYOUT-1..LAYOUT-7): roles, replica groups of every
(pp, dp, tp) layout of 4, 6 and 8 ranks against the coordinate definition, the gate's names and
job-wide catalog, what each group size can do and how scout says it, and the documentation's
table. No processes: the jobs are tests/layouts/test_jobs.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from scout.core.layouts import Coverage, ParallelLayout, coverage_of, layouts_of
from scout.core.recipes import Catalog, RecipeResult
from scout.core.verdict import Status
from scout.gate.model import GateReport, GateReportKind
from scout.job.layouts import JobLayout, resolve_layout
from scout.job.pipeline import GateFeed, Layout

REPO = Path(__file__).resolve().parents[2]
WORLDS = (4, 6, 8)
ALL = [layout for world in WORLDS for layout in layouts_of(world)]


def _naive_replicas(layout: ParallelLayout) -> set[frozenset[int]]:
    """LAYOUT-1 by its definition: ranks whose coordinates agree outside the replicate dims."""
    keep = [axis for axis, name in enumerate(layout.dim_names) if name not in layout.replicate]
    groups: dict[tuple[int, ...], set[int]] = {}
    for flat, coordinate in enumerate(itertools.product(*(range(s) for s in layout.shape))):
        groups.setdefault(tuple(coordinate[a] for a in keep), set()).add(layout.ranks[flat])
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("layout", ALL, ids=lambda layout: "x".join(map(str, layout.shape)))
def test_LAYOUT_1_LAYOUT_7_every_layout_of_4_6_8_ranks_builds_its_groups_by_the_coordinate_definition(
    layout: ParallelLayout,
) -> None:
    pp, dp, tp = layout.shape
    groups = layout.replica_groups()
    assert {frozenset(g) for g in groups} == _naive_replicas(layout)
    assert sorted(r for g in groups for r in g) == list(range(layout.world_size))
    assert len(groups) == pp * tp and all(len(g) == dp == layout.replicas for g in groups)
    for group in groups:  # replicas: one stage, one shard, every data-parallel index in order
        assert len({layout.stage_of(r) for r in group}) == 1 and len({layout.tensor_index(r) for r in group}) == 1
        assert [layout.coordinate(r)[1] for r in group] == list(range(dp))
    for group in layout.tensor_groups():  # one replica's shards of one stage
        assert [layout.tensor_index(r) for r in group] == list(range(tp))
        assert len({layout.coordinate(r)[:2] for r in group}) == 1
    for group in layout.pipeline_groups():  # one replica's stages, in order
        assert [layout.stage_of(r) for r in group] == list(range(pp))
    assert layout.coverage() is coverage_of(dp)
    assert all(layout.observer_peers(r) == next(g for g in groups if r in g) for r in range(layout.world_size))
    names = layout.group_names()
    assert len(set(names)) == len(groups)


def test_LAYOUT_1_roles_come_from_the_dimension_names_or_are_given() -> None:
    layout = ParallelLayout.of(pp=2, dp=3, tp=2)
    assert (layout.replicate, layout.pipeline, layout.tensor) == (("dp",), "pp", "tp")
    assert layout.roles() == {"pp": "pipeline", "dp": "replicate", "tp": "tensor"}
    hsdp = ParallelLayout.from_names((2, 2), ("replicate", "shard"))
    assert (hsdp.replicate, hsdp.pipeline, hsdp.tensor) == (("replicate",), None, None)
    assert hsdp.replica_groups() == ((0, 2), (1, 3)) and hsdp.group_names() == ("dp0", "dp1")
    given = ParallelLayout.from_names((2, 3), ("stages", "data"), replicate="data", pipeline="stages")
    assert given.replica_groups() == ((0, 1, 2), (3, 4, 5)) and given.group_names() == ("stages0", "stages1")
    assert given.stage_of(4) == 1 and given.stages == 2
    # A rank layout that is not 0..n-1 in order (a DeviceMesh may hold any).
    shuffled = ParallelLayout.from_names((2, 2), ("dp", "tp"), ranks=(3, 2, 1, 0))
    assert shuffled.replica_groups() == ((3, 1), (2, 0)) and shuffled.tensor_index(2) == 1


def test_LAYOUT_2_groups_are_named_by_their_coordinates_outside_the_replicas() -> None:
    assert ParallelLayout.of(dp=4).group_names() == ("dp",)
    assert ParallelLayout.of(pp=2, dp=3, tp=1).group_names() == ("pp0", "pp1")
    assert ParallelLayout.of(pp=1, dp=3, tp=2).group_names() == ("tp0", "tp1")
    assert ParallelLayout.of(pp=2, dp=2, tp=2).group_names() == ("pp0.tp0", "pp0.tp1", "pp1.tp0", "pp1.tp1")


@pytest.mark.parametrize(("arguments", "message"), [
    (dict(shape=(2, 2), dim_names=("pp", "tp")), "no replicate dimension among ('pp', 'tp')"),
    (dict(shape=(2, 2), dim_names=("dp", "tp"), replicate="x"), "replicate dimensions ['x'] must be"),
    (dict(shape=(2, 2, 2), dim_names=("dp", "pp", "pipe")), "name ['pp', 'pipe'] as pipeline"),
    (dict(shape=(2, 2), dim_names=("dp", "tp"), tensor="dp"), "tensor dimension 'dp' must be a mesh dimension"),
    (dict(shape=(2, 2), dim_names=("dp", "dp")), "distinct"),
    (dict(shape=(2, 0), dim_names=("dp", "tp")), "ints >= 1, got shape (2, 0)"),
    (dict(shape=(2, 2), dim_names=("dp", "tp"), ranks=(0, 1, 1, 3)), "holds 4 distinct ranks"),
    (dict(shape=(2, 2), dim_names=("dp",)), "2 dimensions (shape (2, 2)) but 1 names"),
])
def test_LAYOUT_1_a_bad_layout_is_an_error_naming_the_value(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as error:
        ParallelLayout.from_names(**arguments)
    assert message in str(error.value)


def test_LAYOUT_1_attach_takes_a_layout_or_peers_and_the_layout_must_span_the_world() -> None:
    with pytest.raises(ValueError, match="pass layout= or peers=, not both"):
        resolve_layout(ParallelLayout.of(dp=2), [(0, 1)], rank=0, world_size=2)
    with pytest.raises(ValueError, match="spans ranks \\[0, 1\\], not the world of 4"):
        resolve_layout(ParallelLayout.of(dp=2), None, rank=0, world_size=4)
    with pytest.raises(TypeError, match="layout must be a DeviceMesh or a scout.ParallelLayout, got int"):
        resolve_layout(3, None, rank=0, world_size=4)
    default = resolve_layout(None, None, rank=2, world_size=4)  # the whole world, DDP replicas
    assert (default.partition, default.names, default.observer_peers, default.checkpoint_namespace) == (
        ((0, 1, 2, 3),), ("dp",), (0, 1, 2, 3), None)
    pipeline = resolve_layout(ParallelLayout.of(pp=2, dp=3, tp=1), None, rank=4, world_size=6)
    assert (pipeline.index, pipeline.names, pipeline.observer_peers) == (1, ("pp0", "pp1"), (3, 4, 5))
    assert pipeline.checkpoint_namespace == "pp1" and pipeline.loop_check_off is not None


def test_LAYOUT_2_the_gate_catalog_is_every_stage_s_recipes_each_applying_to_the_groups_that_hold_it() -> None:
    from scout.job.checks import ReplayCheck

    first = Catalog(2, has_embedding=True, has_output=False)
    last = Catalog(2, has_embedding=False, has_output=True)

    class Runner:
        catalog = first

    check = ReplayCheck("replay", Runner(), Layout.of([(0, 2, 4), (1, 3, 5)], ("pp0", "pp1"), 0), ("h",) * 6)  # type: ignore[arg-type]
    check.group_catalogs = (tuple(map(str, first.recipes())), tuple(map(str, last.recipes())))
    recipes = {recipe.id: recipe.groups for recipe in check.gate_recipes()}
    assert recipes == {"embedding": ("pp0",), "hidden.0": ("pp0", "pp1"), "hidden.1": ("pp0", "pp1"),
                       "output": ("pp1",), "optimizer.0": ("pp0", "pp1")}
    assert [recipe.id for recipe in check.gate_recipes()] == ["embedding", "hidden.0", "hidden.1", "output",
                                                               "optimizer.0"]


def test_LAYOUT_4_three_replicas_name_two_detect_one_checks_nothing() -> None:
    assert [coverage_of(n) for n in (1, 2, 3, 8)] == [Coverage.NONE, Coverage.DETECTS, Coverage.NAMES, Coverage.NAMES]
    with pytest.raises(ValueError, match="at least one rank, got 0"):
        coverage_of(0)


def test_LAYOUT_4_an_inconclusive_observer_finding_in_a_group_of_two_says_detect_only() -> None:
    from scout.core.observer import Evidence, Finding, RoundId, Scope, Stage, StallKind, StallReport
    from scout.observer import wire

    evidence = Evidence(4, 2, 0xAB, Stage.COMPUTE, 1.0)

    def reason(group: tuple[int, ...]) -> str:
        report = StallReport(kind=StallKind.HANG, outcome=Finding.INCONCLUSIVE, scope=Scope.GROUP, key=(4, 2),
                             round=RoundId(0, 1), decided_by=0, reporter=0, attributed=(), ahead=(), missing=(),
                             evidence=(evidence,) * len(group), idle_s=3.0, reason="no-majority", blocking=0)
        return str(wire.report_record(report, group_ranks=group, job_id="j", generation=0)["reason"])

    assert reason((2, 3)) == "detect-only" and reason((2, 3, 4)) == "no-majority"


def test_LAYOUT_4_an_unchecked_report_of_two_replicas_that_disagreed_says_detect_only() -> None:
    from scout.core.recipes import RecipeClass, RecipeId
    from scout.job.gate_driver import GateDriver

    recorded: list[tuple[str, str]] = []

    class Reporter:
        def record(self, kind: Any, reason: str, **_: Any) -> None:
            recorded.append((kind.value, reason))

    driver = GateDriver(None, Reporter(), two_replica_groups=("pp0", "pp1"))  # type: ignore[arg-type]
    recipe = RecipeId(RecipeClass.HIDDEN, 1)
    disagreed = RecipeResult(recipe, 6, Status.INCONCLUSIVE, reason="output:no-majority")
    failed = RecipeResult(recipe, 6, Status.INCONCLUSIVE, reason="replay-status 0:replay_failed")
    report = GateReport(GateReportKind.UNCHECKED, 1, 6, ("hidden.1",), ("pp0",), "detail")
    driver._report(report, GateFeed("hidden.1", 6, {"pp0": disagreed}))
    driver._report(report, GateFeed("hidden.1", 6, {"pp0": failed}))
    driver._report(attrs_evolve(report, groups=("pp2",)), GateFeed("hidden.1", 6, {"pp2": disagreed}))
    assert recorded == [("unchecked", "replay-detect-only"), ("unchecked", "replay-inconclusive"),
                        ("unchecked", "replay-inconclusive")]


def attrs_evolve(value: Any, **changes: Any) -> Any:
    import attrs

    return attrs.evolve(value, **changes)


def test_LAYOUT_5_rank_0_says_once_what_the_layout_can_do_and_what_to_change() -> None:
    names = JobLayout(0, ((0, 2, 4), (1, 3, 5)), ("tp0", "tp1"), ParallelLayout.of(pp=1, dp=3, tp=2)).said()
    assert names[0] == ("scout: layout pp 1 x dp 3 x tp 2 (6 ranks): 2 replica group(s) of 3 rank(s) holding the "
                        "same tensor shard; replay names a faulty rank in each group, the observer names a hung one")
    assert len(names) == 2 and "loop and forward straggler checks are off" in names[1]
    detect = JobLayout(0, (), (), ParallelLayout.of(pp=2, dp=2, tp=2)).said()
    assert "DETECT ONLY" in detect[0] and "at least 3 replicas: a world of >= 12 ranks" in detect[1]
    none = JobLayout(0, (), (), ParallelLayout.of(pp=2, dp=1, tp=2)).said()
    assert "NOT COVERED" in none[0] and "replay is off" in none[0] and len(none) == 2
    assert JobLayout(0, ((0, 1, 2),), ("dp",)).said() == []  # no layout given: nothing new to say
    assert JobLayout(0, (), (), ParallelLayout.of(dp=4)).said() == [
        "scout: layout dp 4 (4 ranks): 1 replica group(s) of 4 rank(s) holding the same state; replay names a "
        "faulty rank in each group, the observer names a hung one"]


def _table_rows() -> list[str]:
    text = (REPO / "docs" / "layouts.md").read_text()
    table = text.split("<!-- layouts: begin -->", 1)[1].split("<!-- layouts: end -->", 1)[0]
    return [line for line in table.splitlines() if re.match(r"^\| \d", line)]


def test_LAYOUT_7_the_documented_table_is_every_layout_of_4_6_8_ranks_with_what_it_can_do() -> None:
    words = {Coverage.NAMES: "names", Coverage.DETECTS: "detects only", Coverage.NONE: "not covered"}
    wanted = [f"| {layout.world_size} | {layout.shape[0]} | {layout.shape[1]} | {layout.shape[2]} | "
              f"{len(layout.replica_groups())} x {layout.replicas} | {words[layout.coverage()]} |" for layout in ALL]
    assert _table_rows() == wanted


def _record(kind: str, ranks: list[int], step: int, *, reason: str = "r", at: float = 0.0,
            group: list[int] | None = None) -> dict[str, Any]:
    import datetime

    time = datetime.datetime.fromtimestamp(at, tz=datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return {"kind": kind, "ranks": ranks, "step": step, "reason": reason, "time": time,
            "evidence": {"group_ranks": group or []}}


def test_LAYOUT_4_the_campaign_s_layouts_part_counts_what_the_jobs_named() -> None:
    from scout.scenarios.campaign import Outcome
    from scout.scenarios.layout_campaign import (
        LAYOUT_KINDS,
        LayoutCase,
        classify_case,
        layout_cases,
    )

    quick = layout_cases(quick=True, seed=3)
    assert quick == layout_cases(quick=True, seed=3) and len(quick) == len(LAYOUT_KINDS) + 2
    assert all(case.rank in case.spec.candidates and case.step in case.spec.steps for case in quick)
    assert len(layout_cases(quick=False, seed=3)) == 2 * (len(LAYOUT_KINDS) + 1) + 4
    sdc = LayoutCase("pp: sdc in stage 0", 1, 8, 0)
    assert (sdc.fault, sdc.steps, sdc.spec.replicas) == ("sdc:1:8", 10, 3)
    assert classify_case(sdc, [_record("sdc", [1], 8), _record("sdc", [1], 10)], "", exit_code=0)[0] is \
        Outcome.LOCALIZED
    assert classify_case(sdc, [_record("sdc", [1], 10)], "", exit_code=0)[0] is Outcome.INCONCLUSIVE  # late
    assert classify_case(sdc, [_record("sdc", [2], 8)], "", exit_code=0)[0] is Outcome.MISATTRIBUTED
    assert classify_case(sdc, [], "", exit_code=0)[0] is Outcome.MISSED
    hang = LayoutCase("pp: hang in stage 1", 4, 8, 0)
    struck = "EXAMPLE-FAULT hang-before-forward rank 4 step 8 at 100.000\n"
    named = [_record("hang", [4], 8, at=103.2)]
    assert classify_case(hang, named, struck, exit_code=0)[:2] == (Outcome.LOCALIZED, (4,))
    assert classify_case(hang, [_record("hang", [4], 8, at=104.5)], struck, exit_code=0)[0] is Outcome.INCONCLUSIVE
    # LAYOUT-3's known limit counts as it is: the waiting neighbour named with the culprit.
    assert classify_case(hang, [*named, _record("hang", [1], 8, at=103.3)], struck, exit_code=0)[:2] == (
        Outcome.MISATTRIBUTED, (1, 4))
    detect = LayoutCase("pp x tp: hang (detect only)", 5, 8, 0)
    only = [_record("inconclusive", [], 8, reason="detect-only", group=[1, 5])]
    assert classify_case(detect, only, struck, exit_code=0)[0] is Outcome.LOCALIZED
    assert classify_case(detect, [_record("inconclusive", [], 8, reason="no-majority", group=[1, 5])], struck,
                         exit_code=0)[0] is Outcome.INCONCLUSIVE
    healthy = LayoutCase("healthy tp", 0, 24, 0)
    assert classify_case(healthy, [], "", exit_code=0)[0] is Outcome.CLEAN
    assert classify_case(healthy, [_record("inconclusive", [], 3)], "", exit_code=0)[0] is Outcome.FALSE_ALARM
    assert classify_case(healthy, [_record("straggler", [2], 3)], "", exit_code=0)[0] is Outcome.FALSE_ATTRIBUTION
    assert classify_case(healthy, [], "", exit_code=None)[0] is Outcome.FALSE_ALARM  # killed at its deadline
