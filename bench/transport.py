"""Benchmark: the MPI and torch.distributed bindings beside the raw library calls, 4 ranks.

Per-call latency (median and p90 over a bounded number of iterations, buffers preallocated) of
all_gather and of the exchange, for 8-byte and 1 MiB payloads:

* MPI (``mpiexec -n 4``): raw mpi4py ``Allgather`` on numpy buffers, the binding's
  ``all_gather_into`` fast path and codec ``all_gather``; raw point-to-point ``Isend/Irecv`` to
  every peer beside the binding's ``exchange`` (what the exchange does underneath).
* torch (4 forked gloo ranks on CPU, store hosted by the launcher): raw
  ``torch.distributed.all_gather`` beside ``all_gather_tensor``; the store-backed codec
  ``all_gather`` and ``exchange`` for reference.

Each iteration starts after a raw barrier (untimed); its latency is the slowest rank's. Goals
(issue: transports): MPI ``all_gather_into`` <= 1.5x raw ``Allgather`` at 1 MiB; torch
``all_gather_tensor`` <= 1.2x raw ``all_gather`` at 1 MiB. Writes bench/results/transport.json.
Run: ./dev py bench/transport.py   (or ./dev bench)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RANKS = 4
SIZES = {"8B": 8, "1MiB": 1 << 20}
ITERATIONS = {"8B": 200, "1MiB": 100}
WARMUP = 5
TIMEOUT_S = 30.0  # every timed call's deadline; a benchmark call never waits longer
RUN_TIMEOUT_S = 300.0
GOALS = {"mpi": 1.5, "torch": 1.2}
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import at_most, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "transport.json"
REPO = Path(__file__).resolve().parents[1]


def _percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {
        "median_us": round(statistics.median(ordered) * 1e6, 1),
        "p90_us": round(p90 * 1e6, 1),
        "iterations": len(ordered),
    }


def _measure_interleaved(
    calls: dict[str, Callable[[int], Any]], sync: Callable[[], None], iterations: int
) -> dict[str, list[float]]:
    """This rank's latency of each ``call(i)``, each after an untimed ``sync()``.

    The calls take turns within every iteration, starting each iteration with the next call
    in line (raw, binding, ...; binding, ..., raw; ...), so that neither a change in the
    machine's load nor the position after the barrier favours one of them.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for index in range(WARMUP + iterations):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            call = calls[name]
            sync()
            start = time.perf_counter()
            call(index)
            elapsed = time.perf_counter() - start
            if index >= WARMUP:
                samples[name].append(elapsed)
    return samples


# -- MPI (one process per rank, under mpiexec) ------------------------------------------------


def _mpi_calls(
    comm: Any, transport: Any, nbytes: int, label: str
) -> dict[str, Callable[[int], Any]]:
    """The calls compared at one payload size, buffers allocated once."""
    import numpy as np
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.full(nbytes, rank, dtype=np.uint8)
    recv = np.empty(nbytes * size, dtype=np.uint8)
    payload = send.tobytes()
    peers = [p for p in range(size) if p != rank]
    inbox = [np.empty(nbytes, dtype=np.uint8) for _ in peers]
    first_round = 1 if label == "8B" else 1_000_000

    def raw_p2p(index: int) -> None:
        requests = [comm.Irecv(buffer, peer, 11) for buffer, peer in zip(inbox, peers, strict=True)]
        requests += [comm.Isend(send, peer, 11) for peer in peers]
        MPI.Request.Waitall(requests)

    def exchange(index: int) -> None:
        result = transport.exchange(payload, round_id=first_round + index, timeout_s=TIMEOUT_S)
        assert not result.missing, result.missing

    return {
        f"raw Allgather {label}": lambda i: comm.Allgather(send, recv),
        f"all_gather_into {label}": lambda i: transport.all_gather_into(
            send, recv, timeout_s=TIMEOUT_S
        ),
        f"all_gather (codec) {label}": lambda i: transport.all_gather(payload, timeout_s=TIMEOUT_S),
        f"raw Isend/Irecv {label}": raw_p2p,
        f"exchange {label}": exchange,
    }


def mpi_rank(out: Path) -> None:
    from mpi4py import MPI

    from scout.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD.Dup()
    transport = MpiTransport(MPI.COMM_WORLD, max_payload_bytes=2 << 20)
    rows: dict[str, list[float]] = {}
    for label, nbytes in SIZES.items():
        calls = _mpi_calls(comm, transport, nbytes, label)
        rows.update(_measure_interleaved(calls, comm.Barrier, ITERATIONS[label]))
    # The latency of an iteration is the slowest rank's.
    gathered = comm.gather(rows, root=0)
    transport.close()
    if comm.Get_rank() == 0:
        slowest = {
            name: [max(per_rank[name][i] for per_rank in gathered) for i in range(len(samples))]
            for name, samples in rows.items()
        }
        out.write_text(json.dumps(slowest))
    comm.Free()


def run_mpi(tmp: Path) -> dict[str, list[float]]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    launcher = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if launcher is None:
        raise SystemExit("no mpiexec: pip install mpi4py mpich")
    out = tmp / "mpi.json"
    command = [
        launcher,
        "-n",
        str(RANKS),
        sys.executable,
        __file__,
        "--role",
        "mpi",
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


# -- torch (forked gloo ranks; the launcher hosts the store) -----------------------------------


def _torch_calls(transport: Any, nbytes: int, label: str) -> dict[str, Callable[[int], Any]]:
    """The calls compared at one payload size, tensors allocated once."""
    import torch
    import torch.distributed as dist

    tensor = torch.full((nbytes,), transport.rank, dtype=torch.uint8)
    out_tensors = [torch.empty_like(tensor) for _ in range(transport.size)]
    payload = bytes(tensor.numpy())
    first_round = 1 if label == "8B" else 1_000_000

    def exchange(index: int) -> None:
        result = transport.exchange(payload, round_id=first_round + index, timeout_s=TIMEOUT_S)
        assert not result.missing, result.missing

    return {
        f"raw all_gather {label}": lambda i: dist.all_gather(out_tensors, tensor),
        f"all_gather_tensor {label}": lambda i: transport.all_gather_tensor(
            tensor, timeout_s=TIMEOUT_S, out=out_tensors
        ),
        f"all_gather (codec, store) {label}": lambda i: transport.all_gather(
            payload, timeout_s=TIMEOUT_S
        ),
        f"exchange (store) {label}": exchange,
    }


def torch_rank(rank: int, port: int, out: Path) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from scout.transport.nccl import TorchTransport

    torch.set_num_threads(1)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("pg", store),  # type: ignore[attr-defined]
        rank=rank,
        world_size=RANKS,
    )
    transport = TorchTransport(store=store, max_payload_bytes=2 << 20)
    rows: dict[str, list[float]] = {}
    for label, nbytes in SIZES.items():
        calls = _torch_calls(transport, nbytes, label)
        rows.update(_measure_interleaved(calls, dist.barrier, ITERATIONS[label]))
    transport.close()
    gathered: list[Any] = [None] * RANKS
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        slowest = {
            name: [max(per_rank[name][i] for per_rank in gathered) for i in range(len(samples))]
            for name, samples in rows.items()
        }
        out.write_text(json.dumps(slowest))
    dist.destroy_process_group()


def run_torch(tmp: Path) -> dict[str, list[float]]:
    """Fork the ranks after one ``import torch``; this process hosts the store."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    out = tmp / "torch.json"
    children = []
    for rank in range(RANKS):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                torch_rank(rank, port, out)
            except BaseException as exc:
                print(f"torch rank {rank}: {exc!r}", file=sys.stderr)
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    server = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False
    )  # type: ignore[attr-defined]
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


# -- report ------------------------------------------------------------------------------------


def _ratio(rows: dict[str, dict[str, float]], name: str, raw: str) -> float:
    return round(rows[name]["median_us"] / rows[raw]["median_us"], 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["mpi"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.role == "mpi":
        mpi_rank(args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="scout-bench-") as tmp:
        mpi = {name: _percentiles(s) for name, s in run_mpi(Path(tmp)).items()}
        torch_rows = {name: _percentiles(s) for name, s in run_torch(Path(tmp)).items()}
    ratios = {
        "mpi all_gather_into / raw Allgather": {
            label: _ratio(mpi, f"all_gather_into {label}", f"raw Allgather {label}")
            for label in SIZES
        },
        "mpi all_gather (codec) / raw Allgather": {
            label: _ratio(mpi, f"all_gather (codec) {label}", f"raw Allgather {label}")
            for label in SIZES
        },
        "mpi exchange / raw Isend/Irecv": {
            label: _ratio(mpi, f"exchange {label}", f"raw Isend/Irecv {label}") for label in SIZES
        },
        "torch all_gather_tensor / raw all_gather": {
            label: _ratio(torch_rows, f"all_gather_tensor {label}", f"raw all_gather {label}")
            for label in SIZES
        },
        "torch all_gather (codec, store) / raw all_gather": {
            label: _ratio(
                torch_rows, f"all_gather (codec, store) {label}", f"raw all_gather {label}"
            )
            for label in SIZES
        },
    }
    goals = {
        "mpi: all_gather_into <= 1.5x raw Allgather at 1 MiB": {
            "ratio": ratios["mpi all_gather_into / raw Allgather"]["1MiB"],
            "met": ratios["mpi all_gather_into / raw Allgather"]["1MiB"] <= GOALS["mpi"],
        },
        "torch: all_gather_tensor <= 1.2x raw all_gather at 1 MiB": {
            "ratio": ratios["torch all_gather_tensor / raw all_gather"]["1MiB"],
            "met": ratios["torch all_gather_tensor / raw all_gather"]["1MiB"] <= GOALS["torch"],
        },
    }
    report = {
        "benchmark": "transport",
        "ranks": RANKS,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "latency": "per call, slowest rank per iteration; median and p90 over iterations",
        "mpi": mpi,
        "torch": torch_rows,
        "ratios_of_medians": ratios,
        "goals": goals,
    }
    goal_list = [
        at_most("mpi all_gather_into vs raw Allgather, 1 MiB", ratios["mpi all_gather_into / raw Allgather"]["1MiB"], GOALS["mpi"], "x"),
        at_most("torch all_gather_tensor vs raw all_gather, 1 MiB", ratios["torch all_gather_tensor / raw all_gather"]["1MiB"], GOALS["torch"], "x"),
    ]
    report["goals_by_name"] = report.pop("goals")
    write_results("transport", report, goal_list, RESULTS)
    for binding, rows in (("mpi", mpi), ("torch", torch_rows)):
        for name, row in rows.items():
            print(
                f"{binding:6s} {name:36s} median {row['median_us']:9.1f} us  p90 {row['p90_us']:9.1f} us"
            )
    for goal, verdict in goals.items():
        print(f"goal {goal}: {verdict['ratio']}x {'met' if verdict['met'] else 'NOT met'}")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
