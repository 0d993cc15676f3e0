"""Attaching scout with the inputs a framework hands out, under torchrun (2 ranks, gloo), one
attach after the other in the same processes (tests/job/test_attach_inputs.py). Each rank writes
one JSON file per case, RUN_DIR/result-CASE-RANK.json: what attach did, this case's progress
records left in /dev/shm, and the processes this trainer started that are still alive. (Files, not
stdout: two ranks printing to torchrun's one pipe under PYTHONUNBUFFERED interleave their lines.)

    torchrun --nproc-per-node 2 --standalone attach_inputs_job.py RUN_DIR

Cases, in this order (the last one ends the job: after a ConfigError the ranks other than 0
leave with status 2): ``foreign-wrapper`` (an optimizer subclass whose __init__ did not run torch's: refused
before anything starts), ``hooks-fail`` (an optimizer whose hooks cannot be registered: attach
fails after its observer started, FRAME-2), ``accelerate`` (a bare Accelerate setup: its real
AcceleratedOptimizer and AcceleratedScheduler, unwrapped, FRAME-1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import scout
from scout.observer.progress import record_name


class Wrapped(torch.optim.Optimizer):
    """A wrapper that subclasses Optimizer but never runs its __init__ (as Accelerate's does)."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner


class NoHooks(torch.optim.SGD):
    """A real optimizer whose step hooks cannot be registered."""

    def register_step_pre_hook(self, hook: Any) -> Any:
        raise RuntimeError("this optimizer takes no step pre-hooks")


def children() -> list[str]:
    """This process's live children, by command line; Python's multiprocessing resource tracker
    (started by the interpreter at the first shared-memory segment, gone with the interpreter)
    is not one of scout's."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and "resource_tracker" not in command:
            found.append(command.strip())
    return found


def case(name: str, run_dir: str) -> dict[str, Any]:
    rank = dist.get_rank()
    os.environ["SCOUT_JOB_ID"] = job_id = f"inputs-{name}-{os.getppid()}"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))
    result: dict[str, Any] = {"case": name, "rank": rank}
    state: dict[str, Any] | None = None
    if name == "foreign-wrapper":
        optimizer: Any = Wrapped(torch.optim.SGD(model.parameters(), lr=0.1))
    elif name == "hooks-fail":
        optimizer = NoHooks(model.parameters(), lr=0.1)
    else:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        inner = torch.optim.AdamW(model.parameters(), lr=0.1)
        model, optimizer, scheduler = accelerator.prepare(
            model, inner, torch.optim.lr_scheduler.LinearLR(inner, 1.0, 0.5, total_iters=10))
        result["wrappers"] = [type(optimizer).__name__, type(scheduler).__name__]
        state = {"lr": scheduler}
    try:
        job = scout.attach(model, optimizer, run_dir=f"{run_dir}/{name}", stall_threshold_s=30, state=state)
    except Exception as error:  # what the user sees
        result["error"] = f"{type(error).__name__}: {error}"
    except SystemExit as leaving:  # a rank other than 0 leaves quietly after a ConfigError (startup.py)
        result["exit"] = leaving.code
    else:
        result["attached_to"] = type(job.optimizer).__name__
        result["state"] = {key: type(value).__name__ for key, value in job.registered.items()}
        job.close()
    time.sleep(1.0)  # an observer being stopped has this long to be gone
    result["records"] = [n for n in os.listdir("/dev/shm") if n == record_name(job_id, 0, rank)]
    result["children"] = children()
    return result


def main() -> None:
    dist.init_process_group("gloo")
    for name in ("hooks-fail", "accelerate", "foreign-wrapper"):
        result = case(name, sys.argv[1])
        written = Path(sys.argv[1]) / f"result-{name}-{result['rank']}.json"
        written.parent.mkdir(parents=True, exist_ok=True)
        written.with_suffix(".part").write_text(json.dumps(result))
        written.with_suffix(".part").replace(written)
        if "exit" in result:
            raise SystemExit(result["exit"])
        if name != "foreign-wrapper":  # after the last case rank 1 is gone (exit status 2)
            dist.barrier()


if __name__ == "__main__":
    main()
