"""The demo job behind ``scout demo``: a real multi-process training job on CPU with a hang.

Four torch.distributed ranks (gloo, CPU, ``OMP_NUM_THREADS=1``) are forked from a forkserver
that imported torch once. Each trains a tiny model, with instrumented collectives and one
spawned observer. At step ``HANG_STEP`` rank ``HANG_RANK`` sleeps ``HOLD_S`` before its
all-reduce, so the other ranks block inside it. The observers notice, agree, and one surviving
peer emits the report. Everything is bounded by ``timeout_s``: past it every rank is killed
(their observers follow within a poll) and the demo fails. Shared-memory records left by a
killed rank are removed at the end.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import attrs

from scout.observer.progress import record_name

__all__ = ["DemoResult", "run_demo"]

WORLD: Final = 4
HANG_RANK: Final = 2
HANG_STEP: Final = 3
STEPS: Final = 5
HOLD_S: Final = 4.0
STEP_S: Final = 0.05
CONFIG: Final[dict[str, float]] = dict(
    stall_threshold_s=1.0, settle_idle_s=0.5, round_deadline_s=0.5, recheck_interval_s=1.0,
    join_deadline_s=60.0, attach_deadline_s=60.0,
)
TIMEOUT_S: Final = 90.0
_SHM_DIR: Final = Path("/dev/shm")


@attrs.frozen
class DemoResult:
    ok: bool
    report: dict[str, Any] | None
    hang_started_s: float | None  # monotonic, in the hanging rank
    report_seen_s: float | None  # monotonic, when the reporter's trainer got it
    wall_s: float
    leftover_segments: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def detection_latency_s(self) -> float | None:
        """Report time minus stall start minus threshold (the benchmark's definition)."""
        if self.hang_started_s is None or self.report_seen_s is None:
            return None
        return self.report_seen_s - self.hang_started_s - CONFIG["stall_threshold_s"]


def demo_rank(rank: int, world: int, job_id: str, options: dict[str, Any], control: Any) -> None:
    """One rank of the demo job (runs in a process forked from the torch forkserver)."""
    import torch
    import torch.distributed as dist

    from scout.core.observer import Stage
    from scout.observer import instrument as scout
    from scout.observer.launch import start_observer
    from scout.observer.progress import ProgressPublisher, RecordIdentity
    from scout.observer.rendezvous import DirectoryRendezvous

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{options['init_file']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=options["collective_timeout_s"]))
    publisher = ProgressPublisher(RecordIdentity(job_id, 0, rank))
    # Start-up (observers joining, the first barrier) is published as a checkpoint-read stage,
    # as a job restoring its state would: that stage's threshold is long, so a slow start on a
    # loaded machine is not mistaken for a hang.
    publisher.begin_stage(Stage.CHECKPOINT_READ)
    handle = start_observer(
        publisher, group_ranks=tuple(range(world)), secret=options["secret"],
        rendezvous=DirectoryRendezvous(options["rendezvous_dir"]), config=options["config"], report_path=options["report_path"],
        on_report=lambda record: control.put(("report", rank, record, time.monotonic())), on_failure="report",
    )
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    handle.wait_ready(options["collective_timeout_s"])
    control.put(("ready", rank, os.getpid(), handle.pid))
    dist.barrier()  # every rank and observer is up; not instrumented yet
    scout.instrument(publisher)
    scout.check_at_each_step(handle.check)
    scout.instrument_module(model)
    publisher.end_stage()
    for step in range(1, options["steps"] + 1):
        scout.mark_step(step)
        loss = model(torch.ones(2, 16)).square().mean()
        loss.backward()
        time.sleep(STEP_S)
        if rank == options["hang_rank"] and step == options["hang_step"]:
            control.put(("hanging", rank, time.monotonic()))
            time.sleep(options["hold_s"])  # the injected hang: the others block in the all-reduce
        for parameter in model.parameters():
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
        optimizer.step()
        optimizer.zero_grad()
    scout.uninstrument()
    # The report reaches the reporter's callback through a queue: let it arrive before closing.
    time.sleep(0.3)
    publisher.close()
    handle.close()
    dist.barrier()
    dist.destroy_process_group()
    control.put(("done", rank, None, time.monotonic()))
    control.close()
    control.join_thread()


def control_messages(control: Any, processes: list[Any], done: set[int], world: int, deadline: float,
                     timeout_s: float, what: str, problems: list[str]) -> Iterator[Any]:
    """The ranks' control messages until ``done`` holds every rank, bounded by ``deadline``.

    Stops early, with the reason appended to ``problems``, at the deadline or when a rank
    process exits abnormally; polls in slices of at most 0.5 s so neither goes unnoticed.
    """
    while len(done) < world:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            problems.append(f"{what} did not finish within {timeout_s} s (ranks done: {sorted(done)})")
            return
        try:
            message = control.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            dead = [p.name for p in processes if p.exitcode not in (None, 0)]
            if dead:
                problems.append(f"rank processes exited abnormally: {dead}")
                return
            continue
        yield message


def _forkserver() -> Any:
    os.environ["OMP_NUM_THREADS"] = "1"
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "scout.observer.instrument", "scout.demo.hang",
                                       "scout.demo.replay", "scout.replay"])
    return context


def _segments(job_id: str, world: int) -> list[Path]:
    return [_SHM_DIR / record_name(job_id, 0, rank).lstrip("/") for rank in range(world)]


def run_demo(*, timeout_s: float = TIMEOUT_S, hold_s: float = HOLD_S, steps: int = STEPS,
             log: Any = None) -> DemoResult:
    """Run the demo job; bounded by ``timeout_s``. ``log(line)`` gets progress lines."""
    say = log or (lambda line: None)
    started = time.monotonic()
    deadline = started + timeout_s
    directory = Path(tempfile.mkdtemp(prefix="scout-demo-"))
    job_id = f"demo-{os.getpid()}-{secrets.token_hex(4)}"
    options: dict[str, Any] = dict(
        init_file=str(directory / "init"), secret=secrets.token_bytes(32),
        rendezvous_dir=str(directory / "rendezvous"), report_path=str(directory / "reports.jsonl"),
        config=CONFIG, steps=steps, hang_rank=HANG_RANK, hang_step=HANG_STEP, hold_s=hold_s,
        collective_timeout_s=max(10.0, timeout_s),
    )
    context = _forkserver()
    control = context.Queue(maxsize=256)
    processes = [context.Process(target=demo_rank, args=(rank, WORLD, job_id, options, control))
                 for rank in range(WORLD)]
    problems: list[str] = []
    report: dict[str, Any] | None = None
    report_seen: float | None = None
    hang_started: float | None = None
    done: set[int] = set()
    ready: dict[int, tuple[int, int]] = {}
    say(f"starting {WORLD} gloo ranks (torch imported once, then forked), one observer each; "
        f"rank {HANG_RANK} will hang for {hold_s} s before its all-reduce at step {HANG_STEP}")
    try:
        for process in processes:
            process.start()
        for message in control_messages(control, processes, done, WORLD, deadline, timeout_s, "the job", problems):
            kind = message[0]
            if kind == "ready":
                ready[message[1]] = (message[2], message[3])
                if len(ready) == WORLD:
                    say(f"all {WORLD} ranks and observers ready after {time.monotonic() - started:.1f} s; training")
            elif kind == "hanging":
                hang_started = message[2]
                say(f"rank {message[1]} hangs now (injected)")
            elif kind == "report" and report is None:
                report, report_seen = message[2], message[3]
            elif kind == "done":
                done.add(message[1])
    finally:
        for process in processes:
            process.join(max(0.1, min(5.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join(5.0)
        # Observers of killed ranks exit on their own (parent-death signal, pid polling); make sure.
        for _, observer_pid in ready.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if _wait_gone(observer_pid, 3.0) is False:
                    os.kill(observer_pid, 9)
        with contextlib.suppress(Exception):
            control.close()
        leftovers = []
        for segment in _segments(job_id, WORLD):
            if segment.exists():
                leftovers.append(segment.name)
                with contextlib.suppress(FileNotFoundError):
                    segment.unlink()
        shutil.rmtree(directory, ignore_errors=True)
    if report is None and not problems:
        problems.append("no report arrived")
    if report is not None and report.get("ranks") != [HANG_RANK]:
        problems.append(f"the report named {report.get('ranks')}, not rank {HANG_RANK}")
    return DemoResult(ok=not problems, report=report, hang_started_s=hang_started, report_seen_s=report_seen,
                      wall_s=time.monotonic() - started, leftover_segments=tuple(leftovers), problems=tuple(problems))


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` is gone (or a zombie), within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if status == "Z":
            return True
        time.sleep(0.05)
    return False
