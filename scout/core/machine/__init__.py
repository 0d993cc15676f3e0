"""Spec machinery for scout's finite machines (observer lifecycle, checkpoint gate).

Theory of operation. A machine is specified by one TOML table (``spec/<name>.toml``, format in
``docs/spec-format.md``): control states, triggers, rows ``source, trigger, dest, guard,
effect, why`` and invariants. Its Python half is a actions module that registers guards,
effects and predicates by name (:class:`Actions`). From the table we derive, and never write
by hand:

- the pure step ``Machine.step(state, event) -> (state, effects)``, run from a dict compiled
  from the rows (``runtime``);
- the ``transitions`` library machine, compared with the table and the compiled dict in both
  directions (``reference``, ``conformance``) -- the tests' oracle, built and imported only
  when asked for, never on the product's path;
- the Markdown table, Mermaid diagram and invariant list inside ``spec/<name>.md``
  (``render``; ``scout spec`` writes them, ``scout spec --check`` proves them current);
- bounded breadth-first model checking of every invariant over the real step (``explore``).

Modules, one job each: ``table`` (the data), ``parse`` (TOML mapping -> validated table),
``actions`` (name -> function registries), ``loader`` (the only file I/O), ``runtime``
(step), ``reference`` (``transitions`` machine), ``conformance``, ``render``, ``properties``,
``explore``, ``errors``.
"""

from typing import Any

from scout.core.machine.actions import Actions
from scout.core.machine.errors import (
    IllegalTransition,
    ModelCheckFailure,
    NondeterministicStep,
    SpecError,
    StepError,
)
from scout.core.machine.explore import Explorable, ExplorationResult, Trace, TraceStep, explore
from scout.core.machine.loader import load_actions, load_machine, load_table, packaged_machine
from scout.core.machine.parse import parse_table
from scout.core.machine.properties import Property
from scout.core.machine.render import new_document, render_block, splice
from scout.core.machine.runtime import Event, Firing, Machine, MachineState, build_machine
from scout.core.machine.table import InvariantSpec, MachineTable, TransitionRow

__all__ = [
    "Actions",
    "Event",
    "Explorable",
    "ExplorationResult",
    "Firing",
    "IllegalTransition",
    "InvariantSpec",
    "Machine",
    "MachineState",
    "MachineTable",
    "ModelCheckFailure",
    "NondeterministicStep",
    "Property",
    "SpecError",
    "StepError",
    "Trace",
    "TraceStep",
    "TransitionRow",
    "build_machine",
    "conformance_problems",
    "explore",
    "load_actions",
    "load_machine",
    "load_table",
    "new_document",
    "packaged_machine",
    "parse_table",
    "reference_step",
    "render_block",
    "splice",
]


def __getattr__(name: str) -> Any:
    """The ``transitions`` oracle's entry points, imported on first use (tests only)."""
    if name == "conformance_problems":
        from scout.core.machine.conformance import conformance_problems

        return conformance_problems
    if name == "reference_step":
        from scout.core.machine.reference import reference_step

        return reference_step
    raise AttributeError(f"module 'scout.core.machine' has no attribute {name!r}")
