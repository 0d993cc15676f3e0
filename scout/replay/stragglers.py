"""Straggler tracking and its reports: the pure tracking lives in
:mod:`scout.core.straggler.tracking` (the job's pipeline and the simulator use it without
torch), the translation of its events into reports in :mod:`scout.reports.kinds`; this module
keeps the public path ``scout.replay.stragglers``."""

from scout.core.straggler.tracking import (
    StragglerEvent,
    StragglerKind,
    StragglerTracker,
    TrailEntry,
    group_timings,
)
from scout.reports.kinds import localization_record_arguments, straggler_record_arguments

__all__ = [
    "StragglerEvent",
    "StragglerKind",
    "StragglerTracker",
    "TrailEntry",
    "group_timings",
    "localization_record_arguments",
    "straggler_record_arguments",
]
