"""The training job of the device-semantics matrix (:mod:`scout.scenarios.device_campaign`).

Run by ``torchrun --nproc-per-node 4 -m scout.scenarios.device_job --run-dir DIR --plan PLAN``:
a small GPT-like model trained on the emulated NCCL backend (:mod:`scout.transport.nccl.emulated`)
with ``scout.attach``, its gradients all-reduced in two buckets the way FSDP2 issues its
reduce-scatters -- from a communication thread (FSDP2's are autograd threads), bucket 1 from
inside backward as soon as its gradients are ready, bucket 0 after backward, both ``async_op`` --
and one sync point per step where the host waits for both (as ``.item()`` or an optimizer
reading the gradients does on a GPU). The training thread issues no collective itself, so every
rank's host coordinate is the same at the sync point whatever went wrong, wherever.

``PLAN`` is a comma-separated list of ``KIND:RANK:STEP`` faults, each held until a report in the
run directory names its rank at its step (:mod:`scout.scenarios.wake`), at most ``--hold-s``
seconds, and then released, so one job runs the whole matrix:

==================  =========================================================================
kind                injected on RANK at STEP
==================  =========================================================================
gpu-hang            after backward a kernel that does not end is queued: the stream never reaches
                    the next collective (``EmulatedProcessGroup.stall_stream``)
launch-withheld     the next collective's kernel is not launched although the stream reached it
host-sleep          the training thread sleeps after backward, before it hands bucket 0 over
thread-sleep        the communication thread sleeps inside backward before it enqueues bucket 1
desync              bucket 0 is enqueued with another shape (same elements) and spins
loop-slow           from STEP on, for ``--loop-slow-steps`` steps, the training thread spends
                    ``--loop-slow-s`` more in every step before it hands bucket 0 over (a slow
                    host-side loop: a loop straggler, LOOP-1..5)
==================  =========================================================================

Each fault prints ``DEVICE-FAULT KIND rank R step S at T`` on stderr when it strikes.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from datetime import timedelta
from functools import partial
from typing import Any, Final

import attrs

__all__ = ["FAULT_KINDS", "Fault", "parse_plan"]

FAULT_KINDS: Final = ("gpu-hang", "launch-withheld", "host-sleep", "thread-sleep", "desync", "loop-slow")
VOCAB, WIDTH, LAYERS, SEQUENCE, BATCH = 64, 32, 3, 16, 8
#: Every rank's host-side time per step (a data loader's, before the forward). Without it a step's
#: loop time (LOOP-1) is the emulated backend's 1-3 ms, whose scheduling noise on 8 processes
#: sharing 2 cores scattered healthy loop ratios over 0.3-2.2 and once confirmed a healthy rank
#: loop-slow (`scout campaign --part device`, seed 0); real steps have host work of their own.
HOST_WORK_S: Final = 0.02
#: The comm thread's bound on one request (a wedged job still ends).
QUEUE_WAIT_S: Final = 120.0


@attrs.frozen
class Fault:
    kind: str
    rank: int
    step: int

    def __attrs_post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown device fault {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        if self.rank < 0 or self.step < 1:
            raise ValueError(f"a device fault needs rank >= 0 and step >= 1, got {self}")

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.rank}:{self.step}"


def parse_plan(text: str) -> tuple[Fault, ...]:
    """``KIND:RANK:STEP,...`` (empty: no fault); at most one fault per step."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, rank, step = item.split(":")
        faults.append(Fault(kind, int(rank), int(step)))
    steps = [f.step for f in faults]
    if len(steps) != len(set(steps)):
        raise ValueError(f"at most one fault per step, got {text!r}")
    return tuple(faults)


def _model() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mixed: torch.Tensor = self.mlp(self.norm(x))
            return x + mixed

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = nn.LayerNorm(WIDTH)
            self.lm_head = nn.Linear(WIDTH, VOCAB)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            logits: torch.Tensor = self.lm_head(self.norm(x))
            return logits

    return Tiny()


class _CommThread:
    """Issues the gradient all-reduces from its own thread, in the order it is handed them (FSDP2's
    backward issues from autograd threads): bucket 1 during backward, bucket 0 after it. The
    training thread gets each ``Work`` back through a bounded queue, in the same order."""

    def __init__(self) -> None:
        self.requests: queue.Queue[tuple[Any, Any, Any] | None] = queue.Queue(maxsize=4)
        self.works: queue.Queue[Any] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._run, name="device-job-comm", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import torch.distributed as dist

        while True:
            request = self.requests.get(timeout=QUEUE_WAIT_S)
            if request is None:
                return
            tensor, asleep, before = request
            if asleep is not None:
                asleep()
            if before is not None:
                before()
            self.works.put(dist.all_reduce(tensor, async_op=True), timeout=QUEUE_WAIT_S)

    def issue(self, tensor: Any, *, asleep: Any = None, before: Any = None) -> None:
        self.requests.put((tensor, asleep, before), timeout=QUEUE_WAIT_S)

    def close(self) -> None:
        self.requests.put(None, timeout=QUEUE_WAIT_S)
        self.thread.join(QUEUE_WAIT_S)


def _announce(fault: Fault) -> None:
    print(f"DEVICE-FAULT {fault.kind} rank {fault.rank} step {fault.step} at {time.time():.3f}", file=sys.stderr,
          flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--plan", default="")
    parser.add_argument("--hold-s", type=float, default=6.0)
    parser.add_argument("--loop-slow-steps", type=int, default=24)
    parser.add_argument("--loop-slow-s", type=float, default=0.15)
    parser.add_argument("--host-work-s", type=float, default=HOST_WORK_S)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import scout
    from scout.reports.kinds import ReportKind
    from scout.scenarios.wake import release_when_named, wait_until_named
    from scout.transport.nccl import emulated

    torch.set_num_threads(1)
    emulated.register()
    dist.init_process_group(emulated.BACKEND, timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    faults = {f.step: f for f in parse_plan(args.plan) if f.rank == rank}
    slow_steps = {step for f in faults.values() if f.kind == "loop-slow"
                  for step in range(f.step, f.step + args.loop_slow_steps)}
    group = emulated.emulated_group()
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = scout.attach(model, optimizer, run_dir=args.run_dir)
    start = job.restore()
    parameters = [p for p in model.parameters() if p.requires_grad]
    half = len(parameters) // 2
    buckets = (parameters[:half], parameters[half:])
    comm = _CommThread()
    world = dist.get_world_size()
    # Bucket 1 (the later layers, whose gradients backward computes first) is handed to the
    # communication thread from inside backward, once its last gradient accumulated.
    state: dict[str, Any] = {"ready": 0, "flat1": None, "asleep": None}
    named_kinds = (ReportKind.HANG, ReportKind.DESYNC)

    def asleep(step: int) -> None:  # a held host thread, awake once named
        wait_until_named(args.run_dir, rank, args.hold_s, kinds=named_kinds, step=step)

    def held(fault: Any, step: int) -> None:  # a held stream, released once named
        release_when_named(fault.release, args.run_dir, rank, args.hold_s, kinds=named_kinds, step=step)

    def withheld_completion(step: int) -> None:  # desync: bucket 0's kernel spins until named
        held(group.withhold_completion(args.hold_s), step)

    def accumulated(_parameter: torch.Tensor) -> None:
        state["ready"] += 1
        if state["ready"] == len(buckets[1]):
            flat = torch.cat([p.grad.reshape(-1) for p in buckets[1]]).div_(world)
            state["flat1"] = flat
            comm.issue(flat, asleep=state["asleep"])

    for parameter in buckets[1]:
        parameter.register_post_accumulate_grad_hook(accumulated)
    for step in range(start + 1, args.steps + 1):
        fault = faults.get(step)
        state.update(ready=0, flat1=None, asleep=partial(asleep, step)
                     if fault is not None and fault.kind == "thread-sleep" else None)
        if fault is not None:
            _announce(fault)
        time.sleep(args.host_work_s)  # the batch's host-side time (a data loader's), on every rank
        generator = torch.Generator().manual_seed(1_000_003 * step + rank)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        flat0 = torch.cat([p.grad.reshape(-1) for p in buckets[0]]).div_(world)
        before = None
        if fault is not None and fault.kind == "gpu-hang":
            held(group.stall_stream(args.hold_s), step)
        elif fault is not None and fault.kind == "launch-withheld":
            held(group.withhold_launch(args.hold_s), step)
        elif fault is not None and fault.kind == "host-sleep":
            asleep(step)
        elif fault is not None and fault.kind == "desync":
            before = partial(withheld_completion, step)  # right before bucket 0
        if step in slow_steps:
            time.sleep(args.loop_slow_s)
        # The same elements in another shape is another collective: another fingerprint.
        comm.issue(flat0.view(2, -1) if fault is not None and fault.kind == "desync" else flat0, before=before)
        # The sync point: the host reads the reduced gradients.
        works = [comm.works.get(timeout=QUEUE_WAIT_S) for _ in buckets]
        for work in works:
            work.wait()
        for bucket, flat in zip(buckets, (flat0, state["flat1"]), strict=True):
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        job.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    comm.close()
    job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
