"""A small GPT trained with DDP and checkpointed with DCP, with scout attached: the five lines
marked ``# scout`` are all it takes (README, "scout on your training job").

    torchrun --nproc-per-node 4 examples/train_gpt.py --run-dir runs/gpt --checkpoint-dir ckpt/gpt

Faults, injected the way they happen in life, for the demo and the tests (``--fault`` or the
environment variable EXAMPLE_FAULT, several separated by commas; only in the first attempt --
neither a torchrun restart nor a Slurm requeue -- so a restart runs clean):

- ``sdc:RANK:STEP``             from STEP on, RANK's second block computes one wrong bit in its
                                output -- every time it runs, replays included (a faulty unit);
- ``flip:RANK:STEP``            at STEP only, RANK's second block computes one wrong bit in its
                                live output (a transient fault: a forward hook for one step);
- ``live-flip:RANK:STEP[:WHERE[:PHASE[:EXTENT[:DURATION]]]]``  a fault of the live step only (a
                                unit that fails under the forward's power or heat; spec/replay.md
                                FAULT-8): bit 12 of one output element of RANK's second block's
                                FFN (WHERE ``mlp``; ``block``: the block's own output; a digit
                                after either picks another block) flips while the loop is inside
                                ``model(x)`` (PHASE ``forward``; ``forward-backward``: through
                                ``loss.backward()``), on every call (EXTENT ``element``; ``call``:
                                the first call of each forward only; ``row``: every element of
                                batch row 0), from STEP on (DURATION ``on``; ``once``: at STEP only);
- ``param-flip:RANK:STEP``      before STEP, one bit of a weight of RANK's second block flips (a
                                memory fault between steps);
- ``state-flip:RANK:STEP``      before STEP, one bit of that weight's AdamW state ``exp_avg`` flips;
- ``hang-before-forward:RANK:STEP:SECONDS``   RANK sleeps before its forward (so before DDP's
                                buffer broadcast: the causal mask is a registered buffer);
- ``hang-before-backward:RANK:STEP:SECONDS``  RANK sleeps between forward and backward;
- ``hang-in-backward:RANK:STEP:SECONDS``      RANK sleeps inside backward (a block's gradient);
- ``freeze:RANK:STEP:SECONDS``  RANK's process is stopped (SIGSTOP) before backward, and continued
                                SECONDS later (a frozen process: swapped out, stuck in the kernel);
- ``...:until-named`` after any of the four hangs above: RANK wakes (or is continued) once a
                                ``hang`` report in the run directory names it, at most SECONDS
                                later -- so that a test does not wait past its evidence;
- ``slow:RANK:FACTOR[:HOW]``    every torch operation of RANK takes FACTOR times as long (a slow
                                device, throttled or degraded): it computes the extra time (HOW
                                ``spin``, the default) or waits for it (HOW ``sleep``: a device
                                that answers late, a throttled rank);
- ``loop-slow:RANK:FACTOR``     RANK's host-side loop work takes FACTOR times the step (a slow
                                data path);
- ``raise:RANK:STEP``           RANK (-1: every rank) raises an exception of the training loop
                                before backward;
- ``slow-exit:RANK:SECONDS``    RANK's (-1: every rank's) exit takes SECONDS, however it leaves
                                (an exit handler of the user's that tears down slowly);
- ``slow-forward:RANK:FACTOR:HOW``  every block's forward on RANK takes FACTOR times as long: a
                                forward hook waits FACTOR - 1 times the block's own forward time,
                                by sleeping (HOW ``sleep``: a descheduled or waiting rank, a noisy
                                neighbour) or by spinning (HOW ``spin``: a slow or throttled core);
- ``slow-loop:RANK:FACTOR:HOW``  after its forward, RANK's loop waits FACTOR - 1 times the
                                forward's time, outside any module (sleeping or spinning, as above);
- ``gpu-hang:RANK:STEP:SECONDS``  RANK's GPU runs a kernel that spins for SECONDS before the
                                forward of STEP (a kernel that does not end); its CPU goes on
                                until it has to wait for the GPU (CUDA only).

And one that is not a fault, for healthy runs (bench/evaluate.py counts false alarms with it):

- ``jitter:SECONDS:SEED``       every rank's step starts up to SECONDS late, at random (drawn from
                                SEED, the rank and the step): the noise of a shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import scout  # scout
import scout.replay.faults  # the faults below only

VOCAB, WIDTH, HEADS, LAYERS, SEQUENCE, BATCH = 256, 64, 4, 4, 32, 8


class Block(nn.Module):
    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.width, self.heads = width, heads
        self.norm_attention = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)
        self.norm_mlp = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        # The causal mask is a buffer, as in most real models: DDP (broadcast_buffers=True, its
        # default) then broadcasts the buffers from rank 0 at every forward, from C++.
        self.register_buffer("mask", torch.ones(SEQUENCE, SEQUENCE, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm_attention(x)).chunk(3, dim=-1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

        scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(width // self.heads)
        mask = self.mask[:length, :length]
        mixed = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ heads(v)).transpose(1, 2)
        x = x + self.projection(mixed.reshape(batch, length, width))
        return x + self.mlp(self.norm_mlp(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = VOCAB, width: int = WIDTH, layers: int = LAYERS, heads: int = HEADS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def batch(step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1_000_003 * step + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator)


class Batches:
    """The training data: a stream of this rank's batches whose position is training state, like
    a stateful data loader's -- registered with scout.attach(state=...), so that a restored run
    reads the batch after the checkpoint's, not the stream's first."""

    def __init__(self, rank: int) -> None:
        self.rank, self.position = rank, 0

    def __next__(self) -> torch.Tensor:
        self.position += 1
        return batch(self.position, self.rank)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


class FaultSet:
    """Several injected faults, each told of every point of the step."""

    def __init__(self, specs: str, rank: int, model: GPT, optimizer: torch.optim.Optimizer | None = None,
                 run_dir: str | None = None) -> None:
        self.faults = [Faults(spec.strip(), rank, model, optimizer, run_dir) for spec in specs.split(",") if spec.strip()]

    def before_forward(self, step: int) -> None:
        for fault in self.faults:
            fault.before_forward(step)

    def before_backward(self, step: int) -> None:
        for fault in self.faults:
            fault.before_backward(step)

    def loop(self, step_s: float) -> None:
        for fault in self.faults:
            fault.loop(step_s)

    def after_forward(self, forward_s: float) -> None:
        for fault in self.faults:
            fault.after_forward(forward_s)

    def after_backward(self, step: int) -> None:
        for fault in self.faults:
            fault.after_backward(step)


#: freeze's watcher with until-named: RUN_DIR RANK SECONDS PID (a process of its own: the frozen
#: one cannot watch).
CONTINUE_WHEN_NAMED = ("import os, signal, sys\n"
                       "from scout.reports.kinds import ReportKind\n"
                       "from scout.scenarios.wake import wait_until_named\n"
                       "wait_until_named(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), kinds=(ReportKind.HANG,))\n"
                       "os.kill(int(sys.argv[4]), signal.SIGCONT)\n")
HANGS = ("hang-before-forward", "hang-before-backward", "hang-in-backward", "freeze")


class Faults:
    """The injected fault (see the module docstring)."""

    def __init__(self, spec: str, rank: int, model: GPT, optimizer: torch.optim.Optimizer | None = None,
                 run_dir: str | None = None) -> None:
        self.kind, *fields = spec.split(":") if spec else ("none",)
        self.until_named = bool(fields) and fields[-1] == "until-named" and self.kind in HANGS
        if self.until_named:
            fields.pop()
            if run_dir is None:
                raise SystemExit(f"--fault {spec}: until-named needs the run directory scout writes to")
        self.run_dir = run_dir
        if self.kind == "live-flip":  # words after RANK:STEP (FAULT-8)
            fields, self.options = fields[:2], fields[2:]
        self.rank = rank
        self.model = model
        self.optimizer = optimizer
        self.active = (bool(spec) and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
                       and int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0)
        self.exit_slowed = False
        self.forward_s = 0.0
        self.how = (fields.pop() if self.kind in ("slow-forward", "slow-loop", "slow") and len(fields) == 3
                    else "spin" if self.kind == "slow" else "sleep")
        if self.how not in ("sleep", "spin"):
            raise SystemExit(f"--fault {spec}: HOW must be sleep or spin, got {self.how!r}")
        if self.kind == "jitter":  # every rank, and not a fault: no target
            self.target, self.values = -1, [float(f) for f in fields]
            self.mine = self.active
        else:
            self.target = int(fields[0]) if fields else -1
            self.values = [float(f) for f in fields[1:]]
            self.mine = self.active and (rank == self.target
                                         or (self.kind in ("raise", "slow-exit") and self.target == -1))
        if self.mine and self.kind == "slow":
            self._slow_device(self.values[0], self.how)
        if self.mine and self.kind == "slow-forward":
            for block in model.layers:
                self._slow_forward(block, self.values[0])
        self.live: scout.replay.faults.LiveFault | None = None
        if self.kind == "live-flip":
            self._live_fault(spec, model)

    def _live_fault(self, spec: str, model: GPT) -> None:
        """FAULT-8 on this rank: a LiveFault entered for the phase it strikes."""
        where, self.phase, extent, self.duration = [*self.options, *("mlp", "forward", "element", "on")[len(self.options):]]
        block = int(where[-1]) if where[-1:].isdigit() else 1
        kind = where.rstrip("0123456789")
        if (len(self.options) > 4 or kind not in ("mlp", "block") or self.phase not in ("forward", "forward-backward")
                or extent not in ("element", "call", "row") or self.duration not in ("on", "once")
                or not 0 <= block < len(model.layers)):
            raise SystemExit(f"--fault {spec}: expected live-flip:RANK:STEP[:mlp|block[N][:forward|forward-backward"
                             f"[:element|call|row[:on|once]]]] with N < {len(model.layers)}")
        if self.mine:
            module = model.layers[block].mlp[2] if kind == "mlp" else model.layers[block]
            self.live = scout.replay.faults.LiveFault(module, bit=12, element=5 if extent != "row" else 0,
                                                      row=0 if extent == "row" else None,
                                                      calls=1 if extent == "call" else None)
        self.entered = False

    def _live_enter(self, step: int) -> None:
        first = int(self.values[0])
        if self.live is not None and (step == first or (step > first and self.duration == "on")):
            if step == first:
                self.announce(step)
            self.live.enter()
            self.entered = True

    def _live_exit(self) -> None:
        if self.entered and self.live is not None:
            self.live.exit()
            self.entered = False

    def wait(self, seconds: float) -> None:
        """Lose ``seconds`` of wall time: asleep, or busy on this core."""
        if self.how == "sleep":
            time.sleep(seconds)
            return
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    def _slow_forward(self, block: nn.Module, factor: float) -> None:
        started: list[float] = []

        def before(_module: nn.Module, _inputs: object) -> None:
            started.append(time.perf_counter())

        def after(_module: nn.Module, _inputs: object, _output: object) -> None:
            if started:
                self.wait((factor - 1.0) * (time.perf_counter() - started.pop()))

        block.register_forward_pre_hook(before)
        block.register_forward_hook(after)

    def _slow_device(self, factor: float, how: str) -> None:
        from torch.overrides import TorchFunctionMode

        owed = [0.0]  # sleep: seconds owed; slept once there is half a millisecond of it

        class Slow(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                started = time.thread_time()
                result = func(*args, **(kwargs or {}))
                extra = (factor - 1.0) * (time.thread_time() - started)
                if how == "sleep":  # a device that answers late: the time passes, not the CPU's
                    owed[0] += extra
                    if owed[0] >= 5e-4:
                        began = time.perf_counter()
                        time.sleep(owed[0])
                        owed[0] -= time.perf_counter() - began
                    return result
                # A slow device computes longer: spin on this thread's CPU clock.
                until = time.thread_time() + extra
                while time.thread_time() < until:
                    pass
                return result

        Slow().__enter__()  # for the life of the process: every op of this rank

    def before_forward(self, step: int) -> None:
        if self.kind == "live-flip":
            self._live_enter(step)
        if self.mine and self.kind == "jitter":
            seconds, seed = self.values
            time.sleep(random.Random(f"{seed:g}:{self.rank}:{step}").uniform(0.0, seconds))
        if self.mine and self.kind == "gpu-hang" and step == int(self.values[0]):
            self.announce(step)
            torch.cuda._sleep(self._cycles(self.values[1]))
        if self.mine and self.kind == "hang-before-forward" and step == int(self.values[0]):
            self.announce(step)
            self.hold(self.values[1])
        if self.mine and self.kind == "sdc" and step == int(self.values[0]):
            self.announce(step)
            self.model.layers[1].register_forward_hook(self.flip)  # for good
        if self.mine and self.kind == "flip" and step == int(self.values[0]):
            self.announce(step)
            self._handle = self.model.layers[1].register_forward_hook(self.flip)
        if self.mine and self.kind in ("param-flip", "state-flip") and step == int(self.values[0]):
            self.announce(step)
            target = self.model.layers[1].mlp[0].weight
            if self.kind == "state-flip":
                assert self.optimizer is not None, "state-flip needs the optimizer"
                target = self.optimizer.state[target]["exp_avg"]
            self.flip_bit(target)
        if self.mine and self.kind == "hang-in-backward" and step == int(self.values[0]):
            seconds = self.values[1]

            def slow_gradient(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
                def sleep(gradient: torch.Tensor) -> torch.Tensor:
                    self.announce(step)
                    self.hold(seconds)
                    return gradient

                output.register_hook(sleep)

            self._handle = self.model.layers[2].register_forward_hook(slow_gradient)

    @staticmethod
    def flip_bit(tensor: torch.Tensor) -> None:
        """One wrong bit in the first element of ``tensor``, in place."""
        with torch.no_grad():
            tensor.detach().view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)

    @staticmethod
    def flip(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        """One wrong bit in the first element of a block's output."""
        output = output.clone()
        Faults.flip_bit(output)
        return output

    @staticmethod
    def _cycles(seconds: float) -> int:
        """GPU clock cycles in ``seconds``, measured on a short spin (the clock varies by GPU)."""
        probe = 10_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
        return int(seconds * probe / (start.elapsed_time(end) / 1e3))

    def hold(self, seconds: float) -> None:
        """A hang's sleep: ``seconds``, or until-named (at most ``seconds``)."""
        if not self.until_named:
            time.sleep(seconds)
            return
        from scout.reports.kinds import ReportKind
        from scout.scenarios.wake import wait_until_named

        wait_until_named(str(self.run_dir), self.rank, seconds, kinds=(ReportKind.HANG,))

    def announce(self, step: int) -> None:
        """One line on stderr when the fault strikes (the tests time detection from it)."""
        print(f"EXAMPLE-FAULT {self.kind} rank {self.rank} step {step} at {time.time():.3f}", file=sys.stderr, flush=True)

    def before_backward(self, step: int) -> None:
        if self.mine and self.kind == "slow-exit" and not self.exit_slowed:
            import atexit

            # Registered after scout.attach, so it runs before scout's: exit handlers run last-in first.
            atexit.register(time.sleep, self.values[0])
            self.exit_slowed = True
        if self.mine and self.kind == "raise" and step == int(self.values[0]):
            self.announce(step)
            raise RuntimeError(f"EXAMPLE-FAULT raise: the training loop of rank {self.rank} failed at step {step}")
        if self.mine and self.kind == "hang-before-backward" and step == int(self.values[0]):
            self.announce(step)
            self.hold(self.values[1])
        if self.mine and self.kind == "freeze" and step == int(self.values[0]):
            import signal
            import subprocess

            self.announce(step)
            if self.until_named:  # a watcher that continues this process once it is named
                subprocess.Popen([sys.executable, "-c", CONTINUE_WHEN_NAMED, str(self.run_dir), str(self.rank),
                                  str(self.values[1]), str(os.getpid())])
            else:
                subprocess.Popen(["sh", "-c", f"sleep {self.values[1]}; kill -CONT {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.mine and self.kind in ("hang-in-backward", "flip") and step == int(self.values[0]):
            self._handle.remove()

    def loop(self, step_s: float) -> None:
        if self.mine and self.kind == "loop-slow":
            time.sleep((self.values[0] - 1.0) * step_s)

    def after_forward(self, forward_s: float) -> None:
        if self.kind == "live-flip" and self.phase == "forward":
            self._live_exit()
        if self.mine and self.kind == "slow-loop":
            self.wait((self.values[0] - 1.0) * forward_s)

    def after_backward(self, step: int) -> None:
        if self.kind == "live-flip":
            self._live_exit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--run-dir", default="runs/gpt")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--fault", default=os.environ.get("EXAMPLE_FAULT", ""))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--step-log", default=None, help="rank 0 appends a JSON line per step: step, lr, data position, "
                                                   "loss (exactly, as float.hex)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.device == "cuda":
        # Replay runs under deterministic algorithms; cuBLAS needs this before CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # NCCL needs a GPU of its own per rank; ranks that share GPUs use gloo (on CUDA tensors).
    one_gpu_each = int(os.environ.get("WORLD_SIZE", "1")) <= torch.cuda.device_count()
    dist.init_process_group("nccl" if args.device == "cuda" and one_gpu_each else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = GPT().to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    # The LR decays linearly to a tenth over 1000 steps; the data stream keeps its position.
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=1000)
    batches = Batches(rank)
    faults = FaultSet(args.fault, rank, model, optimizer, run_dir=args.run_dir)
    job = scout.attach(ddp, optimizer, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir,  # scout
                       state={"lr": scheduler, "data": batches})
    start = job.restore()  # scout
    for step in range(start + 1, args.steps + 1):
        began = time.perf_counter()
        lr = scheduler.get_last_lr()[0]
        tokens = next(batches).to(device)
        faults.before_forward(step)
        forward_began = time.perf_counter()
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        faults.after_forward(time.perf_counter() - forward_began)
        faults.before_backward(step)
        loss.backward()
        faults.after_backward(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        faults.loop(time.perf_counter() - began)
        job.step()  # scout
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0 and args.step_log:
            with open(args.step_log, "a", encoding="utf-8") as log:
                log.write(json.dumps({"step": step, "lr": lr.hex(), "position": batches.position,
                                      "loss": loss.item().hex(), "attempt": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")}) + "\n")
    job.close()  # scout
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
