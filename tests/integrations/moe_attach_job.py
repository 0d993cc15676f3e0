"""A data-parallel job with a toy MoE under ``scout.attach`` (torchrun, gloo), for
tests/integrations/test_moe_attach.py. Usage:

    torchrun --nproc-per-node 4 tests/integrations/moe_attach_job.py --steps N --run-dir R
        --checkpoint-dir C [--common-mode-step S]

scout is configured by SCOUT_* environment variables (moe_catalog, canary, ...). With
``--common-mode-step S`` every rank's gelu miscomputes one bit from step S on (FAULT-7).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import scout  # noqa: E402
from scout.replay import faults  # noqa: E402
from tests.replay.moe_toy import DIM, ToyMoEModel  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--common-mode-step", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # every replica starts alike
    model = DistributedDataParallel(ToyMoEModel(8), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    job = scout.attach(model, optimizer, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir)
    start = job.restore()
    for step in range(start, args.steps):
        if step + 1 == args.common_mode_step:
            faults.faulty_kernel("gelu", element=3, bit=22)  # identically on every rank
        generator = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, DIM, generator=generator)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        job.step()
    job.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
