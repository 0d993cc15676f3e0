"""Tensor-parallel replay on local shards (spec/replay.md TP-1..TP-5) and the checkpoints of
pipeline stages (LAYOUT-6): the stand-ins in one process, then real gloo processes with a real
DTensor block (``parallelize_module``, ``ColwiseParallel``/``RowwiseParallel``). The whole path
under torchrun is tests/layouts/test_jobs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from scout.core.recipes import RecipeClass, RecipeId
from scout.replay.capture import ModuleCapture
from scout.replay.tensor_parallel import (
    TP_NOT_SELF_CHECKED,
    LocalCollectives,
    UnreplayableCollective,
)
from tests import processes

REPO = Path(__file__).resolve().parents[2]


def test_TP_1_every_functional_collective_is_replaced_by_a_local_stand_in_of_its_shape() -> None:
    # The group name is never resolved: the stand-in runs instead of the collective.
    functional = torch.ops._c10d_functional
    x = torch.arange(12.0).reshape(4, 3)
    with LocalCollectives() as mode:
        reduced = functional.wait_tensor(functional.all_reduce(x, "sum", "no-such-group"))
        gathered = functional.all_gather_into_tensor(x, 2, "no-such-group")
        scattered = functional.reduce_scatter_tensor(x, "sum", 2, "no-such-group")
        broadcast = functional.broadcast(x, 0, "no-such-group")
        exchanged = functional.all_to_all_single(x, [2, 2], [2, 2], "no-such-group")
        in_place = functional.all_reduce_(x.clone(), "sum", "no-such-group")
    assert torch.equal(reduced, x) and reduced.data_ptr() != x.data_ptr()
    assert torch.equal(gathered, torch.cat([x, x])) and gathered.shape == (8, 3)
    assert torch.equal(scattered, x[:2]) and torch.equal(broadcast, x) and torch.equal(exchanged, x)
    assert torch.equal(in_place, x)
    assert mode.replaced["_c10d_functional::all_reduce"] == 1 and mode.replaced["_c10d_functional::wait_tensor"] == 1
    with LocalCollectives(), pytest.raises(UnreplayableCollective, match="uneven splits"):
        functional.all_to_all_single(x, [1, 3], [2, 2], "no-such-group")


def test_TP_1_a_c10d_collective_inside_a_replay_fails_it_instead_of_communicating(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with LocalCollectives(), pytest.raises(UnreplayableCollective, match="c10d::allreduce_"):
            dist.all_reduce(torch.ones(2))
    finally:
        dist.destroy_process_group()


def test_TP_5_a_tensor_parallel_call_is_not_self_checked_and_says_why() -> None:
    layer = torch.nn.Linear(3, 3)
    recipe = RecipeId(RecipeClass.HIDDEN, 0)
    capture = ModuleCapture({recipe: layer}, 2**20, self_check=True, not_self_checked={recipe: TP_NOT_SELF_CHECKED})
    capture.arm(1, [recipe])
    layer(torch.ones(2, 3))
    outcome = capture.live(recipe, 1)
    assert outcome.code.name == "UNCHECKED" and outcome.reason == TP_NOT_SELF_CHECKED
    assert capture._unchecked == {} and capture._live == {}  # no live call kept for a self-replay (SELF-9)
    capture.close()


def _launch(tmp_path: Path, scenario: str, world: int, **kwargs: Any) -> dict[int, Any]:
    out = tmp_path / "ranks.json"
    environment = dict(os.environ, OMP_NUM_THREADS="1", SCOUT_TEST_RANK_DEADLINE_S="120")
    done = processes.run_forked("tests.replay._launch:main", [f"tests.layouts._scenarios:{scenario}", str(world),
                                                               json.dumps(kwargs), str(out)],
                                cwd=REPO, env=environment, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["late_ranks"] == [], f"ranks {report['late_ranks']} missed the deadline (a replay communicated?)"
    failed = {r: v["payload"] for r, v in report["ranks"].items() if v["status"] != "ok"}
    assert not failed, failed
    return {int(r): v["payload"] for r, v in report["ranks"].items()}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """One launch of 4 gloo ranks for every test below: a ("dp", "tp") = (2, 2) mesh."""
    return _launch(tmp_path_factory.mktemp("layouts"), "layouts", 4)


@pytest.mark.torchdist
def test_TP_2_TP_3_TP_4_replicas_of_a_shard_replay_alike_alone_and_a_corrupt_shard_changes_only_its_rank(
    four_ranks: dict[int, Any],
) -> None:
    ranks = {rank: result["replay"] for rank, result in four_ranks.items()}  # ranks 0, 2 hold shard 0
    # TP-4: the last rank replayed alone, the others waiting in a barrier, and returned.
    assert ranks[3]["alone"] == ranks[3]["signature"]
    # TP-1: the forward's row-wise all-reduce and the backward's column-wise one were stood in for.
    assert ranks[0]["replaced"]["_c10d_functional::all_reduce"] == 2
    # TP-2: replicas of one shard replay to the same bits, run after run; the shards differ.
    assert all(r["again"] == r["signature"] for r in ranks.values())
    assert ranks[0]["signature"] == ranks[2]["signature"] and ranks[1]["signature"] == ranks[3]["signature"]
    assert ranks[0]["signature"] != ranks[1]["signature"]
    assert len({r["live"] for r in ranks.values()}) == 1  # the live forward: the whole value on every rank
    # TP-3: rank 2's corrupt shard changes its own replay only, not its partner rank 3's.
    assert ranks[2]["corrupt"] != ranks[0]["corrupt"] == ranks[0]["signature"]
    assert ranks[3]["corrupt"] == ranks[1]["corrupt"] == ranks[1]["signature"]


@pytest.mark.torchdist
def test_LAYOUT_6_each_pipeline_stage_saves_and_restores_its_own_module(four_ranks: dict[int, Any]) -> None:
    loaded = {rank: result["checkpoints"] for rank, result in four_ranks.items()}  # stage = rank % 2
    assert [loaded[r]["namespaced"] for r in range(4)] == [1.0, 2.0, 1.0, 2.0]
    # Why the namespace: DCP keeps one copy of entries that share a key, as it does for replicas.
    assert [loaded[r]["plain"] for r in range(4)] == [1.0, 1.0, 1.0, 1.0]


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class _Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _executor(dims: tuple[str, str], *, tensor_parallel: bool, fsdp: bool) -> Any:
    """A DenseExecutor over a two-block model on a 1 x 1 mesh of this one process: block 0
    tensor parallel on the second dimension when asked, both blocks and the root under FSDP2 on
    the first (or, for HSDP's names, the whole mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from scout.replay.replay import DenseExecutor, RecipeModules, ReplayConfig

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=dims)
    model = _Layers()
    if tensor_parallel:
        parallelize_module(model.layers[0], mesh[dims[1]], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if fsdp:
        fsdp_mesh = mesh if dims == ("replicate", "shard") else mesh[dims[0]]
        for block in model.layers:
            fully_shard(block, mesh=fsdp_mesh)
        fully_shard(model, mesh=fsdp_mesh)
    return DenseExecutor(model, None, RecipeModules.discover(model), ReplayConfig())


def test_CAP_7_fsdp2_over_a_tensor_parallel_block_is_never_ready_and_attach_says_so_once(tmp_path: Path) -> None:
    """CAP-7: FSDP2 gathers only its own dimension, so a block it shards over tensor-parallel
    DTensors (parameters sharded along two mesh dimensions) is still sharded at every call:
    never ready. Attach names exactly those recipes; FSDP2 alone, HSDP and tensor parallel alone
    say nothing."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from scout.job.assemble import _never_replayed
    from scout.job.checks import ReplayCheck

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        both = _executor(("dp", "tp"), tensor_parallel=True, fsdp=True)
        assert {str(r) for r in both.sharded_recipes} == {"hidden.0", "hidden.1"}
        assert {str(r) for r in both.never_ready_recipes} == {"hidden.0"}
        check = ReplayCheck("replay", SimpleNamespace(executor=both), SimpleNamespace(names=("dp",)), ("h",))  # type: ignore[arg-type]
        said = _never_replayed([check])
        assert said is not None and said.startswith("scout: NOT COVERED: recipes ['hidden.0'] are sharded by FSDP2 "
                                                    "and by tensor parallel"), said
        assert "no checkpoint can become recovery-verified" in said and "docs/layouts.md" in said
        for executor in (_executor(("dp", "tp"), tensor_parallel=False, fsdp=True),
                         _executor(("replicate", "shard"), tensor_parallel=False, fsdp=True),
                         _executor(("dp", "tp"), tensor_parallel=True, fsdp=False)):
            assert executor.never_ready_recipes == frozenset()
            check = ReplayCheck("replay", SimpleNamespace(executor=executor), SimpleNamespace(names=("dp",)), ("h",))  # type: ignore[arg-type]
            assert _never_replayed([check]) is None
        # Tensor parallel alone is replayed on its local shards (TP-1), not as FSDP2's.
        alone = _executor(("dp", "tp"), tensor_parallel=True, fsdp=False)
        assert {str(r) for r in alone.tensor_parallel_recipes} == {"hidden.0"} and not alone.sharded_recipes
    finally:
        dist.destroy_process_group()


def test_LAYOUT_1_a_replicate_dimension_fsdp2_shards_over_is_refused_naming_it(tmp_path: Path) -> None:
    """LAYOUT-1: ranks along a dimension FSDP2 shards over hold different shards; calling it the
    layout's replicate dimension is refused with the dimension, a parameter and the fix. HSDP's
    replicate dimension, tensor parallel alone and plain tensors pass."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from scout.replay.mesh import check_not_sharded_over_replicas

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        sharded = _Layers()
        fully_shard(sharded, mesh=mesh["dp"])
        with pytest.raises(ValueError, match=r"replicate dimension 'dp' .*parameter 'layers\.0\.up\.weight'.*'dp_shard'"):
            check_not_sharded_over_replicas(sharded, ("dp",))
        check_not_sharded_over_replicas(sharded, ("replicate",))  # 'dp' is not called a replicate one
        hsdp_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
        hsdp = _Layers()
        fully_shard(hsdp, mesh=hsdp_mesh)
        check_not_sharded_over_replicas(hsdp, ("replicate",))
        with pytest.raises(ValueError, match="'shard'"):
            check_not_sharded_over_replicas(hsdp, ("replicate", "shard"))
        check_not_sharded_over_replicas(_executor(("dp", "tp"), tensor_parallel=True, fsdp=False).modules.hidden[0],
                                        ("dp",))
        check_not_sharded_over_replicas(_Layers(), ("dp",))
    finally:
        dist.destroy_process_group()
