"""Stragglers: the per-peer sequential test (table ``spec/straggler.toml``; values in
:mod:`.model`, actions in :mod:`.machine`), evidence and confirmation over a group's checks
(:mod:`.confirmation`) and cross-group localization (:mod:`.localize`)."""

from scout.core.straggler.confirmation import (
    DEFAULT_SEQUENTIAL_CONFIG,
    ConfirmationState,
    SequentialConfig,
    check_evidence,
    confirmation_start,
    confirmation_step,
    log_ratio,
    straggler_machine,
)
from scout.core.straggler.localize import (
    GroupObservation,
    GroupTiming,
    Localization,
    LocalizationStatus,
    family_observations,
    localize,
    localize_hosts,
    localize_live,
)
from scout.core.straggler.model import Confirmed, Recovered, StragglerState, TestBounds

__all__ = [
    "DEFAULT_SEQUENTIAL_CONFIG",
    "ConfirmationState",
    "Confirmed",
    "GroupObservation",
    "GroupTiming",
    "Localization",
    "LocalizationStatus",
    "Recovered",
    "SequentialConfig",
    "StragglerState",
    "TestBounds",
    "check_evidence",
    "confirmation_start",
    "confirmation_step",
    "family_observations",
    "localize",
    "localize_hosts",
    "localize_live",
    "log_ratio",
    "straggler_machine",
]
