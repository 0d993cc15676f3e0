"""Drive the checkpoint gate: step it, execute its ``Persist`` effects through the manifest, and
resume it after a restart (spec/gate.md).

One rank of the job is the gate's writer (:class:`GateRecorder`). It steps the gate with the
job-wide results and, whenever a step emits :class:`~scout.gate.model.Persist`, commits the new
state plus the complete trust-transition log as the next manifest generation *before* it lets any
other effect of that step (a report, a restore) act (GATE-9). Every other rank reads the
manifest (:func:`read_gate`) to learn which checkpoints are verified or quarantined.

Driver loop on the writer::

    recorder, state = GateRecorder.open(manifest_dir, config)
    for event in events:                     # results, captures, boundaries, restarts
        state, effects = gate.step(state, event)
        recorder.record(state, effects)      # durable before anything else happens
        act_on(effects)                      # reports, logs
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from scout.core.machine import MachineState
from scout.gate.codec import config_to_json, state_from_json, state_to_json, transition_to_json
from scout.gate.manifest import (
    LoadedManifest,
    ManifestError,
    ManifestWriter,
    WriteHook,
    load_manifest,
)
from scout.gate.model import (
    GateConfig,
    GateContext,
    GateEvent,
    Persist,
    TrustChange,
)
from scout.gate.step import initial_state, step

__all__ = ["GateConfigMismatch", "GateRecorder", "GateWriter", "gate_payload", "read_gate"]

GateMachineState = MachineState[GateContext]


class GateConfigMismatch(ManifestError):
    """The manifest was written for another catalog or other peer groups of this job id."""


def gate_payload(state: GateMachineState, transitions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What one manifest generation holds: the whole gate state and the trust-transition log."""
    return {"gate": state_to_json(state), "transitions": list(transitions)}


def _state_of(loaded: LoadedManifest, config: GateConfig) -> tuple[GateMachineState, list[dict[str, Any]]]:
    payload = loaded.payload
    state = state_from_json(payload.get("gate"))
    if state.context.config != config:
        raise GateConfigMismatch(
            f"{loaded.path}: the gate was configured with {config_to_json(state.context.config)}, this "
            f"job with {config_to_json(config)}; a job keeps its catalog and peer groups (use a new "
            "job id, and so a new manifest, to change them)"
        )
    transitions = payload.get("transitions")
    if not isinstance(transitions, list):
        raise ManifestError(f"{loaded.path}: payload.transitions is not a list")
    return state, transitions


def read_gate(directory: str | os.PathLike[str], config: GateConfig) -> GateMachineState | None:
    """The gate state in the newest good manifest generation (any rank), or None if none yet."""
    loaded = load_manifest(directory, config.job_id)
    if loaded is None:
        return None
    return _state_of(loaded, config)[0]


class GateRecorder:
    """The writer's side: turns ``Persist`` effects into manifest generations."""

    def __init__(self, writer: ManifestWriter, transitions: list[dict[str, Any]]) -> None:
        self.writer = writer
        self.transitions = transitions

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: GateConfig,
        *,
        hook: WriteHook | None = None,
        generations_kept: int = 3,
    ) -> tuple[GateRecorder, GateMachineState]:
        """Open the manifest as its one writer and return the gate to resume from: the newest
        good generation's state, or a fresh gate (committed as generation 1) for a new job."""
        writer = ManifestWriter(directory, config.job_id, hook=hook, generations_kept=generations_kept)
        try:
            if writer.resumed is None:
                state = initial_state(config)
                recorder = cls(writer, [])
                writer.commit(gate_payload(state, []))
                return recorder, state
            state, transitions = _state_of(writer.resumed, config)
            return cls(writer, list(transitions)), state
        except BaseException:
            writer.close()
            raise

    def record(self, state: GateMachineState, effects: Sequence[object]) -> int | None:
        """Commit ``state`` if the step asked for it; returns the generation written, or None."""
        if not any(isinstance(effect, Persist) for effect in effects):
            return None
        for effect in effects:
            if isinstance(effect, TrustChange):
                self.transitions.append(transition_to_json(effect, len(self.transitions) + 1))
        return self.writer.commit(gate_payload(state, self.transitions))

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> GateRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class GateWriter:
    """The gate's one writer: steps the machine and commits every state change (GATE-9) before
    returning the step's other effects for the caller to act on. ``scout.attach``'s writer rank,
    the simulated gate campaign and the tests all drive the gate through this class."""

    def __init__(self, recorder: GateRecorder, state: GateMachineState) -> None:
        self.recorder = recorder
        self._state = state

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], config: GateConfig, *, hook: WriteHook | None = None
    ) -> GateWriter:
        recorder, state = GateRecorder.open(directory, config, hook=hook)
        return cls(recorder, state)

    @property
    def state(self) -> GateMachineState:
        return self._state

    def apply(self, event: GateEvent) -> tuple[object, ...]:
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
