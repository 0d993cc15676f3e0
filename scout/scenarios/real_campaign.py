"""The real-process part of the fault campaign (``scout campaign``; :mod:`.campaign`).

Each case is one 4-rank job on this machine: processes forked from one forkserver that imported
torch once (``OMP_NUM_THREADS=1``), gloo on CPU, every rank with its own observer process (a
fresh interpreter, :func:`scout.observer.launch.start_observer`) or in-situ replay
(:class:`scout.replay.replay.Replayer`). One fault per job, on a rank and at a step drawn from the
case's seed:

======================  ======================================================================
kind                    injected, and what scout must name
======================  ======================================================================
sleep                   the rank sleeps before its step's all-reduce: observers, ``behind``
SIGSTOP                 the rank stops itself (SIGSTOP) in its compute: observers, ``behind``
SIGKILL                 the rank kills itself (SIGKILL): observers, ``unresponsive`` (*)
bit flip: output        a hidden layer's output has a bit flipped from the step on: replay
bit flip: parameter     one bit of a hidden-layer weight flipped at the step: replay
bit flip: optimizer     one bit of the output head's Adam state flipped at the step: replay
slow compute            every layer of the rank 0.1 s slower: a confirmed compute straggler
slow communication      every replay collective of the rank entered 60 ms late: a confirmed
                        communication straggler
live flip (LAYOUT): ... a fault of the live step only (FAULT-8) under DDP or FSDP2 (a 4 x 1 mesh):
                        bit 12 of one element flipped while the loop is inside ``model(x)``, by
                        a hook on a hidden layer's FFN -- on every call from the step on
                        (``forward``), also through the backward (``forward and backward``), on
                        the first call of each forward only (``one call``), on every element of
                        batch row 0 (``one row``), by the layer's own hook (``block hook``), at
                        the step only (``one step``, a step at which the layer is captured):
                        replay's self-check (SELF-9) names the rank within one cycle
healthy                 observers beside steps with up to 0.5 s jitter, or replay every step:
                        nothing may be named
======================  ======================================================================

A bit-flip job runs the SDC path only (its timing verdicts name no one): on 4 ranks sharing 2 cores
the replay timing of a healthy rank can be skewed for several rounds by other load on the machine,
which is a straggler scout rightly names, but not the injected fault. The slow-compute job runs the
compute timing detector, the slow-communication job the communication one, the healthy replay job
both, all at their defaults.

(*) gloo makes some survivors of a dead peer fail fast (they leave the all-reduce) while others
stay inside it, so their coordinates differ and an honest report is ``inconclusive``; NCCL keeps
every survivor blocked. The SIGKILL case therefore runs its collective as a cross-process barrier
that blocks the survivors as NCCL would (the progress records, observers and their channel are
the real ones); every other case runs torch.distributed over gloo.

Everything is bounded: a job past its deadline is killed (its ranks, their observers) and the
case is counted as it stands. Every process started here dies with its parent
(``PR_SET_PDEATHSIG``), and the harness kills what is left of each job before the next.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import queue
import random
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.observer.progress import record_name
from scout.scenarios.campaign import CaseResult, Outcome, classify

__all__ = ["HEALTHY_KINDS", "REAL_KINDS", "RealCase", "forkserver_context", "real_cases", "run_real_case",
           "run_real_part"]

WORLD: Final = 4
STEP_S: Final = 0.05
HOLD_S: Final = 8.0  # a sleeping rank holds this long: far past the threshold
STUCK_S: Final = 30.0  # a rank whose collective failed stays (bounded) as one blocked on a peer would
COLLECTIVE_TIMEOUT_S: Final = 60.0
#: Faulty jobs: a 2 s threshold, so a loaded 2-core machine does not stall a healthy rank past it.
OBSERVER_CONFIG: Final[dict[str, float]] = dict(
    stall_threshold_s=2.0, settle_idle_s=0.5, round_deadline_s=0.5, recheck_interval_s=1.0,
    join_deadline_s=60.0, attach_deadline_s=60.0,
)
HEALTHY_JITTER_S: Final = 0.5  # healthy observer jobs: steps up to this much slower, under the threshold
JOB_TIMEOUT_S: Final = 90.0
REPORT_SETTLE_S: Final = 0.5  # after the first report, how long to collect further ones
OBSERVER_KINDS: Final = ("sleep", "SIGSTOP", "SIGKILL")
REPLAY_KINDS: Final = ("bit flip: output", "bit flip: parameter", "bit flip: optimizer", "slow compute",
                       "slow communication")
#: FAULT-8's scoped live faults (SELF-9): (where, phase, extent, duration) of each, as
#: examples/train_gpt.py's ``live-flip`` spells them.
LIVE_FAULTS: Final[dict[str, tuple[str, str, str, str]]] = {
    "forward": ("mlp", "forward", "element", "on"),
    "forward and backward": ("mlp", "forward-backward", "element", "on"),
    "one call": ("mlp", "forward", "call", "on"),
    "one row": ("mlp", "forward", "row", "on"),
    "block hook": ("block", "forward", "element", "on"),
    "one step": ("mlp", "forward", "element", "once"),
}
LIVE_LAYOUTS: Final = ("DDP", "FSDP2")
LIVE_KINDS: Final = tuple(f"live flip ({layout}): {name}" for layout in LIVE_LAYOUTS for name in LIVE_FAULTS)
REAL_KINDS: Final = (*OBSERVER_KINDS, *REPLAY_KINDS, *LIVE_KINDS)
HEALTHY_KINDS: Final = ("healthy observers", "healthy replay")
_PR_SET_PDEATHSIG: Final = 1
_SHM_DIR: Final = Path("/dev/shm")


@attrs.frozen
class RealCase:
    kind: str
    rank: int  # the faulty rank (0 for a healthy run, which injects nothing)
    step: int
    seed: int

    @property
    def healthy(self) -> bool:
        return self.kind in HEALTHY_KINDS

    @property
    def reproduce(self) -> str:
        return (f"reproduce with: scout campaign --real-case {self.kind!r} --rank {self.rank} --step {self.step} "
                f"--seed {self.seed}")


def real_cases(*, quick: bool, seed: int) -> list[RealCase]:
    """Quick: each kind once on a rank and step drawn from the seed, and each healthy run once.
    Full: each kind on every rank at two steps (a live flip at one), and each healthy run twice."""
    rng = random.Random(f"real:{seed}")
    cases: list[RealCase] = []
    for kind in REAL_KINDS:
        if quick:
            cases.append(RealCase(kind, rng.randrange(WORLD), rng.choice((3, 4)), rng.getrandbits(32)))
        else:
            steps = (rng.choice((3, 4)),) if kind in LIVE_KINDS else (3, 4)
            cases += [RealCase(kind, rank, step, rng.getrandbits(32)) for rank in range(WORLD) for step in steps]
    for kind in HEALTHY_KINDS:
        cases += [RealCase(kind, 0, 0, rng.getrandbits(32)) for _ in range(1 if quick else 2)]
    return cases


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: this process is killed when its parent (the forkserver) goes away."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def forkserver_context() -> Any:
    """A forkserver that imports torch once; every rank of every job is forked from it."""
    os.environ["OMP_NUM_THREADS"] = "1"
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "scout.observer.instrument", "scout.replay.replay",
                                    "scout.scenarios.real_campaign"])
    return context


# ------------------------------------------------------------------------------------------
# Rank programs (run in processes forked from the forkserver)
# ------------------------------------------------------------------------------------------


def _log_to_file(rank: int, options: dict[str, Any]) -> None:
    """This rank's stdout and stderr (and so its observer's, which inherits them) go to a log in
    the job's directory: the observers' report lines would otherwise interleave with the
    campaign's table; a failing case quotes the log's tail."""
    fd = os.open(os.path.join(options["directory"], f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _start_observer(publisher: Any, rank: int, options: dict[str, Any], control: Any) -> Any:
    from scout.observer.launch import start_observer
    from scout.observer.rendezvous import DirectoryRendezvous

    return start_observer(
        publisher, group_ranks=tuple(range(options["world"])), secret=options["secret"],
        rendezvous=DirectoryRendezvous(options["rendezvous_dir"]), config=options["config"],
        report_path=options["report_path"], on_failure="report",
        on_report=lambda record: control.put(("report", rank, record, time.monotonic())),
    )


def _finish(control: Any) -> None:
    control.close()
    control.join_thread()  # flush the queue before the hard exit
    os._exit(0)  # skip interpreter teardown (gloo threads); everything is already sent


def observer_rank(rank: int, options: dict[str, Any], control: Any) -> None:
    """A gloo rank with an observer: a tiny training loop with instrumented collectives."""
    _die_with_parent()
    try:
        _log_to_file(rank, options)
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from scout.core.observer import Stage
        from scout.observer import instrument as scout_instrument
        from scout.observer.progress import ProgressPublisher, RecordIdentity

        torch.set_num_threads(1)
        world, kind = options["world"], options["kind"]
        dist.init_process_group("gloo", init_method=f"file://{options['init_file']}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        publisher = ProgressPublisher(RecordIdentity(options["job_id"], 0, rank))
        publisher.begin_stage(Stage.CHECKPOINT_READ)  # start-up: a long threshold, as a restoring job
        handle = _start_observer(publisher, rank, options, control)
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
        handle.wait_ready(COLLECTIVE_TIMEOUT_S)
        control.put(("ready", rank, os.getpid(), handle.pid))
        dist.barrier()
        scout_instrument.instrument(publisher)
        scout_instrument.check_at_each_step(handle.check)
        scout_instrument.instrument_module(model)
        publisher.end_stage()
        jitter = random.Random(f"{options['seed']}:{rank}")
        faulty = rank == options["rank"] and kind in OBSERVER_KINDS
        for step in range(1, options["steps"] + 1):
            scout_instrument.mark_step(step)
            model(torch.ones(2, 16)).square().mean().backward()
            time.sleep(STEP_S + (jitter.random() * HEALTHY_JITTER_S if kind == "healthy observers" else 0.0))
            if faulty and step == options["step"]:
                if kind == "sleep":
                    time.sleep(HOLD_S)  # the others block in the all-reduce below
                elif kind == "SIGSTOP":
                    os.kill(os.getpid(), signal.SIGSTOP)  # frozen in its compute, before the all-reduce
            try:
                for parameter in model.parameters():
                    if parameter.grad is not None:
                        dist.all_reduce(parameter.grad)
                        parameter.grad = None
            except RuntimeError:
                time.sleep(STUCK_S)  # a dead peer: stay, as a rank blocked on it would
                break
        scout_instrument.uninstrument()
        time.sleep(0.3)  # let a report reach its callback before the observer is closed
        publisher.close()
        handle.close()
        control.put(("done", rank, None))
    except BaseException as error:  # noqa: BLE001 -- the harness must hear about every failure
        with contextlib.suppress(Exception):
            control.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        _finish(control)


def barrier_rank(rank: int, options: dict[str, Any], barrier: Any, control: Any) -> None:
    """A rank whose collective is a cross-process barrier that blocks the survivors of a dead
    peer as NCCL does (see the module header); progress record and observer are the real ones."""
    _die_with_parent()
    try:
        _log_to_file(rank, options)
        from scout.core.fingerprint import CollectiveCall, fingerprint
        from scout.observer.progress import ProgressPublisher, RecordIdentity

        collective = fingerprint(CollectiveCall("all_reduce"))
        publisher = ProgressPublisher(RecordIdentity(options["job_id"], 0, rank))
        handle = _start_observer(publisher, rank, options, control)
        handle.wait_ready(COLLECTIVE_TIMEOUT_S)
        control.put(("ready", rank, os.getpid(), handle.pid))
        barrier.wait(COLLECTIVE_TIMEOUT_S)
        for step in range(1, options["steps"] + 1):
            publisher.begin_step(step)
            handle.check()
            for _ in range(3):
                time.sleep(STEP_S / 3)
                publisher.advance()
            if rank == options["rank"] and step == options["step"] and options["kind"] == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            publisher.enter_collective(collective)
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(COLLECTIVE_TIMEOUT_S)
            publisher.exit_collective()
        publisher.close()
        handle.close()
        control.put(("done", rank, None))
    except BaseException as error:  # noqa: BLE001
        with contextlib.suppress(Exception):
            control.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        _finish(control)


def _tiny_lm() -> Any:
    """The toy model (:mod:`scout.scenarios.toy`) at the campaign's size, and its vocabulary."""
    from scout.scenarios.toy import TinyLM

    vocab = 64
    return TinyLM(vocab, width=32, heads=4, layers=3), vocab


def live_onset(kind: str, step: int, layer: int, layers: int = 3) -> int:
    """FAULT-8's first struck step: the case's step; a one-step fault moves to the first step
    from there at which its layer is captured (REC-3, hidden interval 1), where the self-check
    can see it (SELF-6)."""
    if not kind.endswith("one step"):
        return step
    return next(s for s in range(step, step + layers) if (s - 1) % layers == layer)


def _layout_of(kind: str) -> str:
    return "FSDP2" if kind.startswith("live flip (FSDP2)") else "DDP"


def replay_rank(rank: int, options: dict[str, Any], control: Any) -> None:
    """A gloo rank training with DDP (or FSDP2 on a 4 x 1 mesh, for the live flips that say so)
    and in-situ replay; the fault of the case on its rank."""
    _die_with_parent()
    try:
        _log_to_file(rank, options)
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel

        from scout.core.recipes import Intervals
        from scout.replay import faults
        from scout.replay.collectives import TorchPeerGroup
        from scout.replay.replay import RecipeModules, ReplayConfig, Replayer

        torch.set_num_threads(1)
        world, kind, fault_step = options["world"], options["kind"], options["step"]
        faulty = rank == options["rank"] and kind in (*REPLAY_KINDS, *LIVE_KINDS)
        dist.init_process_group("gloo", init_method=f"file://{options['init_file']}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        torch.manual_seed(0)
        model, vocab = _tiny_lm()
        if _layout_of(kind) == "FSDP2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
            for block in model.layers:
                fully_shard(block, mesh=mesh)
            ddp = fully_shard(model, mesh=mesh)
            peers = TorchPeerGroup.from_mesh(mesh, ("replicate",), timeout_s=COLLECTIVE_TIMEOUT_S)
        else:
            ddp = DistributedDataParallel(model)
            peers = TorchPeerGroup(timeout_s=COLLECTIVE_TIMEOUT_S)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        from scout.core.verdict import TimingConfig
        from scout.replay.replay import DEFAULT_COMMUNICATION_TIMING

        intervals = Intervals(**options["intervals"])
        # The detectors the job is about (see _TIMING): a timing detector out of scope names no one.
        off = TimingConfig(relative_floor=1e9)
        compute_on = options["timing"] in ("all", "compute")
        communication_on = options["timing"] in ("all", "communication")
        config = ReplayConfig(
            intervals=intervals,
            timing=ReplayConfig().timing if compute_on else off,
            communication_timing=DEFAULT_COMMUNICATION_TIMING if communication_on else off,
        )
        replayer = Replayer(ddp, optimizer, peers, config, RecipeModules.discover(ddp))
        layer = options["layer"]
        if faulty and kind == "slow compute":
            for block in model.layers:
                faults.slow_module(block, 0.1)
        if faulty and kind == "slow communication":
            faults.slow_communication(peers, 0.06)
        live = None  # FAULT-8: entered for the phase it strikes, at the steps it strikes
        where, phase, extent, duration = LIVE_FAULTS[kind.split(": ", 1)[1]] if kind in LIVE_KINDS else ("",) * 4
        if faulty and kind in LIVE_KINDS:
            target = model.layers[layer].mlp[2] if where == "mlp" else model.layers[layer]
            live = faults.LiveFault(target, bit=12, element=5 if extent != "row" else 0,
                                    row=0 if extent == "row" else None, calls=1 if extent == "call" else None)
        named: set[int] = set()
        attributed: list[list[Any]] = []
        confirmed: set[int] = set()
        communication: set[int] = set()
        inconclusive = 0
        errors: list[str] = []
        for step in range(1, options["steps"] + 1):
            if faulty and kind == "bit flip: output" and step == fault_step:
                faults.flip_output_bit(model.layers[layer], element=3, bit=20)
            generator = torch.Generator().manual_seed(1000 * step + rank)
            tokens = torch.randint(0, vocab, (4, 17), generator=generator)
            struck = live is not None and (step == fault_step or (step > fault_step and duration == "on"))
            if struck:
                live.enter()  # type: ignore[union-attr]
            logits = ddp(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            if struck and phase == "forward":
                live.exit()  # type: ignore[union-attr]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if struck and phase == "forward-backward":
                live.exit()  # type: ignore[union-attr]
            optimizer.step()
            report = replayer.after_optimizer_step()
            for result in report.results:
                if result.status.value == "ATTRIBUTED":
                    attributed.append([str(result.recipe), result.step, list(result.outliers), list(result.sources)])
                    named.update(result.outliers)
                elif result.status.value == "INCONCLUSIVE":
                    inconclusive += 1
            # Out of scope means named by no one: a detector "off" (a relative floor no ratio
            # reaches) still feeds its sequential test from its AGREE verdicts (STRAG-2), so its
            # confirmations are not counted either.
            if compute_on:
                confirmed.update(report.confirmed_stragglers)
            if communication_on:
                communication.update(report.confirmed_communication_stragglers)
            errors += list(report.errors)
            if faulty and kind == "bit flip: parameter" and step == fault_step:
                weight = model.layers[layer].mlp[0].weight
                faults.flip_tensor_bit_(weight.data, element=5, bit=25)
            if faulty and kind == "bit flip: optimizer" and step == fault_step:
                faults.flip_tensor_bit_(optimizer.state[model.lm_head.weight]["exp_avg"], element=7, bit=22)
        replayer.close()
        dist.barrier()
        control.put(("done", rank, {"attributed": attributed, "confirmed": sorted(confirmed),
                                    "communication": sorted(communication), "inconclusive": inconclusive,
                                    "errors": errors[:5], "disabled": replayer.disabled_reason}))
    except BaseException as error:  # noqa: BLE001
        with contextlib.suppress(Exception):
            control.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        _finish(control)


# ------------------------------------------------------------------------------------------
# The harness
# ------------------------------------------------------------------------------------------

# Replay cadence per kind: the recipe the fault corrupts is checked every step (or every two).
_INTERVALS: Final[dict[str, dict[str, int]]] = {
    "bit flip: output": {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0},
    "bit flip: parameter": {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0},
    "bit flip: optimizer": {"embedding_steps": 0, "hidden_steps": 0, "output_steps": 0, "optimizer_steps": 1},
    "slow compute": {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0},
    "slow communication": {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0},
    "healthy replay": {"embedding_steps": 3, "hidden_steps": 1, "output_steps": 3, "optimizer_steps": 2},
    **dict.fromkeys(LIVE_KINDS, {"embedding_steps": 0, "hidden_steps": 1, "output_steps": 0, "optimizer_steps": 0}),
}


# Which timing detectors a replay job runs. A bit-flip job is about the SDC path: on 4 ranks
# sharing 2 cores the timing of a healthy rank can be skewed for rounds on end by other load on
# the machine (a real straggler, but not the injected fault), so there the timing verdicts are
# configured never to name anyone. A slow-compute job runs the compute detector, a
# slow-communication job the communication one, and the healthy replay job both, at the defaults.
_TIMING: Final[dict[str, str]] = {"slow compute": "compute", "slow communication": "communication",
                                  "healthy replay": "all"}


def _options(case: RealCase, directory: Path, job_id: str) -> dict[str, Any]:
    kind = case.kind
    # Enough steps for the fault to be checked after it (a hidden layer every step: 3 steps cover
    # all three; slow faults act from step 1 and need straggler_rounds = 3 decided rounds, which a
    # loaded machine can delay with undecided ones), no more.
    layer = random.Random(case.seed).randrange(3)
    step = live_onset(kind, case.step, layer) if kind in LIVE_KINDS else case.step
    # A live flip is named at the first capture of its layer from its onset on: within a cycle.
    steps = {"healthy observers": 12, "healthy replay": 8, "slow compute": 8, "slow communication": 8,
             "bit flip: optimizer": case.step + 2}.get(kind, step + 4)
    return dict(
        kind=kind, rank=case.rank, step=step, seed=case.seed, world=WORLD, steps=steps, job_id=job_id,
        directory=str(directory),
        init_file=str(directory / "init"), secret=secrets.token_bytes(32),
        rendezvous_dir=str(directory / "rendezvous"), report_path=str(directory / "reports.jsonl"),
        config=dict(OBSERVER_CONFIG, stall_threshold_s=3.0) if case.healthy else OBSERVER_CONFIG,
        intervals=_INTERVALS.get(kind, {}), layer=layer,
        timing=_TIMING.get(kind, "none"),
    )


@attrs.define
class _Job:
    log_tail: str = ""
    processes: list[Any] = attrs.field(factory=list)
    observers: list[int] = attrs.field(factory=list)
    reports: list[dict[str, Any]] = attrs.field(factory=list)
    done: dict[int, Any] = attrs.field(factory=dict)
    errors: list[str] = attrs.field(factory=list)


def _collect(control: Any, job: _Job, deadline: float, *, until_report: bool) -> str | None:
    """Control messages until every rank is done (or, for observer jobs, a report plus a short
    settle); returns why it stopped early, or None."""
    first_report: float | None = None
    while len(job.done) < WORLD:
        now = time.monotonic()
        if until_report and first_report is not None and now - first_report >= REPORT_SETTLE_S:
            return None
        if now >= deadline:
            return "the job ran past its deadline"
        try:
            message = control.get(timeout=min(0.25, deadline - now))
        except queue.Empty:
            if job.errors:
                return "a rank failed"
            continue
        kind = message[0]
        if kind == "ready":
            job.observers.append(message[3])
        elif kind == "report":
            job.reports.append(message[2])
            first_report = first_report or time.monotonic()
        elif kind == "done":
            job.done[message[1]] = message[2]
        elif kind == "error":
            job.errors.append(f"rank {message[1]}: {message[2]}")
    return None


def _teardown(job: _Job, job_id: str, directory: Path) -> None:
    started = [process for process in job.processes if process.pid is not None]
    for process in started:
        if process.is_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(process.pid, signal.SIGCONT)  # a stopped rank dies only once continued
            process.kill()
    for process in started:
        process.join(10.0)
    for pid in job.observers:  # parent-death signals would take them with their trainers; at once
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for rank in range(WORLD):
        with contextlib.suppress(FileNotFoundError):
            (_SHM_DIR / record_name(job_id, 0, rank).lstrip("/")).unlink()
    tails = []
    for rank in range(WORLD):
        with contextlib.suppress(OSError):
            lines = (directory / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
            if lines:
                tails.append(f"rank {rank}: {lines[-1][:200]}")
    job.log_tail = " | ".join(tails)
    shutil.rmtree(directory, ignore_errors=True)


def run_real_case(case: RealCase, context: Any, timeout_s: float = JOB_TIMEOUT_S) -> CaseResult:
    """Run one job and classify it (see :func:`scout.scenarios.campaign.classify`)."""
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="scout-campaign-"))
    job_id = f"campaign-{os.getpid()}-{secrets.token_hex(4)}"
    options = _options(case, directory, job_id)
    control = context.Queue(maxsize=1024)
    job = _Job()
    observer_job = case.kind in OBSERVER_KINDS or case.kind == "healthy observers"
    target: Callable[..., None]
    extra: Sequence[Any] = ()
    if case.kind == "SIGKILL":
        target, extra = barrier_rank, (context.Barrier(WORLD),)
    elif observer_job:
        target = observer_rank
    else:
        target = replay_rank
    stopped: str | None = None
    try:
        job.processes = [context.Process(target=target, args=(rank, options, *extra, control), daemon=True)
                         for rank in range(WORLD)]
        for process in job.processes:
            process.start()
        stopped = _collect(control, job, started + timeout_s, until_report=observer_job and not case.healthy)
    finally:
        _teardown(job, job_id, directory)
        with contextlib.suppress(Exception):
            control.close()
    wall_s = time.monotonic() - started
    if observer_job:
        return _classify_observer_job(case, job, stopped, wall_s)
    return _classify_replay_job(case, job, stopped, wall_s)


def _classify_observer_job(case: RealCase, job: _Job, stopped: str | None, wall_s: float) -> CaseResult:
    named = tuple(sorted({rank for record in job.reports for rank in record.get("ranks", [])}))
    expected = {"sleep": "behind", "SIGSTOP": "behind", "SIGKILL": "unresponsive"}.get(case.kind)
    findings = [record.get("evidence", {}).get("finding", record.get("kind")) for record in job.reports]
    ok = bool(job.reports) and named == (case.rank,) and all(f == expected for f in findings) and not job.errors
    if case.healthy:
        ok = not job.reports and not job.errors and stopped is None
    detail = "; ".join([*(f"{f} naming {r.get('ranks')}" for f, r in zip(findings, job.reports, strict=True)),
                        *job.errors, *([stopped] if stopped else [])]) or "no report"
    outcome = classify((case.rank,) if not case.healthy else (), named, ok, bool(job.reports), case.healthy)
    if case.healthy and job.errors:
        outcome = Outcome.FALSE_ALARM
    if not ok and job.log_tail:
        detail += f"; logs: {job.log_tail}"
    return CaseResult("real", case.kind, WORLD, case.seed, outcome, () if case.healthy else (case.rank,), named,
                      f"rank {case.rank} step {case.step}: {detail}", case.reproduce, wall_s, WORLD, case.healthy)


def _classify_replay_job(case: RealCase, job: _Job, stopped: str | None, wall_s: float) -> CaseResult:
    payload = job.done.get(0)
    if payload is None:
        detail = "; ".join([*job.errors, stopped or "rank 0 sent no result", *([job.log_tail] if job.log_tail else [])])
        outcome = Outcome.FALSE_ALARM if case.healthy else Outcome.MISSED
        return CaseResult("real", case.kind, WORLD, case.seed, outcome, () if case.healthy else (case.rank,), (),
                          detail, case.reproduce, wall_s, WORLD, case.healthy)
    attributed = {rank for _, _, outliers, _ in payload["attributed"] for rank in outliers}
    confirmed, communication = set(payload["confirmed"]), set(payload["communication"])
    named = tuple(sorted(attributed | confirmed | communication))
    want = {case.rank}
    if case.kind.startswith("bit flip"):
        ok = attributed == want and not confirmed and not communication
    elif case.kind in LIVE_KINDS:
        # SELF-9: named by its self-check (source live) at its layer's first capture from the
        # onset on, within one cycle (3 hidden layers, interval 1).
        layer = random.Random(case.seed).randrange(3)
        onset = live_onset(case.kind, case.step, layer)
        first = min(((step, recipe, sources) for recipe, step, _, sources in payload["attributed"]), default=None)
        ok = (attributed == want and not confirmed and not communication and first is not None
              and first[1] == f"hidden.{layer}" and "live" in first[2] and onset <= first[0] < onset + 3)
    elif case.kind == "slow compute":
        ok = confirmed == want and not attributed and not communication
    elif case.kind == "slow communication":
        ok = communication == want and not attributed and not confirmed
    else:
        ok = not named and payload["inconclusive"] == 0
    ok = ok and not payload["errors"] and not job.errors and payload["disabled"] is None
    reported = bool(named) or payload["inconclusive"] > 0
    outcome = classify(() if case.healthy else (case.rank,), named, ok, reported, case.healthy)
    detail = (f"rank {case.rank} step {case.step}: attributed {payload['attributed'][:4]}, compute stragglers "
              f"{sorted(confirmed)}, communication stragglers {sorted(communication)}, {payload['inconclusive']} "
              f"inconclusive; errors {payload['errors'][:2] + job.errors[:2]}")
    if not ok and job.log_tail:
        detail += f"; logs: {job.log_tail}"
    return CaseResult("real", case.kind, WORLD, case.seed, outcome, () if case.healthy else (case.rank,), named,
                      detail, case.reproduce, wall_s, WORLD, case.healthy)


def run_real_part(cases: Sequence[RealCase], log: Callable[[str], None] | None = None,
                  timeout_s: float = JOB_TIMEOUT_S) -> list[CaseResult]:
    """Run every case, one job at a time, all forked from one forkserver."""
    say = log or (lambda line: None)
    context = forkserver_context()
    results = []
    started = time.monotonic()
    for index, case in enumerate(cases, start=1):
        result = run_real_case(case, context, timeout_s)
        results.append(result)
        say(f"  real job {index} of {len(cases)}: {case.kind} on rank {case.rank} at step {case.step}: "
            f"{result.outcome.value} ({result.wall_s:.1f} s)")
    say(f"  real-process part: {len(cases)} jobs in {time.monotonic() - started:.0f} s")
    return results
