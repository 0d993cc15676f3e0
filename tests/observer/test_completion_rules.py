"""The completion rules of a round's assessment (spec/observer.md COMPLETION-1..12), on the pure
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
    HostContract,
    ObserverConfig,
    PendingState,
    Scope,
    Stage,
    StallKind,
    assess,
    block_states,
)
from scout.core.observer.machine import HOST_PROGRESS_ONLY, WAITING_ELSEWHERE, voters

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


def test_COMPLETION_1_each_group_is_judged_by_its_voters_with_something_pending() -> None:
    assert block_states([WAITING, GPU_HANG, WAITING, WAITING]) == (
        B, (BlockState.STARTED, BlockState.ENQUEUED, BlockState.STARTED, BlockState.STARTED))
    # A rank without completion evidence votes as missing; it is not "not enqueued".
    untracked = Evidence(5, 3, 0, Stage.COMPUTE, 3.0)
    assert block_states([WAITING, untracked, WAITING, WAITING]) == (
        B, (BlockState.STARTED, None, BlockState.STARTED, BlockState.STARTED))
    # A rank that tracks another group only is not a voter of this one.
    other = rank(source=S + 1)
    assert voters([WAITING, other, WAITING, None], S) == (0, 2, 3)
    assert block_states([WAITING, other, WAITING, WAITING], S) == (
        B, (BlockState.STARTED, None, BlockState.STARTED, BlockState.STARTED))
    assert block_states([WAITING, other, WAITING, WAITING]) is None  # two groups pending: say which
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


# --------------------------------------------------------------------------------------------
# Soundness under NCCL's contract (COMPLETION-9..12)
# --------------------------------------------------------------------------------------------

SUB = 0x5B  # a sub-group's source


def on(item: Evidence, *extra: Completion, contract: HostContract = HostContract.ENQUEUE,
       stale: bool = False) -> Evidence:
    """``item`` with more groups' coordinates, under a host contract."""
    completions = (*item.completions, *extra)
    return Evidence(item.step, item.op, item.fingerprint, item.stage, item.idle_s, completions,
                    (*item.pending_age_s, *(1.0 for _ in extra)), contract, stale)


def idle_group(source: int, done: int = 4) -> Completion:
    return Completion(source, done, done)


def test_COMPLETION_9_host_coordinates_name_nobody_where_collectives_return_at_enqueue() -> None:
    """The issue's sub-group run-ahead: rank 0 drains for logging (host behind), the others run
    two steps ahead, rank 1's stream stalls -- and the group whose collectives stall publishes no
    completion evidence. The host rules alone would name rank 0."""
    drained = Evidence(19, 2, 0, Stage.COMPUTE, 3.0)
    ahead = Evidence(21, 5, 0, Stage.COMPUTE, 3.0)
    blocking = assess([drained, ahead, ahead], config(3))
    assert (blocking.outcome, blocking.attributed) == (Finding.BEHIND, (0,))  # gloo: the host is where the work is
    enqueue = [on(e, contract=HostContract.ENQUEUE) for e in (drained, ahead, ahead)]
    found = assess(enqueue, config(3))
    assert (found.outcome, found.attributed, found.code) == (Finding.INCONCLUSIVE, (), HOST_PROGRESS_ONLY)
    assert "positions [0]" in found.reason and "no completion evidence" in found.reason
    # Tracked groups with nothing pending: the detail says the stall is outside them.
    tracked = [on(e, idle_group(S), contract=HostContract.ENQUEUE) for e in (drained, ahead, ahead)]
    found = assess(tracked, config(3))
    assert (found.outcome, found.code) == (Finding.INCONCLUSIVE, HOST_PROGRESS_ONLY)
    assert "outside every tracked group" in found.reason
    # A desync by host fingerprints alone is no evidence either.
    same = Evidence(21, 5, F, Stage.COLLECTIVE, 3.0)
    odd = Evidence(21, 5, F2, Stage.COLLECTIVE, 3.0)
    found = assess([on(same), on(odd), on(same)], config(3))
    assert (found.outcome, found.attributed, found.code) == (Finding.INCONCLUSIVE, (), HOST_PROGRESS_ONLY)


def test_COMPLETION_9_a_rank_whose_process_stopped_is_still_named_by_where_it_stopped() -> None:
    waiting = on(rank(op=5), contract=HostContract.ENQUEUE)
    stopped = on(Evidence(5, 2, 0, Stage.COMPUTE, 3.0), contract=HostContract.ENQUEUE, stale=True)
    found = assess([waiting, stopped, waiting, waiting], config())
    assert (found.outcome, found.attributed, found.blocking) == (Finding.BEHIND, (1,), 0)
    # Only the stopped rank: a running rank the host rules single out beside it is not named.
    drained = on(Evidence(5, 1, 0, Stage.COMPUTE, 3.0, idle_group(S)), contract=HostContract.ENQUEUE)
    found = assess([waiting, stopped, waiting, drained, waiting], config(5))
    assert (found.outcome, found.attributed) == (Finding.BEHIND, (1,))


def test_COMPLETION_9_the_issues_run_ahead_hang_names_the_stalled_rank_once_its_group_is_tracked() -> None:
    """Same job, the sub-group tracked: rank 1's collective #19 was enqueued but never started;
    ranks 0 and 2 started it and wait (rank 0 drained at its host, rank 2 ran ahead)."""
    drained = Evidence(19, 2, 0, Stage.COMPUTE, 3.0, Completion(SUB, 20, 18, F, ST), 2.0, HostContract.ENQUEUE)
    stalled = Evidence(21, 5, 0, Stage.COMPUTE, 3.0, Completion(SUB, 22, 18, F, E), 2.0, HostContract.ENQUEUE)
    ahead = Evidence(21, 5, 0, Stage.COMPUTE, 3.0, Completion(SUB, 22, 18, F, ST), 2.0, HostContract.ENQUEUE)
    found = assess([drained, stalled, ahead], config(3))
    assert (found.outcome, found.attributed, found.blocking, found.source) == (Finding.BEHIND, (1,), 19, SUB)


def test_COMPLETION_10_a_rank_that_waits_in_another_groups_collective_is_not_named() -> None:
    """Group S: rank 1 never enqueued b -- because its host waits at a sync point for its device,
    which waits in a started collective of the sub-group."""
    waits = on(rank(op=1, enqueued=B - 1), Completion(SUB, 3, 2, G, ST))
    others = [on(WAITING, idle_group(SUB, 3)) for _ in range(3)]
    found = assess([others[0], waits, others[1], others[2]], config())
    assert (found.outcome, found.attributed, found.code) == (Finding.INCONCLUSIVE, (), WAITING_ELSEWHERE)
    # The same rank with nothing pending elsewhere is named.
    idle = on(rank(op=1, enqueued=B - 1), idle_group(SUB, 3))
    found = assess([others[0], idle, others[1], others[2]], config())
    assert (found.outcome, found.attributed) == (Finding.BEHIND, (1,))
    # A pending point-to-point receive is waiting too (COMPLETION-11).
    receiving = on(rank(op=1, enqueued=B - 1), Completion(SUB + 7, 2, 1, F2, U, point_to_point=True))
    found = assess([others[0], receiving, others[1], others[2]], config())
    assert (found.outcome, found.code) == (Finding.INCONCLUSIVE, WAITING_ELSEWHERE)


def test_COMPLETION_11_point_to_point_coordinates_are_never_voted_on() -> None:
    """Three ranks' own sends and receives; rank 1's receive is pending. Nothing is compared (the
    numbers are each rank's own): the host rules judge, and under the enqueue contract they name
    nobody."""
    def sends(position: int) -> Completion:
        if position == 1:
            return Completion(0x900 + position, 4, 3, F, E, point_to_point=True)
        return Completion(0x900 + position, 4, 4, point_to_point=True)

    found = assess([on(Evidence(5, 3 if p != 1 else 2, 0, Stage.COMPUTE, 3.0), sends(p)) for p in range(3)], config(3))
    assert (found.blocking, found.attributed, found.code) == (0, (), HOST_PROGRESS_ONLY)


def test_COMPLETION_12_with_several_groups_pending_the_oldest_blocking_collective_decides() -> None:
    """A TP pair (sub-group, 2 voters: detectable, never attributable) and the default group where
    rank 3 never enqueued b: the attribution wins whatever the ages; between two findings that
    name nobody, the older group's."""
    tp = Completion(SUB, 6, 5, G, ST)
    ranks = [on(WAITING, tp), on(WAITING, Completion(SUB, 6, 5, G, E)), on(WAITING), on(NOT_ENQUEUED)]
    found = assess(ranks, config())
    assert (found.outcome, found.attributed, found.source) == (Finding.BEHIND, (3,), S)
    # Nobody named anywhere: the group pending longest speaks.
    old = [on(WAITING, tp), on(WAITING, Completion(SUB, 6, 5, G, E)), on(WAITING), on(WAITING)]
    old = [Evidence(e.step, e.op, e.fingerprint, e.stage, e.idle_s, e.completions,
                    tuple(9.0 if c.source == SUB else 1.0 for c in e.completions), e.contract) for e in old]
    found = assess(old, config())
    assert (found.source, found.outcome) == (SUB, Finding.INCONCLUSIVE)
