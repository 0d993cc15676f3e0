"""One rank of the torchrun conformance run (the GPU script's case ``nccl_conformance``):

    torchrun --standalone --nproc-per-node=<gpus> -m tests.gpu.gpu_worker OUT_DIR

Each rank drives one GPU and tensors go through NCCL; with ``SCOUT_TORCHRUN_DEVICE=cpu`` the
ranks use gloo on CPU instead (the same launch, for hosts without a GPU). the evidence path uses torchrun's agent
store (MASTER_ADDR:MASTER_PORT), which lives in the torchrun agent, not in a trainer -- the
deployment docs/transports.md recommends. Every rank runs the shared binding cases and the
torch cases (tensors on ``cuda:<local rank>``) and writes ``OUT_DIR/rank<r>.json``.

    python -m tests.gpu.gpu_worker --check OUT_DIR SIZE

checks those files and prints one line per case (exit status 1 if any failed). SCOUT_CASES
(comma-separated names) limits both steps to some cases.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.transport import binding_cases as cases
from tests.transport.torch_cases import TORCH_CASES

ALL_CASES = {**cases.CASES, **TORCH_CASES}


def selected(all_cases: dict[str, cases.Case]) -> dict[str, cases.Case]:
    """The cases named in SCOUT_CASES (comma-separated), or all of them."""
    wanted = os.environ.get("SCOUT_CASES")
    if not wanted:
        return all_cases
    names = set(wanted.split(","))
    return {name: case for name, case in all_cases.items() if name in names}


def run(out_dir: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    from scout.transport.nccl import TorchTransport
    from tests.transport.torch_cases import TorchHooks

    torch.set_num_threads(1)
    local_rank = int(os.environ["LOCAL_RANK"])
    if os.environ.get("SCOUT_TORCHRUN_DEVICE", "cuda") == "cpu":
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # device_id makes NCCL create its communicator now, not in the first timed collective.
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=60))
    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=60),
        wait_for_workers=False,
    )
    hooks = TorchHooks(store, str(out_dir / "filestore"), device=str(device))
    # No store given: the transport connects to MASTER_ADDR:MASTER_PORT, torchrun's agent store.
    transport = TorchTransport()
    results: dict[str, Any] = {}
    try:
        results.update(cases.run_cases(transport, hooks, selected(cases.CASES)))
        results.update(cases.run_cases(transport, hooks, selected(TORCH_CASES)))
    except Exception:
        results["worker_error"] = traceback.format_exc()
    finally:
        transport.close()
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results, default=repr))
    dist.destroy_process_group()


def check(out_dir: Path, size: int) -> int:
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(size)]
    failed = 0
    for name, case in selected(ALL_CASES).items():
        per_rank = [r.get(name, {"error": "missing"}) for r in results]
        if any("skipped" in r for r in per_rank):
            print(f"SKIP {name}: {per_rank[0]['skipped']}")
            continue
        try:
            case.check(per_rank, size, "torch")
        except AssertionError as exc:
            failed += 1
            print(f"FAIL {name}: {exc}")
        else:
            print(f"PASS {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        sys.exit(check(Path(sys.argv[2]), int(sys.argv[3])))
    run(Path(sys.argv[1]))
