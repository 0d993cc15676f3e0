"""One rank of the emulated-backend tests (tests/transport/test_emulated.py): runs every check in
order on a 2-rank ``scoutemu`` world and writes what it saw to ``rank<r>.json``. Every wait is
bounded; the process exits hard at the end (the stream thread of an aborted group may still be
blocked in gloo)."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any


def main(rank: int, init_file: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from scout.observer.flight_recorder import coordinate_from_trace
    from scout.transport.nccl import emulated

    torch.set_num_threads(1)
    seen: dict[str, Any] = {}
    emulated.register()
    emulated.register()  # idempotent
    dist.init_process_group(emulated.BACKEND, init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    group = emulated.emulated_group()
    seen["backend"] = dist.get_backend()
    # INSTR-10: completion tracking picks the emulated backend's recorder.
    from scout.observer import completion
    from scout.observer.progress import ProgressPublisher, RecordIdentity

    publisher = ProgressPublisher(RecordIdentity(f"emulated-{os.path.basename(out_dir)}", 0, rank))
    tracking = completion.start_tracking(publisher)
    seen["completion_source"] = None if tracking is None else tracking.source_name
    if tracking is not None:
        tracking.stop()
    publisher.close()

    # A collective returns at enqueue; its result is there after wait.
    tensor = torch.ones(3) * (rank + 1)
    if rank == 1:
        time.sleep(0.5)
    started = time.monotonic()
    work = dist.all_reduce(tensor, async_op=True)
    seen["enqueue_s"] = time.monotonic() - started
    seen["completed_at_enqueue"] = work.is_completed()
    work.wait()
    seen["all_reduce"] = tensor.tolist()
    output = torch.zeros(4)
    dist.all_gather_into_tensor(output, torch.ones(2) * rank)
    emulated.synchronize()  # a synchronous call returned at enqueue: sync before reading (INSTR-14)
    seen["all_gather_into_tensor"] = output.tolist()
    dist.barrier()

    # A GPU-side hang on rank 1: its stream never reaches the next collective for 1.5 s.
    if rank == 1:
        group.stall_stream(1.5)
    work = dist.all_reduce(tensor, async_op=True)
    time.sleep(0.7)
    dump = group.flight_recorder_dump()
    found = coordinate_from_trace(dump, emulated.group_name(group), group_ranks=(0, 1), started_known=True, wall_minus_monotonic_ns=0)
    seen["hang_state"] = found.pending_state.name
    seen["hang_status"] = dump["pg_status"]["0"]
    work.wait()
    seen["hang_completed"] = work.is_completed()

    # The next collective's kernel not launched on rank 0, though its stream reached it.
    if rank == 0:
        group.withhold_launch(1.0)
    work = dist.all_reduce(tensor, async_op=True)
    time.sleep(0.5)
    seen["withheld_state"] = coordinate_from_trace(group.flight_recorder_dump(), emulated.group_name(group), group_ranks=None,
                                                   started_known=True, wall_minus_monotonic_ns=0).pending_state.name
    work.wait()

    # INSTR-14: a synchronous call returns at enqueue (NCCL from torch 2.8): rank 1's stream is
    # stalled, and both hosts go on; the host's sync point is synchronize().
    if rank == 1:
        group.stall_stream(1.0)
    synchronous = torch.ones(2) * (rank + 1)
    started = time.monotonic()
    dist.all_reduce(synchronous)
    seen["sync_return_s"] = time.monotonic() - started
    seen["sync_done_at_return"] = synchronous.tolist() == [3.0, 3.0]
    emulated.synchronize()
    seen["sync_after_synchronize"] = synchronous.tolist()

    # INSTR-14, INSTR-11: markers run end to end on it -- the mark clock is the group's stream.
    marked = ProgressPublisher(RecordIdentity(f"marked-{os.path.basename(out_dir)}", 0, rank))
    with_markers = completion.start_tracking(marked, source="markers", poll_interval_s=0.05)
    from scout.observer import instrument as inst

    seen["markers_source"] = None if with_markers is None else with_markers.source_name
    if with_markers is not None:
        tracker = with_markers.tracker_for(group)
        if rank == 1:
            group.stall_stream(1.0)
        entry = tracker.begin(0xF00D)  # type: ignore[union-attr]
        inst_work = dist.all_reduce(torch.ones(2), async_op=True)
        tracker.end(entry, inst_work)  # type: ignore[union-attr]
        time.sleep(0.5)
        seen["markers_while_stalled"] = int(tracker.coordinate()[3])  # type: ignore[union-attr]
        emulated.synchronize()
        seen["markers_after"] = list(tracker.coordinate()[:2])  # type: ignore[union-attr]
        with_markers.stop()
    marked.close()
    del inst

    # INSTR-14, INSTR-16: point-to-point on the stream; both ranks send first without deadlock.
    mine, theirs = torch.full((2,), float(rank)), torch.zeros(2)
    peer = 1 - rank
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
    for work in works:
        work.synchronize()
    seen["p2p_received"] = theirs.tolist()
    if rank == 0:
        dist.send(torch.full((2,), 7.0), 1)
    else:
        box = torch.zeros(2)
        dist.recv(box, 0)
        emulated.synchronize()
        seen["p2p_blocking"] = box.tolist()

    # DDP on it: buffers broadcast, buckets all-reduced, gradients averaged.
    model = torch.nn.Linear(2, 2)
    model.register_buffer("mask", torch.full((3,), float(rank)))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.ones(1, 2) * (rank + 1)).sum().backward()
    seen["ddp_weight_grad"] = model.weight.grad.tolist()
    seen["ddp_buffer"] = model.mask.tolist()

    # PyTorch's Flight Recorder on a gloo group (TORCH_FR_BUFFER_SIZE is set by the test): a
    # broadcast called straight from C++, as DDP calls it, is seen pending while rank 1 is late.
    seen.update(_flight_recorder(rank, out_dir))

    # A timed wait that expires aborts the communicator; later collectives fail at once.
    if rank == 0:
        work = dist.all_reduce(tensor, async_op=True)
        try:
            work.wait(datetime.timedelta(seconds=0.5))
            seen["timed_wait"] = "returned"
        except emulated.CommunicatorAborted as error:
            seen["timed_wait"] = str(error)
        seen["aborted"] = group.aborted
        try:
            dist.all_reduce(tensor, async_op=True)
            seen["after_abort"] = "enqueued"
        except emulated.CommunicatorAborted as error:
            seen["after_abort"] = str(error)
    else:
        time.sleep(1.5)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as file:
        json.dump(seen, file)
    sys.stdout.flush()
    os._exit(0)


def _flight_recorder(rank: int, out_dir: str) -> dict[str, Any]:
    import threading

    import torch
    import torch.distributed as dist

    from scout.observer import completion
    from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity

    gloo = dist.new_group(backend="gloo")
    publisher = ProgressPublisher(RecordIdentity(f"fr-{os.path.basename(out_dir)}", 0, rank))
    tracking = completion.start_tracking(publisher, group=gloo, poll_interval_s=0.05)
    seen: dict[str, Any] = {"fr_source": None if tracking is None else tracking.source_name}
    reader = ProgressReader(publisher.name, publisher.token, claim=False)
    dist.all_reduce(torch.ones(2), group=gloo)
    looker = None
    if rank == 0:
        def look() -> None:
            time.sleep(0.8)
            snapshot = reader.read()
            section = None if snapshot is None else snapshot.completion
            first = None if section is None else section.slots[0]
            seen["fr_while_waiting"] = None if first is None else [first.enqueued, first.completed, first.pending_state]
        looker = threading.Thread(target=look)
        looker.start()
    else:
        time.sleep(1.5)
    # Not through scout's wrappers: the Flight Recorder sees it all the same.
    torch._C._distributed_c10d._broadcast_coalesced(gloo, [torch.ones(3)], 1 << 20, 0)
    if looker is not None:
        looker.join(10)
        time.sleep(0.2)
        section = reader.read().completion  # type: ignore[union-attr]
        first = None if section is None else section.slots[0]
        seen["fr_after"] = None if first is None else [first.enqueued, first.completed, first.pending_state]
    if tracking is not None:
        tracking.stop()
    reader.close()
    publisher.close()
    return seen


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
