"""A Megatron-Core loop with scout: Megatron-Core's GPTModel (2 layers, width 64, the local layer
spec, CPU initialization) on synthetic tokens, 4 ranks on CPU under torch DDP over gloo
(tests/integrations/test_megatron.py). The loop is the user's, as Megatron-Core has none; the one
scout line is ``attach(model, optimizer, run_dir=..., checkpoint_dir=..., state=...)``.

    torchrun --nproc-per-node 4 megatron_train_job.py OUT_DIR RUN_DIR STEPS

Megatron-Core 0.16 assumes CUDA in three places that a CPU run meets; this job (not scout) stands
in for them, in this process only (docs/integrations/megatron.md gives the errors):
``torch.cuda.current_device()`` -- where Megatron-Core places its attention buffer and its
checkpoint's failure flag -- answers ``"cpu"``; ``torch.cuda.synchronize()`` (before a checkpoint
write) does nothing; the model-parallel RNG tracker, which forks the CUDA generator around
dropout, is one whose fork changes nothing (dropout is 0 here).

Faults: environment ``PL_FAULT`` as in lightning_train_job.py. Rank 0 appends one JSON line per
optimizer step to ``OUT_DIR/steps.jsonl`` (step, LR, sample indices, loss, attempt).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from asleep import asleep_until_named  # beside this script

from scout.integrations.megatron import attach
from tests.integrations.lightning_train_job import ATTEMPT, VOCAB, Tokens, faults_of

LENGTH = 16


class CpuRngTracker:
    """Megatron-Core's model-parallel RNG tracker on CPU: nothing to fork (dropout is 0)."""

    def fork(self, name: str = "model-parallel-rng") -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def add(self, name: str, seed: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def get_states(self) -> dict[str, Any]:
        return {}

    def set_states(self, states: dict[str, Any]) -> None:
        pass


def stand_in_for_cuda() -> None:
    from megatron.core.tensor_parallel import random as megatron_random

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    megatron_random._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def flip(_module: Any, _inputs: Any, output: Any) -> Any:
    first = output[0] if isinstance(output, tuple) else output
    first = first.clone()
    with torch.no_grad():
        first.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)
    return (first, *output[1:]) if isinstance(output, tuple) else first


def main() -> None:
    out, run_dir, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    stand_in_for_cuda()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.manual_seed(0)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=2, use_cpu_initialization=True,
                               hidden_dropout=0.0, attention_dropout=0.0, pipeline_dtype=torch.float32)
    gpt = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                   max_sequence_length=LENGTH)
    model = torch.nn.parallel.DistributedDataParallel(gpt)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.97 ** step)
    job, start = attach(model, optimizer, run_dir=run_dir, checkpoint_dir=out / "ckpt",
                        state={"lr": schedule})  # scout: the one line
    rank = dist.get_rank()
    sampler = torch.utils.data.DistributedSampler(Tokens(), shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=2, sampler=sampler)
    faults = faults_of(rank)
    positions = torch.arange(LENGTH - 1).unsqueeze(0).expand(2, -1)
    mask = torch.ones(1, 1, LENGTH - 1, LENGTH - 1, dtype=torch.bool).tril().logical_not()
    step = start
    for ids, index in itertools.islice(loader, start, None):  # the loop's resume: the data position
        step += 1
        for kind, at in faults:
            if step == at:
                print(f"PL-FAULT {kind} rank {rank} step {step}", file=sys.stderr, flush=True)
                if kind == "sdc":
                    gpt.decoder.layers[1].register_forward_hook(flip)
                elif kind == "hang":
                    asleep_until_named(run_dir, rank, float(os.environ.get("PL_HANG_S", "12")))
        loss = model(ids[:, :-1], positions, mask, labels=ids[:, 1:]).mean()
        if rank == 0:
            with (out / "steps.jsonl").open("a") as log:
                log.write(json.dumps({"step": step, "lr": float(schedule.get_last_lr()[0]).hex(),
                                      "samples": index.tolist(), "loss": float(loss).hex(), "attempt": ATTEMPT}) + "\n")
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step == steps:
            break
    job.close()


if __name__ == "__main__":
    main()
