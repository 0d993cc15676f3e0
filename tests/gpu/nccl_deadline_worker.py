"""A deadline on a real NCCL collective leaves the communicator usable (spec/transport.md
WAIT-1..WAIT-3), on one GPU, under torchrun (the GPU script's case ``nccl_deadline``):

    torchrun --standalone --nproc-per-node=1 -m tests.gpu.nccl_deadline_worker OUT_JSON

One rank is enough to make a collective late: NCCL orders its stream after the current stream,
so a kernel that spins on the current stream (``torch.cuda._sleep``) holds the collective back.
For ``TorchTransport.all_gather_tensor`` and ``TorchPeerGroup.all_gather_int64``: the call with a
short deadline raises ``DeadlineExceeded`` near its deadline (a timed ``work.wait`` would abort
the communicator here); while the spin lasts the transport refuses the group's tensors; once it
ends the same group runs collectives again and the default group's ``all_reduce`` still works.
Writes what it saw to OUT_JSON; ``check(result)`` says what must hold.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

SPIN_S = 4.0
DEADLINE_S = 0.5
RECOVERY_BOUND_S = 60.0


def _cycles(torch: Any, seconds: float) -> int:
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(seconds * probe / (start.elapsed_time(end) / 1e3))


def _until_it_runs(call: Any) -> tuple[Any, int, float]:
    """Call until it stops raising TransportError (bounded); returns (result, refusals, s)."""
    from scout.transport.base import TransportError

    began_s = time.monotonic()
    refusals = 0
    while True:
        try:
            return call(), refusals, time.monotonic() - began_s
        except TransportError:
            refusals += 1
            if time.monotonic() - began_s > RECOVERY_BOUND_S:
                raise
            time.sleep(0.05)


def run(out: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from scout.replay.collectives import TorchPeerGroup
    from scout.transport.base import DeadlineExceeded, TransportError
    from scout.transport.nccl import TorchTransport

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    # The backend timeout (NCCL's watchdog) is far above every deadline here (WAIT-4).
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=300))
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__}
    cycles = _cycles(torch, SPIN_S)
    transport = TorchTransport()
    try:
        mine = torch.full((4,), 7.0, device=device)
        torch.cuda._sleep(cycles)  # the current stream is busy for SPIN_S
        began_s = time.monotonic()
        try:
            transport.all_gather_tensor(mine, timeout_s=DEADLINE_S)
            result["transport_deadline"] = "completed (the spin did not hold it back)"
        except DeadlineExceeded:
            result["transport_deadline"] = "DeadlineExceeded"
        result["transport_deadline_after_s"] = time.monotonic() - began_s
        try:
            transport.all_gather_tensor(mine, timeout_s=DEADLINE_S)
            result["transport_while_in_flight"] = "ran"
        except TransportError as exc:
            result["transport_while_in_flight"] = type(exc).__name__
        gathered, refusals, waited_s = _until_it_runs(
            lambda: transport.all_gather_tensor(mine, timeout_s=30.0)
        )
        result["transport_after"] = [t.tolist() for t in gathered]
        result["transport_refusals"], result["transport_recovered_after_s"] = refusals, waited_s

        peers = TorchPeerGroup(timeout_s=60.0, backend="nccl", device=device)
        peers.all_gather_int64([1])  # the replay group's communicator exists before the test
        peers.timeout_s = DEADLINE_S
        torch.cuda._sleep(cycles)
        began_s = time.monotonic()
        try:
            peers.all_gather_int64([5, 6])
            result["peers_deadline"] = "completed (the spin did not hold it back)"
        except DeadlineExceeded:
            result["peers_deadline"] = "DeadlineExceeded"
        result["peers_deadline_after_s"] = time.monotonic() - began_s
        torch.cuda.synchronize(device)  # the spin ends; the late collective completes
        result["peers_after"] = peers.all_gather_int64([5, 6])
        total = torch.ones(1, device=device)
        dist.all_reduce(total)
        result["default_group_all_reduce"] = total.item()
    except Exception:
        result["worker_error"] = traceback.format_exc()
    finally:
        transport.close()
    dist.destroy_process_group()
    out.write_text(json.dumps(result, indent=1))
    return result


def check(result: dict[str, Any]) -> list[str]:
    """What must hold; the problems found (empty: the case passed)."""
    if "worker_error" in result:
        return [result["worker_error"]]
    problems = []
    for name in ("transport", "peers"):
        if result.get(f"{name}_deadline") != "DeadlineExceeded":
            problems.append(f"{name}: {result.get(f'{name}_deadline')}")
        elapsed_s = result.get(f"{name}_deadline_after_s", -1.0)
        if not DEADLINE_S * 0.9 <= elapsed_s <= DEADLINE_S + 2.0:
            problems.append(f"{name}: the deadline of {DEADLINE_S} s was kept in {elapsed_s:.3f} s")
    if result.get("transport_while_in_flight") != "TransportError":
        problems.append(f"transport while in flight: {result.get('transport_while_in_flight')}")
    if result.get("transport_after") != [[7.0] * 4]:
        problems.append(f"transport after the spin: {result.get('transport_after')}")
    if result.get("peers_after") != [[5, 6]]:
        problems.append(f"peer group after the spin: {result.get('peers_after')}")
    if result.get("default_group_all_reduce") != 1.0:
        problems.append(f"default group all_reduce: {result.get('default_group_all_reduce')}")
    return problems


if __name__ == "__main__":
    sys.exit(1 if check(run(Path(sys.argv[1]))) else 0)
