"""The wheel check's attach smoke job (run by `./dev wheel-check` under torchrun from an
installed wheel, outside the checkout): a tiny model, 2 gloo ranks, checkpoints, the five
scout lines; it checks what lands in its run directory and exits non-zero on any surprise."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import scout


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def main() -> int:
    run_dir, checkpoint_dir = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(Tiny())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    job = scout.attach(model, optimizer, run_dir=run_dir, checkpoint_dir=checkpoint_dir, replay_interval_steps=1,
                       checkpoint_every_cycles=1)
    start = job.restore()
    for step in range(start + 1, 13):
        tokens = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(step))
        loss = model(tokens).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        job.step()
    job.close()
    if dist.get_rank() == 0:
        from scout import reports

        records = reports.read_records(run_dir / "reports.jsonl")
        kinds = [r["kind"] for r in records]
        verified = [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]
        faults = [k for k in kinds if k in ("hang", "sdc", "desync", "group_stall", "unresponsive")]
        if faults or not verified or kinds[-1] != "finished":
            print(f"wheel smoke job: unexpected reports {kinds}", file=sys.stderr)
            return 1
        print(f"wheel smoke job: ok, {len(verified)} checkpoint(s) verified, reports {sorted(set(kinds))}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
