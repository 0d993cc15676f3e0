"""One rank of an innocence job (:mod:`scout.scenarios.innocence`): hosts that run ahead of their
devices on the emulated NCCL backend, one out-of-band observer per rank, and a list of episodes
run one after another (spec/observer.md COMPLETION-9..12, INSTR-14).

Run by the harness as ``python -m scout.scenarios.innocence_job RANK OPTIONS_JSON``: every rank
of a job with the same options file. Each episode (:class:`scout.scenarios.innocence.Episode`)
issues one step's collectives after another on one kind of group -- the default group, a
``new_group``, both dimensions of a 2-D DeviceMesh, or a pipeline's point-to-point pairs -- with
the host running at most ``ahead`` steps ahead of its device (it waits for the step ``ahead``
back, as a caching allocator's pressure or a full launch queue makes a GPU host wait), and some
ranks draining their streams every ``drain_every`` steps (logging's ``.item()``). At
``stall_step`` the ``stall_rank``'s device stops -- every stream of the rank, for ``hold_s``
(a GPU-side hang) -- or its host sleeps that long before it enqueues (``host``); the others run
on until they wait for it. The observers report what they find into ``reports.jsonl``; the
harness judges every report against the episode it falls in (by the stuck position's step:
episodes use disjoint step ranges). Everything is bounded: the emulated faults release
themselves, the waits have the group's timeout, the harness kills a job past its deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from datetime import timedelta
from typing import Any

__all__ = ["main"]


def _groups(world: int) -> dict[str, Any]:
    """The groups an episode of ``kind`` issues on, made once per job on every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    made: dict[str, Any] = {"default": [dist.group.WORLD]}
    made["new_group"] = [dist.new_group(list(range(world)))]
    if world % 2 == 0 and world >= 4:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        made["mesh"] = [mesh.get_group("tp"), mesh.get_group("dp")]
    made["p2p"] = [dist.group.WORLD]
    return made


def _issue(kind: str, groups: list[Any], rank: int, world: int, tensor: Any) -> list[Any]:
    """One step's communication of ``kind``; returns its works."""
    import torch.distributed as dist

    if kind == "p2p":
        # A pipeline of ``world`` stages: each receives its activations from the stage before
        # and sends its own to the stage after.
        operations = []
        if rank > 0:
            operations.append(dist.P2POp(dist.irecv, tensor, rank - 1))
        if rank < world - 1:
            operations.append(dist.P2POp(dist.isend, tensor.clone(), rank + 1))
        return list(dist.batch_isend_irecv(operations))
    return [dist.all_reduce(tensor, group=group, async_op=True) for group in groups]


def _emulated(groups: list[Any]) -> list[Any]:
    from scout.transport.nccl import emulated

    found = []
    for group in groups:
        try:
            found.append(emulated.emulated_group(group))
        except TypeError:
            continue
    return found


def main(rank: int, options_path: str) -> None:
    with open(options_path, encoding="utf-8") as file:
        options: dict[str, Any] = json.load(file)
    world = int(options["world"])
    log = open(os.path.join(options["directory"], f"rank{rank}.log"), "a", encoding="utf-8")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)

    import torch
    import torch.distributed as dist

    from scout.core.observer import Stage
    from scout.observer import instrument
    from scout.observer.launch import start_observer
    from scout.observer.progress import ProgressPublisher, RecordIdentity
    from scout.observer.rendezvous import DirectoryRendezvous
    from scout.transport.nccl import emulated

    torch.set_num_threads(1)
    emulated.register()
    dist.init_process_group(emulated.BACKEND, init_method=f"file://{options['init_file']}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=float(options["timeout_s"])))
    publisher = ProgressPublisher(RecordIdentity(options["job_id"], 0, rank))
    publisher.begin_stage(Stage.CHECKPOINT_READ)  # start-up: the long threshold, as a restoring job
    handle = start_observer(
        publisher, group_ranks=tuple(range(world)), secret=bytes.fromhex(options["secret"]),
        rendezvous=DirectoryRendezvous(options["rendezvous_dir"]), config=options["observer"],
        report_path=os.path.join(options["directory"], "reports.jsonl"), on_failure="report",
        rounds_path=os.path.join(options["directory"], f"rounds{rank}.jsonl"),
        timeout_s=float(options["timeout_s"]),
    )
    handle.wait_ready(float(options["timeout_s"]))
    groups = _groups(world)
    instrument.instrument(publisher)
    emulated.synchronize()
    dist.barrier()
    emulated.synchronize()
    publisher.end_stage()
    marks = open(os.path.join(options["directory"], f"episodes{rank}.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
    tensor = torch.ones(64)
    for episode in options["episodes"]:
        kind = episode["kind"]
        on = groups[kind]
        streams = _emulated(on) if kind != "p2p" else _emulated(groups["default"])
        outstanding: deque[list[Any]] = deque()
        started = time.monotonic()
        for offset in range(1, int(episode["steps"]) + 1):
            step = int(episode["first_step"]) + offset - 1
            instrument.mark_step(step)
            time.sleep(float(options["compute_s"]))
            if episode["stall_rank"] == rank and offset == episode["stall_step"]:
                print(f"INNOCENCE-FAULT {episode['fault']} rank {rank} step {step}", flush=True)
                if episode["fault"] == "stream":
                    for stream in streams:
                        stream.stall_stream(float(episode["hold_s"]))
                else:
                    time.sleep(float(episode["hold_s"]))
            outstanding.append(_issue(kind, on, rank, world, tensor))
            if rank in episode["drain_ranks"] and offset % int(episode["drain_every"]) == 0:
                emulated.synchronize(float(options["timeout_s"]))  # logging's .item(): the host waits
            while len(outstanding) > int(episode["ahead"]):
                for work in outstanding.popleft():
                    work.synchronize(float(options["timeout_s"]))
        emulated.synchronize(float(options["timeout_s"]))
        # The episode ends together: a collective no observer watches (outside the steps).
        instrument.mark_step(int(episode["first_step"]) + int(episode["steps"]))
        marks.write(json.dumps({"episode": episode["index"], "rank": rank, "started": started,
                                "ended": time.monotonic()}) + "\n")
        marks.flush()
        publisher.begin_stage(Stage.CHECKPOINT_WRITE)  # between episodes: the long threshold
        dist.barrier()
        emulated.synchronize(float(options["timeout_s"]))
        time.sleep(float(options["between_s"]))
        publisher.end_stage()
    instrument.uninstrument()
    time.sleep(0.3)  # a report in flight reaches the file before the observer is closed
    publisher.close()
    handle.close()
    marks.close()
    log.flush()
    os._exit(0)  # skip interpreter teardown (the emulated streams are daemon threads)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(int(sys.argv[1]), sys.argv[2])
