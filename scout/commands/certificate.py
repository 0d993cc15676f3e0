"""``scout certificate RUN_DIR|MANIFEST [STEP]``: show the coverage certificate of a recovery-verified
checkpoint -- which recipes were replayed in the cycle before and the cycle after its capture, at
which steps, with which verdicts from which peer groups (docs/design.md §2.3; docs/gate.md).

RUN_DIR is a run directory of ``scout.attach`` (its manifest is ``RUN_DIR/gate``); MANIFEST is a
manifest directory (the newest good generation is read) or one generation file.
STEP picks the verified checkpoint at that step; without it, the newest verified one. ``--json``
prints the documented certificate object; ``--list`` lists every checkpoint and its trust.
Exit status: 0 shown, 1 no such verified checkpoint (or its certificate does not hold), 2 the
manifest cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from scout.gate.codec import CERTIFICATE_CLAIM, CodecError, certificate_to_json, state_from_json
from scout.gate.manifest import (
    LoadedManifest,
    ManifestError,
    ManifestFallbackWarning,
    decode_manifest,
    load_manifest,
)
from scout.gate.model import (
    Certificate,
    CheckpointEntry,
    CycleRecord,
    GateConfig,
    Trust,
    is_complete_and_clean,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "certificate",
        help="print the coverage certificate of a recovery-verified checkpoint from a gate manifest",
        description=(
            "Print what a RECOVERY_VERIFIED checkpoint's certification rests on: every replay of the "
            "cycle before its capture and the cycle after, with each peer group's verdict."
        ),
    )
    parser.add_argument("manifest", type=Path,
                        help="run directory, manifest directory, or one manifest.<generation>.json file")
    parser.add_argument("step", type=int, nargs="?", help="training step of the checkpoint (default: newest verified)")
    parser.add_argument("--json", action="store_true", help="print the certificate as JSON (schema in docs/gate.md)")
    parser.add_argument("--list", action="store_true", help="list every checkpoint in the manifest and its trust")
    parser.add_argument("--job-id", help="refuse a manifest of another job (default: accept the job it names)")
    parser.set_defaults(func=run)


def _load(path: Path, job_id: str | None) -> LoadedManifest | None:
    if (path / "gate").is_dir():  # a run directory of scout.attach: its manifest is run_dir/gate
        path = path / "gate"
    if path.is_dir():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ManifestFallbackWarning)
            loaded = load_manifest(path, job_id)
        for warning in caught:
            print(f"scout certificate: warning: {warning.message}", file=sys.stderr)
        return loaded
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ManifestError(f"{path}: cannot read: {error}") from error
    try:
        return decode_manifest(data, path, job_id)
    except ManifestError:
        raise
    except Exception as error:  # the private damage type: report it like the reader does
        raise ManifestError(f"{path}: not a good manifest generation: {error}") from error


def _record_lines(role: str, record: CycleRecord, groups: tuple[str, ...]) -> list[str]:
    lines = [f"cycle {record.cycle} ({role} capture, steps {record.start_step}..{record.end_step}): {len(record.replays)} replay(s)"]
    recipe_width = max([len("recipe"), *(len(r.recipe) for r in record.replays)])
    step_width = max([len("step"), *(len(str(r.step)) for r in record.replays)])
    header = f"  {'recipe':<{recipe_width}}  {'step':>{step_width}}  " + "  ".join(f"{g:<12}" for g in groups)
    lines.append(header.rstrip())
    for replay in record.replays:
        by_group = {v.group: v.outcome.value for v in replay.verdicts}
        cells = "  ".join(f"{by_group.get(g, 'n/a'):<12}" for g in groups)
        lines.append(f"  {replay.recipe:<{recipe_width}}  {replay.step:>{step_width}}  {cells}".rstrip())
    return lines


def expert_regime_lines(certificate: Certificate) -> list[str]:
    """The expert regimes replayed in each cycle (spec/moe.md MOE-1, MOE-5): an expert recipe
    ``expert.<slot>@<n_exec>`` is slot ``slot`` replayed at its regime's representative."""
    lines = []
    for role, record in (("before", certificate.before), ("after", certificate.after)):
        experts = sorted({r.recipe for r in record.replays if r.recipe.startswith("expert.")})
        if experts:
            lines.append(f"expert regimes replayed in cycle {record.cycle} ({role}): {', '.join(experts)}")
    return lines


def render_certificate(certificate: Certificate, entry: CheckpointEntry, config: GateConfig, source: str) -> str:
    before, after = certificate.before, certificate.after
    lines = [
        f"Coverage certificate: checkpoint {entry.id} ({entry.trust.value}), job {config.job_id}",
        f"source: {source}",
        f"promoted at step {certificate.promoted_at_step}; catalog {len(certificate.recipes)} recipe(s): "
        f"{', '.join(certificate.recipes)}; peer groups: {', '.join(certificate.groups)}",
        *expert_regime_lines(certificate),
        *(f"coverage note: {note}" for note in config.coverage_notes),
        "",
        *_record_lines("before", before, certificate.groups),
        "",
        *_record_lines("after", after, certificate.groups),
        "",
        f"claim: {CERTIFICATE_CLAIM}",
    ]
    return "\n".join(lines) + "\n"


def _holds(certificate: Certificate, entry: CheckpointEntry, config: GateConfig) -> bool:
    return (
        certificate.checkpoint == entry.id
        and is_complete_and_clean(config, certificate.before)
        and is_complete_and_clean(config, certificate.after)
        and certificate.before.end_step == entry.id.step == certificate.after.start_step
    )


def run(args: argparse.Namespace) -> int:
    try:
        loaded = _load(args.manifest, args.job_id)
        if loaded is None:
            print(f"scout certificate: {args.manifest} holds no manifest yet", file=sys.stderr)
            return 2
        gate = loaded.payload.get("gate")
        state = state_from_json(gate)
    except (ManifestError, CodecError) as error:
        print(f"scout certificate: {error}", file=sys.stderr)
        return 2
    context = state.context
    source = f"{loaded.path} (generation {loaded.generation})"
    if args.list:
        for entry in context.checkpoints:
            print(f"{str(entry.id):<14} {entry.trust.value:<18} {entry.reason}")
        return 0
    verified = [e for e in context.checkpoints if e.trust is Trust.RECOVERY_VERIFIED]
    if args.step is None:
        if not verified:
            print(f"scout certificate: no RECOVERY_VERIFIED checkpoint in {source}", file=sys.stderr)
            return 1
        entry = max(verified, key=lambda e: e.id.step)
    else:
        matches = [e for e in context.checkpoints if e.id.step == args.step]
        chosen = [e for e in matches if e.trust is Trust.RECOVERY_VERIFIED]
        if not chosen:
            known = "; ".join(f"{e.id} is {e.trust.value}: {e.reason}" for e in matches) or "no checkpoint at that step"
            steps = ", ".join(str(e.id.step) for e in verified) or "none"
            print(
                f"scout certificate: no certificate for step {args.step} ({known}); verified steps: {steps}",
                file=sys.stderr,
            )
            return 1
        entry = chosen[0]
    certificate = entry.certificate
    if certificate is None or not _holds(certificate, entry, context.config):
        print(f"scout certificate: the certificate of {entry.id} in {source} does not hold; do not trust it", file=sys.stderr)
        return 1
    if args.json:
        document = certificate_to_json(certificate, context.config.job_id)
        document["manifest"] = {"path": str(loaded.path), "generation": loaded.generation}
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        sys.stdout.write(render_certificate(certificate, entry, context.config, source))
    return 0
