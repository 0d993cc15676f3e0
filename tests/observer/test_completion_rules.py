"""The completion rules of a round's assessment (spec/observer.md COMPLETION-1..8), on the pure
``assess``: the blocking collective, each rank's state of it, and the votes -- all by
``classify_exact``. The explorer checks the same rules over lossy groups
(test_observer_model.py); these read like the spec, one clause at a time."""

from __future__ import annotations

import pytest

from scout.core.observer import (
    BlockState,
    Completion,
    Evidence,
    Finding,
    ObserverConfig,
    PendingState,
    Scope,
    Stage,
    StallKind,
    assess,
    block_states,
)

S = 0x5C0
F, F2, G = 0xF00D, 0xBEEF, 0x600D
B = 10  # the blocking collective in these rounds
E, ST, U = PendingState.ENQUEUED, PendingState.STARTED, PendingState.UNKNOWN


def config(n: int = 4) -> ObserverConfig:
    return ObserverConfig(0, n, stall_threshold_s=2.0, settle_idle_s=1.0)


def rank(op: int = 3, *, enqueued: int = B, completed: int = B - 1, fp: int = F, state: PendingState = ST,
         done_fp: int = 0, source: int = S, stage: Stage = Stage.COMPUTE) -> Evidence:
    pending = enqueued > completed
    completion = Completion(source, enqueued, completed, fp if pending else 0, state if pending else PendingState.NONE,
                            done_fp)
    return Evidence(5, op, 0, stage, 3.0, completion, 2.5 if pending else 0.0)


WAITING = rank()  # b enqueued, its kernel started, waiting for a peer; host at the sync point
GPU_HANG = rank(state=E)  # b enqueued, the stream never reaches it
NOT_ENQUEUED = rank(op=1, enqueued=B - 1)  # the host sleeps before enqueueing b
THREAD_LATE = rank(enqueued=B - 1)  # host at the sync point; the thread that issues b never did
PAST = rank(op=4, enqueued=B + 1, completed=B, fp=G, done_fp=F)  # a broadcast let it through b


def test_COMPLETION_1_the_rules_apply_only_to_comparable_evidence_with_something_pending() -> None:
    assert block_states([WAITING, GPU_HANG, WAITING, WAITING]) == (
        B, (BlockState.STARTED, BlockState.ENQUEUED, BlockState.STARTED, BlockState.STARTED))
    untracked = Evidence(5, 3, 0, Stage.COMPUTE, 3.0)
    assert block_states([WAITING, untracked, WAITING, WAITING]) is None  # an older record
    assert block_states([WAITING, rank(source=S + 1), WAITING, WAITING]) is None  # another group or numbering
    idle = rank(enqueued=B, completed=B)
    assert block_states([idle, idle, idle, idle]) is None  # nothing pending anywhere
    # Without them the host coordinates judge, as before: all at one point, one collective.
    found = assess([idle, idle, idle, idle], config())
    assert (found.outcome, found.blocking) == (Finding.GROUP_STALL, 0)


def test_COMPLETION_2_each_ranks_state_of_the_blocking_collective() -> None:
    blocking, states = block_states([WAITING, PAST, NOT_ENQUEUED, rank(state=U), None])  # type: ignore[misc]
    assert blocking == B
    assert states == (BlockState.STARTED, BlockState.COMPLETED, BlockState.NOT_ENQUEUED, BlockState.UNKNOWN, None)


@pytest.mark.parametrize("culprit", [0, 2, 3])
def test_COMPLETION_5_a_gpu_side_hang_on_any_rank_is_named_though_every_host_waits_at_one_point(culprit: int) -> None:
    evidence = [GPU_HANG if p == culprit else WAITING for p in range(4)]
    found = assess(evidence, config())
    assert (found.outcome, found.attributed, found.kind, found.scope, found.blocking) == (
        Finding.BEHIND, (culprit,), StallKind.HANG, Scope.RANK, B)
    assert "never started" in found.reason and found.key == (5, 3)


def test_COMPLETION_3_a_rank_that_never_enqueued_b_is_behind_whether_its_host_or_another_thread_is_late() -> None:
    for late in (NOT_ENQUEUED, THREAD_LATE):
        found = assess([WAITING, late, WAITING, WAITING], config())
        assert (found.outcome, found.attributed, found.blocking) == (Finding.BEHIND, (1,), B)
        assert "never enqueued" in found.reason


def test_COMPLETION_3_ddps_buffer_broadcast_the_ranks_a_tree_let_through_count_as_having_enqueued_it() -> None:
    """Gloo, started unknown: two ranks completed the broadcast and wait in the bucket
    all-reduce, one waits in the broadcast, one sleeps before its forward."""
    gloo = rank(state=U)
    past = rank(op=9, enqueued=B + 1, completed=B, fp=G, state=U, done_fp=F)
    found = assess([past, past, rank(op=1, enqueued=B - 1), gloo], config())
    assert (found.outcome, found.attributed, found.reason.startswith("never enqueued")) == (Finding.BEHIND, (2,), True)
    # No strict majority has enqueued b (2 of 4): inconclusive, confirmed before it is reported.
    two = assess([past, rank(op=1, enqueued=B - 1), rank(op=1, enqueued=B - 1), gloo], config())
    assert two.outcome is Finding.INCONCLUSIVE and two.attributed == () and two.blocking == B


def test_COMPLETION_4_a_pending_fingerprint_that_differs_is_a_desync_also_against_a_rank_past_b() -> None:
    found = assess([WAITING, WAITING, rank(fp=F2), WAITING], config())
    assert (found.outcome, found.attributed, found.kind) == (Finding.DESYNC, (2,), StallKind.DESYNC)
    # A rank past b contributes the fingerprint of b it completed.
    found = assess([PAST, WAITING, rank(fp=F2)], config(3))
    assert (found.outcome, found.attributed) == (Finding.DESYNC, (2,))
    # An unknown fingerprint (not seen) is no vote.
    found = assess([WAITING, rank(fp=0), rank(fp=F2), rank(fp=0)], config())
    assert found.outcome is Finding.GROUP_STALL


@pytest.mark.parametrize("root", [0, 3])
def test_COMPLETION_4_a_rank_that_completed_past_b_votes_only_b_s_own_fingerprint(root: int) -> None:
    """A broadcast root a few collectives ahead: it completed b and two more, and its last completed
    fingerprint (of b + 2) differs from b's. That fingerprint is not b's and takes no part in the
    vote: nobody is a desync -- the peers wait in b, which the root has passed (group stall of b's
    waiters, no rank named). Only a rank whose last completed collective *is* b votes its
    completed fingerprint (the test above)."""
    ahead = rank(op=7, enqueued=B + 3, completed=B + 2, fp=G, done_fp=F2)
    evidence = [ahead if p == root else WAITING for p in range(4)]
    found = assess(evidence, config())
    assert found.outcome is not Finding.DESYNC and found.attributed == (), found
    assert (found.outcome, found.blocking) == (Finding.GROUP_STALL, B), found
    # The same rank one collective past b, whose last completed one is b: F2 is b's fingerprint there.
    at_b = rank(op=7, enqueued=B + 1, completed=B, fp=G, done_fp=F2)
    found = assess([at_b if p == root else WAITING for p in range(4)], config())
    assert (found.outcome, found.attributed) == (Finding.DESYNC, (root,)), found


def test_COMPLETION_6_no_device_started_b_is_a_group_stall_and_a_minority_started_is_inconclusive() -> None:
    found = assess([GPU_HANG] * 4, config())
    assert (found.outcome, found.scope, found.attributed) == (Finding.GROUP_STALL, Scope.GROUP, ())
    assert "no rank's device started" in found.reason
    found = assess([GPU_HANG, GPU_HANG, GPU_HANG, WAITING], config())
    assert (found.outcome, found.attributed) == (Finding.INCONCLUSIVE, ())
    found = assess([GPU_HANG, GPU_HANG, WAITING, WAITING], config())
    assert (found.outcome, found.attributed) == (Finding.INCONCLUSIVE, ())


def test_COMPLETION_7_a_stuck_collective_everyone_started_is_a_group_stall_or_unresponsive_peers() -> None:
    found = assess([WAITING] * 4, config())
    assert (found.outcome, found.scope, found.missing) == (Finding.GROUP_STALL, Scope.GROUP, ())
    found = assess([WAITING, WAITING, WAITING, None], config())
    assert (found.outcome, found.missing, found.attributed) == (Finding.UNRESPONSIVE, (3,), ())
    # Gloo (started unknown): enqueued everywhere, nobody differs.
    assert assess([rank(state=U)] * 4, config()).outcome is Finding.GROUP_STALL
    # A culprit among missing peers is still named.
    found = assess([WAITING, None, GPU_HANG, WAITING, WAITING], config(5))
    assert (found.outcome, found.attributed, found.missing) == (Finding.BEHIND, (2,), (1,))


def test_COMPLETION_8_a_rank_that_enqueued_b_while_the_majority_did_not_is_never_named() -> None:
    """Two ranks sleep before b; the third waits in it. The host rules alone would name the
    waiting rank as ahead of the majority's coordinate."""
    found = assess([NOT_ENQUEUED, NOT_ENQUEUED, WAITING], config(3))
    assert (found.outcome, found.attributed) == (Finding.INCONCLUSIVE, ())
    # The host rules still name a rank behind the majority.
    behind = rank(op=0, enqueued=B - 1)
    found = assess([NOT_ENQUEUED, NOT_ENQUEUED, behind, NOT_ENQUEUED, WAITING], config(5))
    assert (found.outcome, found.attributed, found.blocking) == (Finding.BEHIND, (2,), 0)


def test_COMPLETION_unsettled_ranks_come_first_and_stages_give_the_kind() -> None:
    moving = Evidence(5, 9, 0, Stage.COMPUTE, 0.1, WAITING.completion, 0.1)
    assert assess([WAITING, moving, GPU_HANG, WAITING], config()).outcome is Finding.UNSETTLED
    loading = rank(op=1, enqueued=B - 1, stage=Stage.DATA_LOADING)
    loading = Evidence(loading.step, loading.op, 0, Stage.DATA_LOADING, 40.0, loading.completion)
    found = assess([WAITING, WAITING, loading, WAITING], ObserverConfig(0, 4, stall_threshold_s=2.0,
                                                                         data_stall_threshold_s=30.0,
                                                                         settle_idle_s=1.0))
    assert (found.outcome, found.attributed, found.kind) == (Finding.BEHIND, (2,), StallKind.DATA_STALL)
