"""Phase 2 of ``scout demo``: a real 4-rank replay job with an SDC and a straggler, and the gate.

Four gloo ranks (CPU, ``OMP_NUM_THREADS=1``) are forked from the demo's forkserver (torch is
imported once). Each trains a tiny decoder-only transformer with DDP and in-situ replay
(:mod:`scout.replay`) at a short cadence: one hidden layer every step, the embedding, the output
head and the optimizer slice every ``CYCLE`` steps, so a replay cycle is ``CYCLE`` steps.

* **Straggler.** From the start, rank ``SLOW_RANK``'s transformer blocks take ``SLOW_FACTOR``
  times their own forward time (each forward sleeps ``(factor - 1) x`` what it took): a compute
  straggler, confirmed after ``straggler_rounds`` consecutive slow replay rounds (STRAG-2).
* **SDC.** From the first step of cycle ``SDC_CYCLE``, rank ``SDC_RANK``'s hidden block
  ``SDC_LAYER`` returns its output with one bit flipped (a faulty arithmetic unit, FAULT-1); the
  replay of that block attributes it.

Every rank decides the same results from the same gathered rows; rank 0 sends them to the
parent, which drives the (pure) checkpoint gate with them: a boundary every ``CYCLE`` steps, a
checkpoint captured at every boundary before the SDC cycle, the manifest persisted through
:class:`~scout.gate.recorder.GateRecorder`. Checkpoints are the gate's step ids only (no
bytes are written: the demo shows the trust decisions, not ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import statistics
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import attrs

from scout.demo.hang import control_messages

__all__ = ["ReplayDemoResult", "run_replay_demo"]

WORLD: Final = 4
CYCLE: Final = 4  # steps per replay cycle
CYCLES: Final = 4  # cycles 0..3; the SDC appears in the last one
SDC_CYCLE: Final = 3
SDC_RANK: Final = 2
SDC_LAYER: Final = 1
SLOW_RANK: Final = 1
REPLAY_SLOW_FACTOR: Final = 3.0  # every replay compute of the slow rank, the optimizer's included
SLOW_FACTOR: Final = 12.0  # forward only; measured ~6x on replay compute (noisy 2-core box)
GROUP: Final = "dp"  # the one peer group: the 4 data-parallel replicas
TIMEOUT_S: Final = 120.0

VOCAB, WIDTH, HEADS, LAYERS, SEQUENCE, BATCH = 64, 64, 4, 3, 32, 4


@attrs.frozen
class ReplayDemoResult:
    ok: bool
    results: tuple[dict[str, Any], ...]  # rank 0's replay results, every step
    confirmed: tuple[tuple[int, list[int]], ...]  # (step, peers confirmed as stragglers at it)
    compute_ratio: float | None  # slow rank's median hidden-layer replay compute / the others' median
    manifest_dir: Path | None
    scratch_dir: Path
    wall_s: float
    problems: tuple[str, ...]
    gate_lines: tuple[str, ...] = ()
    gate_state: Any = None


def _model() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm_attention = nn.LayerNorm(WIDTH)
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
            self.projection = nn.Linear(WIDTH, WIDTH)
            self.norm_mlp = nn.LayerNorm(WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
            self.dropout = nn.Dropout(0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, length, _ = x.shape
            q, k, v = self.qkv(self.norm_attention(x)).chunk(3, dim=-1)

            def heads(t: torch.Tensor) -> torch.Tensor:
                return t.view(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2)

            scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(WIDTH // HEADS)
            mask = torch.ones(length, length, dtype=torch.bool).triu(1)
            attention = scores.masked_fill(mask, float("-inf")).softmax(-1)
            mixed = (attention @ heads(v)).transpose(1, 2).reshape(batch, length, WIDTH)
            x = x + self.dropout(self.projection(mixed))
            out: torch.Tensor = x + self.dropout(self.mlp(self.norm_mlp(x)))
            return out

    class TinyLM(nn.Module):
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
            out: torch.Tensor = self.lm_head(self.norm(x))
            return out

    return TinyLM()


def slow_compute(module: Any, factor: float) -> tuple[Any, Any]:
    """Every forward of ``module`` takes ``factor`` times as long: after it, sleep
    ``(factor - 1)`` times what it took (a compute straggler proportional to the work)."""
    started: list[float] = []

    def before(_module: Any, _args: Any) -> None:
        started.append(time.perf_counter())

    def after(_module: Any, _args: Any, _output: Any) -> None:
        if started:
            time.sleep((factor - 1.0) * (time.perf_counter() - started.pop()))

    return module.register_forward_pre_hook(before), module.register_forward_hook(after)


def replay_rank(rank: int, world: int, options: dict[str, Any], control: Any) -> None:
    """One rank of the replay job (forked from the demo's forkserver)."""
    try:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel

        from scout.core.recipes import Intervals
        from scout.replay import faults
        from scout.replay.collectives import TorchPeerGroup
        from scout.replay.replay import RecipeModules, ReplayConfig, Replayer

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{options['init_file']}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=options["collective_timeout_s"]))
        torch.manual_seed(0)
        model = _model()
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        config = ReplayConfig(
            intervals=Intervals(embedding_steps=CYCLE, hidden_steps=1, output_steps=CYCLE, optimizer_steps=CYCLE),
            optimizer_slice_numel=2**22,  # one optimizer slice: one optimizer recipe per cycle
        )
        peers = TorchPeerGroup(timeout_s=options["collective_timeout_s"])
        replayer = Replayer(ddp, optimizer, peers, config, RecipeModules.discover(ddp))
        if rank == SLOW_RANK:
            for module in (model.embed, *model.layers, model.norm, model.lm_head):
                slow_compute(module, SLOW_FACTOR)
            # The optimizer replay runs no module forward; without this its rounds come out clean
            # and reset the K-round confirmation (STRAG-8), so the straggler was sometimes missed.
            faults.slow_compute(replayer, REPLAY_SLOW_FACTOR)
        if rank == 0:
            control.put(("catalog", rank, [str(r) for r in replayer.catalog.recipes()],
                         replayer.schedule.cycle_length_steps()))
        for step in range(1, CYCLE * CYCLES + 1):
            if rank == SDC_RANK and step == SDC_CYCLE * CYCLE + 1:
                faults.flip_output_bit(model.layers[SDC_LAYER], element=3, bit=20)
                control.put(("sdc-on", rank, step))
            generator = torch.Generator().manual_seed(1000 * step + rank)
            tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator)
            logits = ddp(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            report = replayer.after_optimizer_step()
            results = [{"recipe": str(r.recipe), "step": r.step, "status": r.status.value,
                        "outliers": list(r.outliers), "sources": list(r.sources), "reason": r.reason}
                       for r in report.results]
            control.put(("step", rank, step, results, dict(report.compute_ms),
                         sorted(e.peer for e in report.stragglers if type(e).__name__ == "Confirmed"),
                         list(report.errors)))
        replayer.close()
        dist.barrier()
        control.put(("done", rank, replayer.disabled_reason))
    except BaseException:
        control.put(("error", rank, traceback.format_exc()))
    finally:
        control.close()
        control.join_thread()
        os._exit(0)  # skip interpreter teardown (gloo threads); everything is already sent


def _drive_gate(manifest_dir: Path, job_id: str, catalog: list[str],
                results_by_step: dict[int, list[dict[str, Any]]], say: Any) -> tuple[Any, list[str]]:
    """Feed the job-wide results to the gate: a boundary every CYCLE steps, a capture at every
    boundary before the SDC cycle. Returns the final state and the problems found."""
    from scout.gate.model import (
        CheckpointCaptured,
        CycleBoundary,
        GateConfig,
        GateReport,
        GroupVerdict,
        Outcome,
        RecipeVerdicts,
        TrustChange,
    )
    from scout.gate.recorder import GateRecorder
    from scout.gate.step import step as gate_step

    config = GateConfig(job_id, tuple(catalog), (GROUP,))
    recorder, state = GateRecorder.open(manifest_dir, config)
    problems: list[str] = []

    def apply(event: Any) -> None:
        nonlocal state
        state, effects = gate_step(state, event)
        recorder.record(state, effects)
        for effect in effects:
            if isinstance(effect, TrustChange):
                say(f"  gate: checkpoint {effect.checkpoint} {effect.before.value if effect.before else 'new'} -> "
                    f"{effect.after.value} ({effect.reason})")
            elif isinstance(effect, GateReport):
                say(f"  gate: report {getattr(effect.kind, 'value', effect.kind)} in cycle {effect.cycle} at step {effect.step}: "
                    f"recipes {list(effect.recipes)}, groups {list(effect.groups)}")

    try:
        apply(CycleBoundary(0))
        for cycle in range(CYCLES):
            for step in range(cycle * CYCLE + 1, (cycle + 1) * CYCLE + 1):
                for result in results_by_step.get(step, []):
                    outcome = Outcome(result["status"])
                    verdict = GroupVerdict(GROUP, outcome, tuple(result["outliers"]) if outcome is Outcome.ATTRIBUTED
                                           else (), result["reason"] or "" if outcome is Outcome.INCONCLUSIVE else "")
                    apply(RecipeVerdicts(result["recipe"], state.context.cycle, step, (verdict,)))
            boundary = (cycle + 1) * CYCLE
            apply(CycleBoundary(boundary))
            if cycle < SDC_CYCLE:  # a checkpoint at every boundary up to the one opening the SDC cycle
                apply(CheckpointCaptured(boundary))
    finally:
        recorder.close()
    return state, problems


def run_replay_demo(*, context: Any, timeout_s: float = TIMEOUT_S, log: Any = None) -> ReplayDemoResult:
    """Run the replay job and drive the gate with its results; bounded by ``timeout_s``."""
    say = log or (lambda line: None)
    started = time.monotonic()
    deadline = started + timeout_s
    directory = Path(tempfile.mkdtemp(prefix="scout-demo-replay-"))
    options: dict[str, Any] = dict(init_file=str(directory / "init"), collective_timeout_s=max(30.0, timeout_s))
    control = context.Queue(maxsize=1024)
    processes = [context.Process(target=replay_rank, args=(rank, WORLD, options, control)) for rank in range(WORLD)]
    problems: list[str] = []
    results_by_step: dict[int, list[dict[str, Any]]] = {}
    compute: dict[int, list[float]] = {rank: [] for rank in range(WORLD)}
    confirmed: list[tuple[int, list[int]]] = []
    catalog: list[str] = []
    done: set[int] = set()
    say(f"phase 2: starting {WORLD} gloo ranks with DDP and in-situ replay ({CYCLES} cycles of {CYCLE} steps); "
        f"rank {SLOW_RANK}'s blocks run their forward {SLOW_FACTOR:g}x slower from the start, rank {SDC_RANK} flips a bit in "
        f"hidden block {SDC_LAYER}'s output from step {SDC_CYCLE * CYCLE + 1}")
    manifest_dir: Path | None = None
    state = None
    try:
        for process in processes:
            process.start()
        for message in control_messages(control, processes, done, WORLD, deadline, timeout_s, "the replay job",
                                        problems):
            kind, rank = message[0], message[1]
            if kind == "catalog":
                catalog = message[2]
                say(f"  replay catalog {catalog}; cycle length {message[3]} steps")
            elif kind == "sdc-on":
                say(f"  rank {rank}: bit flip injected from step {message[2]}")
            elif kind == "step":
                _, _, step, results, compute_ms, stragglers, errors = message
                compute[rank] += [ms for recipe, ms in compute_ms.items() if recipe.startswith("hidden")]
                problems += [f"rank {rank} step {step}: {error}" for error in errors]
                if rank == 0:
                    results_by_step[step] = results
                    confirmed.append((step, stragglers))
                    for result in results:
                        if result["status"] != "AGREE":
                            say(f"  step {step}: {result['recipe']} {result['status']} outliers {result['outliers']} "
                                f"({', '.join(result['sources']) or result['reason']})")
                    if stragglers:
                        say(f"  step {step}: straggler confirmed: peer(s) {stragglers}")
            elif kind == "error":
                problems.append(f"rank {rank} failed:\n{message[2]}")
            elif kind == "done":
                done.add(rank)
                if message[2] is not None:
                    problems.append(f"rank {rank}: replay disabled: {message[2]}")
    finally:
        for process in processes:
            if process.pid is None:  # never started
                continue
            process.join(max(0.1, min(5.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join(5.0)
        with contextlib.suppress(Exception):
            control.close()
    lines: list[str] = []
    if not problems and catalog:
        manifest_dir = directory / "manifest"
        say("  feeding the replay verdicts to the checkpoint gate (checkpoints are step ids only: no bytes written)")

        def keep_and_say(line: str) -> None:
            lines.append(line)
            say(line)

        state, gate_problems = _drive_gate(manifest_dir, f"demo-{secrets.token_hex(4)}", catalog, results_by_step,
                                           keep_and_say)
        problems += gate_problems
    slow = compute[SLOW_RANK]
    others = [v for rank, values in compute.items() if rank != SLOW_RANK for v in values]
    ratio = statistics.median(slow) / statistics.median(others) if slow and others and statistics.median(others) > 0 \
        else None
    flat = tuple(result for step in sorted(results_by_step) for result in results_by_step[step])
    return ReplayDemoResult(ok=not problems, results=flat, confirmed=tuple(confirmed), compute_ratio=ratio,
                            manifest_dir=manifest_dir, scratch_dir=directory, wall_s=time.monotonic() - started, problems=tuple(problems),
                            gate_lines=tuple(lines), gate_state=state)


def cleanup(result: ReplayDemoResult) -> None:
    """Remove the job's scratch directory (the manifest lives there)."""
    shutil.rmtree(result.scratch_dir, ignore_errors=True)
