"""Build an MoE regime catalog by profiling (spec/moe.md MOE-4..MOE-7; ``scout moe-catalog``).

For every MoE layer and every candidate ``n_exec`` the grouped-experts module is run once --
forward and backward, the one-hot count vector of one expert, deterministic algorithms, exactly
as an expert replay runs it -- and the backend's report of what ran becomes the execution
fingerprint of that (expert GEMM, ``n_exec``):

- CUDA: the kernels ``torch.profiler`` saw launched (name, grid, block);
- CPU: the matrix-multiply operators the dispatcher ran (op, shapes, strides, dtype, and a
  backend tag naming the CPU BLAS path the build has).

The pure part (``scout.core.moe``) groups ``n_exec`` values with equal fingerprints into regimes,
keeps each regime's Pareto-maximal members, and decides which heterogeneous templates the
catalog qualifies. The catalog is bound to this environment (torch version, device, dtype,
model description) and refuses to load anywhere else (MOE-7).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from scout.core.moe import (
    ExecRecord,
    Fingerprint,
    RegimeCatalog,
    Template,
    build_layer_catalog,
    qualify_template,
)
from scout.replay.moe import ExpertLayers, local_expert_count
from scout.replay.replay import deterministic_algorithms

__all__ = [
    "catalog_environment",
    "default_templates",
    "fingerprint_call",
    "load_catalog",
    "profile_catalog",
    "save_catalog",
]

#: CPU operators that are the expert GEMM (MOE-4): matrix products in every form the dispatcher
#: reports them.
_GEMM_OPS = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot",
             "_grouped_mm", "_scaled_grouped_mm", "_scaled_mm", "convolution")


def _cpu_tag() -> str:
    mkldnn = bool(torch.backends.mkldnn.is_available()) and bool(torch.backends.mkldnn.enabled)  # type: ignore[no-untyped-call]
    return f"cpu/mkldnn={int(mkldnn)}"


class _GemmRecorder(TorchDispatchMode):
    """Records every GEMM-family operator the dispatcher runs (CPU fingerprints)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.records: list[ExecRecord] = []
        self.tag = _cpu_tag()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if name in _GEMM_OPS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.records.append(ExecRecord(
                op=name,
                shapes=tuple(tuple(int(d) for d in t.shape) for t in tensors),
                strides=tuple(tuple(int(s) for s in t.stride()) for t in tensors),
                dtype=",".join(str(t.dtype).removeprefix("torch.") for t in tensors),
                tag=self.tag,
            ))
        return func(*args, **(kwargs or {}))


def _run(module: nn.Module, x: torch.Tensor, counts: torch.Tensor) -> None:
    """Forward and backward as an expert replay runs them (REPLAY-4, REPLAY-5)."""
    parameters = {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in module.named_parameters()}
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    with deterministic_algorithms(True), torch.enable_grad():
        output = torch.func.functional_call(module, parameters, (x, counts))
        targets = [t for t in [x, *parameters.values()] if t.requires_grad]
        torch.autograd.grad([output], targets, [torch.ones_like(output)], allow_unused=True)


def _cuda_kernels(module: nn.Module, x: torch.Tensor, counts: torch.Tensor) -> tuple[list[ExecRecord], str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        _run(module, x, counts)
        torch.cuda.synchronize(x.device)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "trace.json")
        profiler.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    records: list[ExecRecord] = []
    for event in events:
        if event.get("cat") != "kernel":
            continue
        args = event.get("args", {})
        grid, block = args.get("grid"), args.get("block")
        if grid is None or block is None:
            return records, f"kernel {event.get('name')!r} has no grid/block in the profile"
        records.append(ExecRecord(op=str(event.get("name")), grid=tuple(int(g) for g in grid),
                                  block=tuple(int(b) for b in block)))
    return records, "" if records else "the profiler saw no kernel launch"


def fingerprint_call(module: nn.Module, x: torch.Tensor, counts: Sequence[int], n_exec: int = 0) -> Fingerprint:
    """MOE-4: the execution fingerprint of one grouped call with per-expert ``counts``."""
    counts_tensor = torch.tensor(list(counts), dtype=torch.int64, device=x.device)
    if x.device.type == "cuda":
        records, problem = _cuda_kernels(module, x, counts_tensor)
    else:
        recorder = _GemmRecorder()
        with recorder:
            _run(module, x, counts_tensor)
        records = recorder.records
        problem = "" if records else "the dispatcher reported no matrix product"
    return Fingerprint(n_exec, tuple(records), complete=not problem, reason=problem)


def _input_width(module: nn.Module) -> int:
    """The model dimension the grouped experts take: the last dimension of the first grouped
    parameter (``[experts, hidden, dim]``, TorchTitan's ``w1``)."""
    for parameter in module.parameters():
        if parameter.dim() >= 3:
            return int(parameter.shape[-1])
    raise ValueError(f"{type(module).__qualname__} has no grouped parameter")


def default_templates(experts: int, n_values: Sequence[int]) -> list[tuple[int, ...]]:
    """A few deterministic heterogeneous count vectors over the profiled values: skewed (one
    expert takes the most, the rest the least), alternating, and a staircase."""
    ordered = sorted(n_values)
    low, high = ordered[0], ordered[-1]
    templates = [tuple([high] + [low] * (experts - 1)),
                 tuple(high if e % 2 == 0 else low for e in range(experts)),
                 tuple(ordered[e % len(ordered)] for e in range(experts))]
    return [t for t in dict.fromkeys(templates) if len(set(t)) > 1]


def catalog_environment(model_description: str, device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """MOE-7: what a catalog is bound to."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"torch": torch.__version__, "device": f"{device.type}:{name}", "dtype": str(dtype),
            "model": model_description}


def describe_experts(experts: ExpertLayers) -> str:
    """The model part a catalog depends on: each layer's grouped parameter shapes and dtypes."""
    return ";".join(
        f"{type(m).__qualname__}(" + ",".join(f"{n}:{tuple(p.shape)}:{str(p.dtype).removeprefix('torch.')}"
                                            for n, p in m.named_parameters()) + ")"
        for m in experts.layers
    )


def profile_catalog(
    experts: ExpertLayers,
    n_values: Sequence[int],
    *,
    templates: Sequence[Sequence[int]] | None = None,
    seed: int = 2608,
) -> RegimeCatalog:
    """Profile every (layer, ``n_exec``) and build the regime catalog (MOE-4..MOE-7).
    ``templates``: heterogeneous count vectors to qualify (default :func:`default_templates`)."""
    values = sorted({int(n) for n in n_values})
    if not values or values[0] < 1:
        raise ValueError(f"n_exec values must be ints >= 1, got {list(n_values)}")
    layers = []
    all_templates: list[Template] = []
    per_layer = experts.experts_per_layer
    first = next(experts.layers[0].parameters())
    device, dtype = first.device, first.dtype
    for layer_index, module in enumerate(experts.layers):
        count = local_expert_count(module)
        generator = torch.Generator().manual_seed(seed + layer_index)
        width = _input_width(module)
        pool = torch.randn(max(values) * count, width, generator=generator).to(device=device, dtype=dtype)
        # The expert GEMM is the same for every expert of the layer: profile expert 0 alone.
        fingerprints = []
        alone: dict[int, Fingerprint] = {}
        for n in values:
            counts = [n] + [0] * (count - 1)
            fingerprint = fingerprint_call(module, pool[:n], counts, n)
            fingerprints.append(fingerprint)
            alone[n] = fingerprint
        slots = tuple(layer_index * per_layer + e for e in range(per_layer))
        catalog_layer = build_layer_catalog(layer_index, slots, fingerprints)
        layers.append(catalog_layer)
        for template in (templates if templates is not None else default_templates(count, values)):
            vector = tuple(int(c) for c in template)
            if len(vector) != count:
                raise ValueError(f"template {list(vector)} has {len(vector)} counts for {count} local experts")
            call = fingerprint_call(module, pool[: sum(vector)], vector)
            per_expert = {}
            for expert, c in enumerate(vector):
                if c > 0:
                    one_hot = [0] * count
                    one_hot[expert] = c
                    per_expert[expert] = fingerprint_call(module, pool[:c], one_hot, c).records
            all_templates.append(qualify_template(catalog_layer, vector, call.records, per_expert))
    environment = catalog_environment(describe_experts(experts), device, dtype)
    return RegimeCatalog(tuple(sorted(environment.items())), tuple(layers), tuple(all_templates))


def save_catalog(catalog: RegimeCatalog, path: str | os.PathLike[str]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_suffix(target.suffix + ".tmp")
    scratch.write_text(json.dumps(catalog.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(scratch, target)


def load_catalog(path: str | os.PathLike[str], experts: ExpertLayers) -> RegimeCatalog:
    """Read a catalog and refuse it unless it was built for these experts here (MOE-7)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the MoE regime catalog {path}: {error}") from error
    first = next(experts.layers[0].parameters())
    return RegimeCatalog.from_json(data, catalog_environment(describe_experts(experts), first.device, first.dtype))
