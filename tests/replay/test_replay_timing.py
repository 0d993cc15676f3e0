"""Replay timing by events (spec/replay.md STRAG-1, TIMING-1..TIMING-6): on a CUDA device each
timed repetition is the span between two events on the current stream, resolved after the
repetitions without a device-wide drain. Checked on CPU with a fake ``torch.cuda`` that has
CUDA's event contract and refuses every synchronize (tests/fake_cuda.py); the replayer is a real
one (tests/replay/test_replay_local.py's setup), only its device timer is the fake's."""

from __future__ import annotations

import time

import pytest
import torch

from scout.replay import runner as runner_module
from scout.replay.collectives import OwnWallClock
from scout.replay.replay import ReplayConfig
from scout.transport.nccl.timing import CudaEventTimer
from tests.fake_cuda import FakeCuda
from tests.replay.test_replay_local import ScriptedPeers, _setup

CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    cuda = FakeCuda()
    cuda.auto_run = True  # the device finishes what was queued whenever it is asked
    monkeypatch.setattr(runner_module, "timer_for", lambda device: CudaEventTimer(device, cuda=cuda))
    return cuda


def test_STRAG_1_TIMING_2_replay_on_cuda_is_timed_by_events_and_never_drains(fake: FakeCuda) -> None:
    _model, _optimizer, replayer = _setup(ScriptedPeers(), timing_warmup_runs=1, timing_repetitions=3)
    durations_ms = iter([50.0, 4.0, 6.0, 5.0])  # the warm-up, then three timed runs

    def run() -> str:
        fake.launch(next(durations_ms))  # the replay's kernels, queued on the stream
        return "evidence"

    result, median_s, repetitions_s = replayer.timer.timed(CUDA, run)
    assert result == "evidence"
    assert repetitions_s == pytest.approx((0.004, 0.006, 0.005))
    assert median_s == pytest.approx(0.005)
    assert fake.drains == 0


def test_STRAG_1_FAULT_3_compute_hooks_see_the_span_so_far_on_the_device(fake: FakeCuda) -> None:
    """A hook runs inside the timed span and is told the time so far on the same (event)
    timer; device work it queues (a slow device, FAULT-3 on a GPU) is timed."""
    _model, _optimizer, replayer = _setup(ScriptedPeers(), timing_warmup_runs=0, timing_repetitions=1)
    seen: list[float] = []

    def slow_device(elapsed_s: float) -> None:
        seen.append(elapsed_s)
        fake.launch(elapsed_s * 2e3)  # twice the span so far: a 3x straggler

    def run() -> str:
        fake.launch(10.0)
        return "evidence"

    replayer.add_compute_hook(slow_device)
    _result, median_s, _repetitions = replayer.timer.timed(CUDA, run)
    assert seen == [pytest.approx(0.010)]
    assert median_s == pytest.approx(0.030)
    assert fake.drains == 0


def test_TIMING_6_a_device_that_never_finishes_fails_the_replay_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = FakeCuda()  # no auto_run: the device never gets past the end mark
    monkeypatch.setattr(runner_module, "timer_for", lambda device: CudaEventTimer(device, cuda=cuda))
    _model, _optimizer, replayer = _setup(
        ScriptedPeers(), timing_warmup_runs=0, timing_repetitions=1, timing_resolve_timeout_s=0.05
    )
    with pytest.raises(RuntimeError, match="did not finish the timed replay within timing_resolve_timeout_s=0.05"):
        replayer.timer.timed(CUDA, lambda: "evidence")
    assert cuda.drains == 0


def test_STRAG_1_each_clock_on_a_cpu() -> None:
    cpu = torch.device("cpu")
    _model, _optimizer, replayer = _setup(ScriptedPeers())
    assert replayer.timer.timer(cpu) is runner_module.OWN_WALL_TIMER  # auto: wall less run-queue delay
    _model, _optimizer, own = _setup(ScriptedPeers(), timing_clock="own")
    assert own.timer.timer(cpu) is runner_module.OWN_WALL_TIMER
    _model, _optimizer, on_cpu = _setup(ScriptedPeers(), timing_clock="cpu")
    assert on_cpu.timer.timer(cpu) is runner_module.THREAD_CPU_TIMER
    _model, _optimizer, wall = _setup(ScriptedPeers(), timing_clock="wall")
    chosen = wall.timer.timer(cpu)
    assert chosen.name == "wall" and chosen not in (runner_module.THREAD_CPU_TIMER, runner_module.OWN_WALL_TIMER)


def test_STRAG_1_the_own_clock_never_goes_back_and_leaves_out_the_run_queue_delay() -> None:
    # A scripted run-queue delay: the clock is the wall clock less it, and a delay that grows
    # between the two reads of one reading (a preemption) is read again.
    clock = OwnWallClock()
    delays = iter([0.0, 0.0, 0.25, 0.25, 0.5, 0.75, 0.75])
    clock._delay = lambda: next(delays)  # type: ignore[method-assign]
    before = time.monotonic_ns()
    first = clock()  # no delay before and after the wall clock: settled
    second = clock()  # 0.25 s of delay, settled
    third = clock()  # 0.5 s, then 0.75 s after the wall clock (a preemption): read again
    after = time.monotonic_ns()
    assert before <= first <= after
    assert before - 0.25e9 <= second <= after - 0.25e9
    assert before - 0.75e9 <= third <= after - 0.75e9
    real = OwnWallClock()
    readings = [real() for _ in range(2000)]
    assert readings == sorted(readings)
    with pytest.raises(ValueError, match="timing_resolve_timeout_s must be a finite number > 0, got 0"):
        ReplayConfig(timing_resolve_timeout_s=0)
