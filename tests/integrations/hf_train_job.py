"""A Hugging Face Trainer job with scout: GPT-2 from scratch (2 layers, width 64) on synthetic
tokens, 3 ranks on CPU (tests/integrations/test_huggingface.py). The user's script is plain
Trainer code; the one scout line is ``train(trainer, run_dir=...)`` instead of ``trainer.train()``.

    torchrun --nproc-per-node 3 hf_train_job.py OUT_DIR RUN_DIR STEPS

Faults (environment ``HF_FAULT``, comma-separated, each ``KIND:RANK:STEP[:ATTEMPT]``, ATTEMPT
the torchrun restart count it applies to, 0 by default): ``sdc`` -- from STEP on, RANK's second
block computes one wrong bit of its output, replays included; ``hang`` -- RANK sleeps until scout names it (at most 20 s)
before the forward of STEP. Rank 0 appends one JSON line per optimizer step to
``OUT_DIR/steps.jsonl``: the step, the LR, the first sample index of each of its micro-batches,
the loss (as float.hex) and the attempt.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from asleep import asleep_until_named  # beside this script
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from scout.integrations.huggingface import train

VOCAB, LENGTH, SAMPLES = 128, 16, 4096
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sample i: tokens drawn from a generator seeded by i; its first token is i % VOCAB."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(index))
        ids[0] = index % VOCAB
        return {"input_ids": ids, "labels": ids.clone(), "index": torch.tensor(index)}


class LoggingTrainer(Trainer):  # a user's own Trainer subclass: scout does not care
    seen: list[int] = []

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(int(inputs.pop("index")[0]))
        return super().compute_loss(model, inputs, *args, **kwargs)


class Faults(TrainerCallback):  # the test's fault injector, not part of the user's two lines
    def __init__(self, model: GPT2LMHeadModel, rank: int) -> None:
        self.model, self.rank = model, rank
        self.faults = []
        for spec in filter(None, os.environ.get("HF_FAULT", "").split(",")):
            kind, target, step, *attempt = spec.split(":")
            if int(target) == rank and int(attempt[0] if attempt else 0) == ATTEMPT:
                self.faults.append((kind, int(step)))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step + 1
        for kind, at in self.faults:
            if step != at:
                continue
            print(f"HF-FAULT {kind} rank {self.rank} step {step} at {time.time():.3f}", file=sys.stderr, flush=True)
            if kind == "sdc":
                self.model.transformer.h[1].register_forward_hook(flip)
            elif kind == "hang":
                asleep_until_named(sys.argv[2], self.rank, bound_s=20)  # run_dir: argv[2]


def flip(_module: Any, _inputs: Any, output: Any) -> Any:
    first = output[0] if isinstance(output, tuple) else output
    first = first.clone()
    with torch.no_grad():
        first.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)
    return (first, *output[1:]) if isinstance(output, tuple) else first


class StepLog(TrainerCallback):
    def __init__(self, path: Path, trainer: LoggingTrainer) -> None:
        self.path, self.trainer = path, trainer

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs and "loss" in logs:
            with self.path.open("a") as out:
                out.write(json.dumps({"step": state.global_step, "lr": float(logs["learning_rate"]).hex(),
                                      "samples": self.trainer.seen[-args.gradient_accumulation_steps:],
                                      "loss": float(logs["loss"]).hex(), "attempt": ATTEMPT}) + "\n")


def main() -> None:
    out, run_dir, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=str(out / "hf"), max_steps=steps, per_device_train_batch_size=2, learning_rate=1e-3,
        lr_scheduler_type="linear", warmup_steps=3, logging_steps=1, save_strategy="steps",
        save_steps=int(os.environ.get("HF_SAVE_STEPS", "1000")), report_to=[], use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False, ddp_backend="gloo")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    trainer = LoggingTrainer(model=model, args=args, train_dataset=Tokens())
    rank = args.process_index
    trainer.add_callback(Faults(model, rank))
    trainer.add_callback(StepLog(out / "steps.jsonl", trainer))
    train(trainer, run_dir=run_dir)  # scout: the one line


if __name__ == "__main__":
    main()
