"""Trace files for the observer, gate and straggler machines (tests/model_check/traces/*.txt,
runner: tests/model_check/traces.py): event scripts with the transitions and effects each must
produce, as etcd-io/raft's testdata. ``pytest --rewrite-traces`` rewrites the expected lines."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from scout.core.failure import FailureClass
from scout.core.machine import MachineState, packaged_machine
from scout.core.observer import model as observer_model
from scout.core.straggler import DEFAULT_SEQUENTIAL_CONFIG, SequentialConfig, straggler_machine
from scout.core.straggler import model as straggler_model
from scout.gate import model as gate_model
from scout.gate.model import (
    CheckpointCaptured,
    CycleBoundary,
    GateReport,
    Outcome,
    Persist,
    RecipeVerdicts,
    Restart,
    TrustChange,
)
from scout.gate.step import check_event, gate_machine
from tests.model_check import traces


def _triggered(module: Any) -> dict[str, type]:
    """The event classes of a model module, by trigger."""
    return {cls.trigger: cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__ and isinstance(getattr(cls, "trigger", None), str)}


def _public(module: Any) -> dict[str, Any]:
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def _gate_effect(effect: object) -> str:
    if isinstance(effect, Persist):
        return "Persist"
    if isinstance(effect, TrustChange):
        before = "-" if effect.before is None else effect.before.value
        cycles = "" if effect.certificate is None else \
            f" [certified by cycles {effect.certificate.before.cycle} and {effect.certificate.after.cycle}]"
        return f"TrustChange {effect.checkpoint} {before} -> {effect.after.value}{cycles}"
    if isinstance(effect, GateReport):
        return (f"Report {effect.kind.value} cycle={effect.cycle} step={effect.step} recipes={list(effect.recipes)} "
                f"groups={list(effect.groups)}")
    return repr(effect)


def _gate_show(state: MachineState[Any]) -> str:
    context = state.context
    checkpoints = ", ".join(f"{e.id} {e.trust.value}" for e in context.checkpoints)
    cause = None if context.restart_cause is None else context.restart_cause.value
    return (f"timeline={context.timeline} cycle={context.cycle} covered={list(context.covered)} "
            f"checkpoints=[{checkpoints}] restart_cause={cause}")


GATE = traces.TraceMachine(
    "gate", gate_machine,
    {**_public(gate_model), **{outcome.name: outcome for outcome in Outcome}, "FailureClass": FailureClass},
    {"result": RecipeVerdicts, "capture": CheckpointCaptured, "boundary": CycleBoundary, "restart": Restart},
    lambda context: gate_machine().initial_state(context), check_event, _gate_show, _gate_effect,
)
OBSERVER = traces.TraceMachine(
    "observer", lambda: packaged_machine("observer"), _public(observer_model), _triggered(observer_model),
    lambda context: packaged_machine("observer").initial_state(context),
    show=lambda state: f"now_s={state.context.now_s} reported={len(state.context.reported)}",
)
STRAGGLER = traces.TraceMachine(
    "straggler", straggler_machine,
    {**_public(straggler_model), "DEFAULT_SEQUENTIAL_CONFIG": DEFAULT_SEQUENTIAL_CONFIG,
     "SequentialConfig": SequentialConfig},
    _triggered(straggler_model), lambda context: straggler_machine().initial_state(context),
    show=lambda state: f"score={state.context.score} recovery={state.context.recovery} checks={state.context.checks}",
)


@pytest.mark.parametrize("spec", [OBSERVER, GATE, STRAGGLER], ids=lambda spec: spec.name)
def test_TRACE_every_machine_follows_its_trace_file(spec: traces.TraceMachine, request: pytest.FixtureRequest) -> None:
    problems = traces.check_file(spec, rewrite=request.config.getoption("--rewrite-traces"))
    assert not problems, "\n".join(problems)


def test_TRACE_the_runner_refuses_a_malformed_stanza_and_a_forbidden_expression() -> None:
    with pytest.raises(ValueError, match="must be followed by a '----' line"):
        traces.parse("boundary step=0\nPersist\n")
    stanzas = traces.parse("init GateContext(GateConfig('j', ('a',), ('g',)))\n----\nIDLE\n\n"
                           "boundary step=().__class__\n----\n")
    (_, refused) = traces.run(GATE, stanzas)
    assert refused == ("error: ValueError: trace expression '().__class__': only names, literals and calls are "
                       "allowed",)
