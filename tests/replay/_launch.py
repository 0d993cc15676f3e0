"""Run one scenario on N real processes: import torch once here, then fork the ranks.

Usage (from the repository root): python -m tests.replay._launch SCENARIO WORLD KWARGS_JSON OUT_JSON

Every rank joins a gloo group through a file store, runs ``_scenarios.<SCENARIO>(rank, world,
**kwargs)`` and sends back its JSON-able result (or its traceback). Every wait is bounded: the
launcher kills the ranks it started if they run past the deadline, and says which were late.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import time
import traceback
from datetime import timedelta

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (one import, before the fork)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

torch.set_num_threads(1)



def _rank_main(scenario: str, rank: int, world: int, store: str, kwargs: dict, results) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        import importlib

        # SCENARIO is a function of tests.replay._scenarios, or module:function.
        module_name, _, function = scenario.rpartition(":")
        module = importlib.import_module(module_name or "tests.replay._scenarios")
        payload = getattr(module, function)(rank, world, **kwargs)
        results.put((rank, "ok", payload))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # skip interpreter teardown (gloo threads); the result is already sent


def main() -> int:
    scenario, world, kwargs_json, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    kwargs = json.loads(kwargs_json)
    context = mp.get_context("fork")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as scratch:
        store = os.path.join(scratch, "store")
        os.environ["SCOUT_TEST_SCRATCH"] = scratch  # inherited by the forked ranks
        processes = [
            context.Process(target=_rank_main, args=(scenario, r, world, store, kwargs, results))
            for r in range(world)
        ]
        for process in processes:
            process.start()
        # Read here, not at import: tests.processes.run_forked runs main() in a process forked
        # from a forkserver that imported this module once for every launch.
        deadline = time.monotonic() + float(os.environ.get("SCOUT_TEST_RANK_DEADLINE_S", "240"))
        collected: dict[int, tuple[str, object]] = {}
        while len(collected) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, status, payload = results.get(timeout=min(remaining, 5.0))
            except queue.Empty:
                continue
            collected[rank] = (status, payload)
        for process in processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()  # our own child, by its handle
                process.join(timeout=5)
    late = sorted(set(range(world)) - collected.keys())
    output = {
        "late_ranks": late,
        "ranks": {str(r): {"status": s, "payload": p} for r, (s, p) in sorted(collected.items())},
    }
    with open(out_path, "w") as handle:
        json.dump(output, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
