"""Rank programs for the MoE and canary tests (run by ``_launch.py`` as
``tests.replay._moe_scenarios:<name>``). Each returns JSON-able results; assertions live in
the tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from scout.core.recipes import Intervals
from scout.gate.model import CheckpointCaptured, CycleBoundary, GateConfig
from scout.gate.recorder import GateWriter
from scout.gate.results import recipe_verdicts
from scout.replay import faults
from scout.replay.canary import CANARY_RECIPE, Canary, CanaryMonitor
from scout.replay.collectives import TorchPeerGroup
from scout.replay.moe import AllToAllReplay, ExpertLayers, ExpertReplayConfig, ExpertReplayer
from scout.replay.moe_catalog import profile_catalog
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer
from tests.replay.moe_toy import DIM, ToyMoEModel

N_VALUES = (1, 2, 4, 8, 16, 32, 64)


def _average_gradients(model: torch.nn.Module, group: Any, size: int) -> None:
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, group=group)
            parameter.grad /= size


def moe_experts(rank: int, world: int, *, mesh_shape: tuple[int, int] = (4, 1), local_experts: int = 8,
                flip_rank: int = 3, flip_expert: int = 2, flip_step: int = 3, a2a_fault_rank: int = 1,
                a2a_fault_step: int = 4, steps: int = 0, per_check: int = 1) -> dict[str, Any]:
    """Mesh ``(edp, ep)``: ranks with the same ep coordinate hold the same experts (replicas
    along edp; a vote can attribute only in groups of 3 or more). A bit of expert
    ``flip_expert``'s weights flips on ``flip_rank`` after step ``flip_step``; the all-to-all
    receive path of ``a2a_fault_rank`` corrupts one bit from step ``a2a_fault_step`` on.
    ``steps``: 0 = one pass over the compressed catalog; ``per_check``: expert recipes replayed
    at each step (REC-3's lanes, MOE-10)."""
    mesh = init_device_mesh("cpu", tuple(mesh_shape), mesh_dim_names=("edp", "ep"))
    ep = mesh.get_local_rank("ep")
    torch.manual_seed(100 + ep)  # one expert shard per ep coordinate, replicated along edp
    model = ToyMoEModel(local_experts)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    experts = ExpertLayers.discover(model)
    # The regime catalog (MOE-4..MOE-6): profiled here, on every rank, before training.
    catalog = profile_catalog(experts, N_VALUES)
    catalog.assert_covers(catalog.exact_keys())
    expert_peers = TorchPeerGroup.from_mesh(mesh, "edp", timeout_s=60)  # the experts' replicas
    ep_peers = TorchPeerGroup.from_mesh(mesh, "ep", timeout_s=60)  # one EP group: all-to-all
    sync = mesh.get_group("edp")
    edp_size = mesh.size(0)
    replayer = ExpertReplayer(experts, expert_peers, catalog.expert_keys(),
                              ExpertReplayConfig(expert_steps=1, expert_recipes_per_check=per_check))
    ep_group = mesh.get_group("ep")
    a2a = AllToAllReplay(ep_peers, lambda outputs, inputs: dist.all_to_all(outputs, inputs, group=ep_group))
    steps = steps or -(-len(catalog.expert_keys()) // per_check)
    results = []
    dispatch = []
    for step in range(1, steps + 1):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(4, 8, DIM, generator=generator)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        _average_gradients(model, sync, edp_size)
        optimizer.step()
        if rank == flip_rank and step == flip_step:
            faults.flip_tensor_bit_(model.layers[0].experts.w1.data[flip_expert], element=5, bit=30)
        report = replayer.step()
        results += [[str(r.recipe), r.step, r.status.value, list(r.outliers), list(r.sources)] for r in report.results]
        if rank == a2a_fault_rank and step == a2a_fault_step:
            a2a.receive_hook = lambda blocks: faults.flip_tensor_bit_(blocks[0], element=0, bit=3)
        outcome = a2a.check(step)
        dispatch.append([step, outcome.status.value, list(outcome.outliers)])
    replayer.close()
    return {
        "expert_group": list(expert_peers.ranks), "position": expert_peers.position,
        "ep_group": list(ep_peers.ranks), "results": results, "dispatch": dispatch,
        "exact_keys": len(catalog.exact_keys()), "compressed_keys": len(catalog.expert_keys()),
        "regimes": [[list(r.members), list(r.representatives)] for r in catalog.layers[0].regimes],
        "templates": [[list(t.counts), t.qualified] for t in catalog.templates],
        "catalog": catalog.to_json(), "errors": [],
    }


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def canary_common_mode(rank: int, world: int, *, fault_step: int = 5, cycles: int = 4,
                       with_canary: bool = True) -> dict[str, Any]:
    """Data parallel over the world; replay votes among all ranks. From ``fault_step`` on,
    every rank's gelu miscomputes one bit (FAULT-7): common mode. Rank 0 runs the gate with the
    canary in its catalog (or without, ``with_canary=False``: what the vote alone certifies)."""
    torch.manual_seed(7)
    model = _Stack()
    layers = model.layers
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    peers = TorchPeerGroup(timeout_s=60)
    intervals = Intervals(embedding_steps=0, hidden_steps=1, output_steps=0, optimizer_steps=2)
    replayer = Replayer(model, optimizer, peers, ReplayConfig(intervals=intervals), RecipeModules(hidden=tuple(layers)))
    cycle = replayer.schedule.cycle_length_steps()
    control = dist.new_group(backend="gloo")

    def exchange(value: Any) -> list[Any]:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, value, group=control)
        return gathered

    monitor = CanaryMonitor(Canary(), exchange, rank=rank) if with_canary else None
    recipes = [str(r) for r in replayer.catalog.recipes()] + ([str(CANARY_RECIPE)] if with_canary else [])
    config = GateConfig("canary-test", recipes, ("dp",))
    gate = GateWriter.in_memory(config) if rank == 0 else None
    if gate is not None:
        gate.apply(CycleBoundary(0))
    replay_results = []
    canary = []
    handle = None
    for step in range(1, cycle * cycles + 1):
        if step == fault_step:
            handle = faults.faulty_kernel("gelu", element=3, bit=22)  # identically on every rank
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 16, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        _average_gradients(model, None, world)
        optimizer.step()
        report = replayer.step()
        for result in report.results:
            replay_results.append([str(result.recipe), step, result.status.value])
            if gate is not None:
                gate.apply(recipe_verdicts(config, str(result.recipe), gate.state.context.cycle, step,
                                           {"dp": result}))
        if step % cycle == 0:
            if monitor is not None:
                decision = monitor.check(step)
                canary.append([step, decision.outcome.value, list(decision.ranks), list(decision.classes)])
                if gate is not None:
                    (result,) = CanaryMonitor.gate_results(decision, step, [tuple(range(world))])
                    gate.apply(recipe_verdicts(config, str(CANARY_RECIPE), gate.state.context.cycle, step,
                                               {"dp": result}))
            if gate is not None:
                gate.apply(CycleBoundary(step))
                gate.apply(CheckpointCaptured(step))
    if handle is not None:
        handle.remove()
    replayer.close()
    trust = {}
    if gate is not None:
        trust = {str(e.id.step): e.trust.value for e in gate.state.context.checkpoints}
    return {"cycle": cycle, "replay": replay_results, "canary": canary, "trust": trust,
            "control": None if gate is None else gate.state.control, "errors": []}


def titan_experts(rank: int, world: int, *, flip_rank: int = 2, flip_expert: int = 5, steps: int = 0) -> dict[str, Any]:
    """TorchTitan's own GroupedExperts (torch._grouped_mm, bf16) replicated on every rank
    (TitanDegrees(dp_replicate=4, ep=1)); a bit of expert ``flip_expert`` flips on ``flip_rank``
    after step 1."""
    from torchtitan.models.common.moe import GroupedExperts

    from scout.integrations.torchtitan import TitanDegrees, replica_partitions

    torch.manual_seed(11)
    experts_module = GroupedExperts(GroupedExperts.Config(dim=64, hidden_dim=64, num_experts=8))
    with torch.no_grad():
        for parameter in experts_module.parameters():
            parameter.copy_(torch.randn(parameter.shape) / 8)
    holder = torch.nn.Module()
    holder.experts = experts_module
    layers = ExpertLayers.discover(holder)
    catalog = profile_catalog(layers, (16, 32, 64))
    _, expert_partition = replica_partitions(TitanDegrees(dp_replicate=world))
    peers = TorchPeerGroup(partition=expert_partition, timeout_s=60)
    replayer = ExpertReplayer(layers, peers, catalog.expert_keys(), ExpertReplayConfig(expert_steps=1))
    optimizer = torch.optim.SGD(experts_module.parameters(), lr=0.01)
    results = []
    for step in range(1, (steps or len(catalog.expert_keys())) + 1):
        generator = torch.Generator().manual_seed(step)  # the same batch everywhere: replicas
        counts = torch.tensor([16, 8, 0, 24, 16, 32, 8, 24])
        x = torch.randn(int(counts.sum()), 64, generator=generator)
        out = experts_module(x, counts)
        optimizer.zero_grad()
        out.float().pow(2).mean().backward()
        optimizer.step()
        if rank == flip_rank and step == 1:
            faults.flip_tensor_bit_(experts_module.w1_EFD.data[flip_expert], element=3, bit=29)
        report = replayer.step()
        results += [[str(r.recipe), r.step, r.status.value, list(r.outliers)] for r in report.results]
    replayer.close()
    return {"results": results, "keys": len(catalog.expert_keys()), "exact": len(catalog.exact_keys()),
            "templates": [[list(t.counts), t.qualified, t.reason] for t in catalog.templates],
            "regimes": [[list(r.members), list(r.representatives)] for r in catalog.layers[0].regimes],
            "errors": []}
