"""``scout certificate RUN_DIR|MANIFEST [STEP]``: show the coverage certificate of a recovery-verified
checkpoint -- which recipes were replayed in the cycle before and the cycle after its capture, at
which steps, with which verdicts from which peer groups (docs/design.md §2.3; docs/gate.md).

RUN_DIR is a run directory of ``scout.attach`` (its manifest is ``RUN_DIR/gate``); MANIFEST is a
manifest directory (read as every gate reader reads it: every surviving record folded, failing
closed when the newest generation is lost, spec/gate.md GATE-30, GATE-31) or one generation file.
STEP picks the verified checkpoint at that step; without it, the newest verified one. ``--json``
prints the documented certificate object; ``--list`` lists every checkpoint and its trust, and
for a framework's checkpoint its format, path and content digest (spec/frameworks.md FRAME-6).
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

from scout.core.machine import MachineState
from scout.gate.codec import CERTIFICATE_CLAIM, CodecError, certificate_to_json, state_from_json
from scout.gate.fold import certificate_holds
from scout.gate.manifest import ManifestError, read_manifest_file
from scout.gate.model import (
    Certificate,
    CheckpointEntry,
    CycleRecord,
    GateConfig,
    GateContext,
    Trust,
)
from scout.gate.recorder import inspect_gate

GateMachineState = MachineState[GateContext]


def _step(text: str) -> int:
    """A training step: an int >= 0 (argparse calls this; ValueError becomes one usage line)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"STEP must be a training step (an int >= 0), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"STEP must be a training step (an int >= 0), got {value}")
    return value


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
    parser.add_argument("step", type=_step, nargs="?", help="training step of the checkpoint (default: newest verified)")
    parser.add_argument("--json", action="store_true", help="print the certificate as JSON (schema in docs/gate.md)")
    parser.add_argument("--list", action="store_true", help="list every checkpoint in the manifest and its trust")
    parser.add_argument("--job-id", help="refuse a manifest of another job (default: accept the job it names)")
    parser.set_defaults(func=run)


def _load(path: Path, job_id: str | None) -> tuple[GateMachineState, str] | None:
    """The gate state and where it was read. A directory is read as every gate reader reads it
    (folded, failing closed: GATE-30, GATE-31), each warning one stderr line; a single file is
    that generation alone."""
    if (path / "gate").is_dir():  # a run directory of scout.attach: its manifest is run_dir/gate
        path = path / "gate"
    if path.is_dir():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reading = inspect_gate(path, job_id)
        for warning in caught:
            print(f"scout certificate: warning: {warning.message}", file=sys.stderr)
        if reading is None:
            return None
        if reading.fail_closed is not None:
            print(f"scout certificate: warning: fail-closed reading (GATE-31): {reading.fail_closed}; every "
                  "unverified checkpoint is shown QUARANTINED", file=sys.stderr)
        return reading.state, f"{reading.path} (generation {reading.generation})"
    loaded = read_manifest_file(path, job_id)
    return state_from_json(loaded.payload.get("gate")), f"{loaded.path} (generation {loaded.generation})"


def _record_lines(role: str, record: CycleRecord, groups: tuple[str, ...]) -> list[str]:
    live = sum(1 for replay in record.replays if replay.verdicts and all(v.self_checked for v in replay.verdicts))
    lines = [f"cycle {record.cycle} ({role} capture, steps {record.start_step}..{record.end_step}): "
             f"{len(record.replays)} replay(s), live path self-checked in {live} (AGREE+live, SELF-7)"]
    recipe_width = max([len("recipe"), *(len(r.recipe) for r in record.replays)])
    step_width = max([len("step"), *(len(str(r.step)) for r in record.replays)])
    header = f"  {'recipe':<{recipe_width}}  {'step':>{step_width}}  " + "  ".join(f"{g:<12}" for g in groups)
    lines.append(header.rstrip())
    for replay in record.replays:
        by_group = {v.group: v.outcome.value + ("+live" if v.self_checked else "") for v in replay.verdicts}
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
        *([] if entry.artifact is None else [
            f"framework checkpoint: {entry.artifact.format} {entry.artifact.path} ({entry.artifact.digest})"]),
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
    return certificate_holds(certificate, entry.id, config)


def run(args: argparse.Namespace) -> int:
    try:
        found = _load(args.manifest, args.job_id)
        if found is None:
            print(f"scout certificate: {args.manifest} holds no manifest yet", file=sys.stderr)
            return 2
    except (ManifestError, CodecError) as error:
        print(f"scout certificate: {error}", file=sys.stderr)
        return 2
    state, source = found
    context = state.context
    if args.list:
        for entry in context.checkpoints:
            print(f"{str(entry.id):<14} {entry.trust.value:<18} {entry.reason}")
            if entry.artifact is not None:  # FRAME-6: the framework's own checkpoint
                print(f"{'':<14} {entry.artifact.format} {entry.artifact.path} {entry.artifact.digest}")
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
        path, generation = source.rsplit(" (generation ", 1)
        document["manifest"] = {"path": path, "generation": int(generation.rstrip(")"))}
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        sys.stdout.write(render_certificate(certificate, entry, context.config, source))
    return 0
