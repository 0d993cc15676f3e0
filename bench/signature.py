"""Benchmark: tensor_signature on 512 MiB of fp32 and of bf16, one CPU thread, on every native
path this CPU runs (scalar, AVX2, AVX-512, NEON), beside xxh3 and a copy into a preallocated
buffer, all in the same run. Writes bench/results/signature.json.

Goals (spec/replay.md SIG-12): the dispatched path >= xxh3 and >= the copy; the AVX2 path, where the
CPU has it, >= xxh3 too (the issue's AVX2-only machines). Figures are medians of interleaved
rounds -- each round times the copy, xxh3 and every path once, so a change of the machine's load
hits all alike -- with min and max beside them. Every buffer is allocated and written before
timing, so no timed pass pays fresh-page faults. The torch-ops fallback is measured on a smaller
tensor.

Run: ./dev py bench/signature.py [--size-mib 512] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import Goal, at_least, print_goals, spread, write_results  # noqa: E402

from scout.replay import signature  # noqa: E402


def _time_once(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--fallback-size-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", type=Path, default=None)
    arguments = parser.parse_args()
    torch.set_num_threads(1)

    byte_count = arguments.size_mib * 2**20
    fp32 = torch.empty(byte_count // 4, dtype=torch.float32)
    fp32.normal_(generator=torch.Generator().manual_seed(2608))
    bf16 = torch.empty(byte_count // 2, dtype=torch.bfloat16)
    bf16.normal_(generator=torch.Generator().manual_seed(2609))
    destination = torch.empty_like(fp32)
    destination.copy_(fp32)  # fault every destination page in before timing

    paths = signature.native_paths()
    dispatched = signature.native_path()
    cases: dict[str, Callable[[], object]] = {
        "copy_into_preallocated": lambda: destination.copy_(fp32),
    }
    try:
        import xxhash
    except ImportError:
        print("xxhash is not installed (pip install -r requirements-dev.txt)", file=sys.stderr)
        return 2
    view = memoryview(fp32.numpy()).cast("B")
    cases["xxh3_64"] = lambda: xxhash.xxh3_64_intdigest(view)
    for path in paths:
        for name, tensor in (("fp32", fp32), ("bf16", bf16)):
            cases[f"signature_{path}_{name}"] = (
                lambda t=tensor, p=path: signature._tensor_signature_on_path(t, p)
            )
    if dispatched is not None:
        cases["tensor_signature_fp32"] = lambda: signature.tensor_signature(fp32)

    for function in cases.values():
        function()  # warm-up: loads the kernel, touches the caches
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(arguments.repeats):
        for name, function in cases.items():
            seconds[name].append(_time_once(function))

    rows: dict[str, dict[str, float]] = {}
    for name, values in seconds.items():
        rates = [byte_count / s / 1e9 for s in values]
        rows[name] = {f"gb_per_s_{k}": round(v, 2) for k, v in spread(rates).items() if k != "n"}
        rows[name]["repeats"] = len(values)
    fallback_bytes = min(byte_count, arguments.fallback_size_mib * 2**20)
    fallback_source = fp32[: fallback_bytes // 4]
    fallback = [
        fallback_bytes / _time_once(lambda: signature._tensor_signature_torch_only(fallback_source)) / 1e9
        for _ in range(3)
    ]
    rows["torch_ops_fallback"] = {
        "gb_per_s_median": round(statistics.median(fallback), 2),
        "size_mib": fallback_bytes / 2**20,
    }

    copy = rows["copy_into_preallocated"]["gb_per_s_median"]
    xxh3 = rows["xxh3_64"]["gb_per_s_median"]
    ratios = {
        name: {
            "vs_xxh3": round(row["gb_per_s_median"] / xxh3, 3),
            "vs_copy": round(row["gb_per_s_median"] / copy, 3),
        }
        for name, row in rows.items()
        if name.startswith("signature_")
    }
    goals: list[Goal] = []
    if dispatched is not None:
        for name in ("fp32", "bf16"):
            measured = rows[f"signature_{dispatched}_{name}"]["gb_per_s_median"]
            goals.append(at_least(f"signature CPU {dispatched} {name} vs xxh3", measured / xxh3, 1.0, "x"))
            goals.append(at_least(f"signature CPU {dispatched} {name} vs copy", measured / copy, 1.0, "x"))
    if "avx2" in paths and dispatched != "avx2":
        measured = rows["signature_avx2_fp32"]["gb_per_s_median"]
        goals.append(at_least("signature CPU avx2 fp32 vs xxh3", measured / xxh3, 1.0, "x"))
    payload = {
        "size_mib": arguments.size_mib,
        "threads": torch.get_num_threads(),
        "paths": list(paths),
        "dispatched_path": dispatched,
        "backend": signature.signature_backend("cpu").value,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "processor": platform.processor(),
        "rows": rows,
        "ratios": ratios,
    }
    path = write_results("signature", payload, goals, arguments.output)
    for name, row in rows.items():
        extra = ""
        if name in ratios:
            extra = f"  {ratios[name]['vs_xxh3']:.2f}x xxh3, {ratios[name]['vs_copy']:.2f}x copy"
        spread_text = (
            f" (min {row['gb_per_s_min']:.2f}, max {row['gb_per_s_max']:.2f})" if "gb_per_s_min" in row else ""
        )
        print(f"{name:28s} {row['gb_per_s_median']:7.2f} GB/s median{spread_text}{extra}")
    print_goals(goals)
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
