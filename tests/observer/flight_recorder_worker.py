"""One rank of the Flight Recorder source test (test_completion.py, INSTR-10 and INSTR-12): gloo
with ``TORCH_FR_BUFFER_SIZE`` set, completion tracking started as ``instrument()`` starts it, and
rank 1 late for a C++-issued collective (DDP's buffer broadcast, called as DDP calls it). Rank 0
writes what its record showed while it waited. Every wait is bounded."""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time


def main(rank: int, init_file: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from scout.observer import completion
    from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    publisher = ProgressPublisher(RecordIdentity(f"fr-{os.path.basename(out_dir)}", 0, rank))
    tracking = completion.start_tracking(publisher, poll_interval_s=0.05)
    seen: dict[str, object] = {"source": None if tracking is None else tracking.source_name}
    reader = ProgressReader(publisher.name, publisher.token, claim=False)
    dist.all_reduce(torch.ones(2))
    if rank == 0:
        def look() -> None:
            time.sleep(0.8)
            snapshot = reader.read()
            section = None if snapshot is None else snapshot.completion
            seen["while_waiting"] = None if section is None else [section.enqueued, section.completed,
                                                                   section.pending_state]
        looker = threading.Thread(target=look)
        looker.start()
    else:
        time.sleep(1.5)
    # Not through scout's wrappers: the Flight Recorder sees it all the same.
    torch._C._distributed_c10d._broadcast_coalesced(dist.group.WORLD, [torch.ones(3)], 1 << 20, 0)
    if rank == 0:
        looker.join(10)
        time.sleep(0.2)
        section = reader.read().completion  # type: ignore[union-attr]
        seen["after"] = None if section is None else [section.enqueued, section.completed, section.pending_state]
        with open(os.path.join(out_dir, "rank0.json"), "w") as file:
            json.dump(seen, file)
    if tracking is not None:
        tracking.stop()
    reader.close()
    publisher.close()
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
