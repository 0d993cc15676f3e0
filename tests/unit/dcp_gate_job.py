"""A small data-parallel training job with the checkpoint gate, on 4 CPU processes (gloo), for
test_checkpoint_dcp.py. Import torch once here, then fork the ranks.

    python -m tests.unit.dcp_gate_job PHASE WORK_DIR OUT_JSON

``first``: train steps 1..STEPS with DDP (dropout, so RNG state matters; Adam, so optimizer state
matters). Cycle boundaries every CYCLE_STEPS steps; at each one every rank saves the checkpoint
through DCP, then rank 0 (the gate's writer) feeds ``CheckpointCaptured``. Every step replays one
recipe: every rank signs a parameter slice, the signatures are all-gathered and classified by the
one verdict rule. At SDC_STEP rank 2 reports a corrupted signature for the head: the gate
quarantines. The run continues untouched to STEPS and records its final state (the reference).

``restart``: fresh processes, as a relaunched job. Rank 0 reads the manifest; for each failure
class in RESTORES it asks the recovery decision which checkpoint to restore, all ranks load it
through DCP, train on to STEPS and record the final state, which must equal the reference bit
for bit. Every wait is bounded: the launcher kills ranks that run past RANK_DEADLINE_S.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (the one import, before the fork)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

torch.set_num_threads(1)

WORLD = 4
STEPS = 12
CYCLE_STEPS = 3
SDC_STEP = 8
#: The default of SCOUT_TEST_RANK_DEADLINE_S, read when main() runs (tests.processes.run_forked
#: runs it in a fork of a forkserver that imported this module once).
RANK_DEADLINE_S = 240.0
COLLECTIVE_TIMEOUT_S = 120


def _config():
    from scout.gate.model import GateConfig

    return GateConfig("dcp-job", ("embedding", "output"), ("dp",))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Linear(8, 16)
        self.dropout = nn.Dropout(0.25)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.relu(self.embedding(x))))


def build() -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(1234)  # the same initial weights on every rank
    # One parameter per gradient bucket, from the first iteration on. DDP otherwise starts with
    # all parameters in one bucket and rebuilds its buckets after the first iteration; the bucket
    # layout fixes the order of the all-reduce sums, so a restored run (fresh DDP, first
    # iteration) would differ from the uninterrupted one in the last bits (docs/gate.md,
    # "Bit-identical restarts").
    model = DistributedDataParallel(Net(), bucket_cap_mb_list=[1e-6] * 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(99 + dist.get_rank())  # dropout masks differ by rank
    return model, optimizer


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)  # data never touches the global RNG
    return torch.randn(16, 8, generator=generator), torch.randn(16, 4, generator=generator)


def train_step(model: DistributedDataParallel, optimizer: torch.optim.Optimizer, step: int) -> None:
    inputs, targets = batch(dist.get_rank(), step)
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()


def snapshot(model: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> str:
    """A digest of every bit of the training state: parameters, optimizer state, RNG state."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    for state in optimizer.state_dict()["state"].values():
        for value in state.values():
            digest.update(torch.as_tensor(value).detach().contiguous().numpy().tobytes())
    digest.update(torch.get_rng_state().numpy().tobytes())
    return digest.hexdigest()


def replay_result(model: DistributedDataParallel, recipe: str, cycle: int, step: int, corrupt: bool):
    """One recipe replay, job-wide: every rank signs its copy of the recipe's parameters; the
    verdict rule decides over the gathered signatures."""
    from scout.core.recipes import EvidenceKind, RecipeId, ReplayStatus, combine_evidence
    from scout.gate.results import recipe_verdicts

    module = getattr(model.module, {"embedding": "embedding", "output": "head"}[recipe])
    signature = hashlib.sha256(module.weight.detach().numpy().tobytes()).hexdigest()[:16]
    if corrupt:
        signature = "corrupted-" + signature[:6]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, signature)
    statuses = [int(ReplayStatus.OK)] * len(gathered)
    result = combine_evidence(RecipeId.parse(recipe), step, statuses, {EvidenceKind.OUTPUT: gathered})
    return recipe_verdicts(_config(), recipe, cycle, step, {"dp": result})


def first_run(work: Path) -> dict[str, Any]:
    from scout.gate.dcp import save_checkpoint
    from scout.gate.model import CheckpointCaptured, CheckpointId, CycleBoundary
    from scout.gate.recorder import GateRecorder
    from scout.gate.step import step as gate_step

    rank = dist.get_rank()
    model, optimizer = build()
    recorder = state = None
    if rank == 0:
        recorder, state = GateRecorder.open(work / "manifest", _config())
    reports: list[str] = []
    saved: dict[int, str] = {}

    def feed(event: Any) -> None:
        nonlocal state
        if rank == 0:
            state, effects = gate_step(state, event)
            recorder.record(state, effects)
            reports.extend(f"{e.kind.value}: {e.detail}" for e in effects if hasattr(e, "kind"))

    feed(CycleBoundary(0))
    cycle = 1
    recipes = _config().recipe_ids
    for step in range(1, STEPS + 1):
        train_step(model, optimizer, step)
        recipe = recipes[(step - 1) % len(recipes)]
        result = replay_result(model, recipe, cycle, step, corrupt=(step == SDC_STEP and rank == 2))
        feed(result)
        if step % CYCLE_STEPS == 0:
            feed(CycleBoundary(step))
            cycle += 1
            saved[step] = snapshot(model, optimizer)
            save_checkpoint(work / "checkpoints", CheckpointId(0, step), model, optimizer)
            feed(CheckpointCaptured(step))  # only once the bytes are complete on every rank
            if rank == 0 and step == 6:
                shutil.copytree(work / "manifest", work / "manifest-at-6", ignore=shutil.ignore_patterns(".writer.lock"))
    trust = {}
    if rank == 0:
        trust = {str(e.id): e.trust.value for e in state.context.checkpoints}
        recorder.close()
    return {"final": snapshot(model, optimizer), "trust": trust, "reports": reports, "saved": saved}


#: failure class -> the manifest the relaunched job reads. A straggler at step 7 is restarted
#: from the manifest as it stood then (copied by the first run at step 6): the newest checkpoint
#: is a clean CANDIDATE and "latest" wins. The SDC restart reads the final manifest.
RESTORES = (("sdc", "manifest"), ("straggler", "manifest-at-6"))


def restart_run(work: Path) -> dict[str, Any]:
    from scout.gate.dcp import restore_for_failure
    from scout.gate.model import Restart
    from scout.gate.recorder import read_gate
    from scout.gate.recovery import FailureClass
    from scout.gate.step import check_event

    outcomes = {}
    for failure_name, manifest in RESTORES:
        gate_state = read_gate(work / manifest, _config())  # every rank reads; only rank 0 writes
        assert gate_state is not None
        model, optimizer = build()
        decision = restore_for_failure(work / "checkpoints", gate_state, FailureClass(failure_name), model, optimizer)
        assert decision.checkpoint is not None
        check_event(gate_state, Restart(decision.checkpoint.step))  # the gate accepts the restart
        loaded_digest = snapshot(model, optimizer)
        for step in range(decision.checkpoint.step + 1, STEPS + 1):
            train_step(model, optimizer, step)
        outcomes[failure_name] = {
            "choice": decision.choice.value,
            "reason": decision.reason,
            "checkpoint": str(decision.checkpoint),
            "final": snapshot(model, optimizer),
            "loaded": loaded_digest,
        }
    return outcomes


def _rank_main(phase: str, rank: int, work: str, store: str, results: Any) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        function = first_run if phase == "first" else restart_run
        results.put((rank, "ok", function(Path(work))))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # skip interpreter teardown (gloo threads); the result is already sent


def main() -> int:
    phase, work, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    context = mp.get_context("fork")
    results = context.Queue()
    store = os.path.join(work, f"store-{phase}")
    processes = [context.Process(target=_rank_main, args=(phase, r, work, store, results)) for r in range(WORLD)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + float(os.environ.get("SCOUT_TEST_RANK_DEADLINE_S", RANK_DEADLINE_S))
    collected: dict[int, tuple[str, Any]] = {}
    while len(collected) < WORLD and time.monotonic() < deadline:
        try:
            rank, status, payload = results.get(timeout=min(5.0, max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            continue
        collected[rank] = (status, payload)
    for process in processes:
        process.join(timeout=max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()  # our own child, by its handle
            process.join(timeout=5)
    output = {
        "late_ranks": sorted(set(range(WORLD)) - collected.keys()),
        "ranks": {str(r): {"status": s, "payload": p} for r, (s, p) in sorted(collected.items())},
    }
    Path(out_path).write_text(json.dumps(output), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
