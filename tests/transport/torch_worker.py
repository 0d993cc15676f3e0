"""The torch.distributed conformance run. Pytest-free; launched by test_conformance_torch.py as

    python -m tests.transport.torch_worker OUT_DIR [--nproc 4] [--timeout-s 90]

The launcher imports torch once (about 2 s), forks ``--nproc`` gloo ranks, and then hosts the
TCPStore server itself -- a process that is not a trainer, as docs/transports.md recommends --
on 127.0.0.1 and a free port. Each rank runs the shared binding cases (binding_cases.py), the
torch-specific cases (torch_cases.py) and the shared scenarios, and writes
``OUT_DIR/rank<r>.json``; the launcher writes ``OUT_DIR/launcher.json`` (exit codes, scout keys
left in the store). Every wait is bounded; ranks still running at ``--timeout-s`` are killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402  (after the thread settings above)
import torch.distributed as dist  # noqa: E402
from torch.distributed import PrefixStore  # type: ignore[attr-defined]  # noqa: E402

from scout.transport.nccl import TorchTransport  # noqa: E402
from tests.transport import binding_cases as cases  # noqa: E402
from tests.transport.scenario_runner import run_shared_scenarios  # noqa: E402
from tests.transport.torch_cases import TORCH_CASES, TorchHooks  # noqa: E402

HOST = "127.0.0.1"
STORE_TIMEOUT = timedelta(seconds=30)


def worker(rank: int, size: int, port: int, out_dir: Path, file_store_path: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore(
        HOST, port, is_master=False, timeout=STORE_TIMEOUT, wait_for_workers=False
    )
    dist.init_process_group(
        "gloo", store=PrefixStore("pg", store), rank=rank, world_size=size, timeout=STORE_TIMEOUT
    )
    hooks = TorchHooks(store, file_store_path)
    results: dict[str, Any] = {}
    transport = TorchTransport(store=store)
    try:
        results.update(cases.run_cases(transport, hooks, cases.CASES))
        results.update(cases.run_cases(transport, hooks, TORCH_CASES))
        results["scenarios"] = run_shared_scenarios(hooks.fresh_transport)
    except Exception:
        results["worker_error"] = traceback.format_exc()
    finally:
        transport.close()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, default=repr))
    # Leave the process group without waiting on peers that may have failed.
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=90.0)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    file_store_path = tempfile.mktemp(prefix="scout-filestore-", dir=args.out_dir)
    children: dict[int, int] = {}
    for rank in range(args.nproc):
        pid = os.fork()
        if pid == 0:  # the rank: never returns into the launcher's code
            code = 0
            try:
                worker(rank, args.nproc, port, args.out_dir, file_store_path)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    # The store lives in this process, which is not a trainer: it outlives any frozen rank.
    server = dist.TCPStore(
        HOST, port, is_master=True, timeout=STORE_TIMEOUT, wait_for_workers=False
    )
    exit_codes: dict[int, int | str] = {}
    deadline_s = time.monotonic() + args.timeout_s
    while children and time.monotonic() < deadline_s:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        exit_codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
    for pid, rank in children.items():  # still running at the deadline: a hang
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        exit_codes[rank] = f"killed after {args.timeout_s}s"
    leftover = [k.lstrip("/") for k in server.list_keys() if k.lstrip("/").startswith("scout/")]
    report = {
        "exit_codes": {str(k): v for k, v in sorted(exit_codes.items())},
        "scout_keys_left": leftover,
    }
    (args.out_dir / "launcher.json").write_text(json.dumps(report))
    return 0 if all(code == 0 for code in exit_codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
