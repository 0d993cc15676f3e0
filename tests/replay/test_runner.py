"""One replay round for every recipe class (spec/replay.md REPLAY-9): the same tests run over
every executor -- a hidden layer, the embedding, the head, an optimizer slice, a routed expert --
in one process with a scripted peer group (every peer sends what this process sends, unless
``tamper`` edits the rows). The 4-process runs are in test_replay_distributed.py and
test_moe_distributed.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scout.core.recipes import CLASS_ORDER, EvidenceKind, Intervals, RecipeClass, ReplayStatus
from scout.core.replay_round import evidence_position
from scout.core.verdict import Status
from scout.replay.determinism import fixed_cotangent
from scout.replay.moe import ExpertLayers, ExpertReplayConfig, ExpertReplayer
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer
from scout.replay.runner import ReplayRunner
from tests.replay.moe_toy import MoE
from tests.replay.test_replay_local import Rows, ScriptedPeers


class Net(nn.Module):
    """An embedding, two blocks (the second a routed MoE layer's experts inside), and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 24)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(24, 24), nn.GELU()) for _ in range(2)])
        self.moe = MoE(4, top_k=2, dim=24)
        self.head = nn.Linear(24, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x + self.moe(x))


@attrs.frozen
class Executor:
    """How to build a runner that checks one recipe class at every step."""

    name: str
    recipe_class: RecipeClass
    build: Callable[[Net, torch.optim.Optimizer, ScriptedPeers, dict[str, Any]], ReplayRunner]


def _dense(intervals: Intervals) -> Callable[[Net, torch.optim.Optimizer, ScriptedPeers, dict[str, Any]], ReplayRunner]:
    def build(model: Net, optimizer: torch.optim.Optimizer, peers: ScriptedPeers, settings: dict[str, Any]) -> ReplayRunner:
        modules = RecipeModules(embedding=model.embed, hidden=tuple(model.layers), output=model.head)
        return Replayer(model, optimizer, peers, ReplayConfig(intervals=intervals, **settings), modules)
    return build


def _expert(model: Net, optimizer: torch.optim.Optimizer, peers: ScriptedPeers, settings: dict[str, Any]) -> ReplayRunner:
    return ExpertReplayer(ExpertLayers((model.moe.experts,)), peers, ((1, 4),),
                          ExpertReplayConfig(expert_steps=1, **settings))


EXECUTORS = [
    Executor("hidden", RecipeClass.HIDDEN, _dense(Intervals(hidden_steps=1))),
    Executor("embedding", RecipeClass.EMBEDDING, _dense(Intervals(embedding_steps=1))),
    Executor("head", RecipeClass.OUTPUT, _dense(Intervals(output_steps=1))),
    Executor("optimizer", RecipeClass.OPTIMIZER, _dense(Intervals(optimizer_steps=1))),
    Executor("expert", RecipeClass.EXPERT, _expert),
]
every_executor = pytest.mark.parametrize("executor", EXECUTORS, ids=[e.name for e in EXECUTORS])


def _setup(executor: Executor, peers: ScriptedPeers | None = None, **settings: Any) -> tuple[Net, torch.optim.Optimizer, ReplayRunner]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    return model, optimizer, executor.build(model, optimizer, peers or ScriptedPeers(), settings)


def _train_step(model: Net, optimizer: torch.optim.Optimizer, step: int) -> None:
    tokens = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(step))
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(1).flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _results(runner: ReplayRunner, executor: Executor) -> list[Any]:
    report = runner.step()
    assert not report.errors, report.errors
    return [r for r in report.results if r.recipe.recipe_class is executor.recipe_class]


@every_executor
def test_REPLAY_9_EVID_5_STRAG_1_every_executor_agrees_when_healthy_timed_by_warm_up_runs_then_the_median(
    executor: Executor,
) -> None:
    model, optimizer, runner = _setup(executor, timing_warmup_runs=2, timing_repetitions=5)
    seen: list[float] = []
    runner.timer.add_hook(seen.append)
    for step in (1, 2):
        _train_step(model, optimizer, step)
        report = runner.step()
        (result,) = [r for r in report.results if r.recipe.recipe_class is executor.recipe_class]
        assert (result.status, result.step) == (Status.AGREE, step), result
    (name,) = report.compute_ms
    assert len(seen) == 2 * 5  # the warm-up runs are not timed
    repetitions = report.repetitions_ms[name]
    assert len(repetitions) == 5 and report.compute_ms[name] == pytest.approx(sorted(repetitions)[2])
    assert len(report.peer_compute_ms[name]) == 4
    runner.close()


def _every_third_step_recorded(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any, list[tuple[str, int]]]:
    """A hidden-layer runner due every third step whose executor's arm and release calls are
    recorded (REPLAY-10, BUDGET-14)."""
    executor = Executor("hidden", RecipeClass.HIDDEN, _dense(Intervals(hidden_steps=3, embedding_steps=0,
                                                                       output_steps=0, optimizer_steps=0)))
    model, optimizer, runner = _setup(executor)
    calls: list[tuple[str, int]] = []
    arm, release = runner.executor.arm, runner.executor.release
    monkeypatch.setattr(runner.executor, "arm", lambda step, due: (calls.append(("arm", step)), arm(step, due))[1])
    monkeypatch.setattr(runner.executor, "release", lambda: (calls.append(("release", 0)), release())[1])
    return model, optimizer, runner, calls


def test_REPLAY_10_an_idle_step_touches_no_executor_and_arms_only_what_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: most steps have nothing due; they arm nothing again, release nothing and hold
    nothing, and the steps with something due are armed and checked as before."""
    model, optimizer, runner, calls = _every_third_step_recorded(monkeypatch)
    reports = []
    for step in range(1, 8):
        _train_step(model, optimizer, step)
        reports.append(runner.step())
    assert calls == [("arm", 3), ("release", 0), ("arm", 4), ("arm", 6), ("release", 0), ("arm", 7)]
    for report in reports:
        checked = report.step % 3 == 0
        assert [r.status for r in report.results] == ([Status.AGREE] if checked else []), report
        assert report.capture_bytes > 0 if checked else report.capture_bytes == 0
    runner.close()


def test_BUDGET_14_REPLAY_10_keep_step_finishes_an_idle_step_as_step_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """BUDGET-14: a quiet step's ``keep_step()`` (no report) arms and releases exactly what
    ``step()`` does at the same steps, and the due steps are checked alike; at a step with
    something due it is ``step()`` itself (the check runs, nothing is skipped)."""
    model, optimizer, runner, calls = _every_third_step_recorded(monkeypatch)
    for step in range(1, 8):
        _train_step(model, optimizer, step)
        if step % 3:
            assert runner.keep_step() is None
        else:
            (result,) = runner.step().results
            assert (result.status, result.step) == (Status.AGREE, step)
    assert runner.step_count == 7
    assert calls == [("arm", 3), ("release", 0), ("arm", 4), ("arm", 6), ("release", 0), ("arm", 7)]
    _train_step(model, optimizer, 8)
    runner.keep_step()  # step 8: idle
    _train_step(model, optimizer, 9)
    runner.keep_step()  # step 9 is due: the check runs as step() runs it
    result = runner.results[-1]
    assert (result.status, result.step) == (Status.AGREE, 9) and runner.step_count == 9
    runner.close()
    with pytest.raises(RuntimeError, match="was closed"):
        runner.keep_step()


@every_executor
def test_REPLAY_9_resume_at_refuses_anything_but_an_int_at_least_0(executor: Executor) -> None:
    _model, _optimizer, runner = _setup(executor)
    for bad in (-1, True, 2.0, "3", None):
        with pytest.raises(ValueError, match=rf"resume_at needs a step >= 0, got {bad!r}"):
            runner.resume_at(bad)  # type: ignore[arg-type]
    runner.resume_at(6)
    assert runner.step_count == 6


@every_executor
def test_REPLAY_9_REPLAY_7_a_replay_that_raises_is_inconclusive_and_never_reaches_the_loop(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer, runner = _setup(executor)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a kernel fell over")

    monkeypatch.setattr(runner.executor, "replay", broken)
    _train_step(model, optimizer, 1)
    (result,) = _results(runner, executor)
    assert result.status is Status.INCONCLUSIVE and result.reason.startswith("replay-status 0:replay_failed")
    assert runner.disabled_reason is None  # a local failure is a status, not the end of replay


@every_executor
def test_REPLAY_9_READY_4_any_failure_of_the_exchange_disables_the_runner_with_the_reason(executor: Executor) -> None:
    def tamper(index: int, rows: Rows) -> None:
        if index == 2:  # the evidence exchange of the first check (after the schedule contract)
            raise ValueError("the peer group broke")

    model, optimizer, runner = _setup(executor, ScriptedPeers(tamper=tamper))
    _train_step(model, optimizer, 1)
    report = runner.step()
    assert report.errors and "the peer group broke" in report.errors[0]
    assert [r.status for r in report.results] == [Status.INCONCLUSIVE]
    assert runner.disabled_reason is not None and "internal error at step 1" in runner.disabled_reason
    _train_step(model, optimizer, 2)
    (later,) = _results(runner, executor)
    assert later.reason is not None and later.reason.startswith("replay-disabled: internal error")


@every_executor
def test_REPLAY_9_EVID_4_a_peer_with_another_output_is_attributed_for_every_executor(executor: Executor) -> None:
    kind = EvidenceKind.UPDATED if executor.recipe_class is RecipeClass.OPTIMIZER else EvidenceKind.OUTPUT
    position = evidence_position(executor.recipe_class, kind)

    def tamper(index: int, rows: Rows) -> None:
        if index == 2:
            rows[3][position] ^= 1 << 7

    model, optimizer, runner = _setup(executor, ScriptedPeers(tamper=tamper))
    _train_step(model, optimizer, 1)
    (result,) = _results(runner, executor)
    assert (result.status, result.outliers, result.sources) == (Status.ATTRIBUTED, (3,), (kind.value,))


@every_executor
def test_REPLAY_9_READY_5_a_peer_that_is_not_ready_is_inconclusive_for_every_executor(executor: Executor) -> None:
    slot = 1 + 3 * CLASS_ORDER.index(executor.recipe_class)

    def tamper(index: int, rows: Rows) -> None:
        if index == 1:  # the readiness exchange
            rows[2][slot + 1] = int(ReplayStatus.CAPTURE_TOO_LARGE)

    model, optimizer, runner = _setup(executor, ScriptedPeers(tamper=tamper))
    _train_step(model, optimizer, 1)
    (result,) = _results(runner, executor)
    assert (result.status, result.reason) == (Status.INCONCLUSIVE, "not-ready: 2:capture_too_large")


def test_REPLAY_9_REPLAY_5_each_output_gradient_is_seeded_with_its_index() -> None:
    output = torch.zeros(3, 5)
    first, second = fixed_cotangent(output, 0, 2608), fixed_cotangent(output, 1, 2608)
    assert not torch.equal(first, second)
    assert torch.equal(second, torch.randn(3, 5, generator=torch.Generator().manual_seed(2609)))
    assert torch.equal(fixed_cotangent(torch.zeros(2, dtype=torch.int64), 0, 2608), torch.zeros(2, dtype=torch.int64))
