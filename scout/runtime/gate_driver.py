"""Drive the checkpoint gate: step it, execute its ``Persist`` effects through the manifest, and
resume it after a restart (DESIGN.md 2.3; spec/gate.md).

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
from collections.abc import Generator, Sequence
from typing import Any

from scout.core.machine import MachineState
from scout.core.verdict import MISSING, classify_exact
from scout.gate.codec import config_to_json, state_from_json, state_to_json, transition_to_json
from scout.gate.gate import initial_state
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
    GroupVerdict,
    Outcome,
    Persist,
    RecipeResult,
    Trust,
    TrustChange,
    group_verdict,
)
from scout.transport.base import Group
from scout.transport.program import Exchange

__all__ = [
    "NO_VIEW",
    "GateConfigMismatch",
    "GateRecorder",
    "GateView",
    "aggregate_verdicts",
    "gate_payload",
    "gate_view",
    "group_vote",
    "job_result",
    "read_gate",
]

GateState = MachineState[GateContext]


class GateConfigMismatch(ManifestError):
    """The manifest was written for another catalog or other peer groups of this job id."""


def gate_payload(state: GateState, transitions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What one manifest generation holds: the whole gate state and the trust-transition log."""
    return {"gate": state_to_json(state), "transitions": list(transitions)}


def _state_of(loaded: LoadedManifest, config: GateConfig) -> tuple[GateState, list[dict[str, Any]]]:
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


def read_gate(directory: str | os.PathLike[str], config: GateConfig) -> GateState | None:
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
    ) -> tuple[GateRecorder, GateState]:
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

    def record(self, state: GateState, effects: Sequence[object]) -> int | None:
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


# ------------------------------------------------------------------------------------------
# Job-wide aggregation over the transport contract (rank-program steps: they yield transport
# ops, so the same code runs on the simulator, under MPI and under torch.distributed).
# ------------------------------------------------------------------------------------------

#: What every rank knows of the gate: (version, newest verified step or -1, quarantined
#: checkpoints, tainted). Versions only grow, so the newest view wins wherever views meet.
GateView = tuple[int, int, int, bool]
NO_VIEW: GateView = (0, -1, 0, False)


def gate_view(state: GateState, version: int) -> GateView:
    context = state.context
    verified = context.verified_step
    quarantined = sum(entry.trust is Trust.QUARANTINED for entry in context.checkpoints)
    return (version, -1 if verified is None else verified, quarantined, state.control == "TAINTED")


def _newer(view: GateView, candidate: object) -> GateView:
    if isinstance(candidate, (tuple, list)) and len(candidate) == 4:
        other = tuple(candidate)
        if other > view:
            return other
    return view


def group_vote(
    signature: object, view: GateView, *, group: Group, round_id: int, timeout_s: float
) -> Generator[Any, Any, tuple[GroupVerdict, GateView]]:
    """Exchange this rank's replay signature with its peer group (deadline-bounded) and take the
    group's verdict with the one verdict rule; a silent peer is MISSING evidence. The gate view
    rides along, so every member ends with the newest view any member had."""
    answer = yield Exchange((signature, view), round_id=round_id, timeout_s=timeout_s, group=group)
    for payload in answer.answers.values():
        if isinstance(payload, (tuple, list)) and len(payload) == 2:
            view = _newer(view, payload[1])
    evidence = [answer.answers[rank][0] if rank in answer.answers else MISSING for rank in group.ranks]
    return group_verdict(group.name, classify_exact(evidence)), view


def aggregate_verdicts(
    group_index: int,
    verdict: GroupVerdict,
    view: GateView,
    *,
    leaders: Group,
    writer: int,
    round_id: int,
    timeout_s: float,
) -> Generator[Any, Any, tuple[dict[int, GroupVerdict], GateView]]:
    """The leaders' exchange: each group leader (and the gate's writer) sends its group's verdict;
    returns the verdicts that arrived, by group index, and the writer's view if newer. A group
    whose leader was silent is simply absent: :func:`job_result` makes it MISSING (unchecked),
    never SDC and never a hang."""
    mine = (group_index, verdict.group, verdict.outcome.value, verdict.outliers, verdict.reason, view)
    gathered = yield Exchange(mine, round_id=round_id, timeout_s=timeout_s, group=leaders)
    verdicts: dict[int, GroupVerdict] = {}
    for payload in gathered.answers.values():
        index, name, outcome, outliers, reason, _view = payload
        verdicts[int(index)] = GroupVerdict(str(name), Outcome(outcome), tuple(outliers), str(reason))
    writer_payload = gathered.answers.get(writer)
    if writer_payload is not None:
        view = _newer(view, writer_payload[5])
    return verdicts, view


def job_result(
    groups: list[Group], verdicts: dict[int, GroupVerdict], recipe: str, cycle: int, step: int
) -> RecipeResult:
    """One job-wide result: a verdict for every peer group, MISSING where none arrived."""
    return RecipeResult(
        recipe,
        cycle,
        step,
        tuple(
            verdicts.get(index, GroupVerdict(group.name, Outcome.MISSING, (), "no-result"))
            for index, group in enumerate(groups)
        ),
    )
