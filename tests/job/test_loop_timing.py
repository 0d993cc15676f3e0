"""LOOP-6: every loop check's ratios in ``run_dir/timing.jsonl`` (scout/reports/timing.py),
written by the pipeline's reporter rank, summarised by ``scout report`` and drawn in its
picture (scout/reports/loop_timing.py). In one process, from a scripted loop group and synthetic
files; the real 4-rank job is ``test_attach_torchrun.py``'s healthy run."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from scout import reports
from scout.cli import main
from scout.job.checks import LoopStragglerCheck
from scout.job.gate_driver import Reporter, RestoreDecision
from scout.job.pipeline import Layout, Pipeline, run_step
from scout.job.run_dir import RunDir
from scout.replay.arrival import LoopConfig, LoopTimer
from scout.reports.loop_timing import PICTURE_RANKS_MAX, TIMING_RANKS_SHOWN, loop_series
from scout.reports.summary import load_run, summary_text
from scout.reports.timing import (
    TIMING_FILE,
    TIMING_SCHEMA,
    TimingLog,
    make_timing_record,
    read_timing,
    timing_arguments,
)

MS = 1_000_000  # ns
RANKS = (10, 11, 12, 13)


class _Peers:
    """Four loop peers; this process is position 0 (rank 10), the others' rows are scripted."""

    size, position, ranks = 4, 0, RANKS

    def __init__(self) -> None:
        self.others: list[list[int]] = []

    def all_gather_int64(self, row: Sequence[int]) -> list[list[int]]:
        return [list(row), *self.others]

    def broadcast_(self, tensors: object, source_position: int) -> None:
        raise AssertionError("the loop timer only gathers")


def _finish(program: Generator[Any, Any, Any]) -> Any:
    """Run a rank program that yields no transport op (a job of one group)."""
    with pytest.raises(StopIteration) as done:
        next(program)
    return done.value.value


def _record(step: int, ratios: Sequence[float | None], *, generation: int = 0, group: str = "dp",
            ranks: Sequence[int] = (0, 1, 2, 3), confirmed: Sequence[int] = (), kind: str = "loop") -> dict[str, Any]:
    evidence = [None if r is None else math.log(r) for r in ratios]
    arguments = timing_arguments(kind, step=step, group=group, ranks=ranks,
                                 times_ms=[None if r is None else 20.0 * r for r in ratios], evidence=evidence,
                                 confirmed=confirmed, status="AGREE", reason=None, slow_ratio=1.1)
    return make_timing_record(arguments, job_id="j", generation=generation, reporter_rank=0)


def test_LOOP_6_the_pipeline_writes_one_timing_line_per_compared_loop_check_on_the_reporter_rank(
        tmp_path: Path) -> None:
    peers = _Peers()
    clock = [0]
    timer = LoopTimer(peers, LoopConfig(check_every_steps=2, warmup_steps=0), clock_ns=lambda: clock[0],
                      run_queue_delay_s=lambda: 0.0)
    layout = Layout.of((RANKS,), ("dp",), 10)
    sink = RunDir(tmp_path / "run")
    reporter = Reporter(sink, job_id="j", generation=0, hosts=("h",) * 14, rank=10)
    pipeline = Pipeline([LoopStragglerCheck(timer, layout, ("h",) * 14)], rank=10, world_size=14, hosts=("h",) * 14,
                        groups=(RANKS,), on_sdc="report", cycle_steps=0, checkpoint_every_cycles=1,
                        reporter=reporter, gate=None, timeout_s=1.0)
    pipeline.begin(RestoreDecision(0, None, None, None, 0))
    for step in range(1, 13):
        clock[0] += 20 * MS  # this rank's loop: 20 ms; rank 12's is 30 ms
        peers.others = [[step, 2, 20_100, 20_100, 0, 0, 0], [step, 2, 30_000, 30_000, 0, 0, 0],
                        [step, 2, 19_900, 19_900, 0, 0, 0]]
        _finish(run_step(pipeline, step))
    reading = read_timing(tmp_path / "run" / TIMING_FILE)
    assert reading.skipped == 0
    assert [r["step"] for r in reading.records] == [2, 4, 6, 8, 10, 12]  # one line per check
    first, last = reading.records[0], reading.records[-1]
    assert (first["schema"], first["kind"], first["group"], first["ranks"], first["reporter_rank"]) == (
        TIMING_SCHEMA, "loop", "dp", list(RANKS), 10)
    assert first["times_ms"] == [20.0, 20.1, 30.0, 19.9] and first["status"] == "ATTRIBUTED"
    # STRAG-2: (t + f) / (centre + f), the floor f 1 ms, the centre the verdict's (20.0 ms here).
    assert first["performance_ratio"][2] == pytest.approx((30.0 + 1) / (20.0 + 1))
    assert first["evidence"][2] == pytest.approx(math.log(first["performance_ratio"][2]))
    # 1.5x confirms at the 4th check (STRAG-12): the lines say so, and so does the straggler report.
    assert [r["confirmed"] for r in reading.records] == [[], [], [], [12], [12], [12]]
    assert last["slow_ratio"] == 1.1
    straggler = [r for r in sink.records() if r["kind"] == "straggler"]
    assert [(r["ranks"], r["step"], r["reason"]) for r in straggler] == [([12], 8, "loop-slow")]
    assert set(straggler[0]["evidence"]["group_ratios"]) == {"10", "11", "12", "13"}
    # Observation is not a finding: nothing of it went into reports.jsonl.
    assert {r["kind"] for r in sink.records()} == {"restart", "straggler"}


def test_LOOP_6_a_check_that_compared_nothing_writes_no_line(tmp_path: Path) -> None:
    peers = _Peers()
    timer = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=lambda: 0,
                      run_queue_delay_s=lambda: 0.0)
    check = LoopStragglerCheck(timer, Layout.of((RANKS,), ("dp",), 10), ("h",) * 14)
    check.step_begins()
    peers.others = [[2, 1, 1, 1, 0, 0, 0]] * 3  # peers at another step (LOOP-2)
    output = _finish(check.run(1))
    assert output is not None and output.timing == ()


def test_LOOP_7_the_forward_window_is_timed_by_hooks_on_the_hidden_layers_and_gets_its_own_line() -> None:
    import torch
    from torch import nn

    peers = _Peers()
    clock = [0]
    timer = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=lambda: clock[0],
                      run_queue_delay_s=lambda: 0.0)
    first, last = nn.Linear(2, 2), nn.Linear(2, 2)

    def slow_hook(_module: Any, _inputs: Any, _output: Any) -> None:
        clock[0] += 7 * MS  # a user's forward hook on the last layer, registered before attach

    last.register_forward_hook(slow_hook)
    check = LoopStragglerCheck(timer, Layout.of((RANKS,), ("dp",), 10), ("h",) * 14, [first, last])
    check.step_begins()
    clock[0] += 1 * MS
    last(first(torch.zeros(1, 2)))
    clock[0] += 30 * MS
    peers.others = [[1, 1, 31_000, 31_000, 0, 1, 5_000]] * 3
    output = _finish(check.run(1))
    assert peers.others and output is not None
    assert [(line["kind"], line["times_ms"][0]) for line in output.timing] == [("loop", 38.0), ("forward", 7.0)]
    check.close()  # the hooks are removed: a later forward opens no window
    check.step_begins()
    last(first(torch.zeros(1, 2)))
    peers.others = [[2, 1, 31_000, 31_000, 0, 0, 0]] * 3
    output = _finish(check.run(2))
    assert [line["kind"] for line in output.timing] == ["loop"]


def test_LOOP_6_the_log_stops_at_its_line_bound_with_one_warning_across_attempts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / TIMING_FILE
    log = TimingLog(path, lines_max=3)
    assert [log.write(_record(step, [1.0] * 4)) for step in (10, 20)] == [True, True]
    # The next attempt appends to the same file, and counts what is there.
    again = TimingLog(path, lines_max=3)
    with caplog.at_level(logging.WARNING, logger="scout"):
        assert [again.write(_record(step, [1.0] * 4, generation=1)) for step in (10, 20, 30)] == [True, False, False]
        # Each kind has its own bound: the replay's many checks never crowd the loop's out.
        device = make_timing_record({**_record(10, [1.0] * 4), "kind": "device"}, job_id="j", generation=1,
                                    reporter_rank=0)
        assert again.write(device) and again.write(device) and again.write(device) and not again.write(device)
    assert len(path.read_bytes().splitlines()) == 6
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("LOOP-6" in m for m in messages), messages  # one per kind
    assert " 3 loop lines" in messages[0] and " 3 device lines" in messages[1]
    by_bytes = TimingLog(tmp_path / "bytes.jsonl", bytes_max=len(json.dumps(_record(1, [1.0] * 4))) + 50)
    assert [by_bytes.write(_record(step, [1.0] * 4)) for step in (1, 2)] == [True, False]
    with pytest.raises(ValueError, match="lines_max must be an int >= 1, got 0"):
        TimingLog(path, lines_max=0)


def test_LOOP_6_the_reader_skips_a_torn_last_line_and_other_lines_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / TIMING_FILE
    log = TimingLog(path)
    for step in (10, 20):
        log.write(_record(step, [1.0, 1.2, None, 0.9]))
    whole = json.dumps(_record(30, [1.0] * 4)).encode()
    with path.open("ab") as file:
        file.write(b'{"schema": "scout.report/1"}\n')  # not a timing record
        file.write(whole[: len(whole) // 2])  # a crash in the middle of the last write
    reading = read_timing(path)
    assert [r["step"] for r in reading.records] == [10, 20] and reading.skipped == 2
    assert reading.records[0]["performance_ratio"][2] is None
    assert read_timing(tmp_path / "absent.jsonl").records == ()
    far = timing_arguments("loop", step=1, group="dp", ranks=[0, 1], times_ms=[1.0, math.inf], evidence=[800.0, 0.1],
                           confirmed=[], status="AGREE", reason=None, slow_ratio=1.1)
    assert far["performance_ratio"][0] is None and far["times_ms"][1] is None  # no overflow, no inf in JSON
    with pytest.raises(ValueError, match="one time and one evidence per rank"):
        timing_arguments("loop", step=1, group="dp", ranks=[0, 1], times_ms=[1.0], evidence=[0.0, 0.0],
                         confirmed=[], status="AGREE", reason=None, slow_ratio=1.1)


def test_LOOP_6_a_replay_check_writes_a_device_and_a_communication_line() -> None:
    from scout.core.straggler.tracking import ReplayStragglers
    from scout.core.verdict import MISSING, TimingConfig, classify_timing
    from scout.job.checks import ReplayCheck
    from scout.replay.runner import StepReport

    class Runner:
        stragglers = ReplayStragglers(RANKS, device_floor_ms=0.1, communication_timing=TimingConfig())

    compute = {"hidden.0": (10.0, 10.2, 15.0, 9.9), "hidden.1": (5.0, 5.0, 7.5, MISSING)}
    verdicts = {recipe: classify_timing(list(times), TimingConfig()) for recipe, times in compute.items()}
    report = StepReport(6, (), verdicts, {}, 0.0, 0, peer_compute_ms=compute, communication_ms=(3.0, 3.1, 2.9, 3.0),
                        communication=classify_timing([3.0, 3.1, 2.9, 3.0], TimingConfig()),
                        evidence={"device": (0.0, 0.01, 0.4, None), "communication": (0.0, 0.0, 0.0, 0.0)},
                        confirmed_stragglers=frozenset({2}))
    check = ReplayCheck("replay", Runner(), Layout.of((RANKS,), ("dp",), 10), ("h",) * 14)  # type: ignore[arg-type]
    device, communication = check._timing(report)
    assert (device["kind"], device["step"], device["group"], device["ranks"]) == ("device", 6, "dp", list(RANKS))
    assert device["times_ms"] == [15.0, 15.2, 22.5, None]  # summed over the recipes; one missing: none
    assert device["status"] == verdicts["hidden.0"].status.value and device["confirmed"] == [12]
    assert device["performance_ratio"][2] == pytest.approx(math.exp(0.4)) and device["evidence"][3] is None
    assert (communication["kind"], communication["times_ms"], communication["status"]) == (
        "communication", [3.0, 3.1, 2.9, 3.0], "AGREE")
    assert check._timing(attrs.evolve(report, timing={}, communication=None)) == ()  # nothing compared


def _run_dir(tmp_path: Path, records: Sequence[dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    reports.append_record(run / reports.REPORTS_FILE, reports.make_record(
        "restart", job_id="j", reason="started", generation=0, step=0, evidence={"world_size": 4}))
    reports.append_record(run / reports.REPORTS_FILE, reports.make_record(
        "straggler", job_id="j", reason="loop-slow", generation=0, ranks=[3], hosts=["h3"], step=40,
        evidence={"performance_ratio": 1.52}))
    log = TimingLog(run / TIMING_FILE)
    for record in records:
        log.write(record)
    return run


def test_LOOP_6_scout_report_prints_each_ranks_loop_ratios_and_the_confirmed_straggler(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [_record(step, [1.0, 0.98, 1.02, 1.5 if step >= 20 else 1.0], confirmed=[3] if step >= 40 else [])
               for step in range(10, 110, 10)]
    run = _run_dir(tmp_path, records)
    assert main(["report", str(run), "--no-picture"]) == 1  # the straggler is a fault
    text = capsys.readouterr().out
    section = text[text.index("loop timing:"):].splitlines()
    assert section[0] == "loop timing: 10 check(s), steps 10..100, 0 inconclusive; slow ratio 1.10"
    assert section[2].split() == ["3", "1.50", "1.50", "1.50", "9/10"]  # the slowest first
    assert len([line for line in section[2:6] if line.endswith("/10")]) == 4
    assert "confirmed loop-slow: rank(s) [3] at step 40 (ratio 1.52)" in text
    assert main(["report", str(run), "--no-picture", "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)["loop_timing"]
    assert (summary["checks"], summary["ranks"][0]["rank"], summary["ranks"][0]["above"]) == (10, 3, 9)
    # The replay's device checks in one line: how many, and the slowest rank.
    log = TimingLog(run / TIMING_FILE)
    for step in (2, 4, 6):
        log.write({**_record(step, [1.0, 1.3, 1.0, 1.0]), "kind": "device"})
    assert main(["report", str(run), "--no-picture"]) == 1
    assert ("replay device timing: 3 check(s); slowest rank 1: median 1.30, max 1.30, above the slow ratio at 3/3"
            in capsys.readouterr().out)
    with (run / TIMING_FILE).open("ab") as file:
        file.write(b'{"schema": "scout.timing/1", "kind": "lo')  # a crash in the middle of a write
    assert main(["report", str(run), "--no-picture"]) == 1
    assert "; 1 unreadable line(s) of timing.jsonl skipped" in capsys.readouterr().out


def test_LOOP_6_the_summary_of_a_thousand_ranks_is_bounded(tmp_path: Path) -> None:
    ranks = list(range(1000))
    ratios = [1.0 + 0.0001 * r for r in ranks]
    ratios[517] = 1.6
    run = _run_dir(tmp_path, [_record(step, ratios, ranks=ranks) for step in (10, 20, 30)])
    text = summary_text(load_run(run))
    section = text[text.index("loop timing:"):].split("\n\n")[0].splitlines()
    assert len(section) <= TIMING_RANKS_SHOWN + 4
    assert section[2].split()[0] == "517"
    assert f"... {1000 - TIMING_RANKS_SHOWN} more rank(s)" in text
    series, slow = loop_series(load_run(run).timing)
    assert slow == 1.1
    # Many ranks: only those ever above the slow ratio, and each check's median.
    assert [s.label for s in series] == ["rank 517", "median of each check"]
    assert series[1].runs == (((10, pytest.approx(1.05, abs=0.001)), (20, pytest.approx(1.05, abs=0.001)),
                               (30, pytest.approx(1.05, abs=0.001))),)
    assert len(loop_series([_record(10, [1.2] * 40, ranks=range(40))])[0]) == PICTURE_RANKS_MAX + 1


def test_LOOP_6_the_picture_draws_every_ranks_loop_ratio(tmp_path: Path) -> None:
    records = [_record(step, [1.0, 0.98, 1.02, 1.5 if step >= 20 else 1.0]) for step in range(10, 110, 10)]
    records += [_record(step, [1.0, 1.0, 1.0, 1.0], generation=1) for step in (60, 70)]  # a restart
    run = _run_dir(tmp_path, records)
    series, _ = loop_series(load_run(run).timing)
    assert [s.label for s in series] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert [len(run) for run in series[3].runs] == [10, 2]  # one run of points per attempt
    with_strip, without = tmp_path / "with.png", tmp_path / "without.png"
    assert main(["report", str(run), "--picture", str(with_strip)]) == 1
    (run / TIMING_FILE).unlink()
    assert main(["report", str(run), "--picture", str(without)]) == 1
    data = with_strip.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > len(without.read_bytes()) + 5_000


def test_LOOP_7_an_early_exit_or_an_exception_inside_the_forward_does_not_silence_the_loop_lines() -> None:
    """The hooks of attach (LOOP-7) on real layers: a step whose model exits before the last
    layer, and one whose forward raises (the loop catches it and goes on), leave their window
    open. The loop line of every later check still has this rank's time, and a later full
    forward its forward time."""
    import torch
    from torch import nn

    peers = _Peers()
    clock = [0]
    timer = LoopTimer(peers, LoopConfig(check_every_steps=1, warmup_steps=0), clock_ns=lambda: clock[0],
                      run_queue_delay_s=lambda: 0.0)
    first, last = nn.Linear(2, 2), nn.Linear(2, 2)
    fail = [False]

    def raising(_module: Any, _inputs: Any) -> None:
        if fail[0]:
            raise RuntimeError("the forward failed")

    last.register_forward_pre_hook(raising)
    check = LoopStragglerCheck(timer, Layout.of((RANKS,), ("dp",), 10), ("h",) * 14, [first, last])
    lines = []
    for step, how in enumerate(("early exit", "exception", "full", "full"), start=1):
        check.step_begins()
        clock[0] += 5 * MS
        hidden = first(torch.zeros(1, 2))
        clock[0] += 5 * MS
        fail[0] = how == "exception"
        try:
            if how != "early exit":
                last(hidden)
        except RuntimeError:
            pass
        fail[0] = False
        clock[0] += 10 * MS
        peers.others = [[step, 1, 20_000, 20_000, 0, 1, 10_000]] * 3
        output = _finish(check.run(step))
        lines.append({line["kind"]: line["times_ms"][0] for line in output.timing})
    # The open windows' steps have no forward time of this rank (its peers' are compared).
    assert lines == [{"loop": 20.0, "forward": None}, {"loop": 20.0, "forward": None},
                     {"loop": 20.0, "forward": 5.0}, {"loop": 20.0, "forward": 5.0}], lines
    check.close()


def test_LOOP_7_the_picture_draws_the_forward_checks_in_a_strip_of_their_own(tmp_path: Path) -> None:
    loops = [_record(step, [1.0, 1.0, 1.0, 1.0]) for step in range(10, 70, 10)]
    forwards = [_record(step, [1.0, 1.5, 1.0, 1.0], kind="forward") for step in range(10, 70, 10)]
    run = _run_dir(tmp_path, loops + forwards)
    series, _ = loop_series(load_run(run).timing, "forward")
    assert [points[-1][1] for s in series for points in s.runs] == [1.0, 1.5, 1.0, 1.0]
    assert [points[-1][1] for s in loop_series(load_run(run).timing)[0] for points in s.runs] == [1.0] * 4
    both, loop_only = tmp_path / "both.png", tmp_path / "loop.png"
    assert main(["report", str(run), "--picture", str(both)]) == 1  # exit 1: _run_dir's straggler report
    (tmp_path / "again").mkdir()
    assert main(["report", str(_run_dir(tmp_path / "again", loops)), "--picture", str(loop_only)]) == 1
    assert both.read_bytes().startswith(b"\x89PNG") and len(both.read_bytes()) > len(loop_only.read_bytes()) + 5_000
