"""Records the gloo Flight Recorder dump of ``flight_recorder_dumps.GLOO_SUBGROUP_PENDING`` from a
real 2-rank gloo job, so that the fixture can be recorded again on another torch:

    TORCH_FR_BUFFER_SIZE=32 torchrun --standalone --nproc-per-node=2 -m tests.observer.record_fr_dump OUT

Both ranks all-reduce on the default group, then twice on a ``new_group`` of both ranks; rank 1
sleeps before the second, and rank 0 dumps its recorder (``_dump_fr_trace``, the gloo recorder,
as scout reads it: entries without stack traces, only the active ones) while it waits in that
collective. Rank 0 writes ``repr`` of the full dump and of the status-only dump to OUT.
"""

from __future__ import annotations

import os
import pickle
import pprint
import sys
import threading
import time
from datetime import timedelta


def main(out: str) -> None:
    import torch
    import torch.distributed as dist

    if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0) <= 0:
        raise SystemExit("set TORCH_FR_BUFFER_SIZE (e.g. 32) before running: it turns the recorder on")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    sub = dist.new_group([0, 1])
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    dist.all_reduce(tensor, group=sub)
    dumps: dict[str, object] = {}
    if rank == 0:
        c10d = torch._C._distributed_c10d

        def dump_while_blocked() -> None:
            time.sleep(1.0)  # rank 0 is inside the sub-group's second all-reduce by now
            dumps["full"] = pickle.loads(c10d._dump_fr_trace(True, False, True))
            dumps["status_only"] = pickle.loads(c10d._dump_fr_trace(False, False, True))

        thread = threading.Thread(target=dump_while_blocked)
        thread.start()
    else:
        time.sleep(3.0)
    dist.all_reduce(torch.ones(2, 3, dtype=torch.float64), group=sub)
    if rank == 0:
        thread.join(10)
        with open(out, "w", encoding="utf-8") as file:
            file.write(f"# torch {torch.__version__}\n")
            for name, dump in dumps.items():
                file.write(f"{name} = {pprint.pformat(dump, width=110)}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
