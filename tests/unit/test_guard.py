"""scout's exception boundary without torch (spec/guard.md): the rank's record of failures
(scout/reports/guard.py), the test-only injection, and the pipeline's guarded steps
(scout/job/pipeline.py) with checks and a gate writer that raise. The same rules on real ranks:
tests/job/test_guard.py."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from scout.core.recipes import RecipeId, RecipeResult
from scout.core.verdict import Status
from scout.gate.model import GateConfig, Recipe
from scout.gate.recorder import GateWriter
from scout.job.gate_driver import GateDriver, Reporter
from scout.job.pipeline import CheckOutput, Layout, Pipeline, run_step
from scout.reports import guard
from scout.reports.guard import (
    ALIKE_UNTIL_OFF,
    CONSEQUENCES,
    FRAMES_MAX,
    POINTS,
    Boundary,
    Failure,
    InjectedFailure,
    Part,
    parse_injections,
)
from scout.reports.kinds import ReportKind
from scout.transport.program import AllGather

HOSTS = ("h0", "h1", "h2", "h3")


def _raise(depth: int) -> None:
    if depth:
        _raise(depth - 1)
    raise KeyError("output")


def _caught(depth: int = 0) -> BaseException:
    try:
        _raise(depth)
    except KeyError as error:
        return error
    raise AssertionError("unreachable")


def test_GUARD_2_every_part_has_a_reason_and_says_what_off_means() -> None:
    assert set(CONSEQUENCES) == set(Part)
    assert Part.DDP_HOOK.reason == "ddp_hook-failed" and Part.GATE.reason == "gate-failed"
    assert all(point.split(".")[0] in {p.value for p in Part} for point in POINTS)
    assert {Part.INSTRUMENTATION, Part.DDP_HOOK, Part.COMPLETION} == ALIKE_UNTIL_OFF


def test_GUARD_3_a_part_is_recorded_once_with_its_last_frames_and_later_failures_are_counted() -> None:
    boundary = Boundary(rank=3)
    boundary.step = 12
    boundary.failed(Part.GATE, _caught(depth=10), "job.step")
    boundary.failed(Part.GATE, RuntimeError("second"), "job.step")
    (failure,) = boundary.failures([Part.GATE, Part.REPLAY])
    assert (failure.part, failure.rank, failure.step, failure.where) == (Part.GATE, 3, 12, "job.step")
    assert (failure.error_type, failure.message, failure.count) == ("KeyError", "'output'", 2)
    assert len(failure.frames) == FRAMES_MAX and failure.frames[-1].startswith("test_guard.py:")
    assert failure.frames[-1].endswith("in _raise")
    assert boundary.take_new() == [Part.GATE] and boundary.take_new() == []
    # A long message is cut; a record crosses the exchange as plain values and comes back equal.
    boundary.failed(Part.LOOP, ValueError("x" * 2000), "forward hook")
    (loop,) = boundary.failures([Part.LOOP])
    assert len(loop.message) == guard.ERROR_CHARS_MAX and Failure.from_plain(loop.to_plain()) == loop


def test_GUARD_3_a_failed_part_stops_at_once_here_unless_the_observer_reads_it_on_every_rank() -> None:
    boundary = Boundary(rank=0)
    stopped: list[Part] = []
    boundary.on_first_failure = stopped.append
    for part in (Part.LOOP, Part.INSTRUMENTATION):
        boundary.failed(part, RuntimeError("boom"), "hook")
    assert not boundary.running(Part.LOOP)
    assert boundary.running(Part.INSTRUMENTATION), "its record must stay comparable until it is off everywhere"
    assert stopped == [Part.LOOP, Part.INSTRUMENTATION] and not boundary.off
    assert boundary.switch_off([Part.INSTRUMENTATION, Part.INSTRUMENTATION], 7) == [Part.INSTRUMENTATION]
    assert boundary.switch_off([Part.INSTRUMENTATION], 9) == [] and boundary.off == {Part.INSTRUMENTATION: 7}
    assert not boundary.running(Part.INSTRUMENTATION) and boundary.is_off(Part.INSTRUMENTATION)


def test_GUARD_9_an_injection_fires_once_on_its_rank_at_or_after_its_step() -> None:
    injections = parse_injections(" replay.prepare@4:1 , gate.feed@2:0,")
    assert injections == {"replay.prepare": (4, 1), "gate.feed": (2, 0)}
    mine = Boundary(rank=1, injections=injections)
    other = Boundary(rank=0, injections=injections)
    mine.step = other.step = 3
    mine.inject("replay.prepare")  # not yet
    other.inject("replay.prepare")  # not its rank
    mine.step = other.step = 6
    with pytest.raises(InjectedFailure, match="replay.prepare on rank 1, step 6"):
        mine.inject("replay.prepare")
    mine.inject("replay.prepare")  # once
    other.inject("replay.prepare")
    with pytest.raises(InjectedFailure):
        other.inject("gate.feed")


@pytest.mark.parametrize("text", ["replay.prepar@4:1", "replay.prepare@0:1", "replay.prepare@4", "gate.feed@x:0",
                                  "replay.prepare@4:-1"])
def test_GUARD_9_a_bad_injection_is_refused_naming_it_and_the_points(text: str) -> None:
    with pytest.raises(ValueError, match=rf"SCOUT_TEST_INJECT: {text!r} is not POINT@STEP:RANK.*gate.feed"):
        parse_injections(text)


def test_GUARD_9_no_injection_outside_a_job_and_the_flag_follows_the_active_boundary() -> None:
    assert guard.current() is None and not guard.INJECTING
    guard.inject("gate.feed")  # nothing active: nothing happens
    boundary = guard.activate(0, {guard.INJECT_VARIABLE: "gate.feed@1:0"})
    try:
        assert guard.INJECTING and guard.current() is boundary and guard.running(Part.GATE)
    finally:
        guard.deactivate(boundary)
    assert guard.current() is None and not guard.INJECTING and guard.running(Part.GATE)


# -- the pipeline's guarded steps ------------------------------------------------------------

HIDDEN = RecipeId.parse("hidden.0")
OUTPUT = RecipeId.parse("output")
GROUPS = ((0, 1), (2, 3))
NAMES = ("dp0", "dp1")


class Sink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def exclude_hosts(self, hosts: Sequence[str]) -> None:
        pass

    def timing(self, record: Mapping[str, Any]) -> None:
        pass


class Check:
    """A check that is due every step and gives one result per call, or raises."""

    name = "replay"

    def __init__(self, rank: int, results: Sequence[RecipeResult] = (), error: Exception | None = None) -> None:
        self.layout = Layout.of(GROUPS, NAMES, rank)
        self.results = tuple(results)
        self.error = error

    def due(self, step: int) -> bool:
        return True

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        if self.error is not None:
            raise self.error
        return CheckOutput(self.name, self.layout, self.results)
        yield

    def step_begins(self) -> None:
        pass


def _pipeline(check: Check, *, rank: int, gate: GateDriver | None, sink: Sink | None) -> Pipeline:
    reporter = Reporter(sink, job_id="job", generation=0, hosts=HOSTS, rank=rank)
    return Pipeline([check], rank=rank, world_size=4, hosts=HOSTS, groups=GROUPS, on_sdc="restart", cycle_steps=0,
                    checkpoint_every_cycles=1, reporter=reporter, gate=gate, timeout_s=1.0,
                    boundary=Boundary(rank=rank))


def _run(pipeline: Pipeline, step: int, gathered: list[Any] | None = None) -> tuple[Any, list[Any]]:
    """Drive run_step, answering its one exchange with ``gathered`` (what every rank sent)."""
    program = run_step(pipeline, step)
    sent: list[Any] = []
    try:
        op = next(program)
        while True:
            assert isinstance(op, AllGather)
            sent.append(op.payload)
            op = program.send(gathered)
    except StopIteration as done:
        return done.value, sent


def test_GUARD_3_a_check_that_raises_at_a_due_step_still_sends_an_output_so_the_exchange_keeps_its_shape() -> None:
    failing = _pipeline(Check(2, error=RuntimeError("replay broke")), rank=2, gate=None, sink=None)
    outcome, sent = _run(failing, 5, gathered=[((0, (), (), ()),), None, ((1, (), (), ()),), None])
    assert outcome.stop is None and len(sent) == 1  # it entered the step's exchange like every rank
    (payload,) = sent
    assert payload == ((1, (), (), ()),), "the leader of dp1 sends an empty part: its group's results are missing"
    (failure,) = failing.boundary.failures([Part.REPLAY])  # type: ignore[union-attr]
    assert (failure.error_type, failure.step, failure.where) == ("RuntimeError", 0, "job.step")


def test_GUARD_3_without_a_boundary_the_simulator_still_sees_the_exception() -> None:
    pipeline = _pipeline(Check(2, error=RuntimeError("replay broke")), rank=2, gate=None, sink=None)
    pipeline.boundary = None
    with pytest.raises(RuntimeError, match="replay broke"):
        _run(pipeline, 5)


def test_GUARD_6_a_gate_writer_that_raises_stops_and_the_sdc_it_missed_is_still_reported_and_stops_the_job(
    tmp_path: Path,
) -> None:
    """The issue's crash: the writer's configuration lacks a recipe another group feeds
    (``KeyError: 'output'``). The writer stops at once, nothing is promoted, the other groups'
    SDC findings are written by the reporter (counted per rank and recipe, GATE-41), and
    on_sdc = "restart" still stops every rank at this step."""
    sink = Sink()
    config = GateConfig("job", [Recipe(str(HIDDEN), NAMES)], NAMES)  # no "output": a stage without a head
    reporter = Reporter(sink, job_id="job", generation=0, hosts=HOSTS, rank=0)
    gate = GateDriver(GateWriter.open(tmp_path / "gate", config), reporter)
    gate.boundary(0)  # the attempt's first cycle opens
    pipeline = _pipeline(Check(0, [RecipeResult(HIDDEN, 5, Status.AGREE)]), rank=0, gate=gate, sink=sink)
    pipeline.cycle_steps = 3
    sdc = RecipeResult(OUTPUT, 5, Status.ATTRIBUTED, (1,), ("output",))
    gathered = [((0, ((str(HIDDEN), 5, "AGREE", (), (), None, False),), (), ()),), None,
                ((1, tuple(attrs_plain(r) for r in (sdc,)), (), ()),), None]
    outcome, _ = _run(pipeline, 5, gathered)
    assert pipeline.gate is None and pipeline.gate_stopped and pipeline.certifying, \
        "the writer stops at once; every rank stops certifying at the agreed off step"
    (failure,) = pipeline.boundary.failures([Part.GATE])  # type: ignore[union-attr]
    assert (failure.error_type, failure.message) == ("KeyError", "'output'")
    assert outcome.stop is not None and outcome.stop.ranks == (3,), "on_sdc still stops every rank"
    named = [r for r in sink.records if r["kind"] == ReportKind.SDC]
    assert [(r["ranks"], r["evidence"]["gate"]) for r in named] == [([3], "stopped")]
    for step in (6, 7):  # the same finding again: written when its count doubles, as GATE-41 counts
        _run(pipeline, step, gathered)
    assert [r["evidence"]["counts"] for r in sink.records if r["kind"] == ReportKind.SDC] == [[1], [2]]
    # No boundary reaches a stopped writer (cycle end at step 6): nothing more is certified.
    assert not [r for r in sink.records if r["kind"] == ReportKind.CHECKPOINT]


def attrs_plain(result: RecipeResult) -> tuple[Any, ...]:
    from scout.job.aggregate import result_to_plain

    return result_to_plain(result)
