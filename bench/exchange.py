"""Benchmark: the evidence exchange beside the raw collective, at 4 to 64 ranks.

For each world size and payload size, the per-round latency (slowest rank, median over
iterations, each after an untimed barrier) of

* MPI (``mpiexec -n N``): ``MpiTransport.exchange`` beside raw mpi4py ``Allgather`` of the same
  bytes, and the frames the exchange posts per round (counted at the binding's ``_post``);
* torch.distributed (N forked gloo ranks, the launcher hosts the store): ``TorchTransport
  .exchange`` (store-backed) beside raw ``dist.all_gather`` of a uint8 tensor.

Goal (docs/transports.md): exchange <= 1.2x the raw collective at every payload size, O(n) messages
per round. The current exchange posts one frame to every peer (n·(n-1) per round): this
benchmark measures what that costs as n grows. Writes bench/results/exchange.json.

Run: ./dev py bench/exchange.py [--max-ranks 64] [--iterations 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import Goal, at_most, print_goals, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MPI_RANKS = (4, 8, 16, 32, 64)
GLOO_RANKS = (4, 8, 16)
SIZES = {"8B": 8, "1KiB": 1024, "64KiB": 64 * 1024}  # 64 KiB: the default max_payload_bytes
GOAL_RATIO = 1.2
TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 900.0
WARMUP = 3


def _timed(call: Any, sync: Any, iterations: int) -> list[float]:
    samples = []
    for index in range(WARMUP + iterations):
        sync()
        start = time.perf_counter()
        call(index)
        if index >= WARMUP:
            samples.append(time.perf_counter() - start)
    return samples


def mpi_rank(out: Path, iterations: int) -> None:
    import numpy as np
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    transport = MpiTransport(MPI.COMM_WORLD, max_payload_bytes=1 << 20)
    posted = [0]
    original_post = transport._post

    def counting_post(stream: Any, number: int, group: Any, frame: bytes, targets: Any) -> None:
        posted[0] += len(targets)
        original_post(stream, number, group, frame, targets)

    transport._post = counting_post  # type: ignore[method-assign]
    rows: dict[str, Any] = {}
    round_id = 1
    for label, nbytes in SIZES.items():
        send = np.full(nbytes, rank % 256, dtype=np.uint8)
        recv = np.empty(nbytes * size, dtype=np.uint8)
        payload = send.tobytes()
        rows[f"raw Allgather {label}"] = _timed(lambda i, s=send, r=recv: comm.Allgather(s, r), comm.Barrier, iterations)
        posted[0] = 0
        base = round_id

        def exchange(i: int, base: int = base, payload: bytes = payload) -> None:
            result = transport.exchange(payload, round_id=base + i, timeout_s=TIMEOUT_S)
            assert not result.missing, result.missing

        rows[f"exchange {label}"] = _timed(exchange, comm.Barrier, iterations)
        rows[f"frames per rank per round {label}"] = posted[0] / (WARMUP + iterations)
        round_id += WARMUP + iterations + 1
    gathered = comm.gather(rows, root=0)
    transport.close()
    if rank == 0:
        merged: dict[str, Any] = {}
        for name, value in rows.items():
            if isinstance(value, list):
                merged[name] = [max(r[name][i] for r in gathered) for i in range(len(value))]
            else:
                merged[name] = sum(r[name] for r in gathered)  # frames per round, all ranks
        out.write_text(json.dumps(merged))
    comm.Free()


def run_mpi(ranks: int, iterations: int, tmp: Path) -> dict[str, Any]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    launcher = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if launcher is None:
        raise SystemExit("no mpiexec: pip install mpi4py mpich")
    out = tmp / f"mpi{ranks}.json"
    command = [launcher, "-n", str(ranks), sys.executable, __file__, "--role", "mpi",
               "--out", str(out), "--iterations", str(iterations)]
    subprocess.run(command, check=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def torch_rank(rank: int, ranks: int, port: int, out: Path, iterations: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from scout.transport.nccl import TorchTransport

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120),
                          wait_for_workers=False)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store),  # type: ignore[attr-defined]
                            rank=rank, world_size=ranks)
    transport = TorchTransport(store=store, max_payload_bytes=1 << 20)
    rows: dict[str, Any] = {}
    round_id = 1
    for label, nbytes in SIZES.items():
        tensor = torch.full((nbytes,), rank % 256, dtype=torch.uint8)
        outs = [torch.empty_like(tensor) for _ in range(ranks)]
        payload = bytes(tensor.numpy())
        rows[f"raw all_gather {label}"] = _timed(lambda i, o=outs, t=tensor: dist.all_gather(o, t), dist.barrier, iterations)
        base = round_id

        def exchange(i: int, base: int = base, payload: bytes = payload) -> None:
            result = transport.exchange(payload, round_id=base + i, timeout_s=TIMEOUT_S)
            assert not result.missing, result.missing

        rows[f"exchange (store) {label}"] = _timed(exchange, dist.barrier, iterations)
        round_id += WARMUP + iterations + 1
    transport.close()
    gathered: list[Any] = [None] * ranks
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        out.write_text(json.dumps({name: [max(r[name][i] for r in gathered) for i in range(len(v))]
                                   for name, v in rows.items()}))
    dist.destroy_process_group()


def run_torch(ranks: int, iterations: int, tmp: Path) -> dict[str, Any]:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    out = tmp / f"torch{ranks}.json"
    children = []
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                torch_rank(rank, ranks, port, out, iterations)
            except BaseException as exc:
                print(f"torch rank {rank}: {exc!r}", file=sys.stderr)
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=120),
                           wait_for_workers=False)  # type: ignore[attr-defined]
    deadline_s = time.monotonic() + RUN_TIMEOUT_S
    codes = []
    while children and time.monotonic() < deadline_s:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        children.remove(pid)
        codes.append(os.waitstatus_to_exitcode(status))
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        codes.append(-9)
    del server
    if any(codes):
        raise SystemExit(f"torch ranks failed: exit codes {codes}")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["mpi"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--max-ranks", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.role == "mpi":
        mpi_rank(args.out, args.iterations)
        return 0
    rows: list[dict[str, Any]] = []
    goals: list[Goal] = []
    with tempfile.TemporaryDirectory(prefix="scout-bench-") as tmp:
        for binding, sizes, runner, raw_name, ours in (
            ("mpi", MPI_RANKS, run_mpi, "raw Allgather", "exchange"),
            ("gloo", GLOO_RANKS, run_torch, "raw all_gather", "exchange (store)"),
        ):
            for ranks in sizes:
                if ranks > args.max_ranks:
                    continue
                load = round(os.getloadavg()[0], 2)
                measured = runner(ranks, args.iterations, Path(tmp))
                for label in SIZES:
                    raw_us = _median_us(measured[f"{raw_name} {label}"])
                    ours_us = _median_us(measured[f"{ours} {label}"])
                    row = {
                        "binding": binding, "ranks": ranks, "payload": label,
                        "raw_median_us": raw_us, "exchange_median_us": ours_us,
                        "ratio": round(ours_us / raw_us, 2), "load_average_1m": load,
                        "exchange_min_us": round(min(measured[f"{ours} {label}"]) * 1e6, 1),
                        "exchange_max_us": round(max(measured[f"{ours} {label}"]) * 1e6, 1),
                    }
                    frames = measured.get(f"frames per rank per round {label}")
                    if frames is not None:
                        row["frames_per_round"] = frames
                        row["frames_per_round_over_n"] = round(frames / ranks, 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    goals.append(at_most(f"exchange vs raw, {binding} {ranks} ranks {label}", row["ratio"], GOAL_RATIO, "x"))
                    if frames is not None:
                        # O(n): at most a constant number of frames per member and round.
                        goals.append(at_most(f"exchange frames per round / n, mpi {ranks} ranks {label}", frames / ranks, 3.0, "frames"))
    path = write_results("exchange", {"iterations": args.iterations, "rows": rows}, goals)
    print_goals(goals)
    print(f"-> {path}")
    return 0 if all(goal.met for goal in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
