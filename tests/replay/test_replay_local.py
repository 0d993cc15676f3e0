"""The replay driver in one process, with a scripted peer group (spec/replay.md READY-*,
REPLAY-*, EVID-*). The real multi-process runs are in test_replay_distributed.py; these cover
the branches a healthy 4-rank job cannot reach quickly (deadlines, failures, tampered rows)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scout.core.recipes import CLASS_ORDER, EvidenceKind, Intervals, ReplayStatus
from scout.core.replay_round import evidence_position
from scout.core.verdict import Status
from scout.replay import faults
from scout.replay import replay as replay_module
from scout.replay.replay import RecipeModules, ReplayConfig, Replayer, deterministic_algorithms
from scout.transport.base import DeadlineExceeded

Rows = list[list[int]]


class ScriptedPeers:
    """``size`` peers that all send what this process sends, unless ``tamper`` edits the rows."""

    def __init__(self, size: int = 4, tamper: Callable[[int, Rows], None] | None = None) -> None:
        self.size = size
        self.position = 0
        self.ranks = tuple(range(size))
        self.tamper = tamper
        self.gathers = 0
        self.broadcasts = 0

    def all_gather_int64(self, row: Sequence[int]) -> Rows:
        rows = [list(row) for _ in range(self.size)]
        if self.tamper is not None:
            self.tamper(self.gathers, rows)
        self.gathers += 1
        return rows

    def broadcast_(self, tensors: Sequence[torch.Tensor], source_position: int) -> None:
        self.broadcasts += 1


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.norm = nn.BatchNorm1d(6)  # buffers that a forward in train mode updates in place
        self.dropout = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.norm(self.linear(x)).relu())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


EVERY_STEP = Intervals(embedding_steps=1, hidden_steps=1, output_steps=1, optimizer_steps=1)


def _train_step(model: Net, optimizer: torch.optim.Optimizer, step: int) -> None:
    tokens = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(step))
    loss = F.cross_entropy(model(tokens), tokens.roll(1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _state(model: Net, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]
    tensors += [p.grad.clone() for p in model.parameters() if p.grad is not None]
    tensors += [
        v.clone()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    ]
    return tensors


def _bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        for x, y in zip(a, b, strict=True)
    )


def _setup(peers: ScriptedPeers, **config: object) -> tuple[Net, torch.optim.Optimizer, Replayer]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    replayer = Replayer(model, optimizer, peers, ReplayConfig(intervals=EVERY_STEP, **config))  # type: ignore[arg-type]
    return model, optimizer, replayer


def test_REPLAY_5_live_state_is_bitwise_untouched_and_every_recipe_agrees() -> None:
    peers = ScriptedPeers()
    model, optimizer, replayer = _setup(peers)
    for step in range(1, 4):
        _train_step(model, optimizer, step)
        before = _state(model, optimizer)
        report = replayer.after_optimizer_step()
        assert _bitwise(before, _state(model, optimizer))
        assert [str(r.recipe) for r in report.results] == [
            "embedding",
            f"hidden.{(step - 1) % 2}",
            "output",
            "optimizer.0",
        ]
        assert all(r.status is Status.AGREE for r in report.results), report.results
        assert report.capture_bytes > 0 and not report.errors
    assert replayer.coverage().complete and replayer.coverage().clean
    # one readiness and one evidence exchange per step, one broadcast per recipe
    assert peers.gathers == 1 + 2 * 3 and peers.broadcasts == 4 * 3


def _evidence_slot(recipe_class_index: int, kind: EvidenceKind) -> int:
    return evidence_position(CLASS_ORDER[recipe_class_index], kind)


def test_EVID_4_a_differing_peer_signature_is_attributed_to_that_peer() -> None:
    def tamper(call: int, rows: Rows) -> None:
        if call == 2:  # schedule contract, readiness, then evidence of step 1
            rows[2][_evidence_slot(1, EvidenceKind.OUTPUT)] ^= 1  # hidden slot, output group

    model, optimizer, replayer = _setup(ScriptedPeers(tamper=tamper))
    _train_step(model, optimizer, 1)
    results = {str(r.recipe): r for r in replayer.after_optimizer_step().results}
    assert results["hidden.0"].status is Status.ATTRIBUTED
    assert results["hidden.0"].outliers == (2,) and results["hidden.0"].sources == ("output",)
    assert all(results[n].status is Status.AGREE for n in ("embedding", "output", "optimizer.0"))


def test_READY_2_READY_5_a_differing_description_is_inconclusive_and_skips_the_replay() -> None:
    def tamper(call: int, rows: Rows) -> None:
        if call == 1:
            rows[3][1 + 3 * 1 + 2] ^= 1  # hidden slot digest of peer 3

    peers = ScriptedPeers(tamper=tamper)
    model, optimizer, replayer = _setup(peers)
    _train_step(model, optimizer, 1)
    results = {str(r.recipe): r for r in replayer.after_optimizer_step().results}
    assert results["hidden.0"].status is Status.INCONCLUSIVE
    assert results["hidden.0"].reason == "readiness-mismatch: peers [3] describe other work"
    assert results["hidden.0"].outliers == ()
    assert peers.broadcasts == 3  # the three recipes that proceeded; none for hidden.0


def test_READY_1_schedule_disagreement_disables_replay_with_the_reason() -> None:
    def tamper(call: int, rows: Rows) -> None:
        if call == 0:
            rows[1][0] ^= 1

    peers = ScriptedPeers(tamper=tamper)
    model, optimizer, replayer = _setup(peers)
    assert (
        replayer.disabled_reason and "disagree on the replay schedule" in replayer.disabled_reason
    )
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert all(r.status is Status.INCONCLUSIVE for r in report.results)
    assert all((r.reason or "").startswith("replay-disabled") for r in report.results)
    assert peers.gathers == 1  # nothing after the contract


def test_READY_4_a_deadline_disables_replay_and_later_checks_are_inconclusive() -> None:
    class LatePeers(ScriptedPeers):
        def all_gather_int64(self, row: Sequence[int]) -> Rows:
            if self.gathers == 1:
                self.gathers += 1
                raise DeadlineExceeded("replay all_gather", 0.5, (2,))
            return super().all_gather_int64(row)

    peers = LatePeers()
    model, optimizer, replayer = _setup(peers)
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert all(
        r.status is Status.INCONCLUSIVE and "deadline" in (r.reason or "") for r in report.results
    )
    assert replayer.disabled_reason and "deadline at step 1" in replayer.disabled_reason
    _train_step(model, optimizer, 2)
    later = replayer.after_optimizer_step()
    assert all("replay-disabled" in (r.reason or "") for r in later.results)
    assert peers.gathers == 2


class PutModule(nn.Module):
    """Calls an op without a deterministic implementation (put_ without accumulate)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.put_(torch.tensor([0]), torch.tensor([1.0]))
        return y * 2


def test_REPLAY_4_nondeterministic_kernel_is_inconclusive_and_settings_restored() -> None:
    layers = nn.ModuleList([PutModule(), PutModule()])
    model = nn.Sequential(*layers)
    replayer = Replayer(
        model,
        None,
        ScriptedPeers(),
        ReplayConfig(intervals=EVERY_STEP),
        RecipeModules(hidden=tuple(layers)),
    )
    model(torch.randn(3, requires_grad=True))
    assert not torch.are_deterministic_algorithms_enabled()
    report = replayer.after_optimizer_step()
    (result,) = report.results
    assert result.status is Status.INCONCLUSIVE
    assert result.reason == "replay-status " + ",".join(f"{i}:nondeterministic" for i in range(4))
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(RuntimeError, match="deterministic"), deterministic_algorithms():
        torch.zeros(2).put_(torch.tensor([0]), torch.tensor([1.0]))
    assert not torch.are_deterministic_algorithms_enabled()


def test_REPLAY_7_an_exception_in_replay_is_inconclusive_and_never_raises() -> None:
    class FailsInReplay(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if torch.are_deterministic_algorithms_enabled():
                raise ValueError("broken only in replay")
            return x * 2

    layers = nn.ModuleList([FailsInReplay(), FailsInReplay()])
    model = nn.Sequential(*layers)
    replayer = Replayer(
        model,
        None,
        ScriptedPeers(2),
        ReplayConfig(intervals=EVERY_STEP),
        RecipeModules(hidden=tuple(layers)),
    )
    model(torch.randn(3))
    (result,) = replayer.after_optimizer_step().results
    assert result.status is Status.INCONCLUSIVE
    assert result.reason == "replay-status 0:replay_failed,1:replay_failed"


def test_REC_5_stage_without_embedding_or_head_is_not_applicable() -> None:
    layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
    model = nn.Sequential(*layers)
    replayer = Replayer(
        model,
        None,
        ScriptedPeers(),
        ReplayConfig(intervals=EVERY_STEP),
        RecipeModules(hidden=tuple(layers)),
    )
    assert [c.value for c in replayer.catalog.not_applicable()] == [
        "embedding",
        "output",
        "optimizer",
        "expert",
    ]
    for _ in range(2):
        model(torch.randn(2, 4))
        replayer.after_optimizer_step()
    view = replayer.coverage()
    assert view.complete and view.clean and len(view.accepted) == 2


def test_REC_7_model_without_repeated_layers_names_the_class_and_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"no repeated layers found in Linear.*RecipeModules\(hidden="
    ):
        RecipeModules.discover(nn.Linear(3, 3))


def test_REC_7_discovery_finds_layers_embedding_and_head_through_wrappers() -> None:
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.module = inner

    net = Net()
    found = RecipeModules.discover(Wrapper(net))
    assert (
        found.hidden == tuple(net.layers)
        and found.embedding is net.embed
        and found.output is net.head
    )


def test_VERDICT_4_singleton_group_warns_once_and_certifies_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="scout.replay")
    model, optimizer, replayer = _setup(ScriptedPeers(1))
    assert "one member" in caplog.text
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert all(r.status is Status.INCONCLUSIVE and r.reason == "singleton" for r in report.results)
    assert not replayer.coverage().complete


def test_REPLAY_1_source_position_outside_the_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="source_position 4 is outside the peer group of 4"):
        _setup(ScriptedPeers(4), source_position=4)


def test_STRAG_1_compute_time_reported_apart_from_collectives() -> None:
    model, optimizer, replayer = _setup(ScriptedPeers())
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert set(report.compute_ms) == {"embedding", "hidden.0", "output", "optimizer.0"}
    assert all(ms > 0 for ms in report.compute_ms.values())
    assert set(report.timing) == set(report.compute_ms)
    assert all(v.status is Status.AGREE for v in report.timing.values())


def test_FAULT_3_slow_compute_multiplies_each_measured_replay_compute_by_its_factor() -> None:
    model, optimizer, replayer = _setup(ScriptedPeers())
    seen: list[float] = []
    recorder = replayer.add_compute_hook(seen.append)  # runs first: the time before the fault
    slow = faults.slow_compute(replayer, factor=3.0)
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    repetitions = replayer.config.timing_repetitions
    assert len(report.compute_ms) == 4 and len(seen) == 4 * repetitions  # timed runs only
    # Recipes replay in a fixed order; each timed repetition includes the sleep of 2x its own,
    # so the median of the repetitions does too (STRAG-1).
    for index, ms in enumerate(report.compute_ms.values()):
        runs = seen[index * repetitions : (index + 1) * repetitions]
        assert ms >= 3.0 * min(runs) * 1e3
    slow.remove()
    recorder.remove()
    _train_step(model, optimizer, 2)
    replayer.after_optimizer_step()
    assert len(seen) == 4 * repetitions  # removed hooks are not called again
    for factor in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="factor"):
            faults.slow_compute(replayer, factor)
    with pytest.raises(TypeError, match="Replayer"):
        faults.slow_compute(object(), 1.5)


def test_CAP_2_too_large_capture_is_not_ready_on_that_peer() -> None:
    model, optimizer, replayer = _setup(ScriptedPeers(), max_capture_bytes=16)
    _train_step(model, optimizer, 1)
    report = replayer.after_optimizer_step()
    assert all(r.status is Status.INCONCLUSIVE for r in report.results)
    assert all("capture_too_large" in (r.reason or "") for r in report.results)
    assert int(ReplayStatus.CAPTURE_TOO_LARGE) == 3


def test_API_1_attach_once_per_model_and_again_after_close() -> None:
    from scout.replay import attach_replay as attach

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = attach(
        model, optimizer, peers=ScriptedPeers(), config=ReplayConfig(intervals=EVERY_STEP)
    )
    with pytest.raises(RuntimeError, match="already attached to this Net"):
        attach(model, optimizer, peers=ScriptedPeers())
    _train_step(model, optimizer, 1)
    assert all(r.status is Status.AGREE for r in handle.step().results)
    handle.close()
    with pytest.raises(RuntimeError, match="was closed"):
        handle.step()
    again = attach(
        model, optimizer, peers=ScriptedPeers(), config=ReplayConfig(intervals=EVERY_STEP)
    )
    _train_step(model, optimizer, 2)
    assert all(r.status is Status.AGREE for r in again.step().results)
    again.close()


def test_CAP_1_a_call_mixing_devices_is_not_ready_with_the_devices_named() -> None:
    class TwoInputs(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b.to(a.device)

    from scout.core.recipes import RecipeClass, RecipeId
    from scout.replay.capture import CaptureFailure, ModuleCapture

    recipe = RecipeId(RecipeClass.HIDDEN, 0)
    module = TwoInputs()
    capture = ModuleCapture({recipe: module}, max_capture_bytes=2**20)
    capture.arm(1, [recipe])
    with pytest.raises((NotImplementedError, RuntimeError)):
        module(torch.ones(2), torch.ones(2, device="meta"))
    record = capture.get(recipe, 1)
    assert isinstance(record, CaptureFailure) and "['cpu', 'meta']" in record.reason


def test_READY_3_EVID_1_every_exchange_has_a_fixed_size_whatever_is_due() -> None:
    sizes: list[int] = []

    class Recording(ScriptedPeers):
        def all_gather_int64(self, row: Sequence[int]) -> Rows:
            sizes.append(len(row))
            return super().all_gather_int64(row)

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sparse = Intervals(embedding_steps=3, hidden_steps=1, output_steps=2, optimizer_steps=4)
    replayer = Replayer(model, optimizer, Recording(), ReplayConfig(intervals=sparse))
    for step in range(1, 7):
        _train_step(model, optimizer, step)
        replayer.after_optimizer_step()
    assert sizes[0] == 1  # the schedule contract
    assert set(sizes[1:]) == {replay_module.READINESS_ROW_LENGTH, replay_module.EVIDENCE_ROW_LENGTH}


def test_OPT_1_OPT_3_slice_replay_reproduces_the_live_update_and_leaves_the_optimizer_alone() -> (
    None
):
    from scout.core.recipes import RecipeClass, RecipeId
    from scout.replay.optimizer import OptimizerCapture, OptimizerSnapshot

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=False)
    recipe = RecipeId(RecipeClass.OPTIMIZER, 0)
    capture = OptimizerCapture(optimizer, slice_numel=50, max_capture_bytes=2**20)
    parameters = list(model.parameters())
    for step, check_index in ((1, 0), (2, 1), (3, 2)):
        capture.arm(recipe, step, check_index)
        _train_step(model, optimizer, step)
        snapshot = capture.get(recipe, step)
        assert isinstance(snapshot, OptimizerSnapshot)
        assert sum(s.segment.stop - s.segment.start for s in snapshot.segments) == 50
        live_before = _state(model, optimizer)
        updated = capture.replay(snapshot)
        assert _bitwise(
            live_before, _state(model, optimizer)
        )  # OPT-3: the live optimizer untouched
        # the replayed slice equals the live slice after the real step (AdamW is elementwise)
        from scout.replay.signature import structured_signature

        live_slices = []
        for s in snapshot.segments:
            p = parameters[s.segment.parameter_index]
            state = optimizer.state[p]
            live_slices.append(
                (
                    p.detach().reshape(-1)[s.segment.start : s.segment.stop],
                    {
                        k: (
                            v.reshape(-1)[s.segment.start : s.segment.stop]
                            if v.shape == p.shape
                            else v
                        )
                        for k, v in state.items()
                    },
                )
            )
        assert updated == structured_signature(live_slices)
    capture.arm(recipe, 4, 3)
    assert "not called in step 4" in capture.get(recipe, 4).reason  # type: ignore[union-attr]
    capture.close()
