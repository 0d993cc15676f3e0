"""Benchmark: tensor_signature on 512 MiB of fp32, one CPU thread, beside xxh3 and a plain copy
into a preallocated buffer, all measured in the same run. Writes bench/results/signature.json.

Goal (SIG-12): >= 10 GB/s. Figures to beat (docs/prior-art.md; measured on the same class of machine): the
reference's signature 0.6-0.7 GB/s; xxh3 16-19 GB/s; copy into preallocated memory 9-10 GB/s.
Every buffer is allocated and written before timing, so no timed pass pays fresh-page faults
(about 1.6 GB/s here). The torch-ops fallback is measured too, on a smaller tensor.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/signature.py [--size-mib 512] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from scout.replay import signature  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "signature.json"
GOAL_GB_PER_S = 10.0


def measure(function: Callable[[], object], byte_count: int, repeats: int) -> dict[str, float]:
    function()  # warm-up: loads the kernel, touches the caches
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return {
        "gb_per_s_median": round(byte_count / statistics.median(seconds) / 1e9, 2),
        "gb_per_s_best": round(byte_count / min(seconds) / 1e9, 2),
        "seconds_median": round(statistics.median(seconds), 5),
        "repeats": repeats,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--fallback-size-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS)
    arguments = parser.parse_args()
    torch.set_num_threads(1)

    byte_count = arguments.size_mib * 2**20
    source = torch.empty(byte_count // 4, dtype=torch.float32)
    source.normal_(generator=torch.Generator().manual_seed(2608))
    destination = torch.empty_like(source)
    destination.copy_(source)  # fault every destination page in before timing

    rows: dict[str, dict[str, float] | str | None] = {}
    backend = signature.signature_backend("cpu")
    rows["tensor_signature"] = measure(
        lambda: signature.tensor_signature(source), byte_count, arguments.repeats
    )
    rows["copy_into_preallocated"] = measure(
        lambda: destination.copy_(source), byte_count, arguments.repeats
    )
    try:
        import xxhash
    except ImportError:
        rows["xxh3_64"] = "not installed (pip install -r requirements-dev.txt)"
    else:
        view = memoryview(source.numpy()).cast("B")
        rows["xxh3_64"] = measure(
            lambda: xxhash.xxh3_64_intdigest(view), byte_count, arguments.repeats
        )
    fallback_bytes = min(byte_count, arguments.fallback_size_mib * 2**20)
    fallback_source = source[: fallback_bytes // 4]
    rows["torch_ops_fallback"] = measure(
        lambda: signature._tensor_signature_torch_only(fallback_source),
        fallback_bytes,
        max(3, arguments.repeats // 2),
    )
    rows["torch_ops_fallback"]["size_mib"] = fallback_bytes / 2**20

    achieved = rows["tensor_signature"]
    assert isinstance(achieved, dict)
    result = {
        "benchmark": "signature",
        "dtype": "float32",
        "size_mib": arguments.size_mib,
        "threads": torch.get_num_threads(),
        "backend": backend.value,
        "goal_gb_per_s": GOAL_GB_PER_S,
        "meets_goal": achieved["gb_per_s_median"] >= GOAL_GB_PER_S,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "rows": rows,
    }
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        if isinstance(row, dict):
            print(
                f"{name:26s} {row['gb_per_s_median']:7.2f} GB/s median "
                f"({row['gb_per_s_best']:.2f} best)"
            )
        else:
            print(f"{name:26s} {row}")
    print(f"backend={backend.value} goal {GOAL_GB_PER_S} GB/s met: {result['meets_goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
