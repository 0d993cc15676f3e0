"""A worker for tests/job/test_attach_fsdp.py: the example GPT under FSDP2 with HSDP on a CPU mesh
(replicate x shard, 2 x 2 unless a fourth argument says e.g. ``4x1``; ``docs`` runs the layout
block of docs/attach.md as written, with ``device = "cpu"``), scout attached with the replicas as
peers, and optionally one of the example's faults (fifth argument, e.g. ``flip:1:6`` or
``live-flip:1:6``; several separated by commas). Run under torchrun."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import scout
from scout.replay import TorchPeerGroup

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "attach.md"


def docs_layout() -> str:
    """The python block between ``<!-- layout: begin -->`` and ``<!-- layout: end -->``."""
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("<!-- layout: begin -->", 1)[1].split("<!-- layout: end -->", 1)[0]
    return block.strip().removeprefix("```python").removesuffix("```")


def main() -> None:
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    run_dir, checkpoint_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    layout = sys.argv[4] if len(sys.argv) > 4 else "2x2"
    fault = sys.argv[5] if len(sys.argv) > 5 else ""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = example.GPT()
    if layout == "docs":
        namespace = {"device": "cpu", "dist": dist, "model": model}
        exec(compile(docs_layout(), str(DOCS), "exec"), namespace)  # noqa: S102 -- the docs' own code
        mesh, peers = namespace["mesh"], namespace["peers"]
    else:
        replicas, shards = (int(n) for n in layout.split("x"))
        mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        peers = TorchPeerGroup.from_mesh(mesh, ("replicate",))
    faults = example.FaultSet(fault, dist.get_rank(), model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = scout.attach(model, optimizer, run_dir=run_dir, checkpoint_dir=checkpoint_dir, peers=peers,
                       replay_interval_steps=1, checkpoint_every_cycles=1)
    start = job.restore()
    replica = mesh.get_local_rank("replicate")
    for step in range(start + 1, steps + 1):
        tokens = example.batch(step, replica)
        faults.before_forward(step)
        began = time.perf_counter()
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, example.VOCAB), tokens[:, 1:].reshape(-1))
        faults.after_forward(time.perf_counter() - began)
        faults.before_backward(step)
        loss.backward()
        faults.after_backward(step)
        optimizer.step()
        optimizer.zero_grad()
        job.step()
    job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
