"""The toy's bindings with one planted bug, for showing that exploration finds it by the
shortest trace: ``increment`` skips a number from odd counts, so a count can overshoot."""

from __future__ import annotations

import attrs

from scout.core.machine import Bindings
from tests.model_check.toy import bindings as correct
from tests.model_check.toy.bindings import Counted, ToyContext, ToyOutcome

BINDINGS = Bindings()
BINDINGS.guard(correct.at_limit)
BINDINGS.effect(correct.start_count)
BINDINGS.effect(correct.report)
BINDINGS.effect(correct.clear)
BINDINGS.predicate(correct.count_within_limit)
BINDINGS.predicate(correct.report_only_on_reaching_limit)
BINDINGS.predicate(correct.limit_reached)
BINDINGS.predicate(correct.count_abandoned)


@BINDINGS.effect
def increment(context: ToyContext, event: object) -> ToyOutcome:
    count = context.count + (2 if context.count % 2 else 1)
    return attrs.evolve(context, count=count), (Counted(count),)
