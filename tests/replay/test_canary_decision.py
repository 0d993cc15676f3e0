"""The canary decision, every field of every outcome (spec/canary.md CANARY-3..CANARY-7).

``tests/replay/test_moe_core.py`` shows each outcome once; these tests pin what a report and the
gate read from a decision -- the ranks, the classes, the golden signatures kept, the reason and
the status -- exactly, so that a decision that names the wrong ranks or drops its golden fails
here (the mutation target ``core-canary``, tests/mutation/survivors.md)."""

from __future__ import annotations

import pytest

from scout.core.canary import CanaryDecision, CanaryOutcome, decide_canary
from scout.core.verdict import MISSING, Status

GOLDEN = {"output": 5, "hidden": 1}  # deliberately not in sorted order
KEPT = (("hidden", 1), ("output", 5))


def test_CANARY_3_no_ranks_is_an_error_saying_so() -> None:
    with pytest.raises(ValueError) as error:
        decide_canary(GOLDEN, [])
    assert str(error.value) == "no ranks: a canary check needs at least one reading"


def test_CANARY_6_missing_readings_name_every_silent_rank_and_keep_the_golden() -> None:
    decision = decide_canary(GOLDEN, [dict(GOLDEN), MISSING, dict(GOLDEN), MISSING])
    assert decision == CanaryDecision(CanaryOutcome.INCONCLUSIVE, (), (), KEPT, "no canary reading from ranks [1, 3]")
    assert decision.status is Status.INCONCLUSIVE
    # Before the first record there is no golden to keep.
    before = decide_canary(None, [MISSING, {"hidden": 1}])
    assert before == CanaryDecision(CanaryOutcome.INCONCLUSIVE, (), (), (), "no canary reading from ranks [0]")


@pytest.mark.parametrize("golden", [None, GOLDEN])
def test_CANARY_6_ranks_with_different_classes_are_inconclusive(golden: dict[str, int] | None) -> None:
    kept = () if golden is None else KEPT
    # The odd rank is the second one, and its classes are a superset of the first's.
    readings = [{"hidden": 1}, {"hidden": 1, "output": 5}, {"hidden": 1}]
    assert decide_canary(golden, readings) == CanaryDecision(
        CanaryOutcome.INCONCLUSIVE, (), (), kept, "ranks ran canaries of different recipe classes")
    # The same classes in another insertion order are the same classes.
    same = decide_canary(golden, [{"output": 5, "hidden": 1}, {"hidden": 1, "output": 5}, {"hidden": 1, "output": 5}])
    assert same.outcome is not CanaryOutcome.INCONCLUSIVE


def test_CANARY_3_recording_keeps_the_majority_and_names_each_minority_rank_and_class() -> None:
    readings = [
        {"output": 5, "hidden": 1},
        {"output": 5, "hidden": 7},  # rank 1 differs in hidden
        {"output": 5, "hidden": 1},
        {"output": 9, "hidden": 1},  # rank 3 differs in output
        {"output": 5, "hidden": 1},
    ]
    decision = decide_canary(None, readings)
    assert decision == CanaryDecision(CanaryOutcome.RECORDED, (1, 3), ("hidden", "output"), KEPT, "")
    assert decision.status is Status.ATTRIBUTED
    # Only the class with a minority is listed; the ranks are sorted whatever the class order.
    only_output = decide_canary(None, [{"hidden": 1, "output": 9}, {"hidden": 1, "output": 5}, {"hidden": 1, "output": 5}])
    assert only_output == CanaryDecision(CanaryOutcome.RECORDED, (0,), ("output",), KEPT, "")


def test_CANARY_3_a_unanimous_record_agrees() -> None:
    decision = decide_canary(None, [dict(GOLDEN)] * 3)
    assert decision == CanaryDecision(CanaryOutcome.RECORDED, (), (), KEPT, "")
    assert decision.status is Status.AGREE
    # One rank alone records nothing: a group of one certifies nothing (VERDICT's singleton).
    assert decide_canary(None, [{"hidden": 4}]) == CanaryDecision(
        CanaryOutcome.INCONCLUSIVE, (), (), (), "canary hidden: no strict majority to record (Reason.SINGLETON)")


def test_CANARY_3_no_strict_majority_records_nothing_and_names_the_class() -> None:
    # hidden has a strict majority, output does not: nothing is recorded, not even hidden.
    readings = [{"hidden": 1, "output": 5}, {"hidden": 1, "output": 6}, {"hidden": 1, "output": 5}, {"hidden": 1, "output": 6}]
    assert decide_canary(None, readings) == CanaryDecision(
        CanaryOutcome.INCONCLUSIVE, (), (), (), "canary output: no strict majority to record (Reason.NO_MAJORITY)")


def test_CANARY_8_a_golden_of_other_classes_is_inconclusive_naming_both() -> None:
    readings = [{"hidden": 1, "expert": 3}] * 2
    assert decide_canary(GOLDEN, readings) == CanaryDecision(
        CanaryOutcome.INCONCLUSIVE, (), (), KEPT,
        "canary classes ['expert', 'hidden'] differ from the golden's ['hidden', 'output']")


def test_CANARY_4_unchanged_when_every_rank_matches_the_golden() -> None:
    decision = decide_canary(GOLDEN, [{"hidden": 1, "output": 5}] * 3)
    assert decision == CanaryDecision(CanaryOutcome.UNCHANGED, (), (), KEPT, "")
    assert decision.status is Status.AGREE


def test_CANARY_4_each_changed_rank_is_named_for_any_changed_class() -> None:
    readings = [
        {"hidden": 1, "output": 5},
        {"hidden": 2, "output": 5},  # only hidden changed
        {"hidden": 1, "output": 5},
        {"hidden": 1, "output": 6},  # only output changed
    ]
    decision = decide_canary(GOLDEN, readings)
    assert decision == CanaryDecision(CanaryOutcome.ATTRIBUTED, (1, 3), ("hidden", "output"), KEPT,
                                      "ranks [1, 3] changed their canary since it was recorded")
    assert decision.status is Status.ATTRIBUTED
    # A majority that changed together is still named (a vote would call it agreement).
    majority = decide_canary(GOLDEN, [{"hidden": 1, "output": 5}, {"hidden": 2, "output": 5}, {"hidden": 2, "output": 5}])
    assert majority == CanaryDecision(CanaryOutcome.ATTRIBUTED, (1, 2), ("hidden",), KEPT,
                                      "ranks [1, 2] changed their canary since it was recorded")


def test_CANARY_5_every_rank_changed_is_common_mode_with_only_the_changed_classes() -> None:
    readings = [{"hidden": 2, "output": 5}, {"hidden": 3, "output": 5}, {"hidden": 2, "output": 5}]
    decision = decide_canary(GOLDEN, readings)
    assert decision == CanaryDecision(
        CanaryOutcome.COMMON_MODE, (0, 1, 2), ("hidden",), KEPT,
        "every rank's canary changed since it was recorded: common-mode corruption")
    assert decision.status is Status.ATTRIBUTED
    # Every rank changed, each in another class: still common mode, both classes listed.
    mixed = decide_canary(GOLDEN, [{"hidden": 2, "output": 5}, {"hidden": 1, "output": 6}])
    assert (mixed.outcome, mixed.ranks, mixed.classes) == (CanaryOutcome.COMMON_MODE, (0, 1), ("hidden", "output"))
    # A single rank that changed is every rank: common mode, not attributed.
    assert decide_canary(GOLDEN, [{"hidden": 2, "output": 5}]).outcome is CanaryOutcome.COMMON_MODE


@pytest.mark.parametrize(
    ("outcome", "ranks", "status"),
    [
        (CanaryOutcome.RECORDED, (), Status.AGREE),
        (CanaryOutcome.RECORDED, (2,), Status.ATTRIBUTED),
        (CanaryOutcome.UNCHANGED, (), Status.AGREE),
        (CanaryOutcome.ATTRIBUTED, (1,), Status.ATTRIBUTED),
        (CanaryOutcome.COMMON_MODE, (0, 1), Status.ATTRIBUTED),
        (CanaryOutcome.INCONCLUSIVE, (), Status.INCONCLUSIVE),
    ],
)
def test_CANARY_7_the_status_the_gate_reads(outcome: CanaryOutcome, ranks: tuple[int, ...], status: Status) -> None:
    assert CanaryDecision(outcome, ranks, (), ()).status is status
