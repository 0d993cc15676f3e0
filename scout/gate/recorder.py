"""Drive the checkpoint gate: step it, execute its ``Persist`` effects through the manifest, and
resume it after a restart (spec/gate.md).

One rank of the job is the gate's writer (:class:`GateRecorder`). It steps the gate with the
job-wide results and, whenever a step emits :class:`~scout.gate.model.Persist`, commits the new
state plus the complete trust-transition log as the next manifest generation, and appends the
step's trust transitions to the trust log, *before* it lets any other effect of that step (a
report, a restore) act (GATE-9). No other rank of the job reads the manifest: the writer decides
a restore and ``scout.attach`` broadcasts the decision. Outside the job, the ops sidecar and page
and ``scout report`` read it (:func:`inspect_gate`, :func:`inspect_gate_problems`) to learn
which checkpoints are verified or quarantined.

Reading folds every surviving record (:mod:`scout.gate.fold`): a quarantine any of them holds
stands (GATE-30), and a lost newest generation makes the reader fail closed (GATE-31). A writer
that resumes from such a directory commits the folded state and then accepts nothing but a
restart (GATE-32). Driver loop on the writer::

    recorder, state = GateRecorder.open(manifest_dir, config)
    for event in events:                     # results, captures, boundaries, restarts
        state, effects = gate.step(state, event)
        recorder.record(state, effects)      # durable before anything else happens
        act_on(effects)                      # reports, logs
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import attrs

from scout.core.machine import MachineState
from scout.gate.codec import (
    CodecError,
    certificate_to_json,
    config_to_json,
    state_from_json,
    state_to_json,
    transition_from_json,
    transition_to_json,
)
from scout.gate.fold import Folded, GenerationRecord, LogRecord, fold
from scout.gate.manifest import (
    MAX_FILE_BYTES,
    LoadedManifest,
    ManifestDamaged,
    ManifestError,
    ManifestFailClosedWarning,
    ManifestRepairWarning,
    ManifestSet,
    ManifestWriter,
    WriteHook,
    read_manifest_set,
)
from scout.gate.model import (
    Certificate,
    GateConfig,
    GateContext,
    GateEffect,
    GateEvent,
    Persist,
    Trust,
    TrustChange,
)
from scout.gate.recovery import EmergencyReplay, FailureClass, RecoveryDecision, recover
from scout.gate.step import initial_state, step

__all__ = [
    "GateConfigMismatch",
    "GateReading",
    "GateRecorder",
    "GateResumeRefused",
    "GateWriter",
    "MemoryRecorder",
    "StateRecorder",
    "gate_payload",
    "inspect_gate",
    "inspect_gate_problems",
    "read_gate",
    "read_gate_reading",
]

GateMachineState = MachineState[GateContext]


class GateConfigMismatch(ManifestError):
    """The manifest was written for another catalog or other peer groups of this job id."""


class GateResumeRefused(ManifestError):
    """The writer resumed fail-closed after a lost generation and was asked to commit anything
    but a restart (GATE-32)."""


def gate_payload(state: GateMachineState, transitions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What one manifest generation holds: the whole gate state and the trust-transition log."""
    return {"gate": state_to_json(state), "transitions": list(transitions)}


@dataclass(frozen=True)
class GateReading:
    """What a reader knows: the folded gate state, the generation it rests on, and why it
    failed closed (None when it did not). ``changes`` are the trust changes the fold made."""

    state: GateMachineState
    generation: int
    path: Path
    fail_closed: str | None
    changes: tuple[TrustChange, ...]
    notes: tuple[str, ...]

    def decide(
        self, failure: FailureClass, emergency_replay: EmergencyReplay = EmergencyReplay.NOT_RUN
    ) -> RecoveryDecision:
        """The recovery decision on the folded state; when the reader failed closed the
        decision's notes say why (GATE-31)."""
        decision = recover(self.state, failure, emergency_replay)
        if self.fail_closed is None:
            return decision
        return attrs.evolve(decision, notes=(*decision.notes, f"fail-closed reading of {self.path}: {self.fail_closed}"))


def _generation_record(loaded: LoadedManifest) -> tuple[GenerationRecord, list[dict[str, Any]]]:
    """Decode one verified generation; raises CodecError naming the bad field."""
    payload = loaded.payload
    state = state_from_json(payload.get("gate"))
    raw = payload.get("transitions")
    if not isinstance(raw, list):
        raise CodecError("payload.transitions: expected a list")
    transitions = tuple(transition_from_json(item, f"transitions[{index}]") for index, item in enumerate(raw))
    return GenerationRecord(loaded.generation, state, transitions), raw


def _log_records(found: ManifestSet, notes: list[str]) -> list[LogRecord]:
    records = []
    for raw in found.log:
        try:
            sequence, change = transition_from_json(raw, "record")
        except CodecError as error:
            notes.append(f"trust-log record {raw.get('sequence')!r} skipped: {error}")
            continue
        records.append(LogRecord(sequence, int(raw["generation"]), change))
    return records


@dataclass(frozen=True)
class _Folding:
    reading: GateReading
    base: GenerationRecord
    base_transitions: list[dict[str, Any]]
    log: list[LogRecord]


def _fold_set(found: ManifestSet, config: GateConfig | None) -> _Folding | None:
    if found.newest is None:
        if found.named_anything:
            raise ManifestDamaged(
                f"{found.directory}: no manifest generation verifies "
                f"({found.lost_reason or '; '.join(f'{s.path}: {s.why}' for s in found.skipped) or 'none is left'}); "
                "restore a copy of the directory or start the gate afresh with a new job id"
            )
        return None
    notes = list(found.problems)
    decoded: list[tuple[GenerationRecord, list[dict[str, Any]], LoadedManifest]] = []
    lost = [(item.generation, item.why) for item in found.lost]
    for loaded in found.good:
        try:
            record, raw = _generation_record(loaded)
        except CodecError as error:
            if not decoded:  # newer than every decodable one: as good as lost
                lost.append((loaded.generation, f"{loaded.path.name} verifies but does not decode ({error})"))
            else:
                notes.append(f"{loaded.path}: verifies but does not decode ({error}); not folded")
            continue
        decoded.append((record, raw, loaded))
    if not decoded:
        raise ManifestDamaged(f"{found.directory}: no manifest generation decodes ({'; '.join(w for _, w in lost)}); "
                              "restore a copy of the directory or start the gate afresh with a new job id")
    base, base_raw, base_loaded = decoded[0]
    if config is not None and base.state.context.config != config:
        raise GateConfigMismatch(
            f"{base_loaded.path}: the gate was configured with {config_to_json(base.state.context.config)}, this "
            f"job with {config_to_json(config)}; a job keeps its catalog and peer groups (use a new "
            "job id, and so a new manifest, to change them)"
        )
    log = _log_records(found, notes)
    folded: Folded = fold(base, [record for record, _raw, _loaded in decoded[1:]], log, lost)
    reading = GateReading(folded.state, base.generation, base_loaded.path, folded.fail_closed, folded.changes,
                          (*notes, *folded.notes))
    return _Folding(reading, base, base_raw, log)


def _warn(reading: GateReading) -> None:
    for note in reading.notes:
        warnings.warn(ManifestRepairWarning(note), stacklevel=3)
    if reading.fail_closed is not None:
        warnings.warn(ManifestFailClosedWarning(
            f"{reading.path.parent}: reading fails closed from generation {reading.generation}: "
            f"{reading.fail_closed}; only RECOVERY_VERIFIED checkpoints are restorable (GATE-31)"), stacklevel=3)


def inspect_gate(directory: str | os.PathLike[str], job_id: str | None = None, *,
                 max_bytes: int = MAX_FILE_BYTES) -> GateReading | None:
    """The folded reading of a manifest directory without knowing the job's config (tools such
    as ``scout certificate``); None when the directory holds no manifest. Never writes."""
    folding = _fold_set(read_manifest_set(directory, job_id, max_bytes=max_bytes), None)
    return None if folding is None else folding.reading


def inspect_gate_problems(directory: str | os.PathLike[str],
                          job_id: str | None = None) -> tuple[GateReading | None, str | None]:
    """:func:`inspect_gate` for a page or a report: the reading and, instead of warnings, one
    line of what a reader is told about it (repairs, and a fail-closed reading, GATE-30, GATE-31),
    or None. Raises what :func:`inspect_gate` raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reading = inspect_gate(directory, job_id)
    notes = [str(w.message) for w in caught]
    if reading is not None and reading.fail_closed is not None:
        notes.append(f"fail-closed reading: {reading.fail_closed}")
    return reading, "; ".join(dict.fromkeys(notes)) or None


def read_gate_reading(directory: str | os.PathLike[str], config: GateConfig, *,
                      max_bytes: int = MAX_FILE_BYTES) -> GateReading | None:
    """The folded reading (any rank), checked against this job's config; None if no manifest yet."""
    folding = _fold_set(read_manifest_set(directory, config.job_id, max_bytes=max_bytes), config)
    return None if folding is None else folding.reading


def read_gate(directory: str | os.PathLike[str], config: GateConfig) -> GateMachineState | None:
    """The folded gate state (any rank), or None if there is no manifest yet. A fail-closed
    reading (GATE-31) is a :class:`~scout.gate.manifest.ManifestFailClosedWarning`; its state
    shows every unverified checkpoint QUARANTINED with the reason."""
    reading = read_gate_reading(directory, config)
    if reading is None:
        return None
    _warn(reading)
    return reading.state


def _log_record(transition: Mapping[str, Any], certificate: Certificate | None, job_id: str) -> dict[str, Any]:
    record = dict(transition)
    record["certificate"] = None if certificate is None else certificate_to_json(certificate, job_id)
    return record


class GateRecorder:
    """The writer's side: turns ``Persist`` effects into manifest generations and trust-log
    records. ``fail_closed`` says why the writer resumed closed (None normally); until a restart
    is committed it refuses every other state (GATE-32)."""

    def __init__(self, writer: ManifestWriter, transitions: list[dict[str, Any]]) -> None:
        self.writer = writer
        self.transitions = transitions
        self.fail_closed: str | None = None
        self._restart_required_after: int | None = None  # the timeline a restart must leave
        # GATE-39: the last state committed by record(), its trust changes and its generation.
        self._last_recorded: tuple[GateMachineState, tuple[TrustChange, ...], int] | None = None

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: GateConfig,
        *,
        hook: WriteHook | None = None,
        generations_kept: int = 3,
        max_bytes: int = MAX_FILE_BYTES,
    ) -> tuple[GateRecorder, GateMachineState]:
        """Open the manifest as its one writer and return the gate to resume from: the folded
        state of what survives, or a fresh gate (committed as generation 1) for a new job. When
        the directory is not exactly consistent (a fold changed trust, a lost generation, a
        trust log or head behind) the resumed state is committed at once (GATE-32)."""
        writer = ManifestWriter(directory, config.job_id, hook=hook, generations_kept=generations_kept,
                                max_bytes=max_bytes)
        try:
            folding = _fold_set(writer.reading, config)
            if folding is None:
                state = initial_state(config)
                recorder = cls(writer, [])
                writer.commit(gate_payload(state, []))
                return recorder, state
            reading = folding.reading
            recorder = cls(writer, list(folding.base_transitions))
            logged = {item.sequence for item in folding.log}
            repair = [
                _log_record(transition, change.certificate if change.certificate is not None else
                            _certificate_of(reading.state, change), config.job_id)
                for transition, (sequence, change) in zip(folding.base_transitions, folding.base.transitions,
                                                          strict=True)
                if sequence not in logged
            ]
            head = writer.reading.head
            consistent = (
                not reading.changes and not repair and not writer.reading.problems and reading.fail_closed is None
                and head is not None and head.generation == reading.generation
            )
            for note in reading.notes:
                warnings.warn(ManifestRepairWarning(note), stacklevel=2)
            if reading.fail_closed is not None:
                recorder.fail_closed = reading.fail_closed
                recorder._restart_required_after = reading.state.context.timeline
                warnings.warn(ManifestFailClosedWarning(
                    f"{writer.directory}: the gate resumes fail-closed ({reading.fail_closed}); every unverified "
                    "checkpoint is quarantined and the next committed step must be a restart (GATE-32)"),
                    stacklevel=2)
            if not consistent:
                recorder._commit(reading.state, reading.changes, repair)
            return recorder, reading.state
        except BaseException:
            writer.close()
            raise

    def record(self, state: GateMachineState, effects: Sequence[object]) -> int | None:
        """Commit ``state`` if the step asked for it; returns the generation written, or None.
        A failed commit raises and changes nothing here; the same call may be retried (GATE-33).
        Recording the state committed last, with the same changes, again writes nothing and
        returns its generation (GATE-39)."""
        if not any(isinstance(effect, Persist) for effect in effects):
            return None
        changes = tuple(effect for effect in effects if isinstance(effect, TrustChange))
        if self._last_recorded is not None and self._last_recorded[:2] == (state, changes):
            return self._last_recorded[2]
        # GATE-32: after a lost generation only a restart -- or a loss (GATE-42), which takes
        # restorability away and certifies nothing -- may be committed in the same timeline.
        only_losses = bool(changes) and all(change.after is Trust.LOST for change in changes)
        if (self._restart_required_after is not None and state.context.timeline <= self._restart_required_after
                and not only_losses):
            raise GateResumeRefused(
                f"{self.writer.directory}: the gate resumed fail-closed ({self.fail_closed}); the first step "
                f"after that must be a restart (Restart(step of a RECOVERY_VERIFIED checkpoint), or Restart(None) "
                f"when none is verified), but this state is still in timeline {state.context.timeline}"
            )
        generation = self._commit(state, changes)
        if not only_losses:
            self._restart_required_after = None
        self._last_recorded = (state, changes, generation)
        return generation

    def _commit(self, state: GateMachineState, changes: Sequence[TrustChange],
                repair: Sequence[dict[str, Any]] = ()) -> int:
        first = len(self.transitions) + 1
        new = [transition_to_json(change, first + index) for index, change in enumerate(changes)]
        transitions = [*self.transitions, *new]
        records = [*repair, *(_log_record(transition, change.certificate, state.context.config.job_id)
                              for transition, change in zip(new, changes, strict=True))]
        generation = self.writer.commit(gate_payload(state, transitions), records)
        self.transitions = transitions  # only once the generation is durable: a retry appends nothing twice
        return generation

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> GateRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _certificate_of(state: GateMachineState, change: TrustChange) -> Certificate | None:
    """The certificate a promotion's log record carries (the transition log itself omits it)."""
    if change.after is not Trust.RECOVERY_VERIFIED:
        return None
    entry = state.context.entry(change.checkpoint)
    return None if entry is None else entry.certificate


class StateRecorder(Protocol):
    """Where a writer commits the gate's states: the manifest (:class:`GateRecorder`), or a
    simulated storage in the simulator (as it simulates the network)."""

    fail_closed: str | None

    def record(self, state: GateMachineState, effects: Sequence[object]) -> int | None: ...

    def close(self) -> None: ...


class MemoryRecorder:
    """Commits in memory: every state a step asked to persist, in order. The simulator's
    storage (it replaces the disk as it replaces the network) and the tests' writer."""

    fail_closed: str | None = None

    def __init__(self) -> None:
        self.generations: list[GateMachineState] = []

    def record(self, state: GateMachineState, effects: Sequence[object]) -> int | None:
        if not any(isinstance(effect, Persist) for effect in effects):
            return None
        self.generations.append(state)
        return len(self.generations)

    def close(self) -> None:
        pass


class GateWriter:
    """The gate's one writer: steps the machine and commits every state change (GATE-9) before
    returning the step's other effects for the caller to act on. ``scout.attach``'s writer rank,
    the simulated gate campaign and the tests all drive the gate through this class."""

    def __init__(self, recorder: StateRecorder, state: GateMachineState) -> None:
        self.recorder = recorder
        self._state = state

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], config: GateConfig, *, hook: WriteHook | None = None
    ) -> GateWriter:
        recorder, state = GateRecorder.open(directory, config, hook=hook)
        return cls(recorder, state)

    @classmethod
    def in_memory(cls, config: GateConfig) -> GateWriter:
        """A fresh gate whose commits stay in memory (:class:`MemoryRecorder`)."""
        return cls(MemoryRecorder(), initial_state(config))

    @property
    def state(self) -> GateMachineState:
        return self._state

    def apply(self, event: GateEvent) -> tuple[GateEffect, ...]:
        """Step the gate with ``event`` (a GateInputError leaves everything unchanged), commit
        the new state if the step asks for it, and return the step's effects."""
        state, effects = step(self._state, event)
        self.recorder.record(state, effects)
        self._state = state
        return effects

    def close(self) -> None:
        self.recorder.close()

    def __enter__(self) -> GateWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
