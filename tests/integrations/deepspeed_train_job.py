"""A DeepSpeed loop with scout: the tiny language model of lightning_train_job.py on synthetic
tokens, 3 ranks on CPU (DS_ACCELERATOR=cpu, gloo; tests/integrations/test_deepspeed.py). The loop
is plain DeepSpeed code with the usual resume idiom; the one scout line is ``attach(engine,
run_dir=...)`` after ``deepspeed.initialize``, which loads the checkpoint the gate chose.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 3 deepspeed_train_job.py OUT_DIR RUN_DIR STEPS

Faults: environment ``PL_FAULT`` as in lightning_train_job.py. ``DS_SAVE_STEPS``: the loop's own
``engine.save_checkpoint(OUT_DIR/ckpt, tag=f"step{N}")`` cadence; ``DS_ZERO_STAGE`` (default 0).
Rank 0 appends one JSON line per optimizer step to ``OUT_DIR/steps.jsonl`` (step, LR, sample
indices, loss, attempt).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
from asleep import asleep_until_named  # beside this script
from torch import nn

from scout.integrations.deepspeed import attach
from tests.integrations.accelerate_train_job import TinyLM
from tests.integrations.lightning_train_job import ATTEMPT, VOCAB, Tokens, faults_of, flip


def main() -> None:
    out, run_dir, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # DeepSpeed's CPU accelerator compiles a shared-memory collective with g++ on first use (minutes on
    # 2 cores); the gloo path it falls back to elsewhere is all a test needs.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": int(os.environ.get("DS_ZERO_STAGE", "0"))}}
    model = TinyLM()

    def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.97 ** step)

    engine, _optimizer, _loader, scheduler = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                                  config=config, lr_scheduler=schedule)
    job, start, _client_state = attach(engine, run_dir=run_dir)  # scout: the one line
    rank = torch.distributed.get_rank()
    sampler = torch.utils.data.DistributedSampler(Tokens(), shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=2, sampler=sampler)
    faults = faults_of(rank)
    save_every = int(os.environ.get("DS_SAVE_STEPS", "1000"))
    step = start
    for ids, index in itertools.islice(loader, start, None):  # the loop's resume: the data position
        step += 1
        for kind, at in faults:
            if step == at:
                print(f"PL-FAULT {kind} rank {rank} step {step}", file=sys.stderr, flush=True)
                if kind == "sdc":
                    engine.module.blocks[1].register_forward_hook(flip)
                elif kind == "hang":
                    asleep_until_named(run_dir, rank, float(os.environ.get("PL_HANG_S", "12")))
        logits = engine(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        if rank == 0:
            with (out / "steps.jsonl").open("a") as log:
                log.write(json.dumps({"step": step, "lr": float(scheduler.get_last_lr()[0]).hex(),
                                      "samples": index.tolist(), "loss": float(loss).hex(), "attempt": ATTEMPT}) + "\n")
        engine.backward(loss)
        engine.step()
        if step % save_every == 0:
            engine.save_checkpoint(str(out / "ckpt"), tag=f"step{step}")
        if step == steps:
            break
    job.close()


if __name__ == "__main__":
    main()
