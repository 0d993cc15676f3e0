"""``scout moe-catalog --model MODULE:FACTORY --n-exec 1,2,4,... --out CATALOG.json``: build an
MoE regime catalog by profiling (spec/moe.md MOE-4..MOE-7).

MODULE is imported with the current directory first on the import path. FACTORY is called
(with ``--kwargs`` as JSON keyword arguments) to build the model; its grouped-experts modules
(``--experts``, else found as spec/moe.md MOE-9 says) are profiled at every ``n_exec`` on ``--device`` in
``--dtype``. The catalog lists each MoE layer's regimes, the replayed representatives, the
heterogeneous templates it qualifies, and the environment it is bound to; `scout.attach`'s
expert replay and the TorchTitan integration load it and refuse one built elsewhere.
Exit status: 0 written, 2 bad arguments or the model cannot be built.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "moe-catalog",
        help="profile a model's MoE experts and write the regime catalog expert replay uses",
        description="Profile every MoE layer's expert GEMM at each n_exec, group the values into regimes by "
                    "execution fingerprint, keep each regime's Pareto-maximal representatives, and write the "
                    "versioned catalog bound to this environment.",
    )
    parser.add_argument("--model", required=True, help="MODULE:FACTORY that returns the model (an nn.Module)")
    parser.add_argument("--kwargs", default="{}", help="JSON keyword arguments for FACTORY")
    parser.add_argument("--experts", default=None,
                        help="the grouped-experts modules, comma-separated names from model.named_modules() "
                             "(default: modules named GroupedExperts or subclasses, else found by structure; "
                             "spec/moe.md MOE-9)")
    parser.add_argument("--n-exec", required=True, help="comma-separated per-expert row counts, e.g. 1,2,4,8,16")
    parser.add_argument("--template", action="append", default=None,
                        help="a heterogeneous per-expert count vector to qualify, comma-separated (repeatable; "
                             "default: a few skewed ones over the n_exec values)")
    parser.add_argument("--device", default="cpu", help="device to profile on (default cpu)")
    parser.add_argument("--dtype", default=None, help="parameter dtype, e.g. bfloat16 (default: the model's)")
    parser.add_argument("--out", required=True, help="where to write the catalog JSON")
    parser.set_defaults(func=run)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"scout moe-catalog: {what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise SystemExit(f"scout moe-catalog: {what} is empty")
    return values


def run(args: argparse.Namespace) -> int:
    import torch

    from scout.replay.moe import ExpertLayers
    from scout.replay.moe_catalog import profile_catalog, save_catalog

    module_name, _, factory_name = args.model.partition(":")
    if not module_name or not factory_name:
        print(f"scout moe-catalog: --model must be MODULE:FACTORY, got {args.model!r}", file=sys.stderr)
        return 2
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # MOE-9: the user's module from the current directory, as `python -c`
    names = () if args.experts is None else tuple(n.strip() for n in args.experts.split(",") if n.strip())
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
        model = factory(**json.loads(args.kwargs))
        model = model.to(device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None)
        experts = ExpertLayers.discover(model, names)
        templates = None if args.template is None else [_ints(t, "--template") for t in args.template]
        catalog = profile_catalog(experts, _ints(args.n_exec, "--n-exec"), templates=templates)
    except (ImportError, AttributeError, ValueError, TypeError) as error:
        print(f"scout moe-catalog: {error}", file=sys.stderr)
        return 2
    save_catalog(catalog, args.out)
    summary = catalog.to_json()["summary"]
    print(f"wrote {args.out}: {len(catalog.layers)} MoE layer(s), {summary['compressed_keys']} expert recipe(s) "
          f"instead of {summary['exact_keys']} exact keys")
    for layer in catalog.layers:
        for regime in layer.regimes:
            kind = " (exact: " + regime.reason + ")" if regime.exact else ""
            print(f"  layer {layer.layer}: n_exec {list(regime.members)} -> replay {list(regime.representatives)}{kind}")
    for template in catalog.templates:
        print(f"  template layer {template.layer} {list(template.counts)}: "
              f"{'qualified' if template.qualified else 'not qualified'} ({template.reason})")
    return 0
