"""Invariants at run time: an id, a statement, and the predicate the explorer evaluates.

``always`` must hold in every reached state (scope ``state``) or across every executed step
(scope ``step``); ``sometimes`` must hold in at least one, so a property whose situation is never
reached fails instead of passing vacuously (stateright's always/sometimes).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from scout.core.machine.table import InvariantKind, InvariantScope


@attrs.frozen
class Property:
    id: str
    kind: InvariantKind
    scope: InvariantScope
    text: str
    # scope "state": (state) -> bool; scope "step": (previous, event, next, effects) -> bool
    predicate: Callable[..., bool]

    @classmethod
    def always(
        cls, id: str, text: str, predicate: Callable[..., bool], *, scope: InvariantScope = "state"
    ) -> Property:
        return cls(id, "always", scope, text, predicate)

    @classmethod
    def sometimes(
        cls, id: str, text: str, predicate: Callable[..., bool], *, scope: InvariantScope = "state"
    ) -> Property:
        return cls(id, "sometimes", scope, text, predicate)

    def describe(self) -> str:
        return f"{self.id} ({self.kind}, {self.scope}): {self.text}"
