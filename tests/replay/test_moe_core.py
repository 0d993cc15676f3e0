"""Pure parts of MoE replay and the canary (spec/moe.md, spec/canary.md), and `scout moe-catalog`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scout.core.canary import CanaryOutcome, decide_canary
from scout.core.moe import (
    CatalogEnvironmentError,
    ExecRecord,
    Fingerprint,
    RegimeCatalog,
    build_layer_catalog,
    covers,
    expert_rows,
    materialize_rows,
    validate_counts,
)
from scout.core.recipes import Catalog, Intervals, RecipeClass, RecipeId, Schedule
from scout.core.verdict import MISSING, Status

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]


def test_MOE_1_expert_recipe_ids_round_trip_and_schedule_in_catalog_order() -> None:
    recipe = RecipeId(RecipeClass.EXPERT, 3, 64)
    assert str(recipe) == "expert.3@64" and RecipeId.parse("expert.3@64") == recipe
    with pytest.raises(ValueError, match="n_exec >= 1"):
        RecipeId(RecipeClass.EXPERT, 0)
    with pytest.raises(ValueError, match="expert.<slot>@<n_exec>"):
        RecipeId.parse("expert.3")
    catalog = Catalog(0, False, False, 0, expert_keys=((0, 4), (0, 64), (1, 4)))
    schedule = Schedule(catalog, Intervals(expert_steps=2))
    assert [str(d.recipe) for s in range(1, 9) for d in schedule.due(s)] == [
        "expert.0@4", "expert.0@64", "expert.1@4", "expert.0@4"]
    assert schedule.cycle_length_steps() == 6


def test_MOE_2_MOE_3_materialization_truncates_or_repeats_and_counts_are_validated() -> None:
    assert materialize_rows(10, 4) == (0, 1, 2, 3)
    assert materialize_rows(3, 7) == (0, 1, 2, 0, 1, 2, 0)
    assert expert_rows([2, 0, 5], 2) == (2, 7)
    assert expert_rows([2, 0, 5], 1) == (0, 7)  # no token: the whole packed input
    assert validate_counts([1, 2], 3, 2) == (1, 2)
    with pytest.raises(ValueError, match="sum to 3, but the packed input has 4 rows"):
        validate_counts([1, 2], 4, 2)
    with pytest.raises(ValueError, match="3 per-expert counts for 2 local experts"):
        validate_counts([1, 1, 1], 3, 2)
    with pytest.raises(ValueError, match="ints >= 0"):
        validate_counts([-1, 4], 3, 2)
    with pytest.raises(ValueError, match="n_exec must be an int >= 1"):
        materialize_rows(3, 0)


def _kernel(n: int, name: str = "gemm_128x64", grid: tuple[int, ...] | None = None) -> Fingerprint:
    return Fingerprint(n, (ExecRecord(name, block=(128, 1, 1), grid=grid or ((n + 127) // 128, 4, 1)),))


def test_MOE_4_MOE_5_regimes_by_kernel_and_pareto_maximal_representatives() -> None:
    prints = [_kernel(64, "gemv"), _kernel(128, "gemv"), _kernel(256), _kernel(512), _kernel(1024)]
    layer = build_layer_catalog(0, (0, 1), prints)
    assert [(r.members, r.representatives) for r in layer.regimes] == [((64, 128), (128,)), ((256, 512, 1024), (1024,))]
    assert covers(prints[4], prints[2]) and not covers(prints[2], prints[4])
    assert not covers(prints[1], prints[2])  # another kernel: another regime
    # A grid that does not grow with n (e.g. split-k chosen differently): two maximal members.
    odd = [_kernel(256, grid=(2, 8, 1)), _kernel(512, grid=(4, 4, 1))]
    assert build_layer_catalog(0, (0,), odd).regimes[0].representatives == (256, 512)
    # An incomplete fingerprint keeps its exact key.
    incomplete = Fingerprint(32, (), complete=False, reason="the profiler saw no kernel launch")
    exact = build_layer_catalog(0, (0,), [incomplete, _kernel(256), _kernel(512)])
    assert exact.regimes[0].exact and exact.regimes[0].members == (32,)
    with pytest.raises(ValueError, match="repeat"):
        build_layer_catalog(0, (0,), [_kernel(1), _kernel(1)])


def _catalog() -> RegimeCatalog:
    layer = build_layer_catalog(0, (0, 1, 2, 3, 4, 5, 6, 7), [_kernel(n) for n in (128, 256, 512)])
    environment = {"torch": "2.13.0", "device": "cpu:cpu", "dtype": "torch.float32", "model": "toy"}
    return RegimeCatalog(tuple(sorted(environment.items())), (layer,))


def test_MOE_5_MOE_7_catalog_is_smaller_covers_the_exact_keys_and_is_bound_to_its_environment() -> None:
    catalog = _catalog()
    assert len(catalog.expert_keys()) == 8 < len(catalog.exact_keys()) == 24
    catalog.assert_covers(catalog.exact_keys())
    data = json.loads(json.dumps(catalog.to_json()))
    environment = dict(catalog.environment)
    assert RegimeCatalog.from_json(data, environment) == catalog
    with pytest.raises(CatalogEnvironmentError, match="torch: catalog '2.13.0', here '2.14.0'"):
        RegimeCatalog.from_json(data, {**environment, "torch": "2.14.0"})
    with pytest.raises(ValueError, match="not a scout.moe-catalog/1 catalog"):
        RegimeCatalog.from_json({"schema": "other"})
    with pytest.raises(ValueError, match="missing"):
        RegimeCatalog((("torch", "2.13.0"),), ())


def test_CANARY_3_CANARY_4_CANARY_5_CANARY_6_the_decision() -> None:
    first = decide_canary(None, [{"hidden": 1}, {"hidden": 1}, {"hidden": 2}])
    assert first.outcome is CanaryOutcome.RECORDED and first.ranks == (2,) and dict(first.golden) == {"hidden": 1}
    assert first.status is Status.ATTRIBUTED
    golden = {"hidden": 1, "output": 5}
    same = decide_canary(golden, [dict(golden)] * 3)
    assert same.outcome is CanaryOutcome.UNCHANGED and same.status is Status.AGREE
    # One rank changed, even though a vote of two would not be decided: attributed to it.
    one = decide_canary(golden, [dict(golden), {"hidden": 9, "output": 5}])
    assert one.outcome is CanaryOutcome.ATTRIBUTED and one.ranks == (1,) and one.classes == ("hidden",)
    # Every rank changed alike: the vote agrees; the canary reports common mode.
    every = decide_canary(golden, [{"hidden": 9, "output": 5}] * 4)
    assert every.outcome is CanaryOutcome.COMMON_MODE and every.ranks == (0, 1, 2, 3)
    assert every.status is Status.ATTRIBUTED
    assert decide_canary(golden, [dict(golden), MISSING]).outcome is CanaryOutcome.INCONCLUSIVE
    assert decide_canary(None, [{"hidden": 1}, {"hidden": 2}]).outcome is CanaryOutcome.INCONCLUSIVE


def test_MOE_7_scout_moe_catalog_writes_a_catalog_that_loads_only_here(tmp_path: Path) -> None:
    out = tmp_path / "catalog.json"
    completed = subprocess.run(
        [sys.executable, "-m", "scout.cli", "moe-catalog", "--model", "tests.replay.moe_toy:ToyMoEModel",
         "--kwargs", '{"experts": 8}', "--n-exec", "2,4,16,32", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"},
    )
    assert completed.returncode == 0, completed.stderr
    assert "16 expert recipe(s) instead of 32 exact keys" in completed.stdout
    import torch

    from scout.replay.moe import ExpertLayers
    from scout.replay.moe_catalog import load_catalog
    from tests.replay.moe_toy import ToyMoEModel

    experts = ExpertLayers.discover(ToyMoEModel(8))
    assert load_catalog(out, experts).expert_keys()[:2] == ((0, 4), (0, 32))
    with pytest.raises(CatalogEnvironmentError, match="model"):
        load_catalog(out, ExpertLayers.discover(ToyMoEModel(8).to(torch.float64)))


def test_MOE_9_experts_found_by_name_by_base_class_or_by_structure_never_by_a_class_name_contract() -> None:
    import torch
    from torch import nn

    from scout.replay.moe import ExpertLayers
    from tests.replay.moe_toy import GroupedExperts, ToyMoEModel

    class RenamedExperts(GroupedExperts):  # a user's subclass of TorchTitan-style experts
        pass

    class Stack(nn.Module):  # no GroupedExperts anywhere in its classes: found by its [E, out, in] weight
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4, 6, 5))

    model = ToyMoEModel(4, layers=2)
    for layer in model.layers:
        layer.experts.__class__ = RenamedExperts
    assert ExpertLayers.discover(model).layers == tuple(layer.experts for layer in model.layers)
    structural = nn.Sequential(nn.Conv2d(3, 3, 3), nn.ModuleDict({"moe": Stack()}), nn.Linear(5, 5))
    assert ExpertLayers.discover(structural).layers == (structural[1]["moe"],)  # not the 4-D conv weight
    # Explicit names win, in the order given; a DDP-style wrapper's "module." prefix is optional.
    wrapper = nn.Module()
    wrapper.module = model
    chosen = ExpertLayers.discover(wrapper, ("layers.1.experts", "module.layers.0.experts"))
    assert chosen.layers == (model.layers[1].experts, model.layers[0].experts)
    with pytest.raises(ValueError, match=r"'layers\.9\.experts'.*found by structure: \['module\.layers\.0\.experts'"):
        ExpertLayers.discover(wrapper, ("layers.9.experts",))
    with pytest.raises(ValueError, match="Linear has no grouped parameter"):
        ExpertLayers.discover(model, ("inp",))
    with pytest.raises(ValueError, match="no grouped-experts module in Sequential.*moe_experts="):
        ExpertLayers.discover(nn.Sequential(nn.Conv2d(3, 3, 3), nn.Linear(3, 3)))


def test_MOE_9_scout_moe_catalog_imports_the_users_module_from_the_current_directory(tmp_path: Path) -> None:
    """The `scout` command, run where the user's module is, without PYTHONPATH; the experts
    named with --experts (their class is not named GroupedExperts)."""
    (tmp_path / "user_moe.py").write_text((REPO / "tests/replay/moe_toy.py").read_text().replace(
        "GroupedExperts", "MyExperts"))
    out = tmp_path / "catalog.json"
    scout = Path(sys.executable).with_name("scout")
    command = [str(scout), "moe-catalog", "--model", "user_moe:ToyMoEModel", "--kwargs", '{"experts": 4}',
               "--n-exec", "2,16", "--experts", "layers.0.experts", "--out", str(out)]
    env = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert completed.returncode == 0, completed.stderr
    assert "wrote" in completed.stdout and json.loads(out.read_text())["schema"] == "scout.moe-catalog/1"


def test_MOE_10_expert_recipes_share_the_dense_cycle_when_they_fit() -> None:
    from scout.job.checks import Cycle, expert_cadence

    def cycle(experts: int, cadence: tuple[int, int]) -> Cycle:
        keys = tuple((slot, 4) for slot in range(experts))
        return Cycle.of(Schedule(Catalog(hidden_layer_count=0, has_embedding=False, has_output=False,
                                         optimizer_slice_count=0, expert_keys=keys),
                                 Intervals(expert_steps=cadence[0], expert_recipes_per_check=cadence[1])))

    dense = Cycle.of(Schedule(Catalog(hidden_layer_count=3, has_embedding=True, has_output=True,
                                      optimizer_slice_count=1), Intervals(6, 2, 6, 6)))
    assert dense == Cycle(6, "3 hidden recipe(s), one every 2 step(s)")
    # The newcomer's catalog: 72 expert recipes on a 6-step dense cycle took 72 steps with one
    # expert recipe per step; 8 per step (the default bound) take 9, 12 (uncut) take 6.
    for experts, bound, expected in ((2, 8, 6), (4, 8, 4), (6, 8, 6), (7, 8, 4), (12, 8, 6), (36, 8, 6),
                                     (72, 8, 9), (72, 12, 6), (36, 4, 9)):
        assert cycle(experts, expert_cadence(dense.steps, experts, bound)).steps == expected, (experts, bound)
    assert cycle(72, expert_cadence(6, 72, 8)) == Cycle(9, "72 expert recipe(s), 8 every 1 step(s)")
    assert expert_cadence(0, 0, 1) == (1, 1)
    with pytest.raises(ValueError, match="max_expert_replays_per_step must be >= 1, got 0"):
        expert_cadence(6, 7, 0)


def test_MOE_10_REC_3_REC_4_the_expert_cycle_is_within_the_dense_cycle_unless_the_bound_cuts_it() -> None:
    """Every dense cycle up to 16 steps, every catalog up to 60 expert recipes, bounds 1..9: the
    cycle is at most the dense one when ceil(n_e / C) <= bound, else ceil(n_e / bound); and any
    window of that many steps replays every expert recipe (REC-4), with no recipe twice in one
    check."""
    from scout.job.checks import expert_cadence

    for dense in range(1, 17):
        for experts in range(1, 61):
            keys = tuple((slot, 2) for slot in range(experts))
            catalog = Catalog(hidden_layer_count=0, has_embedding=False, has_output=False, optimizer_slice_count=0,
                              expert_keys=keys)
            for bound in range(1, 10):
                interval, per_check = expert_cadence(dense, experts, bound)
                schedule = Schedule(catalog, Intervals(expert_steps=interval, expert_recipes_per_check=per_check))
                steps = schedule.cycle_length_steps()
                fits = -(-experts // dense) <= bound
                assert steps <= dense if fits else steps == -(-experts // bound), (dense, experts, bound, steps)
                for first in (1, interval + 1, 7):
                    seen = []
                    for step in range(first, first + steps):
                        due = [d.recipe for d in schedule.due(step)]
                        assert len(set(due)) == len(due) <= bound
                        seen += due
                    assert set(seen) == set(catalog.recipes()), (dense, experts, bound, first)


def test_MOE_2_MOE_10_CAP_2_lanes_capture_every_armed_expert_within_one_budget() -> None:
    """Several expert recipes armed at one step (lanes): the grouped module's pre-hook captures
    each armed expert of its layer at the layer's first call, and the capture budget covers them
    together -- the capture that would pass it is refused, naming what is already held."""
    import torch

    from scout.core.recipes import DueRecipe, ReplayStatus
    from scout.replay.moe import ExpertExecutor, ExpertLayers, ExpertReplayConfig
    from tests.replay.moe_toy import DIM, ToyMoEModel

    torch.manual_seed(0)
    model = ToyMoEModel(4)
    experts = ExpertLayers.discover(model)
    keys = [(0, 2), (1, 2), (2, 2)]
    one_capture = 2 * DIM * 4  # n_exec rows of DIM float32
    executor = ExpertExecutor(experts, keys, ExpertReplayConfig(max_capture_bytes=2 * one_capture))
    due = [DueRecipe(RecipeId(RecipeClass.EXPERT, slot, n), 1, 0) for slot, n in keys]
    executor.arm(1, due)
    model(torch.randn(2, 8, DIM))
    statuses = [executor.prepare(d)[0] for d in due]
    assert statuses == [ReplayStatus.OK, ReplayStatus.OK, ReplayStatus.CAPTURE_TOO_LARGE]
    assert executor.held_bytes() == 2 * one_capture
    assert "already held" in executor.prepare(due[2])[1][-1]
    executor.release()
    assert executor.held_bytes() == 0
    executor.close()
