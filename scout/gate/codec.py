"""Gate state, trust transitions and certificates as plain JSON values (pure).

The manifest (:mod:`scout.gate.manifest`) stores what this module makes; a restarted job decodes
it to resume its gate. Decoding validates every field and raises :class:`CodecError` naming the
path of the bad value (``checkpoints[2].trust``), because a manifest is read by other ranks and
other versions of scout. The JSON shapes are documented in ``docs/gate.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from scout.core.failure import FailureClass
from scout.core.guards import whole_number
from scout.core.machine import MachineState
from scout.gate.model import (
    Artifact,
    Certificate,
    CheckpointEntry,
    CheckpointId,
    CycleRecord,
    GateConfig,
    GateContext,
    GateState,
    GroupVerdict,
    Outcome,
    Recipe,
    Replay,
    SdcRecord,
    Trust,
    TrustChange,
)

__all__ = [
    "CERTIFICATE_SCHEMA",
    "CodecError",
    "certificate_from_json",
    "certificate_to_json",
    "config_from_json",
    "config_to_json",
    "state_from_json",
    "state_to_json",
    "transition_from_json",
    "transition_to_json",
]

CERTIFICATE_SCHEMA: Final = "scout.certificate/1"
CONTROL_STATES: Final = tuple(state.value for state in GateState)
#: What a certificate claims, word for word (docs/gate.md); printed with every certificate.
CERTIFICATE_CLAIM: Final = (
    "Every recipe of the catalog was replayed in the cycle before this checkpoint's capture and in "
    "the cycle after it, and every applicable peer group agreed (strict majority, no outlier, no "
    "missing peer) on every replay listed; where a verdict is self_checked, every peer's live output "
    "of that captured call also equalled its own replay of it. Nothing else is claimed: state no "
    "recipe covers, the live computation of calls that were not self-checked, and corruption shared "
    "by a majority of a group's replicas, are outside it."
)

GateMachineState = MachineState[GateContext]
T = TypeVar("T")


class CodecError(ValueError):
    """A JSON value does not describe a gate state; the message names the path and the value."""


# ------------------------------------------------------------------------------------------
# Encoding
# ------------------------------------------------------------------------------------------


def _checkpoint(checkpoint: CheckpointId) -> dict[str, int]:
    return {"timeline": checkpoint.timeline, "step": checkpoint.step}


def _verdict(verdict: GroupVerdict) -> dict[str, Any]:
    return {
        "group": verdict.group,
        "outcome": verdict.outcome.value,
        "outliers": list(verdict.outliers),
        "reason": verdict.reason,
        **({"self_checked": True} if verdict.self_checked else {}),  # SELF-7; absent: false
    }


def _replay(replay: Replay) -> dict[str, Any]:
    return {"recipe": replay.recipe, "step": replay.step, "verdicts": [_verdict(v) for v in replay.verdicts]}


def _record(record: CycleRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "cycle": record.cycle,
        "start_step": record.start_step,
        "end_step": record.end_step,
        "replays": [_replay(r) for r in record.replays],
    }


def config_to_json(config: GateConfig) -> dict[str, Any]:
    return {
        "job_id": config.job_id,
        "recipes": [
            {"id": r.id, "groups": None if r.groups is None else list(r.groups)} for r in config.recipes
        ],
        "groups": list(config.groups),
        **({"coverage_notes": list(config.coverage_notes)} if config.coverage_notes else {}),
    }


def certificate_to_json(certificate: Certificate, job_id: str) -> dict[str, Any]:
    """The documented certificate object (docs/gate.md, "Certificate JSON")."""
    before = _record(certificate.before)
    after = _record(certificate.after)
    assert before is not None and after is not None
    return {
        "schema": CERTIFICATE_SCHEMA,
        "job_id": job_id,
        "checkpoint": _checkpoint(certificate.checkpoint),
        "promoted_at_step": certificate.promoted_at_step,
        "catalog": list(certificate.recipes),
        "peer_groups": list(certificate.groups),
        "before": before,
        "after": after,
        "claim": CERTIFICATE_CLAIM,
    }


def _entry(entry: CheckpointEntry, job_id: str) -> dict[str, Any]:
    return {
        "checkpoint": _checkpoint(entry.id),
        "trust": entry.trust.value,
        "reason": entry.reason,
        "before": _record(entry.before),
        "certificate": None if entry.certificate is None else certificate_to_json(entry.certificate, job_id),
        # FRAME-6: the framework's checkpoint, when the framework wrote it (absent in older manifests).
        "artifact": None if entry.artifact is None else {
            "format": entry.artifact.format, "path": entry.artifact.path, "digest": entry.artifact.digest},
    }


def state_to_json(state: GateMachineState) -> dict[str, Any]:
    context = state.context
    job_id = context.config.job_id
    sdc = context.sdc
    return {
        "control": state.control,
        "config": config_to_json(context.config),
        "timeline": context.timeline,
        "cycle": context.cycle,
        "cycle_start_step": context.cycle_start_step,
        "covered": list(context.covered),
        "unchecked": list(context.unchecked),
        "replays": [_replay(r) for r in context.replays],
        "previous_clean": _record(context.previous_clean),
        "checkpoints": [_entry(e, job_id) for e in context.checkpoints],
        "last_step": context.last_step,
        "last_capture_step": context.last_capture_step,
        "sdc": None
        if sdc is None
        else {"recipe": sdc.recipe, "cycle": sdc.cycle, "step": sdc.step, "groups": list(sdc.groups)},
        "restart_cause": None if context.restart_cause is None else context.restart_cause.value,
    }


def transition_to_json(change: TrustChange, sequence: int) -> dict[str, Any]:
    """One entry of the manifest's trust-transition log; ``sequence`` counts from 1."""
    return {
        "sequence": sequence,
        "checkpoint": _checkpoint(change.checkpoint),
        "before": None if change.before is None else change.before.value,
        "after": change.after.value,
        "reason": change.reason,
    }


# ------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------


def _get(data: Mapping[str, Any], key: str, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise CodecError(f"{path or 'value'}: expected an object, got {type(data).__name__}")
    if key not in data:
        raise CodecError(f"{path}.{key}: missing" if path else f"{key}: missing")
    return data[key]


def _int(value: Any, path: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not whole_number(value):
        raise CodecError(f"{path}: expected an int, got {value!r}")
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise CodecError(f"{path}: expected a string, got {value!r}")
    return value


def _list(value: Any, path: str, item: Callable[[Any, str], T]) -> tuple[T, ...]:
    if not isinstance(value, list):
        raise CodecError(f"{path}: expected a list, got {type(value).__name__}")
    return tuple(item(element, f"{path}[{index}]") for index, element in enumerate(value))


def _enum_value(enum_type: Any, value: Any, path: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum_type)
        raise CodecError(f"{path}: {value!r} is not one of {allowed}") from None


def _checkpoint_from(value: Any, path: str) -> CheckpointId:
    try:
        return CheckpointId(_int(_get(value, "timeline", path), f"{path}.timeline"), _int(_get(value, "step", path), f"{path}.step"))
    except ValueError as error:
        if isinstance(error, CodecError):
            raise
        raise CodecError(f"{path}: {error}") from error


def _self_checked(value: Any, path: str) -> bool:
    """SELF-7: optional (manifests written before the self-check hold none); a bool when present."""
    flag = value.get("self_checked", False) if isinstance(value, Mapping) else False
    if not isinstance(flag, bool):
        raise CodecError(f"{path}.self_checked: expected true or false, got {flag!r}")
    return flag


def _verdict_from(value: Any, path: str) -> GroupVerdict:
    try:
        return GroupVerdict(
            _str(_get(value, "group", path), f"{path}.group"),
            _enum_value(Outcome, _get(value, "outcome", path), f"{path}.outcome"),
            _list(_get(value, "outliers", path), f"{path}.outliers", _int),
            _str(_get(value, "reason", path), f"{path}.reason"),
            _self_checked(value, path),
        )
    except CodecError:
        raise
    except (TypeError, ValueError) as error:
        raise CodecError(f"{path}: {error}") from error


def _replay_from(value: Any, path: str) -> Replay:
    return Replay(
        _str(_get(value, "recipe", path), f"{path}.recipe"),
        _int(_get(value, "step", path), f"{path}.step"),
        _list(_get(value, "verdicts", path), f"{path}.verdicts", _verdict_from),
    )


def _record_from(value: Any, path: str) -> CycleRecord | None:
    if value is None:
        return None
    return CycleRecord(
        _int(_get(value, "cycle", path), f"{path}.cycle"),
        _int(_get(value, "start_step", path), f"{path}.start_step"),
        _int(_get(value, "end_step", path), f"{path}.end_step"),
        _list(_get(value, "replays", path), f"{path}.replays", _replay_from),
    )


def _required_record(value: Any, path: str) -> CycleRecord:
    record = _record_from(value, path)
    if record is None:
        raise CodecError(f"{path}: missing cycle record")
    return record


def certificate_from_json(value: Any, path: str = "certificate") -> Certificate:
    schema = _get(value, "schema", path)
    if schema != CERTIFICATE_SCHEMA:
        raise CodecError(f"{path}.schema: {schema!r} is not {CERTIFICATE_SCHEMA!r}")
    return Certificate(
        _checkpoint_from(_get(value, "checkpoint", path), f"{path}.checkpoint"),
        _list(_get(value, "catalog", path), f"{path}.catalog", _str),
        _list(_get(value, "peer_groups", path), f"{path}.peer_groups", _str),
        _required_record(_get(value, "before", path), f"{path}.before"),
        _required_record(_get(value, "after", path), f"{path}.after"),
        _int(_get(value, "promoted_at_step", path), f"{path}.promoted_at_step"),
    )


def transition_from_json(value: Any, path: str = "transition") -> tuple[int, TrustChange]:
    """Decode one entry of the trust-transition log (or a trust-log record, which adds a
    ``certificate`` to promotions): ``(sequence, change)``. Raises :class:`CodecError`."""
    sequence = _int(_get(value, "sequence", path), f"{path}.sequence")
    if sequence < 1:
        raise CodecError(f"{path}.sequence: expected an int >= 1, got {sequence!r}")
    before = _get(value, "before", path)
    certificate = value.get("certificate") if isinstance(value, Mapping) else None
    change = TrustChange(
        _checkpoint_from(_get(value, "checkpoint", path), f"{path}.checkpoint"),
        None if before is None else _enum_value(Trust, before, f"{path}.before"),
        _enum_value(Trust, _get(value, "after", path), f"{path}.after"),
        _str(_get(value, "reason", path), f"{path}.reason"),
        None if certificate is None else certificate_from_json(certificate, f"{path}.certificate"),
    )
    return sequence, change


def _artifact_from(value: Any, path: str) -> Artifact | None:
    if value is None:
        return None
    text = {key: _str(_get(value, key, path), f"{path}.{key}") for key in ("format", "path", "digest")}
    if not all(text.values()):
        raise CodecError(f"{path}: an artifact's format, path and digest are non-empty strings, got {value!r}")
    return Artifact(text["format"], text["path"], text["digest"])


def _entry_from(value: Any, path: str) -> CheckpointEntry:
    certificate = _get(value, "certificate", path)
    return CheckpointEntry(
        _checkpoint_from(_get(value, "checkpoint", path), f"{path}.checkpoint"),
        _enum_value(Trust, _get(value, "trust", path), f"{path}.trust"),
        _str(_get(value, "reason", path), f"{path}.reason"),
        _record_from(_get(value, "before", path), f"{path}.before"),
        None if certificate is None else certificate_from_json(certificate, f"{path}.certificate"),
        _artifact_from(value.get("artifact") if isinstance(value, Mapping) else None, f"{path}.artifact"),
    )


def _recipe_from(value: Any, path: str) -> Recipe:
    groups = _get(value, "groups", path)
    return Recipe(
        _str(_get(value, "id", path), f"{path}.id"),
        None if groups is None else _list(groups, f"{path}.groups", _str),
    )


def config_from_json(value: Any, path: str = "config") -> GateConfig:
    groups: tuple[str, ...] = _list(_get(value, "groups", path), f"{path}.groups", _str)
    try:
        notes = value.get("coverage_notes", []) if isinstance(value, dict) else []
        return GateConfig(
            _str(_get(value, "job_id", path), f"{path}.job_id"),
            _list(_get(value, "recipes", path), f"{path}.recipes", _recipe_from),
            groups,
            _list(notes, f"{path}.coverage_notes", _str),
        )
    except CodecError:
        raise
    except ValueError as error:
        raise CodecError(f"{path}: {error}") from error


def _sdc_from(value: Any, path: str) -> SdcRecord | None:
    if value is None:
        return None
    return SdcRecord(
        _str(_get(value, "recipe", path), f"{path}.recipe"),
        _int(_get(value, "cycle", path), f"{path}.cycle"),
        _int(_get(value, "step", path), f"{path}.step"),
        _list(_get(value, "groups", path), f"{path}.groups", _str),
    )


def _cause_from(value: Any, path: str) -> FailureClass | None:
    return None if value is None else _enum_value(FailureClass, value, path)


def _names(value: Any, path: str, config: GateConfig) -> tuple[str, ...]:
    names = _list(value, path, _str)
    unknown = [n for n in names if n not in config.recipe_ids]
    if unknown:
        raise CodecError(f"{path}: unknown recipe id(s) {unknown}; the catalog is {list(config.recipe_ids)}")
    return names


def state_from_json(data: Any) -> GateMachineState:
    """Decode :func:`state_to_json`'s output; raises :class:`CodecError` naming the bad field."""
    control = _get(data, "control", "")
    if control not in CONTROL_STATES:
        raise CodecError(f"control: {control!r} is not one of {', '.join(CONTROL_STATES)}")
    config = config_from_json(_get(data, "config", ""))
    context = GateContext(
        config=config,
        timeline=_int(_get(data, "timeline", ""), "timeline"),
        cycle=_int(_get(data, "cycle", ""), "cycle"),
        cycle_start_step=_int(_get(data, "cycle_start_step", ""), "cycle_start_step", optional=True),
        covered=_names(_get(data, "covered", ""), "covered", config),
        unchecked=_names(_get(data, "unchecked", ""), "unchecked", config),
        replays=_list(_get(data, "replays", ""), "replays", _replay_from),
        previous_clean=_record_from(_get(data, "previous_clean", ""), "previous_clean"),
        checkpoints=_list(_get(data, "checkpoints", ""), "checkpoints", _entry_from),
        last_step=_int(_get(data, "last_step", ""), "last_step"),
        last_capture_step=_int(_get(data, "last_capture_step", ""), "last_capture_step", optional=True),
        sdc=_sdc_from(_get(data, "sdc", ""), "sdc"),
        # GATE-36; a manifest written before the cause was recorded has none.
        restart_cause=_cause_from(data.get("restart_cause"), "restart_cause"),
    )
    return MachineState(GateState(control), context)
