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
from scout.replay.self_check import check_live_call, not_reproducible
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
    linear = nn.Sequential(nn.Linear(6, 6), nn.GELU())
    x = torch.randn(8, 6, requires_grad=True)
    assert (_live(linear, x, rows=2).code, _live(linear, x, rows=2).path) == (LiveCheck.MATCH, "cut")
    # BatchNorm in training mode couples the rows: the cut replay differs from the live rows,
    # which is no evidence; the exact replay of the whole call reproduces them.
    coupled = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
    assert (_live(coupled, x, rows=2).code, _live(coupled, x, rows=2).path) == (LiveCheck.MATCH, "exact")
    assert _live(coupled, x, rows=0).path == "exact"
    # A flip in the checked rows is DIFFER; a flip outside them is not seen (SELF-6).
    linear.register_forward_hook(_flip)
    assert _live(linear, x, rows=2).code is LiveCheck.DIFFER
    late = nn.Linear(6, 6)
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
    outcome = check_live_call(failing, (torch.randn(4, 5),), {}, torch.zeros(4, 3), rng=_rng())
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
