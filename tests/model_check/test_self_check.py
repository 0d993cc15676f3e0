"""The live path's self-check decision (spec/replay.md SELF-4, SELF-5): exhaustively for every
group of up to 6 peers over every code (MATCH, DIFFER, UNCHECKED, an unknown code, MISSING)
against a clause-by-clause reference that counts by hand, and by property for larger groups.
The decision must take its majority from ``classify_exact`` (one rule, VERDICT): a test reads
the module to make sure no second count of a majority appears in it."""

from __future__ import annotations

import contextlib
import inspect
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scout.core import self_check
from scout.core.self_check import LiveCheck, SelfCheckOutcome, SelfCheckVerdict, decide_self_check
from scout.core.verdict import MISSING

UNKNOWN = 7  # a code this version does not know: takes no part (SELF-4)
CODES: tuple[Any, ...] = (MISSING, int(LiveCheck.UNCHECKED), int(LiveCheck.MATCH), int(LiveCheck.DIFFER), UNKNOWN)


def naive(codes: list[Any]) -> tuple[SelfCheckOutcome, tuple[int, ...], str | None]:
    """SELF-4 read literally, counting by hand (the reference, not the product)."""
    n = len(codes)
    match = [i for i, c in enumerate(codes) if c == LiveCheck.MATCH]
    differ = [i for i, c in enumerate(codes) if c == LiveCheck.DIFFER]
    silent = n - len(match) - len(differ)  # UNCHECKED, unknown and MISSING take no part
    if not match and not differ:
        return SelfCheckOutcome.NOT_CHECKED, (), None
    if n == 1:
        return SelfCheckOutcome.INCONCLUSIVE, (), "singleton"
    if 2 * len(match) > n:
        if differ:
            return SelfCheckOutcome.ATTRIBUTED, tuple(differ), None
        if silent:
            return SelfCheckOutcome.INCONCLUSIVE, (), "missing-evidence"
        return SelfCheckOutcome.AGREE, (), None
    if 2 * len(differ) > n:
        return SelfCheckOutcome.INCONCLUSIVE, (), "not-reproducible"
    if 2 * (max(len(match), len(differ)) + silent) > n:
        return SelfCheckOutcome.INCONCLUSIVE, (), "missing-evidence"
    return SelfCheckOutcome.INCONCLUSIVE, (), "no-majority"


def summary(verdict: SelfCheckVerdict) -> tuple[SelfCheckOutcome, tuple[int, ...], str | None]:
    return verdict.outcome, verdict.outliers, verdict.reason


def test_SELF_4_SELF_5_every_group_of_up_to_6_peers_decides_as_the_reference() -> None:
    checked = 0
    for n in range(1, 7):
        for codes in itertools.product(CODES, repeat=n):
            decided = decide_self_check(list(codes))
            assert summary(decided) == naive(list(codes)), codes
            # SELF-5: only a DIFFER peer is ever named, and only under a strict MATCH majority.
            assert all(codes[p] == LiveCheck.DIFFER for p in decided.outliers), codes
            assert (decided.outcome is SelfCheckOutcome.ATTRIBUTED) == bool(decided.outliers)
            checked += 1
    assert checked == sum(len(CODES) ** n for n in range(1, 7))


def test_SELF_4_one_rule_the_majority_comes_from_classify_exact() -> None:
    source = inspect.getsource(self_check)
    assert "classify_exact(" in source
    assert "2 *" not in source and "most_common" not in source and "Counter" not in source
    healthy = decide_self_check([1, 1, 1, 2])
    assert healthy.verdict is not None and healthy.verdict.healthy_value == LiveCheck.MATCH


def test_SELF_4_worked_cases() -> None:
    assert decide_self_check([1, 1, 1, 1]).outcome is SelfCheckOutcome.AGREE
    assert summary(decide_self_check([1, 2, 1, 1])) == (SelfCheckOutcome.ATTRIBUTED, (1,), None)
    # The majority does not reproduce its own live output: nondeterminism, never a fault.
    assert summary(decide_self_check([2, 2, 2, 1])) == (SelfCheckOutcome.INCONCLUSIVE, (), "not-reproducible")
    # Two replicas see the disagreement, and name nobody.
    assert summary(decide_self_check([1, 2])) == (SelfCheckOutcome.INCONCLUSIVE, (), "no-majority")
    # A rank that could not check takes no part; its silence may hide a majority either way.
    assert summary(decide_self_check([1, 1, 0, 2])) == (SelfCheckOutcome.INCONCLUSIVE, (), "missing-evidence")
    assert decide_self_check([0, 0, 0]).outcome is SelfCheckOutcome.NOT_CHECKED
    assert decide_self_check([MISSING, 0, UNKNOWN]).outcome is SelfCheckOutcome.NOT_CHECKED


def test_SELF_4_bad_input_is_an_error_naming_the_value() -> None:
    import pytest

    with pytest.raises(ValueError, match="at least one"):
        decide_self_check([])
    with pytest.raises(TypeError, match=r"peer 1: .* got str 'match'"):
        decide_self_check([1, "match"])
    with pytest.raises(TypeError, match="got bool"):
        decide_self_check([1, True])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CODES), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_SELF_4_SELF_5_properties_for_larger_groups(codes: list[Any], random: Any) -> None:
    decided = decide_self_check(codes)
    assert summary(decided) == naive(codes)
    # VERDICT-7: permuting the peers permutes the outliers and changes nothing else.
    order = list(range(len(codes)))
    random.shuffle(order)
    permuted = decide_self_check([codes[i] for i in order])
    assert permuted.outcome is decided.outcome and permuted.reason == decided.reason
    assert sorted(order[p] for p in permuted.outliers) == list(decided.outliers)
    # More MATCH peers never turn an attribution into silence, and a MATCH peer is never named.
    assert not any(codes[p] != LiveCheck.DIFFER for p in decided.outliers)


# -- The deferred re-execution: every order of a step's events, on the real capture ----------------

FIRST = ("forward", "struck forward", "struck forward and backward", "raising forward")
LATER = ("second forward", "in-place parameters", "in-place input", "optimizer step")
BACKWARDS = (None, "backward", "backward recomputing")


def _step_orders() -> list[tuple[str, ...]]:
    """Every step: one first forward (the captured call), then any subset of LATER and at most one
    backward, in every order in which the optimizer steps after the backward (a loop's order),
    then job.step()."""
    orders = []
    for first in FIRST:
        for backward in BACKWARDS:
            pool = [*LATER, *([backward] if backward else [])]
            for size in range(len(pool) + 1):
                for chosen in itertools.combinations(pool, size):
                    orders += [(first, *order, "job.step") for order in itertools.permutations(chosen)
                               if backward not in order or "optimizer step" not in order
                               or order.index(backward) < order.index("optimizer step")]
    return orders


def _expected(order: tuple[str, ...]) -> str:
    """SELF-9 read literally: the code the step's capture must get."""
    if order[0] == "raising forward":
        return "UNCHECKED"
    check_at = order.index("optimizer step") if "optimizer step" in order else order.index("job.step")
    if any(event in ("in-place parameters", "in-place input") for event in order[:check_at]):
        return "UNCHECKED"
    return "DIFFER" if order[0].startswith("struck") else "MATCH"


def test_SELF_9_every_order_of_a_steps_events_checks_outside_the_live_call_once_and_soundly(
        monkeypatch: Any) -> None:
    import torch
    from torch import nn

    from scout.core.recipes import Intervals, RecipeClass, RecipeId
    from scout.replay import capture as capture_module
    from scout.replay.faults import LiveFault
    from scout.replay.replay import RecipeModules, ReplayConfig, Replayer
    from tests.replay.test_replay_local import ScriptedPeers

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.dropout = nn.Dropout(0.25)  # the RNG state the live call consumed
            self.register_buffer("scale", torch.ones(4))  # rewritten at every forward, as DDP's broadcast
            self.fail = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(self.dropout(x)) * self.scale
            if self.fail:
                raise RuntimeError("the forward failed")
            return y

    torch.manual_seed(0)
    block = Block()
    optimizer = torch.optim.SGD(block.parameters(), lr=0.01)
    config = ReplayConfig(intervals=Intervals(embedding_steps=0, hidden_steps=1, output_steps=0, optimizer_steps=0),
                          timing_warmup_runs=0, timing_repetitions=1)
    replayer = Replayer(block, optimizer, ScriptedPeers(), config, RecipeModules(hidden=(block,)))
    capture = replayer.dense.capture
    fault = LiveFault(block.linear, bit=12, element=1)
    phase = ["outside"]
    calls: list[str] = []  # the phase of every call of the submodule
    checks: list[str] = []  # the phase of every re-execution
    block.linear.register_forward_hook(lambda _m, _a, _o: calls.append(phase[0]))
    check = capture_module.check_live_call

    def counted(*args: Any, **kwargs: Any) -> Any:
        checks.append(phase[0])
        return check(*args, **kwargs)

    monkeypatch.setattr(capture_module, "check_live_call", counted)
    hidden = RecipeId(RecipeClass.HIDDEN, 0)
    orders = _step_orders()
    for step, order in enumerate(orders, start=1):
        calls.clear()
        checks.clear()
        x = torch.randn(3, 4)
        loss = None
        # A forward-and-backward fault stays entered until the backward ends (after the forward
        # when the step has no backward).
        struck_through_backward = order[0] == "struck forward and backward" and any(
            event.startswith("backward") for event in order)
        for event in order:
            if event in FIRST or event == "second forward":
                with torch.no_grad():
                    block.scale.copy_(torch.ones(4))  # DDP's buffer broadcast at every forward
                phase[0] = "forward"
                struck = event.startswith("struck")
                block.fail = event == "raising forward"
                if struck:
                    fault.enter()
                try:
                    out = block(x if event in FIRST else torch.randn(3, 4))
                    loss = out.square().sum() if loss is None else loss + out.square().sum()
                except RuntimeError:
                    pass
                finally:
                    block.fail = False
                    if struck and not struck_through_backward:
                        fault.exit()
            elif event.startswith("backward"):
                phase[0] = "backward"
                if event == "backward recomputing":
                    block(x)  # activation checkpointing: the block again, inside the backward
                if loss is not None:
                    # Autograd refuses a tensor changed in place: the loop goes on.
                    with contextlib.suppress(RuntimeError):
                        loss.backward()
                    loss = None
                if struck_through_backward:
                    fault.exit()
                    struck_through_backward = False
            elif event == "in-place parameters":
                phase[0] = "outside"
                with torch.no_grad():
                    block.linear.weight.mul_(1.0 - 2.0**-10)  # another optimizer, or the loop
            elif event == "in-place input":
                phase[0] = "outside"
                with torch.no_grad():
                    x.add_(1.0)
            elif event == "optimizer step":
                phase[0] = "optimizer"
                optimizer.step()
                optimizer.zero_grad()
            else:
                phase[0] = "job.step"
                first = capture.live(hidden, step)
                again = capture.live(hidden, step)
                assert (first.code, first.reason) == (again.code, again.reason), order
                assert first.code.name == _expected(order), (order, first)
                # Never inside the live call, at most once per capture.
                assert set(checks) <= {"optimizer", "job.step"} and len(checks) <= 1, (order, checks)
                if "optimizer step" in order and first.code.name != "UNCHECKED":
                    assert checks == ["optimizer"], (order, checks)
                forwards = sum(e in FIRST or e == "second forward" for e in order)
                assert calls.count("forward") == forwards, (order, calls)
                assert calls.count("backward") == (order.count("backward recomputing")), (order, calls)
                replayer.after_optimizer_step()
                assert len(checks) <= 1, (order, checks)
        phase[0] = "outside"
    assert len(orders) == 2020 and fault.struck > 0
    replayer.close()
