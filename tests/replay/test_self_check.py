"""The live path's self-check in one process (spec/replay.md SELF-1..SELF-3, SELF-8): the capture's
one-shot hook, the cut and exact replays, the codes in the evidence row and the vote. The real
4-rank jobs (DDP and FSDP2 under torchrun) are in tests/job/test_self_check_jobs.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

from scout.core.recipes import EvidenceKind, RecipeClass, RecipeId
from scout.core.replay_round import evidence_position
from scout.core.self_check import LiveCheck
from scout.core.verdict import Status
from scout.replay.capture import ModuleCapture
from scout.replay.self_check import LiveCall, check_live_call, not_reproducible, record_live_call
from tests.replay.row_wise import RowWiseLinear
from tests.replay.test_replay_local import Net, ScriptedPeers, _bitwise, _setup, _state, _train_step

HIDDEN_0 = RecipeId(RecipeClass.HIDDEN, 0)


def _flip(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
    """A user's fault injection: one bit of the first element of the output, as train_gpt.py does."""
    output = output.clone()
    with torch.no_grad():
        output.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)
    return output


def _live(module: nn.Module, *args: torch.Tensor, rows: int = 0) -> Any:
    """One captured call of ``module`` and its self-check outcome."""
    capture = ModuleCapture({HIDDEN_0: module}, 2**30, rows=rows, self_check=True)
    capture.arm(1, [HIDDEN_0])
    module(*args)
    outcome = capture.live(HIDDEN_0, 1)
    capture.close()
    return outcome


@pytest.mark.parametrize("rows", [0, 2])
def test_SELF_2_training_is_bitwise_the_same_with_the_self_check_on_or_off(rows: int) -> None:
    """BatchNorm (a buffer updated in the forward) and dropout (the RNG the call consumed): the
    self-replay updates no statistic twice and leaves the generator where the live call left it."""
    states = []
    for on in (True, False):
        model, optimizer, replayer = _setup(ScriptedPeers(), self_check=on, replay_rows=rows)
        for step in range(1, 4):
            _train_step(model, optimizer, step)
            report = replayer.after_optimizer_step()
            modules = [r for r in report.results if r.recipe.recipe_class is not RecipeClass.OPTIMIZER]
            assert all(r.status is Status.AGREE and r.self_checked is on for r in modules), report.results
        states.append(_state(model, optimizer) + [torch.get_rng_state()])
    assert _bitwise(states[0], states[1])


def test_SELF_1_SELF_4_a_flip_in_one_live_call_is_named_by_the_vote_with_source_live() -> None:
    """A forward hook flips one bit of hidden.1's output in this rank's live call of step 2 only:
    the replay vote cannot see it (the hook is gone by the check); this rank's code is DIFFER,
    and with its peers MATCH the recipe is attributed to it, from the live group alone."""
    slot = evidence_position(RecipeClass.HIDDEN, EvidenceKind.LIVE)
    rows_seen: list[list[int]] = []

    def peers_match(gather: int, rows: list[list[int]]) -> None:
        if len(rows[0]) > slot and rows[0][slot] == LiveCheck.DIFFER:
            rows_seen.append(list(rows[0]))
            for peer in (0, 1, 3):  # the others' live calls reproduced
                rows[peer][slot] = int(LiveCheck.MATCH)

    model, optimizer, replayer = _setup(ScriptedPeers(tamper=peers_match))
    _train_step(model, optimizer, 1)
    replayer.after_optimizer_step()
    handle = model.layers[1].register_forward_hook(_flip)  # registered before step 2's forward
    _train_step(model, optimizer, 2)
    handle.remove()
    report = replayer.after_optimizer_step()
    (hidden,) = [r for r in report.results if r.recipe == RecipeId(RecipeClass.HIDDEN, 1)]
    assert (hidden.status, hidden.outliers, hidden.sources) == (Status.ATTRIBUTED, (2,), ("live",))
    assert len(rows_seen) == 1  # only the hidden slot differed, once
    others = [r for r in report.results if r is not hidden]
    assert all(r.status is Status.AGREE for r in others), others


def test_SELF_3_a_cut_replay_that_matches_costs_rows_over_batch_and_a_mismatch_falls_back_to_the_exact_one() -> None:
    torch.manual_seed(0)
    linear = nn.Sequential(RowWiseLinear(6, 6), nn.GELU())  # rows independent of the batch on every CPU
    x = torch.randn(8, 6, requires_grad=True)
    assert (_live(linear, x, rows=2).code, _live(linear, x, rows=2).path) == (LiveCheck.MATCH, "cut")
    # BatchNorm in training mode couples the rows: the cut replay differs from the live rows,
    # which is no evidence; the exact replay of the whole call reproduces them.
    coupled = nn.Sequential(RowWiseLinear(6, 6), nn.BatchNorm1d(6))
    assert (_live(coupled, x, rows=2).code, _live(coupled, x, rows=2).path) == (LiveCheck.MATCH, "exact")
    assert _live(coupled, x, rows=0).path == "exact"
    # A flip in the checked rows is DIFFER; a flip outside them is not seen (SELF-6).
    linear.register_forward_hook(_flip)
    assert _live(linear, x, rows=2).code is LiveCheck.DIFFER
    late = RowWiseLinear(6, 6)
    late.register_forward_hook(lambda _m, _a, out: torch.cat([out[:2], _flip(late, None, out[2:])]))
    assert _live(late, x, rows=2).code is LiveCheck.MATCH
    assert _live(late, x, rows=0).code is LiveCheck.DIFFER


class _Noisy(nn.Module):
    """Draws from Python's generator, which replay does not capture: not reproducible."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * random.random()


def test_SELF_3_calls_that_cannot_be_reproduced_are_unchecked_never_differ() -> None:
    x = torch.randn(4, 3)
    noisy = _live(_Noisy(), x)
    assert (noisy.code, noisy.path) == (LiveCheck.UNCHECKED, "exact") and "two replays" in noisy.reason
    cast = nn.Linear(3, 3)
    cast.register_forward_hook(lambda _m, _a, out: out.double())  # like FSDP2's output_dtype
    assert _live(cast, x).code is LiveCheck.UNCHECKED and "structure" in _live(cast, x).reason
    failing = nn.Linear(3, 3)
    recorded = record_live_call(failing, (torch.randn(4, 5),), {}, torch.zeros(4, 3), rng=_rng())
    assert isinstance(recorded, LiveCall)
    outcome = check_live_call(recorded)
    assert outcome.code is LiveCheck.UNCHECKED and "self-check failed" in outcome.reason
    assert not_reproducible(torch.device("cpu")) is None
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert "without deterministic algorithms" in (not_reproducible(torch.device("cuda")) or "")
    finally:
        torch.use_deterministic_algorithms(previous)


def test_SELF_3_self_check_off_takes_no_part_and_the_result_says_so() -> None:
    capture = ModuleCapture({HIDDEN_0: nn.Linear(3, 3)}, 2**30, self_check=False)
    capture.arm(1, [HIDDEN_0])
    capture.module(HIDDEN_0)(torch.randn(2, 3))
    assert capture.live(HIDDEN_0, 1).code is LiveCheck.UNCHECKED
    assert capture.live(HIDDEN_0, 1).reason == "self_check is off"
    model, optimizer, replayer = _setup(ScriptedPeers(), self_check=False)
    _train_step(model, optimizer, 1)
    assert not any(r.self_checked for r in replayer.after_optimizer_step().results)
    assert isinstance(model, Net)


def _rng() -> Any:
    from scout.replay.rng import capture_rng_state

    return capture_rng_state()


def test_SELF_8_no_collective_is_added_and_a_transformer_block_takes_the_cut_replay() -> None:
    """SELF-8: the self-check adds no exchange (the same gathers and broadcasts with it on or off),
    and the example GPT's block (attention, LayerNorm, GELU MLP) reproduces its first row from a
    one-row replay on a CPU, so the exact replay of the whole call is not needed."""
    counts = []
    for on in (True, False):
        peers = ScriptedPeers()
        model, optimizer, replayer = _setup(peers, self_check=on)
        for step in range(1, 3):
            _train_step(model, optimizer, step)
            replayer.after_optimizer_step()
        counts.append((peers.gathers, peers.broadcasts))
    assert counts[0] == counts[1]
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("train_gpt", Path(__file__).parents[2] / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    block = example.Block()
    outcome = _live(block, torch.randn(8, example.SEQUENCE, example.WIDTH, requires_grad=True), rows=1)
    assert (outcome.code, outcome.path) == (LiveCheck.MATCH, "cut")


# -- SELF-9: never inside the live call -------------------------------------------------------


def _peers_match_when_this_rank_differs(rows_seen: list[list[int]]) -> ScriptedPeers:
    """Four peers; when this rank (position 2) reports DIFFER, the others reproduced theirs."""
    slot = evidence_position(RecipeClass.HIDDEN, EvidenceKind.LIVE)

    def tamper(_gather: int, rows: list[list[int]]) -> None:
        if len(rows[0]) > slot and rows[0][slot] == LiveCheck.DIFFER:
            rows_seen.append(list(rows[0]))
            for peer in (0, 1, 3):
                rows[peer][slot] = int(LiveCheck.MATCH)

    return ScriptedPeers(tamper=tamper)


def _phased_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, fault: Any,
                 *, through_backward: bool = False) -> None:
    """One training step whose forward (and backward, if asked) runs with ``fault`` entered."""
    import torch.nn.functional as F

    tokens = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(step))
    fault.enter()
    try:
        loss = F.cross_entropy(model(tokens), tokens.roll(1))
        if not through_backward:
            fault.exit()
        optimizer.zero_grad()
        loss.backward()
    finally:
        if through_backward:
            fault.exit()
    optimizer.step()


@pytest.mark.parametrize("through_backward", [False, True])
def test_SELF_9_FAULT_8_a_fault_confined_to_the_live_phase_is_differ_and_named(through_backward: bool) -> None:
    """Issue 41 in one process: a submodule of hidden.1 (its Linear, hooked by LiveFault) flips bit
    12 of one element only while the loop is inside ``model(x)`` (or inside the forward and the
    backward). A re-execution inside the live forward met the same flip and said MATCH; run at
    the optimizer's pre-step hook it does not, so this rank is DIFFER and the vote names it."""
    from scout.replay.faults import LiveFault

    rows_seen: list[list[int]] = []
    model, optimizer, replayer = _setup(_peers_match_when_this_rank_differs(rows_seen))
    fault = LiveFault(model.layers[1].linear, bit=12, element=1)
    _phased_step(model, optimizer, 1, fault, through_backward=through_backward)  # hidden.0's step
    replayer.after_optimizer_step()
    _phased_step(model, optimizer, 2, fault, through_backward=through_backward)  # hidden.1 captured
    # SELF-9: checked at the optimizer's pre-step hook, before job.step() asked for the code.
    pending = replayer.dense.capture._live[RecipeId(RecipeClass.HIDDEN, 1)]
    assert (pending.code, pending.path) == (LiveCheck.DIFFER, "exact"), pending
    report = replayer.after_optimizer_step()
    (hidden,) = [r for r in report.results if r.recipe == RecipeId(RecipeClass.HIDDEN, 1)]
    assert (hidden.status, hidden.outliers, hidden.sources) == (Status.ATTRIBUTED, (2,), ("live",))
    assert fault.struck == 2 and len(rows_seen) == 1
    # Healthy calls of the same job still reproduce: the step after the fault is taken away.
    fault.remove()
    _train_step(model, optimizer, 3)
    assert all(r.status is Status.AGREE for r in replayer.after_optimizer_step().results)


def test_SELF_9_the_re_execution_never_runs_inside_the_forward_or_the_backward() -> None:
    """Every call of a submodule during the step is logged with the phase the loop is in: the
    self-check's calls (those beyond the live forward's one per step) come after the backward."""
    model, optimizer, replayer = _setup(ScriptedPeers())
    phase = ["outside"]
    seen: list[str] = []
    model.layers[0].linear.register_forward_hook(lambda _m, _a, _o: seen.append(phase[0]))
    for step in (1, 2, 3):
        tokens = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(step))
        seen.clear()
        phase[0] = "forward"
        loss = torch.nn.functional.cross_entropy(model(tokens), tokens.roll(1))
        phase[0] = "backward"
        optimizer.zero_grad()
        loss.backward()
        phase[0] = "optimizer"
        optimizer.step()
        phase[0] = "job.step"
        report = replayer.after_optimizer_step()
        assert all(r.status is Status.AGREE and r.self_checked for r in report.results
                   if r.recipe.recipe_class is not RecipeClass.OPTIMIZER), report.results
        assert seen.count("forward") == 1 and "backward" not in seen, seen
        if step % 2:  # hidden.0 is captured at odd steps: its re-execution ran before the update
            assert "optimizer" in seen, seen


def test_SELF_9_without_an_optimizer_the_check_runs_at_job_step_and_changed_state_is_unchecked(
        caplog: pytest.LogCaptureFixture) -> None:
    """Replay not given the optimizer: the re-execution runs when job.step() asks for the code. An
    optimizer scout does not know stepped the parameters first: UNCHECKED, naming the parameter --
    never a comparison with parameters the live call did not use. A step that left them alone (a
    loss scaler that skipped it) is checked there."""
    import logging

    from scout.replay.replay import ReplayConfig, Replayer
    from tests.replay.test_replay_local import EVERY_STEP

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    replayer = Replayer(model, None, ScriptedPeers(), ReplayConfig(intervals=EVERY_STEP))
    with caplog.at_level(logging.INFO, logger="scout.replay"):
        _train_step(model, optimizer, 1)  # steps the parameters before job.step()
        report = replayer.after_optimizer_step()
    assert not any(r.self_checked for r in report.results), report.results
    assert "parameter 'linear.weight' changed after the live call" in caplog.text
    tokens = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
    torch.nn.functional.cross_entropy(model(tokens), tokens.roll(1)).backward()  # no optimizer step
    report = replayer.after_optimizer_step()
    assert all(r.self_checked for r in report.results), report.results
    replayer.close()


def test_SELF_9_an_argument_modified_in_place_and_a_call_that_raised_are_unchecked() -> None:
    linear = nn.Linear(6, 6)
    capture = ModuleCapture({HIDDEN_0: linear}, 2**30, self_check=True)
    capture.arm(1, [HIDDEN_0])
    x = torch.randn(4, 6)
    linear(x)
    x.add_(1.0)  # the loop reuses the activation's storage after the call
    outcome = capture.live(HIDDEN_0, 1)
    assert outcome.code is LiveCheck.UNCHECKED and "modified in place" in outcome.reason

    def raising(_module: nn.Module, _args: Any, _output: Any) -> None:
        raise RuntimeError("the forward failed")

    handle = linear.register_forward_hook(raising)  # runs before the capture's one-shot hook
    capture.arm(2, [HIDDEN_0])
    with pytest.raises(RuntimeError, match="the forward failed"):
        linear(torch.randn(4, 6))
    handle.remove()
    linear(torch.randn(4, 6))  # a later call of the step (a retry) is not the captured one
    outcome = capture.live(HIDDEN_0, 2)
    assert outcome.code is LiveCheck.UNCHECKED and "raised before it returned" in outcome.reason
    capture.close()
