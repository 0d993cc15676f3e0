"""Rank programs for the real-process replay tests (run by ``_launch.py``, one per rank).

A tiny decoder-only transformer (embedding, a few pre-norm blocks with causal attention and
dropout, output head) trained with DDP over gloo on CPU. Faults are injected with
``scout.replay.faults``. Each program returns JSON-able results; assertions live in the tests.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scout.core.recipes import Intervals
from scout.replay import faults
from scout.replay.collectives import TorchPeerGroup, TransportPeerGroup
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer
from scout.reports.kinds import straggler_reason
from scout.scenarios.toy import TinyLM as ScoutTinyLM

VOCAB = 64
WIDTH = 32
HEADS = 4
LAYERS = 3
SEQUENCE = 16
BATCH = 4


def TinyLM() -> ScoutTinyLM:  # noqa: N802 (the model's name, as the tests spell it)
    """The toy model (:mod:`scout.scenarios.toy`) at these tests' size, with dropout."""
    return ScoutTinyLM(VOCAB, WIDTH, HEADS, LAYERS, dropout=0.1)


def _batch(rank: int, step: int, length: int = SEQUENCE, batch: int = BATCH) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (batch, length + 1), generator=generator)


def _result_dict(result: Any) -> dict[str, Any]:
    return {
        "recipe": str(result.recipe),
        "step": result.step,
        "status": result.status.value,
        "outliers": list(result.outliers),
        "sources": list(result.sources),
        "reason": result.reason,
    }


def _snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    tensors += [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    tensors += [b.detach().clone() for b in model.buffers()]
    for state in optimizer.state.values():
        tensors += [v.detach().clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def _bitwise_equal(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    if len(before) != len(after):
        return False
    return all(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        for a, b in zip(before, after, strict=True)
    )


def train(
    rank: int,
    world: int,
    *,
    steps: int = 12,
    intervals: dict[str, int] | None = None,
    output_flip: dict[str, int] | None = None,
    parameter_flip: dict[str, int] | None = None,
    state_flip: dict[str, int] | None = None,
    short_batch: dict[str, int] | None = None,
    tiny_capture_rank: int | None = None,
    intervals_override: dict[str, Any] | None = None,
    slow_rank: dict[str, Any] | None = None,
    slow_communication: dict[str, Any] | None = None,
    batch: int = BATCH,
    binding: bool = False,
    check_isolation: bool = False,
    replay_options: dict[str, Any] | None = None,
    record_timings: bool = False,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Train ``steps`` steps with replay; inject the requested faults on their ranks. ``dtype``
    is the model's parameter (and so activation) dtype, e.g. "bfloat16"."""
    torch.manual_seed(0)
    model = TinyLM().to(getattr(torch, dtype))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    if intervals_override and rank == intervals_override["rank"]:
        intervals = intervals_override["intervals"]
    config = ReplayConfig(
        intervals=Intervals(**(intervals or {})),
        max_capture_bytes=1 if rank == tiny_capture_rank else 256 * 2**20,
        **(replay_options or {}),
    )
    peers: Any
    if binding:  # the project's torch binding, over a process group of replay's own
        from scout.transport.nccl import TorchTransport

        store = dist.FileStore(os.path.join(os.environ["SCOUT_TEST_SCRATCH"], "scout"), world)
        transport = TorchTransport(dist.new_group(list(range(world))), store=store)
        peers = TransportPeerGroup(transport, timeout_s=60.0)
    else:
        peers = TorchPeerGroup(timeout_s=60.0)
    replayer = Replayer(ddp, optimizer, peers, config, RecipeModules.discover(ddp))
    if output_flip and rank == output_flip["rank"]:
        faults.flip_output_bit(
            model.layers[output_flip["layer"]], element=3, bit=output_flip["bit"]
        )
    if slow_rank and rank == slow_rank["rank"]:
        for layer in model.layers:
            faults.slow_module(layer, slow_rank["delay_s"])
    if slow_communication and rank == slow_communication["rank"]:
        faults.slow_communication(peers, slow_communication["delay_s"])
    results: list[dict[str, Any]] = []
    stragglers: list[list[Any]] = []
    confirmed: list[list[int]] = []
    isolation_ok = True
    compute_ms: list[dict[str, float]] = []
    collective_ms: list[float] = []
    capture_bytes = []
    errors: list[str] = []
    communication: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        length = SEQUENCE
        if short_batch and rank == short_batch["rank"] and step == short_batch["step"]:
            length = SEQUENCE // 2
        tokens = _batch(rank, step, length, batch)
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        before = _snapshot(model, optimizer) if check_isolation else []
        report = replayer.after_optimizer_step()
        if check_isolation:
            isolation_ok &= _bitwise_equal(before, _snapshot(model, optimizer))
        results += [_result_dict(r) for r in report.results]
        compute_ms.append(report.compute_ms)
        collective_ms.append(report.collective_ms)
        capture_bytes.append(report.capture_bytes)
        errors += list(report.errors)
        if record_timings:
            timings.append(
                {
                    "peers": {k: list(v) for k, v in report.peer_compute_ms.items()},
                    "repetitions": {k: list(v) for k, v in report.repetitions_ms.items()},
                }
            )
        stragglers.append([[type(e).__name__, e.peer] for e in report.stragglers])
        confirmed.append(sorted(report.confirmed_stragglers))
        verdict = report.communication
        communication.append(
            {
                "own_ms": list(report.communication_ms),
                "status": verdict.status.value if verdict is not None else None,
                "outliers": list(verdict.outliers) if verdict is not None else [],
                "reports": [[type(e).__name__, e.peer] for e in report.communication_stragglers],
                "confirmed": sorted(report.confirmed_communication_stragglers),
            }
        )
        if parameter_flip and rank == parameter_flip["rank"] and step == parameter_flip["step"]:
            weight = model.layers[parameter_flip["layer"]].mlp[0].weight
            faults.flip_tensor_bit_(weight.data, element=5, bit=parameter_flip["bit"])
        if state_flip and rank == state_flip["rank"] and step == state_flip["step"]:
            exp_avg = optimizer.state[model.lm_head.weight]["exp_avg"]
            faults.flip_tensor_bit_(exp_avg, element=7, bit=state_flip["bit"])
    coverage = replayer.coverage()
    replayer.close()
    dist.barrier()
    return {
        "results": results,
        "isolation_ok": isolation_ok,
        "compute_ms": compute_ms,
        "collective_ms": collective_ms,
        "capture_bytes": capture_bytes,
        "errors": errors,
        "stragglers": stragglers,
        "confirmed_stragglers": confirmed,
        "communication": communication,
        "timings": timings,
        "disabled_reason": replayer.disabled_reason,
        "coverage_pending": [str(r) for r in coverage.pending],
        "final_loss": float(loss.detach()),
    }


def _local_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters, gradients and optimizer state as this rank holds them (local shards)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        to_local = getattr(t, "to_local", None)
        return (to_local() if to_local is not None else t).detach().clone()

    tensors = [local(p) for p in model.parameters()]
    tensors += [local(p.grad) for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [local(v) for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def train_hsdp(
    rank: int,
    world: int,
    *,
    steps: int = 4,
    mesh_shape: list[int] | None = None,
    intervals: dict[str, int] | None = None,
    output_flip: dict[str, int] | None = None,
    check_isolation: bool = False,
) -> dict[str, Any]:
    """FSDP2 (``fully_shard``) with HSDP on a (replicate x shard) mesh over gloo on CPU; replay
    peers are the replicas of one shard (``TorchPeerGroup.from_mesh(mesh, "replicate")``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    shape = tuple(mesh_shape or (2, world // 2))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = TinyLM()
    if output_flip and rank == output_flip["rank"]:
        # A faulty unit inside block `layer` (a submodule: replay runs the block's submodules'
        # hooks, not the FSDP block's own).
        faults.flip_output_bit(model.layers[output_flip["layer"]].mlp, element=3, bit=20)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    peers = TorchPeerGroup.from_mesh(mesh, "replicate", timeout_s=60.0)
    # PEER-3: the same group learned from the mesh's process group instead of its layout.
    from_group = TorchPeerGroup.from_process_group(mesh.get_group("replicate"), timeout_s=60.0)
    config = ReplayConfig(intervals=Intervals(**(intervals or {})))
    replayer = Replayer(model, optimizer, peers, config, RecipeModules.discover(model))
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    isolation_ok = True
    for step in range(1, steps + 1):
        tokens = _batch(rank, step)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        before = _local_tensors(model, optimizer) if check_isolation else []
        report = replayer.after_optimizer_step()
        if check_isolation:
            isolation_ok &= _bitwise_equal(before, _local_tensors(model, optimizer))
        results += [_result_dict(r) for r in report.results]
        errors += list(report.errors)
    replayer.close()
    dist.barrier()
    return {
        "peers": list(peers.ranks),
        "peers_from_process_group": list(from_group.ranks),
        "position": peers.position,
        "sharded_recipes": sorted(str(r) for r in replayer.sharded_recipes),
        "results": results,
        "errors": errors,
        "isolation_ok": isolation_ok,
        "disabled_reason": replayer.disabled_reason,
        "final_loss": float(loss.detach()),
    }


def _event_dict(event: Any) -> dict[str, Any]:
    return {
        "kind": event.kind.value,
        "change": event.change,
        "reason": straggler_reason(event).value,
        "step": event.step,
        "peer": event.peer,
        "rank": event.rank,
        "ratio": event.performance_ratio,
        "checks": event.checks,
    }


def _active(fault: dict[str, Any] | None, rank: int, step: int) -> bool:
    return (
        fault is not None
        and rank == fault["rank"]
        and fault.get("from_step", 1) <= step < fault.get("until_step", 1 << 30)
    )


def train_stragglers(
    rank: int,
    world: int,
    *,
    steps: int,
    check_every: int = 2,
    loop_check_every: int | None = None,
    device_slow: dict[str, Any] | None = None,
    loop_slow: dict[str, Any] | None = None,
    batch: int = 16,
    width: int = WIDTH,
    record: bool = True,
) -> dict[str, Any]:
    """DDP training with replay and the loop timer (LOOP-1..LOOP-4), checks every
    ``check_every`` steps. ``device_slow``: {"rank", "factor", "from_step", "until_step"}: every
    tensor operation of that rank computes ``factor`` times as long (FAULT-5) in those steps;
    every rank runs the same dispatch mode (factor 1 when healthy), so its own cost is the same
    everywhere. ``loop_slow``: the same keys; that rank's loop body is followed by a wait of
    ``factor - 1`` times its duration (FAULT-6)."""
    import time

    from scout.replay.arrival import LoopConfig, LoopTimer

    torch.manual_seed(0)
    model = TinyLM()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    every = {"embedding_steps": 0, "hidden_steps": check_every, "output_steps": 0}
    config = ReplayConfig(intervals=Intervals(optimizer_steps=check_every, **every))
    peers = TorchPeerGroup(timeout_s=60.0)
    replayer = Replayer(ddp, optimizer, peers, config, RecipeModules.discover(ddp))
    loop = LoopTimer(peers, LoopConfig(check_every_steps=loop_check_every or check_every))

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations
        entry = time.monotonic_ns()
        tensor = bucket.buffer().div_(world)
        future = dist.all_reduce(tensor, async_op=True).get_future()

        def done(completed: Any) -> Any:
            loop.collective(entry, time.monotonic_ns())
            return completed.value()[0]

        return future.then(done)

    ddp.register_comm_hook(None, hook)
    slow_ops = faults.SlowOps(1.0).enter()
    slow_loop = faults.SlowLoop(loop_slow["factor"] if loop_slow else 1.0)
    checks: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    body_cpu_ms: list[float] = []
    try:
        for step in range(1, steps + 1):
            slow_ops.factor = device_slow["factor"] if _active(device_slow, rank, step) else 1.0
            loop.begin_step()
            cpu_started = time.thread_time()
            with contextlib.ExitStack() as stack:
                if _active(loop_slow, rank, step):
                    stack.enter_context(slow_loop)
                tokens = _batch(rank, step, SEQUENCE, batch)
                logits = ddp(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            body_cpu_ms.append((time.thread_time() - cpu_started) * 1e3)
            loop_check = loop.end_step(step)
            report = replayer.after_optimizer_step()
            found = list(report.straggler_events)
            if loop_check is not None:
                found += list(loop_check.events)
            events += [_event_dict(e) for e in found]
            if record and (report.evidence or loop_check is not None):
                checks.append(
                    {
                        "step": step,
                        "device": list(report.evidence.get("device", ())),
                        "communication": list(report.evidence.get("communication", ())),
                        "loop": list(loop_check.evidence) if loop_check else [],
                        "loop_ms": list(loop_check.loop_ms) if loop_check else [],
                        "compute_ms": {k: list(v) for k, v in report.peer_compute_ms.items()},
                        "confirmed": {
                            "device": sorted(report.confirmed_stragglers),
                            "communication": sorted(report.confirmed_communication_stragglers),
                            "loop": sorted(loop_check.confirmed) if loop_check else [],
                        },
                    }
                )
    finally:
        slow_ops.exit()
    replayer.close()
    dist.barrier()
    return {
        "checks": checks,
        "events": events,
        "body_cpu_ms": body_cpu_ms,
        "errors": [],
        "results": [],
        "disabled_reason": replayer.disabled_reason,
        "loop_disabled_reason": loop.disabled_reason,
        "operations": slow_ops.operations,
    }
