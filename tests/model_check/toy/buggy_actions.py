"""The toy's bindings with one planted bug, for showing that exploration finds it by the
shortest trace: ``increment`` skips a number from odd counts, so a count can overshoot."""

from __future__ import annotations

import attrs

from scout.core.machine import Actions
from tests.model_check.toy import actions as correct
from tests.model_check.toy.actions import Counted, ToyContext, ToyOutcome

ACTIONS = Actions()
ACTIONS.guard(correct.at_limit)
ACTIONS.effect(correct.start_count)
ACTIONS.effect(correct.report)
ACTIONS.effect(correct.clear)
ACTIONS.predicate(correct.count_within_limit)
ACTIONS.predicate(correct.report_only_on_reaching_limit)
ACTIONS.predicate(correct.limit_reached)
ACTIONS.predicate(correct.count_abandoned)


@ACTIONS.effect
def increment(context: ToyContext, event: object) -> ToyOutcome:
    count = context.count + (2 if context.count % 2 else 1)
    return attrs.evolve(context, count=count), (Counted(count),)
