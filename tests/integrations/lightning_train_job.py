"""A PyTorch Lightning job with scout: a tiny language model (embedding, two blocks of width 64, a
head) on synthetic tokens, 3 ranks on CPU, strategy ddp (tests/integrations/test_lightning.py).
The user's script is plain Lightning code; the one scout line is ``fit(trainer, model, ...,
run_dir=...)`` instead of ``trainer.fit(model, ...)``.

    torchrun --nproc-per-node 3 lightning_train_job.py OUT_DIR RUN_DIR STEPS

Faults (environment ``PL_FAULT``, comma-separated, each ``KIND:RANK:STEP[:ATTEMPT]``, ATTEMPT the
torchrun restart count it applies to, 0 by default): ``sdc`` -- from STEP on, RANK's second block
computes one wrong bit of its output, replays included; ``hang`` -- RANK sleeps until scout names it, at most ``PL_HANG_S``
seconds (default 12) before the forward of STEP. ``PL_SAVE_STEPS``: the ModelCheckpoint's
``every_n_train_steps`` (``step=N.ckpt`` under OUT_DIR/ckpt). Rank 0 appends one JSON line per
optimizer step to ``OUT_DIR/steps.jsonl``: the step, the LR it trains with, the sample indices
of its batch, the loss (as float.hex) and the attempt.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from asleep import asleep_until_named  # beside this script
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn

from scout.integrations.lightning import fit

VOCAB, LENGTH, SAMPLES, WIDTH = 128, 16, 4096, 64
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Tokens(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: tokens drawn from a generator seeded by i; its first token is i % VOCAB."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(index))
        ids[0] = index % VOCAB
        return ids, torch.tensor(index)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(pl.LightningModule):
    def __init__(self, out: Path, faults: list[tuple[str, int]]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)
        self.out, self.faults = out, faults

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, index = batch
        step = self.trainer.global_step + 1
        for kind, at in self.faults:
            if step == at:
                print(f"PL-FAULT {kind} rank {self.global_rank} step {step} at {time.time():.3f}", file=sys.stderr,
                      flush=True)
                if kind == "sdc":
                    self.blocks[1].register_forward_hook(flip)
                elif kind == "hang":
                    asleep_until_named(sys.argv[2], self.global_rank, float(os.environ.get("PL_HANG_S", "12")))
        logits = self(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        if self.global_rank == 0:
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            with (self.out / "steps.jsonl").open("a") as log:
                log.write(json.dumps({"step": step, "lr": float(lr).hex(), "samples": index.tolist(),
                                      "loss": float(loss).hex(), "attempt": ATTEMPT}) + "\n")
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.97 ** step)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(Tokens(), batch_size=2, shuffle=True)


def flip(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    output = output.clone()
    with torch.no_grad():
        output.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)
    return output


def faults_of(rank: int) -> list[tuple[str, int]]:
    found = []
    for spec in filter(None, os.environ.get("PL_FAULT", "").split(",")):
        kind, target, step, *attempt = spec.split(":")
        if int(target) == rank and int(attempt[0] if attempt else 0) == ATTEMPT:
            found.append((kind, int(step)))
    return found


def main() -> None:
    out, run_dir, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    saves = ModelCheckpoint(dirpath=out / "ckpt", filename="{step}", save_top_k=-1,
                            every_n_train_steps=int(os.environ.get("PL_SAVE_STEPS", "1000")))
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp",
                         max_steps=steps, callbacks=[saves], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out)
    model = TinyLM(out, faults_of(int(os.environ["RANK"])))
    fit(trainer, model, run_dir=run_dir)  # scout: the one line


if __name__ == "__main__":
    main()
