"""Gate runs and the storage-fault safety property shared by the manifest damage tests
(tests/unit/test_manifest_damage.py, real files) and the storage model
(tests/model_check/test_manifest_model.py, pure): spec/gate.md GATE-30..32.

The property, for a reading R of a damaged directory whose writer last committed the true state T:

- every checkpoint restorable in R is restorable in T (so nothing quarantined or superseded in T
  is ever restorable again), and every RECOVERY_VERIFIED one in R is verified in T with the same
  certificate (GATE-30);
- if R did not fail closed, R holds exactly T's trust;
- if the newest generation is lost, R fails closed: it says why and only verified checkpoints of
  T are restorable in it (GATE-31).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from scout.core.machine import MachineState
from scout.gate.model import (
    RESTORABLE,
    CheckpointCaptured,
    CycleBoundary,
    GateConfig,
    GateContext,
    GateEvent,
    GateState,
    Outcome,
    RecipeVerdicts,
    Restart,
    ResultClass,
    Trust,
)
from scout.gate.step import initial_state, step
from tests.gate_story import CONFIG, clean_cycle, story, verdicts
from tests.model_check.gate_harness import class_vectors, environment, make_config

GateMachineState = MachineState[GateContext]


def taint_without_quarantine() -> list[GateEvent]:
    """An SDC while nothing is quarantinable: the commit that taints the gate changes no trust,
    so only the head witnesses it; then a capture that is quarantined at once."""
    return [
        CycleBoundary(0),
        *clean_cycle(1, 0),
        CycleBoundary(100),
        RecipeVerdicts("hidden", 2, 120, verdicts(dp0=Outcome.ATTRIBUTED)),
        CheckpointCaptured(150),
        CycleBoundary(200),
    ]


def random_events(seed: int, length: int = 40, config: GateConfig | None = None) -> tuple[GateConfig, list[GateEvent]]:
    """A random run the gate accepts, from the model checker's environment (every result class,
    captures, boundaries, restarts)."""
    config = config or make_config(2, 2)
    enabled = environment(class_vectors, captures_max=8)
    rng = random.Random(seed)
    state = initial_state(config)
    events: list[GateEvent] = []
    for _ in range(length):
        choices = enabled(state)
        event = rng.choices(choices, weights=[_weight(state, e) for e in choices])[0]
        state, _effects = step(state, event)  # type: ignore[arg-type]
        events.append(event)  # type: ignore[arg-type]
    return config, events


def _weight(state: GateMachineState, event: object) -> float:
    """Bias random runs towards what leads to candidates and promotions (clean results for
    recipes not yet covered, boundaries that close a complete cycle, captures at a boundary),
    so they reach every trust state, not only restarts and quarantines."""
    context = state.context
    if isinstance(event, RecipeVerdicts):
        return 8.0 if event.result_class is ResultClass.CLEAN and event.recipe not in context.covered else 0.3
    if isinstance(event, CycleBoundary):
        return 6.0 if context.cycle_complete or context.cycle_start_step is None else 1.0
    if isinstance(event, CheckpointCaptured):
        return 6.0 if event.step == context.cycle_start_step else 1.0
    return 4.0 if state.control is GateState.TAINTED else 0.2


def runs() -> Iterator[tuple[str, GateConfig, list[GateEvent]]]:
    yield "story", CONFIG, story()
    yield "taint-without-quarantine", CONFIG, taint_without_quarantine()
    for seed in (1, 2):
        config, events = random_events(seed)
        yield f"random-{seed}", config, events


def trust_map(state: GateMachineState) -> dict[str, str]:
    return {str(entry.id): entry.trust.value for entry in state.context.checkpoints}


def restorable_ids(state: GateMachineState) -> set[str]:
    return {str(entry.id) for entry in state.context.checkpoints if entry.trust in RESTORABLE}


def violations(reading: GateMachineState, truth: GateMachineState, *, fail_closed: str | None,
               newest_lost: bool) -> list[str]:
    """Every way ``reading`` breaks the storage-fault property against ``truth`` (empty: none)."""
    problems = []
    true_entries = {str(entry.id): entry for entry in truth.context.checkpoints}
    for entry in reading.context.checkpoints:
        name = str(entry.id)
        true = true_entries.get(name)
        if entry.trust in RESTORABLE and (true is None or true.trust not in RESTORABLE):
            problems.append(f"{name} restorable ({entry.trust.value}) but {true.trust.value if true else 'unknown'} "
                            "in truth (GATE-30)")
        if entry.trust is Trust.RECOVERY_VERIFIED and (
                true is None or true.trust is not Trust.RECOVERY_VERIFIED or true.certificate != entry.certificate):
            problems.append(f"{name} verified in the reading, not in truth with that certificate")
    if fail_closed is None and trust_map(reading) != trust_map(truth):
        problems.append(f"no fail-closed, yet trust differs: {trust_map(reading)} vs {trust_map(truth)}")
    if newest_lost:
        if fail_closed is None:
            problems.append("the newest generation is lost but the reading did not fail closed (GATE-31)")
        unverified = [str(e.id) for e in reading.context.checkpoints
                      if e.trust in RESTORABLE and e.trust is not Trust.RECOVERY_VERIFIED]
        if unverified:
            problems.append(f"fail-closed reading still restores unverified {unverified} (GATE-31)")
    return problems


def committed_states(config: GateConfig, events: Sequence[GateEvent]) -> list[GateMachineState]:
    """The state of every generation a recorder commits for ``events`` (generation 1 first)."""
    from scout.gate.model import Persist

    state = initial_state(config)
    states = [state]
    for event in events:
        state, effects = step(state, event)
        if any(isinstance(effect, Persist) for effect in effects):
            states.append(state)
    return states


__all__ = ["Restart", "committed_states", "random_events", "restorable_ids", "runs", "trust_map", "violations"]
