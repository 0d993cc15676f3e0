"""TorchTitan's DeepSeek-V3 debug model (MoE) trains a few steps with scout on, on one GPU
(docs/integrations.md). TorchTitan 0.3 cannot train on CPU (no attention backend with a CPU
backward), so this is the trainer-path check of the integration; the CPU parts are
tests/integrations.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 torchrun --standalone --nproc-per-node 3 \\
        tests/gpu/torchtitan_train.py OUT_DIR [STEPS]   (default: one pass over the expert recipes)

Three processes share GPU 0 (replay needs peers to compare; NCCL refuses two ranks on one
device, so the process group is gloo over CUDA tensors). The script builds TorchTitan's own
model classes, profiles its GroupedExperts into a regime catalog on CUDA (kernel fingerprints),
attaches scout through ``scout.integrations.torchtitan.attach_to_titan`` -- the function
TorchTitan's ``post_optimizer_build_fn`` calls -- and trains STEPS steps on synthetic tokens.
Rank 0 writes OUT_DIR/torchtitan_train.json; exit 0 iff training finished, every expert
recipe was replayed, and nothing was attributed.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    out = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 0  # 0: one pass over the expert catalog
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    from torchtitan.models.deepseek_v3 import model_registry

    from scout.integrations.torchtitan import ScoutSettings, attach_to_titan
    from scout.replay.moe import ExpertLayers
    from scout.replay.moe_catalog import profile_catalog, save_catalog

    spec = model_registry("debugmodel", attn_backend="flex")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    torch.manual_seed(0)  # every rank the same weights: they are data-parallel replicas
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.02)
    catalog_path = out / "moe.json"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        catalog = profile_catalog(ExpertLayers.discover(model), (16, 64, 256))
        save_catalog(catalog, catalog_path)
    dist.barrier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    settings = ScoutSettings(enable=True, run_dir=str(out / "run"), moe_catalog=str(catalog_path), expert_steps=1,
                             overrides=(("replay_interval_steps", 1), ("canary", True), ("observer", False)))
    job = attach_to_titan(settings, optimizer, [model], types.SimpleNamespace(dp_replicate=world))
    steps = steps or len(job.expert_replayer.catalog.expert_keys)
    losses = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, 2048, (2, 128), generator=generator).to(device)
        positions = torch.arange(128, device=device).repeat(2, 1)
        logits = model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():  # data parallel by hand: gloo over CUDA tensors
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
                parameter.grad /= world
        optimizer.step()  # scout's post-hook: expert replay, then job.step()
        losses.append(float(loss))
    experts = job.expert_replayer
    results = [[str(r.recipe), r.step, r.status.value, list(r.outliers), r.reason] for r in experts.results]
    job.close()
    if rank == 0:
        (out / "torchtitan_train.json").write_text(json.dumps({"losses": losses, "expert_results": results},
                                                               indent=1))
    dist.destroy_process_group()
    replayed = {r[0] for r in results}
    ok = len(losses) == steps and not any(r[2] == "ATTRIBUTED" for r in results) and replayed == {
        str(r) for r in experts.catalog.recipes()}
    print(f"torchtitan_train rank {rank}: {'ok' if ok else 'FAILED'}; {len(results)} expert replays, "
          f"statuses {sorted({r[2] for r in results})}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
