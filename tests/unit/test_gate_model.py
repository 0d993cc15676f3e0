"""The gate model's certification check, ``is_complete_and_clean`` (GATE-1, GATE-8), on records
the machine never builds: the check is the invariants' ground truth, so each of its refusals is
tested directly (the explorations only ever hand it well-formed cycles). Also the step seen so
far, which the explorations cannot vary (their results all sit at a cycle's first step)."""

from __future__ import annotations

import pytest

from scout.gate.model import (
    CheckpointCaptured,
    CycleBoundary,
    CycleRecord,
    GateConfig,
    GateReport,
    GateReportKind,
    GateState,
    GroupVerdict,
    Outcome,
    Recipe,
    RecipeVerdicts,
    Replay,
    is_complete_and_clean,
)
from scout.gate.step import GateInputError, check_event, initial_state, step

CONFIG = GateConfig("job", (Recipe("embedding", ("dp0",)), "hidden"), ("dp0", "dp1"))


def agree(*groups: str) -> tuple[GroupVerdict, ...]:
    return tuple(GroupVerdict(group, Outcome.AGREE) for group in groups)


GOOD = CycleRecord(
    3, 100, 200, (Replay("embedding", 100, agree("dp0")), Replay("hidden", 150, agree("dp0", "dp1")))
)


def with_replays(*replays: Replay, start: int = 100, end: int = 200) -> CycleRecord:
    return CycleRecord(3, start, end, replays)


def test_GATE_8_a_complete_clean_cycle_certifies() -> None:
    assert is_complete_and_clean(CONFIG, GOOD)
    # Replays on the boundaries themselves are inside the cycle.
    edges = with_replays(Replay("embedding", 100, agree("dp0")), Replay("hidden", 200, agree("dp0", "dp1")))
    assert is_complete_and_clean(CONFIG, edges)


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(
            with_replays(Replay("embedding", 200, agree("dp0")), Replay("hidden", 200, agree("dp0", "dp1")), start=200, end=200),
            id="empty-cycle",
        ),
        pytest.param(with_replays(*GOOD.replays, start=201, end=200), id="backwards-cycle"),
        pytest.param(with_replays(GOOD.replays[1]), id="a-recipe-not-replayed"),
        pytest.param(with_replays(GOOD.replays[0], Replay("hidden", 99, agree("dp0", "dp1"))), id="replay-before-start"),
        pytest.param(with_replays(GOOD.replays[0], Replay("hidden", 201, agree("dp0", "dp1"))), id="replay-after-end"),
        pytest.param(with_replays(GOOD.replays[0], Replay("hidden", 150, agree("dp0"))), id="a-group-left-out"),
        pytest.param(with_replays(Replay("embedding", 100, agree("dp0", "dp1")), GOOD.replays[1]), id="a-group-it-does-not-apply-to"),
        pytest.param(
            with_replays(
                GOOD.replays[0],
                Replay("hidden", 150, (GroupVerdict("dp0", Outcome.AGREE), GroupVerdict("dp1", Outcome.INCONCLUSIVE, (), "no-majority"))),
            ),
            id="an-inconclusive-group",
        ),
        pytest.param(
            with_replays(
                GOOD.replays[0],
                Replay("hidden", 150, agree("dp0", "dp1")),
                Replay("hidden", 160, (GroupVerdict("dp0", Outcome.ATTRIBUTED, (1,)), GroupVerdict("dp1", Outcome.AGREE))),
            ),
            id="a-later-attributed-replay",
        ),
    ],
)
def test_GATE_1_GATE_8_what_does_not_certify(record: CycleRecord) -> None:
    assert not is_complete_and_clean(CONFIG, record)


def test_GATE_16_every_accepted_result_moves_the_step_seen_so_far() -> None:
    """A result inside an UNCLEAN cycle is a step the job has reached: a capture behind it is
    refused like any other capture behind a step already seen (every result row updates it)."""
    config = GateConfig("job", ("embedding", "hidden"), ("dp0",))
    inconclusive = (GroupVerdict("dp0", Outcome.INCONCLUSIVE, (), "no-majority"),)
    state, _ = step(initial_state(config), CycleBoundary(100))
    state, _ = step(state, RecipeVerdicts("embedding", 1, 130, inconclusive))  # CHECKING -> UNCLEAN
    assert state.control is GateState.UNCLEAN
    with pytest.raises(GateInputError, match="behind step 130"):
        check_event(state, CheckpointCaptured(120))
    state, _ = step(state, RecipeVerdicts("hidden", 1, 150, inconclusive))  # still UNCLEAN
    with pytest.raises(GateInputError, match="behind step 150"):
        check_event(state, CheckpointCaptured(140))
    with pytest.raises(GateInputError, match="behind step 150"):
        check_event(state, CycleBoundary(140))


def test_GATE_5_an_inconclusive_group_without_a_reason_code_is_reported_as_such() -> None:
    config = GateConfig("job", ("hidden",), ("dp0", "dp1"))
    state, _ = step(initial_state(config), CycleBoundary(100))
    silent = (GroupVerdict("dp0", Outcome.INCONCLUSIVE), GroupVerdict("dp1", Outcome.MISSING, (), "no-result"))
    _, effects = step(state, RecipeVerdicts("hidden", 1, 100, silent))
    (report,) = [e for e in effects if isinstance(e, GateReport)]
    assert report.kind is GateReportKind.UNCHECKED and report.groups == ("dp0", "dp1")
    assert "group dp0 inconclusive (no reason given); group dp1 gave no verdict." in report.detail
