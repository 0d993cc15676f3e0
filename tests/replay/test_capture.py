"""Capture through public module hooks (spec/replay.md CAP-1..CAP-6), one process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scout.core.recipes import RecipeClass, RecipeId, ReplayStatus
from scout.replay.capture import Capture, CaptureFailure, ModuleCapture
from scout.replay.rng import capture_rng_state, installed_rng_state

LAYER = RecipeId(RecipeClass.HIDDEN, 0)


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.5)

    def forward(
        self, x: torch.Tensor, *, scale: float = 1.0, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        y = self.dropout(self.linear(x)) * scale
        return y if mask is None else y * mask


def test_CAP_1_captures_only_when_armed_and_only_the_first_call() -> None:
    module = Noisy()
    capture = ModuleCapture({LAYER: module}, max_capture_bytes=2**20)
    module(torch.randn(2, 8))
    assert isinstance(capture.get(LAYER, 1), CaptureFailure)
    capture.arm(1, [LAYER])
    first = torch.randn(2, 8)
    module(first)
    module(torch.randn(2, 8))  # a second call in the same step is not recorded
    record = capture.get(LAYER, 1)
    assert isinstance(record, Capture) and torch.equal(record.args[0], first)
    failure = capture.get(LAYER, 2)
    assert isinstance(failure, CaptureFailure) and failure.status is ReplayStatus.NOT_READY
    capture.arm(2, [LAYER])
    assert "was not called" in capture.get(LAYER, 2).reason  # type: ignore[union-attr]
    with capture.suspended():
        module(first)
    assert isinstance(capture.get(LAYER, 2), CaptureFailure)
    capture.close()
    capture.arm(3, [])


def test_CAP_1_the_capture_hook_is_on_a_module_only_while_armed_after_its_earlier_pre_hooks() -> None:
    """Issue 38: an idle step runs none of capture's code; the call recorded is the one the
    module's forward receives (a pre-hook registered before the arming has run)."""
    module = Noisy()
    capture = ModuleCapture({LAYER: module}, max_capture_bytes=2**20)
    assert len(module._forward_pre_hooks) == 0
    module.register_forward_pre_hook(lambda _module, args: (args[0] * 2,))  # the job's own hook
    capture.arm(1, [LAYER])
    assert len(module._forward_pre_hooks) == 2
    x = torch.randn(2, 8)
    module(x)
    record = capture.get(LAYER, 1)
    assert isinstance(record, Capture) and torch.equal(record.args[0], x * 2)
    capture.arm(2, [LAYER])  # armed again: still one hook of capture's
    assert len(module._forward_pre_hooks) == 2
    capture.arm(3, [])
    assert len(module._forward_pre_hooks) == 1
    module(x)
    assert isinstance(capture.get(LAYER, 3), CaptureFailure)
    capture.arm(4, [LAYER])
    capture.close()
    assert len(module._forward_pre_hooks) == 1
    capture.arm(5, [LAYER])  # after close nothing is hooked again
    assert len(module._forward_pre_hooks) == 1


def test_CAP_2_CAP_5_capture_memory_is_bounded_and_reported() -> None:
    module = Noisy()
    x = torch.randn(64, 8)
    rng_bytes = torch.get_rng_state().numel()
    fits = ModuleCapture({LAYER: module}, max_capture_bytes=x.numel() * 4 + rng_bytes)
    fits.arm(1, [LAYER])
    module(x)
    assert isinstance(fits.get(LAYER, 1), Capture)
    assert fits.held_bytes == x.numel() * 4 + rng_bytes
    fits.release()
    assert fits.held_bytes == 0
    refuses = ModuleCapture({LAYER: module}, max_capture_bytes=x.numel() * 4)
    refuses.arm(1, [LAYER])
    module(x)
    record = refuses.get(LAYER, 1)
    assert isinstance(record, CaptureFailure)
    assert record.status is ReplayStatus.CAPTURE_TOO_LARGE
    assert f"max_capture_bytes={x.numel() * 4}" in record.reason
    assert refuses.held_bytes == 0
    with pytest.raises(ValueError, match="max_capture_bytes must be >= 0, got -1"):
        ModuleCapture({LAYER: module}, max_capture_bytes=-1)


def test_CAP_3_REPLAY_2_rng_state_is_the_one_the_live_call_consumed() -> None:
    module = Noisy().train()
    capture = ModuleCapture({LAYER: module}, max_capture_bytes=2**20)
    capture.arm(1, [LAYER])
    x = torch.randn(4, 8)
    live = module(x)
    record = capture.get(LAYER, 1)
    assert isinstance(record, Capture)
    before_replay = torch.get_rng_state()
    with capture.suspended(), installed_rng_state(record.rng):
        again = module(*record.args, **record.kwargs)
    assert torch.equal(live, again)  # same dropout mask
    assert torch.equal(torch.get_rng_state(), before_replay)  # own state restored (REPLAY-2)


def test_CAP_4_by_value_with_kwargs_flags_and_autocast() -> None:
    module = Noisy()
    capture = ModuleCapture({LAYER: module}, max_capture_bytes=2**20)
    capture.arm(1, [LAYER])
    x = torch.randn(3, 8, requires_grad=True)
    mask = torch.ones(3, 8)
    module(x.t().contiguous().t(), scale=2.0, mask=mask)
    mask.zero_()  # the loop may reuse its buffers; the capture keeps its own copy
    record = capture.get(LAYER, 1)
    assert isinstance(record, Capture)
    assert torch.equal(record.kwargs["mask"], torch.ones(3, 8))
    assert record.kwargs["scale"] == 2.0
    assert record.requires_grad == (True, False)
    assert all(t.is_contiguous() and not t.requires_grad for t in record.tensors())
    assert record.autocast.device_type == "cpu" and record.autocast.enabled is False
    assert record.training is True
    # READY-1: the description holds structure and plain values, never tensor contents.
    flat: list[object] = []

    def walk(value: object) -> None:
        if isinstance(value, tuple):
            for item in value:
                walk(item)
        else:
            flat.append(value)

    walk(record.describe())
    assert not any(isinstance(v, torch.Tensor) for v in flat)
    assert "torch.float32" in flat and 2.0 in flat


def test_CAP_6_a_failing_capture_never_reaches_the_training_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = Noisy()
    capture = ModuleCapture({LAYER: module}, max_capture_bytes=2**20)

    def boom(*_args: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(capture, "_record", boom)
    capture.arm(1, [LAYER])
    module(torch.randn(2, 8))  # does not raise
    record = capture.get(LAYER, 1)
    assert isinstance(record, CaptureFailure) and "disk on fire" in record.reason


def test_SIG_11_rng_state_signature_excludes_device_index() -> None:
    from scout.replay.signature import structured_signature

    state = capture_rng_state(torch.device("cpu"))
    twin = state.clone()
    assert structured_signature(state.as_structure()) == structured_signature(twin.as_structure())
    torch.rand(1)
    assert structured_signature(capture_rng_state().as_structure()) != structured_signature(
        state.as_structure()
    )


def test_CAP_8_rows_cut_every_batch_shaped_argument_alike() -> None:
    from scout.core.recipes import RecipeClass, RecipeId
    from scout.replay.capture import Capture, ModuleCapture

    class Call(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
            return x * mask + table.sum()

    recipe = RecipeId(RecipeClass.HIDDEN, 0)
    module = Call()
    capture = ModuleCapture({recipe: module}, max_capture_bytes=2**20, rows=1)
    capture.arm(1, [recipe])
    module(torch.randn(4, 3), mask=torch.ones(4, 3), table=torch.randn(5, 2))
    record = capture.get(recipe, 1)
    assert isinstance(record, Capture)
    assert [tuple(t.shape) for t in record.tensors()] == [(1, 3), (1, 3), (5, 2)]
    with pytest.raises(ValueError, match="rows"):
        ModuleCapture({recipe: module}, max_capture_bytes=1, rows=-1)
