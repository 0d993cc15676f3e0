"""Stragglers: the per-peer confirmation machine (table ``spec/straggler.toml``; values in
:mod:`.model`, actions in :mod:`.machine`), confirmation over a group's timing rounds
(:mod:`.confirmation`) and cross-group localization (:mod:`.localize`)."""

from scout.core.straggler.confirmation import (
    ConfirmationState,
    Round,
    confirmation_start,
    confirmation_step,
    round_from_verdict,
    straggler_machine,
)
from scout.core.straggler.localize import (
    GroupObservation,
    Localization,
    LocalizationStatus,
    localize,
)
from scout.core.straggler.model import Confirmed, Recovered, StragglerState

__all__ = [
    "ConfirmationState",
    "Confirmed",
    "GroupObservation",
    "Localization",
    "LocalizationStatus",
    "Recovered",
    "Round",
    "StragglerState",
    "confirmation_start",
    "confirmation_step",
    "localize",
    "round_from_verdict",
    "straggler_machine",
]
