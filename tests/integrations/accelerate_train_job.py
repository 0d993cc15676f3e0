"""A bare Hugging Face Accelerate loop with scout: the tiny language model of
lightning_train_job.py (embedding, two blocks of width 64, a head) on synthetic tokens, 3 ranks on
CPU (tests/integrations/test_accelerate.py). The loop is plain Accelerate code with the usual
resume idiom; the one scout line is ``attach(accelerator, model, optimizer, run_dir=...)`` after
``prepare``, whose step replaces the loop's own choice of a checkpoint to resume from.

    torchrun --nproc-per-node 3 accelerate_train_job.py OUT_DIR RUN_DIR STEPS

Faults: environment ``PL_FAULT`` as in lightning_train_job.py. ``ACC_SAVE_STEPS``: the loop's
own ``accelerator.save_state(OUT_DIR/ckpt/step_N)`` cadence. Rank 0 appends one JSON line per
optimizer step to ``OUT_DIR/steps.jsonl`` (step, LR, sample indices, loss, attempt).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from asleep import asleep_until_named  # beside this script
from torch import nn

from scout.integrations.accelerate import attach
from tests.integrations.lightning_train_job import ATTEMPT, VOCAB, Block, Tokens, faults_of, flip

WIDTH = 64


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


def main() -> None:
    out, run_dir, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(out)))
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.97 ** step)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=2, shuffle=True)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    job, start = attach(accelerator, model, optimizer, run_dir=run_dir)  # scout: the one line
    faults = faults_of(accelerator.process_index)
    save_every = int(os.environ.get("ACC_SAVE_STEPS", "1000"))
    step = start
    for ids, index in accelerator.skip_first_batches(loader, start):  # the loop's resume: the data position
        step += 1
        for kind, at in faults:
            if step == at:
                print(f"PL-FAULT {kind} rank {accelerator.process_index} step {step}", file=sys.stderr, flush=True)
                if kind == "sdc":
                    accelerator.unwrap_model(model).blocks[1].register_forward_hook(flip)
                elif kind == "hang":
                    asleep_until_named(run_dir, accelerator.process_index, float(os.environ.get("PL_HANG_S", "12")))
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        if accelerator.is_main_process:
            with (out / "steps.jsonl").open("a") as log:
                log.write(json.dumps({"step": step, "lr": float(schedule.get_last_lr()[0]).hex(),
                                      "samples": index.tolist(), "loss": float(loss).hex(), "attempt": ATTEMPT}) + "\n")
        accelerator.backward(loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % save_every == 0:
            accelerator.save_state(str(out / "ckpt" / f"step_{step}"))
        if step == steps:
            break
    job.close()


if __name__ == "__main__":
    main()
