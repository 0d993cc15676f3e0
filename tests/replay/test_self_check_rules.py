"""The self-check's rules pinned whole, in one process (spec/replay.md SELF-1..SELF-5, SELF-9): the
vote's errors and verdict, the device a call is judged on, the checked rows of calls with no
batch, a 1-D batch or a scalar beside it, the settings the re-execution runs in, the arguments'
``requires_grad``, keyword arguments, a sharded module's gathered parameters and buffers, the
buffers a replay rewrote, the capture hooks suspended during the re-execution, and every outcome
with its path and reason. The meta device stands in for an accelerator: what is decided from a
call's device needs no GPU to be seen."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call

from scout.core.recipes import RecipeClass, RecipeId
from scout.core.self_check import LiveCheck, SelfCheckOutcome, decide_self_check
from scout.core.verdict import MISSING, classify_exact
from scout.replay.capture import CaptureFailure, ModuleCapture
from scout.replay.rng import capture_rng_state
from scout.replay.self_check import (
    LiveCall,
    LiveOutcome,
    check_live_call,
    not_reproducible,
    record_live_call,
)
from tests.replay.row_wise import RowWiseLinear

HIDDEN_0 = RecipeId(RecipeClass.HIDDEN, 0)
HIDDEN_1 = RecipeId(RecipeClass.HIDDEN, 1)
NOT_DETERMINISTIC = ("the live call ran on {} without deterministic algorithms "
                     "(torch.use_deterministic_algorithms(True)), so two runs of it may differ")
CUBLAS = "cuBLAS is deterministic only with CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before CUDA starts"


@contextlib.contextmanager
def _deterministic(enabled: bool, warn_only: bool = False) -> Iterator[None]:
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def _checked(module: nn.Module, *args: Any, rows: int = 0, kwargs: dict[str, Any] | None = None,
             between: Any = None, **recorded: Any) -> LiveOutcome:
    """A live call of ``module``, its record (SELF-1) and its check (SELF-9) as the capture does them."""
    rng = capture_rng_state()
    output = module(*args, **(kwargs or {}))
    live = record_live_call(module, args, kwargs or {}, output, rng=rng, rows=rows, **recorded)
    if isinstance(live, LiveOutcome):
        return live
    if between is not None:
        between()
    return check_live_call(live)


# -- SELF-4: the vote --------------------------------------------------------------------------


def test_SELF_4_bad_input_errors_are_whole() -> None:
    with pytest.raises(ValueError) as empty:
        decide_self_check([])
    assert str(empty.value) == "no peers: a self-check needs at least one code (VERDICT-3)"
    with pytest.raises(TypeError) as wrong:
        decide_self_check([1, "match"])
    assert str(wrong.value) == ("peer 1: a self-check code is an int (0 (UNCHECKED), 1 (MATCH), 2 (DIFFER)), "
                                "got str 'match'")


def test_SELF_4_every_checked_outcome_carries_classify_exacts_verdict_on_the_rows_ints() -> None:
    """The verdict field is the one classify_exact verdict over the codes as they travel (ints,
    UNCHECKED given as MISSING), for AGREE, ATTRIBUTED and INCONCLUSIVE alike."""
    for codes, voted, outcome in (
            ([1, 1, 1], [1, 1, 1], SelfCheckOutcome.AGREE),
            ([1, 0, 1], [1, MISSING, 1], SelfCheckOutcome.INCONCLUSIVE),
            ([1, 2, 1, 1], [1, 2, 1, 1], SelfCheckOutcome.ATTRIBUTED),
            ([2, 2, 1], [2, 2, 1], SelfCheckOutcome.INCONCLUSIVE),
            ([1, 2], [1, 2], SelfCheckOutcome.INCONCLUSIVE)):
        decided = decide_self_check(codes)
        expected = classify_exact(voted)
        assert decided.outcome is outcome, codes
        assert decided.verdict == expected and repr(decided.verdict) == repr(expected), codes
    assert decide_self_check([0, 0]).verdict is None


# -- SELF-3: the device a call is judged on ------------------------------------------------------


def test_SELF_3_not_reproducible_names_the_device_and_the_cublas_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, meta = torch.device("cuda"), torch.device("meta")
    with _deterministic(False):
        assert not_reproducible(cuda) == NOT_DETERMINISTIC.format("cuda")
        assert not_reproducible(meta) == NOT_DETERMINISTIC.format("meta")
        assert not_reproducible(torch.device("cpu")) is None
    with _deterministic(True):
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        assert not_reproducible(cuda) == CUBLAS
        assert not_reproducible(meta) is None  # the cuBLAS setting is CUDA's only
        for setting in (":4096:8", ":16:8"):
            monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", setting)
            assert not_reproducible(cuda) is None and not_reproducible(meta) is None
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
        assert not_reproducible(cuda) == CUBLAS


def test_SELF_3_a_call_is_judged_on_its_arguments_device_then_its_outputs_then_its_modules() -> None:
    with _deterministic(False):
        # Tensors on a device that is not a CPU, deterministic algorithms off: UNCHECKED, said once.
        outcome = _checked(nn.GELU(), torch.zeros(4, 3, device="meta"))
        assert outcome == LiveOutcome(LiveCheck.UNCHECKED, "", NOT_DETERMINISTIC.format("meta"))

        # Arguments on the CPU: a CPU call, whatever device its output went to (here the check then
        # fails to sign a meta output: UNCHECKED for that reason, not for the device).
        class ToMeta(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x.to("meta")

        moved = _checked(ToMeta(), torch.randn(4, 3))
        assert moved.code is LiveCheck.UNCHECKED and moved.reason.startswith("self-check failed: "), moved

        # No tensor argument: the output's device.
        class Table(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("table", torch.zeros(4, 3, device="meta"))

            def forward(self) -> torch.Tensor:
                return self.table * 2

        assert _checked(Table()) == LiveOutcome(LiveCheck.UNCHECKED, "", NOT_DETERMINISTIC.format("meta"))


class _Counter(nn.Module):
    """A module whose call has no tensor in or out (a statistic kept in a buffer): the CPU, checked."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, n: int) -> None:
        self.seen += n


def test_SELF_3_a_call_with_no_tensor_and_no_parameter_is_a_cpu_call_and_matches() -> None:
    with _deterministic(False):
        assert _checked(_Counter(), 3) == LiveOutcome(LiveCheck.MATCH, "exact")
        assert _checked(_Counter(), 3, rows=2) == LiveOutcome(LiveCheck.MATCH, "exact")


def test_SELF_3_an_output_that_cannot_be_signed_is_unchecked_at_the_hook_with_the_error() -> None:
    class Opaque(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return object()

    recorded = record_live_call(Opaque(), (torch.zeros(2, 2),), {}, object(), rng=capture_rng_state())
    assert isinstance(recorded, LiveOutcome)
    assert (recorded.code, recorded.path) == (LiveCheck.UNCHECKED, "")
    assert recorded.reason.startswith("self-check failed: TypeError(") and "object" in recorded.reason


# -- SELF-1 / CAP-8: the checked rows --------------------------------------------------------


class _RowSums(nn.Module):
    """Embedding of 1-D tokens, one value per row: a 1-D batch in and out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens).sum(-1)


class _WithScalar(nn.Module):
    """The rows and a scalar (a loss beside the activations): the scalar is checked whole."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = RowWiseLinear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x), self.linear.weight.sum()


class _Doubling(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_SELF_1_CAP_8_the_batch_is_the_first_tensors_leading_dimension_even_1_d() -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 10, (8,))
    assert _checked(_RowSums(), tokens, rows=2) == LiveOutcome(LiveCheck.MATCH, "cut")
    # A 1-D output of a 2-D batch is cut to the same rows.
    class Summed(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum(-1)

    assert _checked(Summed(), torch.randn(8, 6), rows=2) == LiveOutcome(LiveCheck.MATCH, "cut")
    # A scalar beside the rows is kept whole and the cut replay still matches.
    assert _checked(_WithScalar(), torch.randn(8, 6), rows=2) == LiveOutcome(LiveCheck.MATCH, "cut")
    # No batch (a 0-d argument): the whole output, by the exact replay.
    assert _checked(_Doubling(), torch.tensor(3.0), rows=2) == LiveOutcome(LiveCheck.MATCH, "exact")
    # A batch no larger than the rows: no cut, the exact replay.
    assert _checked(_Doubling(), torch.randn(2, 3), rows=2) == LiveOutcome(LiveCheck.MATCH, "exact")
    # rows 0 (the default): the whole output.
    assert _checked(_Doubling(), torch.randn(8, 3)) == LiveOutcome(LiveCheck.MATCH, "exact")


def test_SELF_3_SELF_6_a_flip_in_the_scalar_beside_the_rows_is_differ_with_its_reason() -> None:
    """The scalar is checked whole: a flip of it in the live call only is DIFFER."""
    torch.manual_seed(0)

    class Struck(_WithScalar):
        live = True

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y, s = super().forward(x)
            return (y, s + 1.0) if self.live else (y, s)

    struck = Struck()

    def healed() -> None:
        struck.live = False

    assert _checked(struck, torch.randn(8, 6), rows=2, between=healed) == LiveOutcome(
        LiveCheck.DIFFER, "exact", "the live output differs from two identical replays of the call")


# -- SELF-2: the replay is the live call again ------------------------------------------------


class _Settings(nn.Module):
    """Its output reads the settings the call ran in (as a module choosing a fast path would)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flags = (torch.is_grad_enabled(), torch.get_num_threads() - 1, torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled())
        return self.linear(x) + sum(float(flag) * 4**i for i, flag in enumerate(flags))


def test_SELF_2_the_re_execution_runs_in_the_live_calls_settings_and_restores_the_callers() -> None:
    torch.manual_seed(0)
    module, x = _Settings(), torch.randn(4, 3)
    threads = torch.get_num_threads()

    def record(**settings: Any) -> LiveCall:
        with contextlib.ExitStack() as stack:
            if "grad" in settings:
                stack.enter_context(torch.set_grad_enabled(settings["grad"]))
            if "deterministic" in settings:
                stack.enter_context(_deterministic(*settings["deterministic"]))
            if "autocast" in settings:
                stack.enter_context(torch.autocast("cpu", dtype=settings["autocast"]))
            if "threads" in settings:
                torch.set_num_threads(settings["threads"])
            try:
                rng = capture_rng_state()
                output = module(x)
                live = record_live_call(module, (x,), {}, output, rng=rng)
            finally:
                torch.set_num_threads(threads)
        assert isinstance(live, LiveCall)
        return live

    def now() -> tuple[Any, ...]:
        return (torch.is_grad_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(), torch.is_autocast_enabled("cpu"),
                torch.get_autocast_dtype("cpu"))

    cases: list[tuple[dict[str, Any], Any]] = [
        ({"grad": False}, contextlib.nullcontext),
        ({}, torch.no_grad),
        ({"threads": threads + 1}, contextlib.nullcontext),
        ({"deterministic": (True, False)}, contextlib.nullcontext),
        ({"deterministic": (True, True)}, lambda: _deterministic(True, False)),
        ({"autocast": torch.bfloat16}, contextlib.nullcontext),
        ({}, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
        ({"autocast": torch.bfloat16}, lambda: torch.autocast("cpu", dtype=torch.float16)),
        ({"autocast": torch.bfloat16}, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
    ]
    for settings, checking in cases:
        live = record(**settings)
        with checking():
            before = now()
            outcome = check_live_call(live)
            assert now() == before, settings
        assert outcome == LiveOutcome(LiveCheck.MATCH, "exact"), (settings, outcome)


class _GradAware(nn.Module):
    """Takes another path when its input requires grad (as activation checkpointing or a fused
    inference path does): the replay must see the arguments' ``requires_grad`` as the call did."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 if x.requires_grad else 3.0)


def test_SELF_2_the_arguments_keep_their_requires_grad() -> None:
    for requires_grad in (True, False):
        x = torch.randn(4, 3, requires_grad=requires_grad)
        assert _checked(_GradAware(), x) == LiveOutcome(LiveCheck.MATCH, "exact"), requires_grad


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return self.linear(x) * scale


def test_SELF_2_keyword_arguments_are_replayed() -> None:
    torch.manual_seed(0)
    assert _checked(_Scaled(), torch.randn(4, 3), kwargs={"scale": 3.0}) == LiveOutcome(LiveCheck.MATCH, "exact")


class _Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = RowWiseLinear(6, 6)
        self.norm = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


def test_SELF_2_CAP_7_a_sharded_module_replays_on_the_gathered_parameters_and_copies_of_its_buffers() -> None:
    """The gathered copies CAP-7 took are what the live call used, not the module's own (a shard,
    here other values); the buffer copies are shared with the peers' replay: never written."""
    torch.manual_seed(0)
    for training in (False, True):
        module = _Normed().train(training)
        gathered = {name: (p.detach() * 1.5).requires_grad_(True) for name, p in module.named_parameters()}
        buffers = {name: b.detach().clone() + (0.25 if b.is_floating_point() else 0)
                   for name, b in module.named_buffers()}
        kept = {name: b.clone() for name, b in buffers.items()}
        x = torch.randn(8, 6)
        rng = capture_rng_state()
        output = functional_call(module, {**gathered, **{n: b.clone() for n, b in buffers.items()}}, (x,))
        live = record_live_call(module, (x,), {}, output, rng=rng, rows=2, parameters=gathered, buffers=buffers)
        assert isinstance(live, LiveCall)
        outcome = check_live_call(live)
        # Training mode couples the rows (BatchNorm): the cut replay differs, the exact one matches.
        assert outcome == LiveOutcome(LiveCheck.MATCH, "exact" if training else "cut"), (training, outcome)
        assert all(torch.equal(buffers[name], kept[name]) for name in kept), training


def test_SELF_9_a_replay_that_wrote_the_buffers_copy_after_the_modules_own_were_rewritten_is_unchecked() -> None:
    """BatchNorm in training mode: the cut replay writes the hook's copy of the running statistics;
    the exact replay needs them as the live call left them. The module's own unchanged: copied
    again, MATCH. Rewritten by a later forward (DDP's broadcast, a second micro-batch): UNCHECKED."""
    torch.manual_seed(0)
    module, x = _Normed(), torch.randn(8, 6)
    assert _checked(module, x, rows=2) == LiveOutcome(LiveCheck.MATCH, "exact")
    outcome = _checked(module, x, rows=2, between=lambda: module(torch.randn(8, 6)))
    assert outcome == LiveOutcome(LiveCheck.UNCHECKED, "", (
        "a replay updated the module's buffers and its own were rewritten after the live call (DDP's buffer "
        "broadcast at a later forward)"))


def test_SELF_9_changed_state_is_unchecked_with_the_whole_reason() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(3, 3)

    def step() -> None:
        with torch.no_grad():
            linear.weight.mul_(0.5)

    assert _checked(linear, torch.randn(4, 3), between=step) == LiveOutcome(LiveCheck.UNCHECKED, "", (
        "parameter 'weight' changed after the live call (an optimizer other than the one scout was given, "
        "or the loop, stepped or replaced it before the check)"))
    x = torch.randn(4, 3)
    assert _checked(linear, x, between=lambda: x.add_(1.0)) == LiveOutcome(
        LiveCheck.UNCHECKED, "", "an argument of the live call was modified in place after it")


def test_SELF_3_every_exact_outcome_has_its_path_and_reason() -> None:
    import random

    class Noisy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * random.random()

    assert _checked(Noisy(), torch.randn(4, 3)) == LiveOutcome(LiveCheck.UNCHECKED, "exact", (
        "two replays of the call differ from each other: it is not reproducible here (a nondeterministic kernel)"))
    cast = nn.Linear(3, 3)
    cast.register_forward_hook(lambda _m, _a, out: out.double())
    assert _checked(cast, torch.randn(4, 3)) == LiveOutcome(LiveCheck.UNCHECKED, "exact", (
        "a forward hook changed the output's structure (dtype or shape), so no replay of the module can equal it"))


# -- SELF-2: the capture hooks are suspended during the re-execution ------------------------------


class _Outer(nn.Module):
    """Calls ``inner`` only for a batch of at most 2 rows: the cut replay does, the live call not."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.inner = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return self.inner(y) if x.shape[0] <= 2 else y


def test_SELF_2_no_capture_is_taken_from_the_re_execution() -> None:
    torch.manual_seed(0)
    outer = _Outer()
    capture = ModuleCapture({HIDDEN_0: outer, HIDDEN_1: outer.inner}, 2**30, rows=2, self_check=True)
    capture.arm(1, [HIDDEN_0, HIDDEN_1])
    outer(torch.randn(8, 6))
    # The cut replay called inner (and so differed); the exact replay matched.
    assert capture.live(HIDDEN_0, 1) == LiveOutcome(LiveCheck.MATCH, "exact")
    missing = capture.get(HIDDEN_1, 1)
    assert isinstance(missing, CaptureFailure)
    assert missing.reason == "hidden.1 was armed for step 1 but its module was not called", missing
    capture.close()


def test_SELF_5_SELF_9_a_submodule_replaced_after_an_earlier_check_is_read_anew() -> None:
    """A captured module whose submodule is replaced between two checks (an adapter swapped in, a
    layer rebuilt): the second check keeps the new submodule's buffers and watches its parameters
    -- a healthy call is never DIFFER, and the new parameters stepped before the check are seen."""
    torch.manual_seed(0)
    module, x = _Normed().eval(), torch.randn(8, 6)
    assert _checked(module, x) == LiveOutcome(LiveCheck.MATCH, "exact")
    module.norm = nn.BatchNorm1d(6).eval()
    with torch.no_grad():
        module.norm.running_mean.add_(0.5)
    assert _checked(module, x) == LiveOutcome(LiveCheck.MATCH, "exact")
    module.linear = nn.Linear(6, 6)

    def step() -> None:
        with torch.no_grad():
            module.linear.weight.mul_(0.5)

    assert _checked(module, x, between=step) == LiveOutcome(LiveCheck.UNCHECKED, "", (
        "parameter 'linear.weight' changed after the live call (an optimizer other than the one scout was "
        "given, or the loop, stepped or replaced it before the check)"))
