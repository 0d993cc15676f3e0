"""Straggler tracking and its reports: the pure code lives in
:mod:`scout.core.straggler.tracking` (the job's pipeline and the simulator use it without
torch); this module keeps the public path ``scout.replay.stragglers``."""

from scout.core.straggler.tracking import (
    REASONS,
    StragglerEvent,
    StragglerKind,
    StragglerTracker,
    TrailEntry,
    group_timings,
    localization_record_arguments,
    straggler_record_arguments,
)

__all__ = [
    "REASONS",
    "StragglerEvent",
    "StragglerKind",
    "StragglerTracker",
    "TrailEntry",
    "group_timings",
    "localization_record_arguments",
    "straggler_record_arguments",
]
