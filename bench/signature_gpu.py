"""Benchmark and check: the tensor signature of a CUDA tensor (Triton kernel, SIG-7) beside a
device-to-device copy of the same bytes. Writes bench/results/signature_gpu.json.

Checks (exit status 1 if one fails): the GPU signature equals the CPU signature of the same
bytes for fp32, bf16, fp16, fp64 and int8 tensors of several sizes (block boundaries and a
padded tail included); every single-bit flip of a 4 KiB tensor changes it, on the device.
Goal (spec/replay.md SIG-12): signature bandwidth >= 50 % of the device-to-device copy's, both counted
as bytes of the tensor per second, medians of CUDA-event-timed repeats, for 1 GiB of fp32 and
of bf16. Several launch shapes are timed; the goal uses the one the library uses.
Without CUDA or Triton it writes the reason and exits 0 (nothing to measure here).

Run on a GPU host: python bench/signature_gpu.py   (the GPU script tests/gpu/run.py runs it)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import Goal, at_least, print_goals, write_results  # noqa: E402

from scout.replay import _gpu, signature  # noqa: E402

GOAL_FRACTION_OF_COPY = 0.5
SHAPES = ((1024, 4, 4), (1024, 8, 8), (2048, 4, 8), (4096, 2, 8), (512, 8, 4))


def _median_seconds(function: Callable[[], object], repeats: int) -> float:
    function()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def check_equal_to_cpu() -> list[str]:
    problems = []
    per_program = _gpu.BLOCK_WORDS * _gpu.BLOCKS_PER_PROGRAM
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8):
        size = torch.empty((), dtype=dtype).element_size()
        for count in (1, 4099, (8 * 3 * per_program) // size + 3, (64 << 20) // size + 1):
            cpu = (torch.randn(count, generator=torch.Generator().manual_seed(count)) * 30).to(dtype)
            gpu_value, cpu_value = signature.tensor_signature(cpu.cuda()), signature.tensor_signature(cpu)
            if gpu_value != cpu_value:
                problems.append(f"{dtype} x {count}: GPU {gpu_value:#x} != CPU {cpu_value:#x}")
    return problems


def check_every_flip() -> list[str]:
    raw = torch.randint(0, 256, (4096 + 5,), dtype=torch.uint8, device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(5))
    before = signature.tensor_signature(raw)
    unseen = []
    for byte in range(raw.numel()):
        for bit in range(8):
            raw[byte] ^= 1 << bit
            if signature.tensor_signature(raw) == before:
                unseen.append((byte, bit))
            raw[byte] ^= 1 << bit
    return [f"{len(unseen)} single-bit flips unseen, e.g. {unseen[:5]}"] if unseen else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", type=Path, default=None)
    arguments = parser.parse_args()
    reason = None if torch.cuda.is_available() else "no CUDA device"
    reason = reason or _gpu.unavailable_reason()
    if reason is not None:
        path = write_results("signature_gpu", {"skipped": reason}, [], arguments.output)
        print(f"signature_gpu: skipped ({reason}) -> {path}")
        return 0

    problems = check_equal_to_cpu() + check_every_flip()
    byte_count = arguments.size_mib << 20
    rows: dict[str, dict[str, float]] = {}
    goals: list[Goal] = []
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        source = torch.randn(byte_count // torch.empty((), dtype=dtype).element_size(),
                             device="cuda", dtype=dtype)
        destination = torch.empty_like(source)
        copy_s = _median_seconds(lambda s=source, d=destination: d.copy_(s), arguments.repeats)
        words = source.view(torch.int64)
        shapes = {}
        for block, steps, warps in SHAPES:
            seconds = _median_seconds(
                lambda w=words, b=block, k=steps, n=warps: _gpu.content_words(w, b, k, n),
                arguments.repeats,
            )
            shapes[f"block{block}_steps{steps}_warps{warps}"] = round(byte_count / seconds / 1e9, 1)
        library_s = _median_seconds(lambda s=source: signature.tensor_signature(s), arguments.repeats)
        sixteenth = source[: source.numel() // 16]
        torch_ops_s = _median_seconds(
            lambda s=sixteenth: signature._tensor_signature_torch_only(s), 3
        ) * 16
        copy_gb_s = byte_count / copy_s / 1e9
        library_gb_s = byte_count / library_s / 1e9
        rows[name] = {
            "copy_gb_per_s": round(copy_gb_s, 1),
            "tensor_signature_gb_per_s": round(library_gb_s, 1),
            "torch_ops_gb_per_s": round(byte_count / torch_ops_s / 1e9, 1),
            **{f"kernel_{k}_gb_per_s": v for k, v in shapes.items()},
        }
        goals.append(at_least(f"signature GPU {name} vs d2d copy", library_gb_s / copy_gb_s,
                              GOAL_FRACTION_OF_COPY, "x", f"{library_gb_s:.0f} vs {copy_gb_s:.0f} GB/s"))
        del source, destination, words
        torch.cuda.empty_cache()
    payload = {
        "device": torch.cuda.get_device_name(),
        "size_mib": arguments.size_mib,
        "checks_failed": problems,
        "rows": rows,
        "torch": torch.__version__,
    }
    path = write_results("signature_gpu", payload, goals, arguments.output)
    for name, row in rows.items():
        print(name, row)
    for problem in problems:
        print(f"CHECK FAILED: {problem}")
    print_goals(goals)
    print(f"-> {path}")
    if problems:
        return 1
    return 0 if all(goal.met for goal in goals) else 3


if __name__ == "__main__":
    sys.exit(main())
