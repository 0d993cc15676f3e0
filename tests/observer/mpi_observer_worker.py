"""One MPI rank with an observer (run by tests/observer/test_observer_mpi.py under mpiexec).

Usage: python -m tests.observer.mpi_observer_worker OUT_DIR SCENARIO. Scenarios: ``behind``
(rank 2 sleeps before the MPI all-reduce of step 3), ``healthy`` (steps with slow ones under
the threshold). Writes OUT_DIR/rank<r>.json: the reports its observer's callback received and
the observer's statistics. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from mpi4py import MPI

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint
from scout.observer.mpi import start_mpi_observer
from scout.transport.mpi import MpiTransport

CONFIG = dict(stall_threshold_s=1.0, settle_idle_s=0.5, round_deadline_s=0.5, recheck_interval_s=1.0,
              join_deadline_s=30.0, attach_deadline_s=30.0)
FP = fingerprint(CollectiveCall("all_reduce", None, (TensorMeta("float64", (1,)),), reduce_op="SUM"))
HOLD_S = 4.0


def main() -> None:
    out_dir, scenario = Path(sys.argv[1]), sys.argv[2]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = MpiTransport(comm, setup_timeout_s=30.0)
    reports: list[dict[str, object]] = []
    # Each half of an MPMD job may keep its reports apart (nothing shared between "hosts").
    report_dir = Path(os.environ.get("SCOUT_TEST_REPORT_DIR", out_dir))
    publisher, handle = start_mpi_observer(
        transport, config=CONFIG, report_path=str(report_dir / "reports.jsonl"),
        stats_path=str(out_dir / f"stats{rank}.json"), on_report=reports.append, on_failure="report",
    )
    handle.wait_ready(60.0)
    transport.barrier(timeout_s=30.0)
    steps, layer_s = (4, 0.03) if scenario == "behind" else (12, 0.05)
    held_at = None
    for step in range(1, steps + 1):
        publisher.begin_step(step)
        handle.check()
        for _ in range(3):
            time.sleep(layer_s)
            publisher.advance()
        if scenario == "behind" and rank == 2 and step == 3:
            held_at = time.monotonic()
            time.sleep(HOLD_S)
        if scenario == "healthy" and step % 4 == rank % 4:
            time.sleep(0.5)  # a slow step, under the threshold
        publisher.enter_collective(FP)
        comm.allreduce(float(step))  # a blocking MPI collective: the others wait here for rank 2
        publisher.exit_collective()
    # Reports reach the callback through a queue: give the reporter's a moment to arrive.
    deadline = time.monotonic() + 2.0
    while scenario == "behind" and not reports and rank == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    publisher.close()
    handle.close()
    comm.barrier()
    stats = json.loads((out_dir / f"stats{rank}.json").read_text()) if (out_dir / f"stats{rank}.json").exists() else {}
    result = {"rank": rank, "reports": reports, "stats": stats, "held_at": held_at,
              "observer_exit": handle.process.returncode}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    transport.close()


if __name__ == "__main__":
    main()
