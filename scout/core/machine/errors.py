"""Errors of the spec machinery, split by who must act: the spec author (SpecError), the
driver that fed the machine an event (StepError), or the model-check harness (ModelCheckFailure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scout.core.machine.explore import ExplorationResult, Trace


class SpecError(ValueError):
    """A machine table or its actions are wrong; the message names the file and the row."""


class StepError(Exception):
    """A step could not be taken; the machine state the caller holds is still valid."""


class IllegalTransition(StepError):
    """No row of the table accepts this event in this state (h11 style: nothing changed)."""

    def __init__(self, message: str, *, control: str, trigger: str) -> None:
        super().__init__(message)
        self.control = control
        self.trigger = trigger


class NondeterministicStep(StepError):
    """More than one row's guard held at once: the table is ambiguous, which is a spec bug."""

    def __init__(self, message: str, *, control: str, trigger: str) -> None:
        super().__init__(message)
        self.control = control
        self.trigger = trigger


class ModelCheckFailure(AssertionError):
    """Exploration found a violated ``always``, a step that raised, or a ``sometimes`` never
    witnessed. ``trace`` is the shortest failing trace where one exists."""

    def __init__(
        self,
        message: str,
        *,
        result: ExplorationResult[Any, Any],
        trace: Trace[Any, Any] | None = None,
        property_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.result = result
        self.trace = trace
        self.property_id = property_id
