"""A worked run of the checkpoint gate, shared by the gate, manifest, certificate and recovery
tests: two promotions, an unchecked cycle, an SDC that quarantines job-wide, a restart from the
verified checkpoint, and a promotion in the new timeline. Reads like spec/gate.md's example."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scout.core.failure import FailureClass
from scout.gate.codec import transition_to_json
from scout.gate.model import (
    CheckpointCaptured,
    CycleBoundary,
    GateConfig,
    GateEvent,
    GroupVerdict,
    Outcome,
    Persist,
    RecipeVerdicts,
    Restart,
    TrustChange,
)
from scout.gate.recorder import gate_payload
from scout.gate.step import initial_state, step

CONFIG = GateConfig("story-job", ("embedding", "hidden", "head"), ("dp0", "dp1"))


def verdicts(**outcomes: Outcome) -> tuple[GroupVerdict, ...]:
    """One verdict per group; groups not named agree."""
    result = []
    for group in CONFIG.groups:
        outcome = outcomes.get(group, Outcome.AGREE)
        if outcome is Outcome.ATTRIBUTED:
            result.append(GroupVerdict(group, outcome, (3,)))
        elif outcome is Outcome.INCONCLUSIVE:
            result.append(GroupVerdict(group, outcome, (), "no-majority"))
        elif outcome is Outcome.MISSING:
            result.append(GroupVerdict(group, outcome, (), "no-result"))
        else:
            result.append(GroupVerdict(group, outcome))
    return tuple(result)


def clean_cycle(cycle: int, first_step: int) -> list[GateEvent]:
    return [
        RecipeVerdicts(recipe, cycle, first_step + 10 * index, verdicts())
        for index, recipe in enumerate(CONFIG.recipe_ids)
    ]


def story() -> list[GateEvent]:
    return [
        CycleBoundary(0),  # cycle 1 opens
        *clean_cycle(1, 0),
        CycleBoundary(100),  # cycle 1 complete and clean -> cycle 2
        CheckpointCaptured(100),  # CANDIDATE
        *clean_cycle(2, 110),
        CheckpointCaptured(150),  # mid-cycle: CAPTURED
        CycleBoundary(200),  # promotes t0/s100
        CheckpointCaptured(200),  # CANDIDATE
        RecipeVerdicts("embedding", 3, 210, verdicts()),
        RecipeVerdicts("hidden", 3, 220, verdicts(dp1=Outcome.INCONCLUSIVE)),  # unchecked
        RecipeVerdicts("head", 3, 230, verdicts()),
        CycleBoundary(300),  # candidate t0/s200 is not promoted
        CheckpointCaptured(300),  # CAPTURED: cycle 3 was unclean
        *clean_cycle(4, 300),
        CycleBoundary(400),
        CheckpointCaptured(400),  # CANDIDATE
        RecipeVerdicts("embedding", 5, 410, verdicts()),
        RecipeVerdicts("hidden", 5, 420, verdicts(dp0=Outcome.ATTRIBUTED)),  # SDC: quarantine
        CheckpointCaptured(450),  # quarantined at capture
        CycleBoundary(500),
        Restart(100, FailureClass.SDC),  # back to the verified checkpoint; timeline 1
        CycleBoundary(100),
        *clean_cycle(7, 100),
        CycleBoundary(200),
        CheckpointCaptured(200),  # CANDIDATE in timeline 1
        *clean_cycle(8, 200),
        CycleBoundary(300),  # promotes t1/s200
    ]


def run_story() -> Iterator[tuple[GateEvent, Any, tuple[object, ...]]]:
    state = initial_state(CONFIG)
    for event in story():
        state, effects = step(state, event)
        yield event, state, effects


def story_payloads() -> list[dict[str, Any]]:
    """The manifest payload of every generation the story's writer commits, generation 1 first
    (the fresh gate), exactly as GateRecorder builds them."""
    state = initial_state(CONFIG)
    transitions: list[dict[str, Any]] = []
    payloads = [gate_payload(state, transitions)]
    for _event, state, effects in run_story():
        if not any(isinstance(effect, Persist) for effect in effects):
            continue
        for effect in effects:
            if isinstance(effect, TrustChange):
                transitions.append(transition_to_json(effect, len(transitions) + 1))
        payloads.append(gate_payload(state, transitions))
    return payloads
