"""Child of tests/job/test_ddp_hook.py under torchrun: the gradients DDP averages with scout's
publishing hook (scout/job/hooks.py) against DDP's own path, and the reduce ops the hook used."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scout.job import hooks
from scout.job.hooks import publish_ddp_buckets
from scout.observer import instrument
from scout.observer.progress import ProgressPublisher, RecordIdentity


def gradients(model: nn.Module, rank: int) -> list[torch.Tensor]:
    """The second backward's gradients: DDP rebuilds its buckets after the first (to bucket_cap_mb)."""
    for iteration in range(2):
        model.zero_grad(set_to_none=True)
        inputs = torch.randn(16, 256, generator=torch.Generator().manual_seed(10 * rank + iteration))
        model(inputs).square().sum().backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))

    reference = gradients(DistributedDataParallel(net(), bucket_cap_mb=0.25), rank)
    ops: list[str] = []
    original = hooks._all_reduce  # the hook's all-reduce, straight into the group

    def recording(group: object, tensor: torch.Tensor, op: object) -> object:
        ops.append(str(op))
        return original(group, tensor, op)

    hooks._all_reduce = recording
    publisher = ProgressPublisher(RecordIdentity(f"ddp-hook-{sys.argv[1]}", 0, rank))
    instrument.instrument(publisher, collectives=False)
    hooked = DistributedDataParallel(net(), bucket_cap_mb=0.25)
    assert publish_ddp_buckets(hooked, publisher)
    mine = gradients(hooked, rank)
    instrument.uninstrument()
    publisher.close()
    if rank == 0:
        print(json.dumps({"equal": all(torch.equal(a, b) for a, b in zip(reference, mine, strict=True)),
                          "gradients": len(mine), "ops": sorted(set(ops)), "calls": len(ops)}), flush=True)
    dist.destroy_process_group()
    # The verdict is out. The interpreter's own teardown of this process (DDP models with a Python
    # comm hook, gloo's threads) once aborted in C++ on CI -- "terminate called without an active
    # exception", exit -6, after the line above (1 run of 4, 2026-12-07): not this test's question,
    # and not reproduced since (the suspected cause, torch's guard of the hook's then() callback
    # taking the GIL on gloo's thread during finalization, is in the stop-58 note); the job ends here.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
