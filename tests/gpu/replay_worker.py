"""One rank of the replay SDC case under torchrun (the GPU script's case ``replay_sdc``):

    torchrun --standalone --nproc-per-node=<gpus> -m tests.gpu.replay_worker OUT_DIR

The bit-flip scenario of tests/replay (spec/replay.md FAULT-1, REPLAY-6) on real GPUs: a tiny
transformer trained with DDP over NCCL, replay over a NCCL peer group of its own with every
tensor on the GPU (signatures computed on the device, SIG-7), and one rank whose hidden
layer 1 flips bit 20 of one output element on every call. ``SCOUT_REPLAY_BACKEND=gloo`` runs
more ranks than GPUs (they share the GPUs; DDP over gloo on CUDA tensors, replay's peer group
over gloo on the CPU), so that three replicas can attribute the flip on a host with fewer GPUs.
With ``SCOUT_TORCHRUN_DEVICE=cpu`` the same run uses gloo on CPU (how the launch is exercised
without a GPU). Each rank writes ``OUT_DIR/replay_rank<r>.json``.

    python -m tests.gpu.replay_worker --check OUT_DIR SIZE

checks those files (PASS/FAIL line, exit status 1 on failure). What is expected depends on the
number of ranks: 3 or more -> the faulty rank is ATTRIBUTED within one cycle; 2 -> the
disagreement is detected but never attributed (Inconclusive, VERDICT n = 2); 1 -> every
check is Inconclusive ``singleton``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

CASE = "replay_sdc_bit_flip"
STEPS = 3
FLIP_LAYER = 1
# Embedding and output every 3 steps, each hidden layer once in 3 steps, the optimizer every 2.
INTERVALS = {"embedding_steps": 3, "hidden_steps": 1, "output_steps": 3, "optimizer_steps": 2}


def faulty_rank(size: int) -> int:
    return 2 if size >= 3 else size - 1


def run(out_dir: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # cuBLAS is deterministic only with a fixed workspace; replay refuses nondeterministic
    # kernels (REPLAY-4), so set it before CUDA initializes.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from scout.core.recipes import Intervals
    from scout.replay import faults
    from scout.replay.collectives import TorchPeerGroup
    from scout.replay.replay import RecipeModules, ReplayConfig, Replayer
    from tests.replay._scenarios import VOCAB, TinyLM, _batch, _result_dict

    torch.set_num_threads(1)
    local_rank = int(os.environ["LOCAL_RANK"])
    if os.environ.get("SCOUT_TORCHRUN_DEVICE", "cuda") == "cpu":
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        backend = "gloo"
    else:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = os.environ.get("SCOUT_REPLAY_BACKEND", "nccl")
        if backend == "nccl":
            dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=120))
        else:  # ranks share GPUs: NCCL refuses two ranks on one device
            dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, size = dist.get_rank(), dist.get_world_size()
    result: dict[str, Any] = {"device": str(device), "backend": backend}
    try:
        torch.manual_seed(0)
        model = TinyLM().to(device)
        ddp = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        # Over gloo the replay group's rows and broadcasts travel on the CPU.
        peers = TorchPeerGroup(timeout_s=120.0, backend=backend,
                               device=device if backend == "nccl" else torch.device("cpu"))
        replayer = Replayer(
            ddp,
            optimizer,
            peers,
            ReplayConfig(intervals=Intervals(**INTERVALS)),
            RecipeModules.discover(ddp),
        )
        if rank == faulty_rank(size):
            faults.flip_output_bit(model.layers[FLIP_LAYER], element=3, bit=20)
        results: list[dict[str, Any]] = []
        errors: list[str] = []
        for step in range(1, STEPS + 1):
            tokens = _batch(rank, step).to(device)
            logits = ddp(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            report = replayer.after_optimizer_step()
            results += [_result_dict(r) for r in report.results]
            errors += list(report.errors)
        replayer.close()
        result.update(results=results, errors=errors, disabled_reason=replayer.disabled_reason)
    except Exception:
        result["worker_error"] = traceback.format_exc()
    (out_dir / f"replay_rank{rank}.json").write_text(json.dumps({CASE: result}, default=repr))
    dist.barrier()
    dist.destroy_process_group()


def check_results(per_rank: list[dict[str, Any]], size: int) -> None:
    """Assert what the run must show for ``size`` ranks (see the module docstring)."""
    for rank, entry in enumerate(per_rank):
        assert "worker_error" not in entry, f"rank {rank}: {entry['worker_error']}"
        assert not entry["errors"] and entry["disabled_reason"] is None, (rank, entry)
    results = per_rank[0]["results"]
    # READY-2: every peer decides from the same gathered rows.
    assert all(entry["results"] == results for entry in per_rank), "ranks reported differently"
    assert len(results) == 6, results  # 3 hidden, embedding, output, optimizer.0
    flipped = [r for r in results if r["recipe"] == f"hidden.{FLIP_LAYER}"]
    others = [r for r in results if r["recipe"] != f"hidden.{FLIP_LAYER}"]
    if size == 1:
        assert all(r["status"] == "INCONCLUSIVE" and r["reason"] == "singleton" for r in results)
        return
    assert all(r["status"] == "AGREE" for r in others), others
    if size == 2:
        assert [(r["status"], r["outliers"]) for r in flipped] == [("INCONCLUSIVE", [])], flipped
        return
    # The flip is the block's own forward hook, which its self-replay does not run (SELF-2): on
    # the CPU the faulty rank's live output also differs from its own replay ("live"); on a GPU
    # without deterministic algorithms the self-check is unchecked (SELF-3, SELF-6).
    sources = ["output", "live"] if per_rank[0]["device"] == "cpu" else ["output"]
    assert [(r["step"], r["status"], r["outliers"], r["sources"]) for r in flipped] == [
        (FLIP_LAYER + 1, "ATTRIBUTED", [faulty_rank(size)], sources)
    ], flipped


def load(out_dir: Path, size: int) -> list[dict[str, Any]]:
    return [json.loads((out_dir / f"replay_rank{r}.json").read_text())[CASE] for r in range(size)]


def check(out_dir: Path, size: int) -> int:
    try:
        check_results(load(out_dir, size), size)
    except (AssertionError, OSError, KeyError) as exc:
        print(f"FAIL {CASE}: {exc!r}")
        return 1
    print(f"PASS {CASE}")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        sys.exit(check(Path(sys.argv[2]), int(sys.argv[3])))
    run(Path(sys.argv[1]))
