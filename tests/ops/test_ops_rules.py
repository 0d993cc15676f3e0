"""The ops rules compared whole, in-process (issue 41's mutation run over scout/ops): the Slurm
requeue and its exclude file (OPS-7, OPS-8, OPS-10) against a scripted scontrol, what one node
counts of each report (OPS-3), the reports tail (OPS-12), the on_report runner's outcomes
(OPS-4) and the ops files. Each test names what an operator sees: the message, the series, the
calls made to Slurm."""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import re
import signal
import socket
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from scout import reports
from scout.ops import launch, paths, slurm, web
from scout.ops.hooks import OUTCOMES, OnReportRunner, OutputTail
from scout.ops.launch import NodeOps
from scout.ops.slurm import (
    EXCLUDE_FILE_BYTES_MAX,
    EXCLUDE_LIST_BYTES_MAX,
    PENDING_POLL_S,
    RequeueResult,
    SlurmError,
    excluded_hosts,
    expand_hosts,
    job_fields,
    read_exclude_file,
    requeue_excluding,
    run_scontrol,
)
from scout.ops.state import NodeState, RankProgress, RankStats, RoundHistogram
from scout.ops.tail import ReportTail
from scout.reports.kinds import ReportKind
from tests.ops.test_ops_processes import _gate_with_a_verified_checkpoint

pytestmark = [pytest.mark.processes, pytest.mark.light]

# -- the exclude file (OPS-10) ----------------------------------------------------------------


def test_OPS_10_the_exclude_file_is_read_whole_in_order_once_each_and_its_bound_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "exclude_hosts.txt"
    path.write_text("gpu3\n gpu1\tgpu3\n\ngpu2 \n", encoding="utf-8")
    assert read_exclude_file(path) == excluded_hosts(path) == ["gpu3", "gpu1", "gpu2"]
    path.write_bytes(b"g" * EXCLUDE_FILE_BYTES_MAX)  # exactly the bound: read
    assert read_exclude_file(str(path)) == ["g" * EXCLUDE_FILE_BYTES_MAX]
    path.write_bytes(b"g" * (EXCLUDE_FILE_BYTES_MAX + 1))
    message = f"{path} is over {EXCLUDE_FILE_BYTES_MAX} bytes: not an exclude-hosts file scout wrote " \
              "(one host name per line); check it"
    with pytest.raises(SlurmError) as raised:
        read_exclude_file(path)
    assert str(raised.value) == message
    with pytest.raises(SlurmError) as raised:  # only a missing file is "no hosts"
        excluded_hosts(path)
    assert str(raised.value) == message


def test_OPS_10_an_exclude_file_that_cannot_be_read_says_which_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "exclude_hosts.txt"
    path.write_bytes(b"gpu1\n\xffgpu2\n")
    with pytest.raises(SlurmError) as raised:
        read_exclude_file(path)
    assert str(raised.value) == (f"{path} is not UTF-8 text (byte 5: b'\\xff'): scout writes host names one per "
                                 "line; fix or remove it")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    path.unlink()
    path.mkdir()
    with pytest.raises(SlurmError) as raised:
        excluded_hosts(path)
    assert str(raised.value) == (f"{path} is a directory, not an exclude-hosts file (one host name per line); "
                                 "remove it or pass --exclude-file")
    assert raised.value.__suppress_context__
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # any other OSError (here ELOOP): named with the system's words
    with pytest.raises(SlurmError) as raised:
        read_exclude_file(loop)
    assert str(raised.value) == f"cannot read the exclude-hosts file {loop}: Too many levels of symbolic links"
    assert raised.value.__suppress_context__


# -- one scontrol call --------------------------------------------------------------------------


def test_OPS_10_one_scontrol_call_answers_its_output_or_a_slurm_error_naming_the_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert run_scontrol(["show", "job"], scontrol="echo") == "show job\n"
    with pytest.raises(SlurmError) as raised:
        run_scontrol(["-c", "echo out; echo ' the error ' >&2; exit 3"], scontrol="sh")
    assert str(raised.value) == "sh -c 'echo out; echo '\"'\"' the error '\"'\"' >&2; exit 3' failed (3): the error"
    with pytest.raises(SlurmError) as raised:  # nothing on stderr: stdout is quoted
        run_scontrol(["-c", "echo ' only out '; exit 2"], scontrol="sh")
    assert str(raised.value).endswith("failed (2): only out")
    with pytest.raises(SlurmError) as raised:
        run_scontrol(["-c", f"printf '%0{3000}d' 0 >&2; exit 1"], scontrol="sh")
    assert str(raised.value).endswith("failed (1): " + "0" * 2000)
    missing = str(tmp_path / "no-scontrol")
    with pytest.raises(SlurmError) as raised:
        run_scontrol(["show"], scontrol=missing)
    assert str(raised.value) == f"{missing!r} was not found: run this where Slurm's commands are installed"
    assert raised.value.__suppress_context__
    monkeypatch.setattr(slurm, "SCONTROL_TIMEOUT_S", 0.3)
    with pytest.raises(SlurmError) as raised:
        run_scontrol(["5"], scontrol="sleep")
    assert str(raised.value) == "sleep 5 did not answer within 0.3 s"
    assert raised.value.__suppress_context__
    with pytest.raises(SlurmError) as raised:
        run_scontrol(["-c", "exit 1; " + "y" * 400], scontrol="sh")
    command = "sh -c 'exit 1; " + "y" * 400 + "'"
    assert str(raised.value) == f"{command[:300]}... ({len(command)} chars) failed (1): "
    with pytest.raises(SlurmError) as raised:  # exactly the bound: shown whole
        run_scontrol(["-c", "exit 1;" + " " * (300 - len("sh -c 'exit 1;'"))], scontrol="sh")
    assert str(raised.value).startswith("sh -c 'exit 1; ") and "chars)" not in str(raised.value)


def test_OPS_8_a_jobs_fields_come_from_its_first_record_and_host_lists_are_expanded_by_slurm() -> None:
    calls: list[tuple[str, ...]] = []

    def answer(text: str):  # noqa: ANN202
        def run(arguments: Sequence[str]) -> str:
            calls.append(tuple(arguments))
            return text
        return run

    fields = job_fields("7", answer("\n  \nJobId=7 JobState=PENDING ExcNodeList=(null) Empty= Name=a b\n"
                                    "JobId=8 JobState=RUNNING\n"))
    assert fields == {"JobId": "7", "JobState": "PENDING", "ExcNodeList": "(null)", "Empty": "", "Name": "a"}
    assert calls == [("show", "job", "-o", "7")]
    with pytest.raises(SlurmError) as raised:
        job_fields("9", answer(" \n\n"))
    assert str(raised.value) == "scontrol knows no job 9"
    calls.clear()
    assert expand_hosts("", answer("x")) == [] and expand_hosts("(null)", answer("x")) == [] and calls == []
    assert expand_hosts("n[1-2]", answer("n1\nn2\n")) == ["n1", "n2"] and calls == [("show", "hostnames", "n[1-2]")]


# -- the requeue (OPS-8, OPS-10) ----------------------------------------------------------------


class Slurm:
    """scontrol as a job's state machine, each call recorded: the state, ExcNodeList and
    BatchFlag the job shows, and how many shows it stays in its state after a requeue."""

    def __init__(self, state: str = "FAILED", excluded: str = "(null)", batch: str = "1",
                 completing_shows: int = 1, expand: dict[str, list[str]] | None = None) -> None:
        self.state, self.excluded, self.batch = state, excluded, batch
        self.completing_shows = completing_shows
        self.expand = expand or {}
        self.held = False
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, arguments: Sequence[str]) -> str:
        self.calls.append(tuple(arguments))
        verb = arguments[0]
        if tuple(arguments[:2]) == ("show", "job"):
            shown = self.state
            if self.state == "COMPLETING":
                self.completing_shows -= 1
                if self.completing_shows <= 0:
                    self.state = "PENDING"
            return f"JobId={arguments[3]} JobState={shown} BatchFlag={self.batch} ExcNodeList={self.excluded}\n"
        if tuple(arguments[:2]) == ("show", "hostnames"):
            return "\n".join(self.expand.get(arguments[2], arguments[2].split(","))) + "\n"
        if verb == "requeuehold":
            self.state, self.held = "COMPLETING", True
        elif verb == "hold":
            self.held = True
        elif verb == "update" and arguments[2].startswith("ExcNodeList="):
            self.excluded = arguments[2].split("=", 1)[1]
        elif verb == "release":
            self.held = False
        return ""

    def verbs(self) -> list[str]:
        return [" ".join(call) for call in self.calls]


def no_sleep(_s: float) -> None:
    pass


def test_OPS_8_the_requeue_makes_exactly_these_calls_and_answers_what_it_did() -> None:
    job = Slurm(excluded="node9,node2", completing_shows=2)
    slept: list[float] = []
    result = requeue_excluding("42_3", ["node2", "node5", "node5", "node7"], run=job, sleep=slept.append)
    assert job.verbs() == [
        "show job -o 42_3", "requeuehold 42_3",
        "show job -o 42_3", "show job -o 42_3", "show job -o 42_3",  # COMPLETING twice, then PENDING
        "show hostnames node9,node2",
        "update JobId=42_3 ExcNodeList=node9,node2,node5,node7",
        "show job -o 42_3", "show hostnames node9,node2,node5,node7",
        "update JobId=42_3 StartTime=now", "release 42_3"]
    assert slept == [PENDING_POLL_S, PENDING_POLL_S]
    assert result == RequeueResult("42_3", "FAILED", ("node9", "node2", "node5", "node7"), ("node5", "node5", "node7"))
    assert not job.held


def test_OPS_8_a_pending_job_is_held_not_requeued_and_nothing_to_add_is_not_an_update() -> None:
    job = Slurm(state="PENDING", excluded="node2")
    result = requeue_excluding("42", ["node2"], run=job, sleep=no_sleep)
    assert job.verbs() == ["show job -o 42", "hold 42", "show job -o 42", "show hostnames node2", "show job -o 42",
                           "show hostnames node2", "update JobId=42 StartTime=now", "release 42"]
    assert result == RequeueResult("42", "PENDING", ("node2",), ())
    nothing = Slurm(state="RUNNING")
    assert requeue_excluding("42", [], run=nothing, sleep=no_sleep) == RequeueResult("42", "RUNNING", (), ())
    assert nothing.verbs() == ["show job -o 42", "requeuehold 42", "show job -o 42", "show job -o 42",
                               "show job -o 42", "update JobId=42 StartTime=now", "release 42"]
    unknown = Slurm()
    unknown_state = unknown.__call__

    def no_state(arguments: Sequence[str]) -> str:  # a job that shows no JobState before the requeue
        text = unknown_state(arguments)
        return text.replace("JobState=FAILED ", "") if tuple(arguments[:2]) == ("show", "job") else text

    assert requeue_excluding("42", [], run=no_state, sleep=no_sleep).state_before == "?"


def test_OPS_8_what_cannot_be_requeued_is_refused_before_the_job_is_touched() -> None:
    refusals = {
        ("42;rm", ("n",), 60.0): "job id '42;rm' is not a Slurm job id (digits, or JOB_TASK for an array task)",
        ("42_", ("n",), 60.0): "job id '42_' is not a Slurm job id (digits, or JOB_TASK for an array task)",
        ("x42", ("n",), 60.0): "job id 'x42' is not a Slurm job id (digits, or JOB_TASK for an array task)",
        ("42\n", ("n",), 60.0): "job id '42\\n' is not a Slurm job id (digits, or JOB_TASK for an array task)",
        ("42", ("n",), 0.0): "timeout_s must be in (0, 3600] seconds, got 0.0",
        ("42", ("n",), 3600.5): "timeout_s must be in (0, 3600] seconds, got 3600.5",
    }
    for bad in ("", "a,b", "n[1-2]", "a]", "a=b", "a b", "a\tb", "a\nb"):
        refusals[("42", ("ok", bad), 60.0)] = f"host names {[bad]!r} cannot go into a Slurm host list"
    for (job_id, hosts, timeout_s), message in refusals.items():
        job = Slurm()
        with pytest.raises(SlurmError) as raised:
            requeue_excluding(job_id, hosts, run=job, timeout_s=timeout_s, sleep=no_sleep)
        assert str(raised.value) == message, (job_id, hosts, timeout_s)
        assert job.calls == []
    interactive = Slurm(batch="0")
    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", ["n"], run=interactive, sleep=no_sleep)
    assert str(raised.value) == "job 42 is not a batch job (srun/salloc): only sbatch jobs can be requeued"
    assert interactive.verbs() == ["show job -o 42"]
    assert requeue_excluding("42", ["n"], run=Slurm(), timeout_s=3600, sleep=no_sleep).added == ("n",)


def test_OPS_10_an_exclude_list_one_scontrol_argument_cannot_hold_is_refused_before_the_hold() -> None:
    prefix = len("ExcNodeList=")
    fits = ["a" * (EXCLUDE_LIST_BYTES_MAX - prefix - len("node9,"))]  # exactly the bound with node9
    job = Slurm(excluded="node9")
    assert requeue_excluding("42", fits, run=job, sleep=no_sleep).added == tuple(fits)
    over = ["a" * (EXCLUDE_LIST_BYTES_MAX - prefix - len("node9,") + 1)]
    job = Slurm(excluded="node9")
    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", over, run=job, sleep=no_sleep)
    assert str(raised.value) == (
        f"excluding these 2 host(s) from job 42 takes an ExcNodeList of {EXCLUDE_LIST_BYTES_MAX + 1} bytes, over the "
        f"{EXCLUDE_LIST_BYTES_MAX} one scontrol argument may hold (the kernel refuses longer ones: argument list "
        "too long); the job was not touched. Shorten the exclude file (a Slurm range such as node[1-40] is one "
        "entry) or drain the hosts instead (scontrol update NodeName=... State=DRAIN)")
    assert job.verbs() == ["show job -o 42"]
    # A range that Slurm expands past the bound is found once the job is held: it stays held.
    many = [f"node{i:05d}" for i in range(EXCLUDE_LIST_BYTES_MAX // 10)]
    job = Slurm(excluded="node[00000-09999]", expand={"node[00000-09999]": many})
    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", ["gpu1"], run=job, sleep=no_sleep)
    length = prefix + len(",".join([*many, "gpu1"]))
    assert str(raised.value) == (
        f"excluding these {len(many) + 1} host(s) from job 42 takes an ExcNodeList of {length} bytes, over the "
        f"{EXCLUDE_LIST_BYTES_MAX} one scontrol argument may hold (the kernel refuses longer ones: argument list "
        "too long). Shorten the exclude file (a Slurm range such as node[1-40] is one entry) or drain the hosts "
        "instead (scontrol update NodeName=... State=DRAIN); job 42 is held; release it by hand with: "
        "scontrol release 42")
    assert job.held and not any(call[0] in ("update", "release") for call in job.calls)


def test_OPS_8_a_job_that_does_not_become_pending_stays_held_past_its_deadline() -> None:
    job = Slurm(completing_shows=1000)
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += 10.0

    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", ["node2"], run=job, timeout_s=30, clock=lambda: now[0], sleep=sleep)
    assert str(raised.value) == ("job 42 was not pending 30 s after the requeue (state COMPLETING); job 42 is held; "
                                 "release it by hand with: scontrol release 42")
    assert len(slept) == 3 and job.held  # at 100, 110, 120 it waits; at 130 (the deadline) it gives up
    assert job.verbs().count("show job -o 42") == 5


def test_OPS_10_any_failure_once_held_says_the_job_is_held_once() -> None:
    job = Slurm()

    def failing_release(arguments: Sequence[str]) -> str:
        if arguments[0] == "release":
            raise SlurmError("scontrol release 42 failed (1): Invalid job id")
        return job(arguments)

    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", ["node2"], run=failing_release, sleep=no_sleep)
    assert str(raised.value) == ("scontrol release 42 failed (1): Invalid job id; job 42 is held; release it by hand "
                                 "with: scontrol release 42")
    assert raised.value.__suppress_context__
    ignored = Slurm()

    def ignoring_update(arguments: Sequence[str]) -> str:
        return "" if arguments[0] == "update" else ignored(arguments)

    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", ["node2", "node3"], run=ignoring_update, sleep=no_sleep)
    assert str(raised.value) == ("job 42's ExcNodeList is [] after the update, without ['node2', 'node3']; job 42 is "
                                 "held; release it by hand with: scontrol release 42")


# -- what one node counts (OPS-3) ---------------------------------------------------------------


def _report(kind: str, reason: str, reporter: int | None, ranks: Sequence[int] = (), hosts: Sequence[str] = (),
            **evidence: Any) -> dict[str, Any]:
    return reports.make_record(kind, source=ReportKind(kind).source.value, reason=reason, job_id="j", generation=0,
                               ranks=list(ranks), hosts=list(hosts), step=5, evidence=evidence,
                               reporter_rank=reporter)


def test_OPS_3_a_node_counts_its_ranks_reports_and_rank_zeros_node_those_without_a_reporter() -> None:
    zero = NodeState("j", 0, "h0", frozenset({0, 1}), True)
    other = NodeState("j", 0, "h1", frozenset({2, 3}), False)
    before = attrs.asdict(other)
    assert not other.add_record(_report("hang", "behind-majority", None, [2], ["h1"]), unix_s=5.0)
    assert not other.add_record(_report("hang", "behind-majority", 1, [2], ["h1"]), unix_s=5.0)
    assert attrs.asdict(other) == before, "a report the node does not count changes nothing"
    assert zero.add_record(_report("hang", "behind-majority", None, [2, 3], ["h1"]), unix_s=0.5)
    assert zero.add_record(_report("hang", "behind-majority", 1, [3], ["h1", "h2"]), unix_s=0.25)
    assert zero.add_record(_report("hang", "stuck", 0, [2]))
    assert zero.add_record(_report("sdc", "minority", 1, [3], ["h9"]), unix_s=7.0)
    assert zero.reports == {("hang", "behind-majority"): 2, ("hang", "stuck"): 1, ("sdc", "minority"): 1}
    # One host for the ranks names it; several (or none) cannot say which rank is where.
    assert zero.rank_faults == {(2, "h1", "hang"): 1, (3, "h1", "hang"): 1, (3, "", "hang"): 1, (2, "", "hang"): 1,
                                (3, "h9", "sdc"): 1}
    assert zero.last_report_unix_s == {"hang": 0.5, "sdc": 7.0}, "the newest time, even one below 1 s"
    assert zero.restarts == {} and zero.straggler_confirmed == {}


def test_OPS_3_restarts_count_by_reason_and_stragglers_follow_their_reports() -> None:
    state = NodeState("j", 1, "h0", frozenset({0, 1, 2, 3}), True)
    for reason in ("started", "restored", "restored", "exhausted"):
        state.add_record(_report("restart", reason, 0))
    assert state.restarts == {"restored": 2, "exhausted": 1}
    # The flavour: the evidence's straggler, else the reason's kind; confirmed by the evidence's
    # change, else by the reason (a recovered-... reason clears it).
    state.add_record(_report("straggler", "device-slow", 0, [3]))
    state.add_record(_report("straggler", "recovered-loop-slow", 0, [2]))
    state.add_record(_report("straggler", "localized-forward-slow", 0, [1, 0]))
    state.add_record(_report("straggler", "device-slow", 0, [2], straggler="communication", change="recovered"))
    assert state.straggler_confirmed == {(3, "device"): True, (2, "loop"): False, (1, "forward"): True,
                                         (0, "forward"): True, (2, "communication"): False}
    state.add_record({"kind": "straggler", "reason": "odd-reason", "reporter_rank": 0, "ranks": [1],
                      "evidence": None})
    assert state.straggler_confirmed[(1, "odd-reason")] is True
    assert state.reports[("straggler", "odd-reason")] == 1 and state.reports[("straggler", "device-slow")] == 2


def test_OPS_5_round_latencies_fall_in_their_buckets_and_checkpoints_by_trust() -> None:
    rounds = RoundHistogram()
    for latency_s in (0.0, 0.001, 0.0011, 5.0, 5.5, -1.0, math.nan, math.inf):
        rounds.observe(latency_s)
    assert rounds.counts == [2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1] and rounds.total == 5
    assert rounds.sum_s == pytest.approx(10.5021)
    assert rounds.cumulative() == [("0.001", 2), ("0.0025", 3), ("0.005", 3), ("0.01", 3), ("0.025", 3),
                                   ("0.05", 3), ("0.1", 3), ("0.25", 3), ("0.5", 3), ("1", 3), ("2.5", 3), ("5", 4),
                                   ("+Inf", 5)]
    state = NodeState("j", 0, "h0", frozenset({0}), True)
    assert state.newest_verified_step() is None and state.checkpoints_by_trust() == {}
    state.set_checkpoints([(0, 40, "RECOVERY_VERIFIED"), (1, 20, "RECOVERY_VERIFIED"), (0, 90, "CANDIDATE")])
    assert state.newest_verified_step() == 40 and state.checkpoints_known
    assert state.checkpoints_by_trust() == {"RECOVERY_VERIFIED": 2, "CANDIDATE": 1}
    state.set_stats(0, {"step": True, "wall_s": math.inf, "costs": [], "stragglers": {"device": 3}})
    assert state.stats[0] == RankStats()
    state.set_stats(0, {"step": 4, "wall_s": 2, "costs": {"replay_s": False}, "stragglers": []})
    assert state.stats[0] == RankStats(step=4, wall_s=2.0) and state.stats[0].replay_cost_ratio == 0.0
    assert RankStats().replay_cost_ratio is None


# -- reading the reports (OPS-12, OPS-15) -------------------------------------------------------


def _line(step: int) -> bytes:
    return (json.dumps(_report("hang", "behind-majority", 0, [1], ["h"]) | {"step": step}, sort_keys=True)
            + "\n").encode()


def test_OPS_12_the_tail_reads_whole_lines_within_its_bound_and_counts_what_is_not_a_report(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    with pytest.raises(ValueError, match="offset must be >= 0, got -1"):
        ReportTail(path, from_end=False, offset=-1)
    tail = ReportTail(path, from_end=True)  # no file yet: everything once it exists
    assert tail.offset == 0 and tail.read() == []
    with pytest.raises(ValueError, match="max_bytes must be >= 1, got 0"):
        tail.read(0)
    first, second = _line(1), _line(2)
    path.write_bytes(first + b"\n  \n" + b"[1]\n" + second)
    assert [r["step"] for r in tail.read(len(first))] == [1], "a read that ends on a newline takes that line"
    assert tail.offset == len(first) and tail.skipped == 0
    assert [r["step"] for r in tail.read()] == [2] and tail.skipped == 1, "blank lines are not counted"
    assert tail.offset == path.stat().st_size
    # A line longer than one read is let go (it cannot be a report) and the next one is read.
    with path.open("ab") as file:
        file.write(b"x" * 50 + b"\n" + _line(3))
    assert tail.read(50) == [] and tail.read(50) == []
    assert [r["step"] for r in tail.read()] == [3]
    # Started at a line's offset (the page's newest lines): that line on; a truncated file from its start.
    assert [r["step"] for r in ReportTail(path, from_end=False, offset=len(first) + 6).read()] == [2, 3]
    at = ReportTail(path, from_end=False, offset=len(first) + 6)
    path.write_bytes(_line(4))  # truncated and rewritten, same file
    assert [r["step"] for r in at.read()] == [4]
    gone = ReportTail(tmp_path / "none.jsonl", from_end=False, offset=5)
    assert gone.offset == 0


# -- on_report (OPS-4) --------------------------------------------------------------------------


def _until_idle(runner: OnReportRunner) -> None:
    deadline = time.monotonic() + 20
    while not runner.idle:
        assert time.monotonic() < deadline, "the runner did not finish its queue"
        runner.poll()
        time.sleep(0.01)


def test_OPS_4_the_runner_refuses_what_it_cannot_run_with_and_logs_drops_sparingly() -> None:
    for kwargs, message in (({"argv": []}, "on_report needs a command, got an empty one"),
                            ({"timeout_s": 0}, r"on_report timeout_s must be in \(0, 600\] seconds, got 0"),
                            ({"timeout_s": 600.5}, r"on_report timeout_s must be in \(0, 600\] seconds, got 600.5"),
                            ({"queue_max": 0}, "queue_max must be >= 1, got 0")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            OnReportRunner(**{"argv": ["true"], "timeout_s": 5, "log": print, **kwargs})
    logged: list[str] = []
    runner = OnReportRunner(["true"], timeout_s=600, queue_max=1, log=logged.append)
    assert runner.idle and runner.counts == dict.fromkeys(OUTCOMES, 0)
    assert runner.submit({"kind": "hang"}) and not runner.idle
    assert [runner.submit({"kind": "hang"}) for _ in range(200)] == [False] * 200
    assert runner.counts["dropped"] == 200 and len(runner.queue) == 1
    assert logged == ["on_report: 1 report(s) dropped: 1 already wait (each command may take up to 600 s)",
                      "on_report: 100 report(s) dropped: 1 already wait (each command may take up to 600 s)",
                      "on_report: 200 report(s) dropped: 1 already wait (each command may take up to 600 s)"]
    record = {"kind": "hang"}
    runner = OnReportRunner(["true"], timeout_s=5, log=logged.append)
    runner.submit(record)
    record["kind"] = "changed"
    assert runner.queue[0] == {"kind": "hang"}, "the queue keeps the record as it was submitted"


def test_OPS_4_each_outcome_is_counted_and_every_failure_logged_with_the_commands_last_output(tmp_path: Path) -> None:
    logged: list[str] = []
    seen = tmp_path / "seen"
    script = f'cat > {seen}; echo "$SCOUT_REPORT_KIND $SCOUT_TEST_VALUE" >> {seen}'
    ok = OnReportRunner(["sh", "-c", script], timeout_s=5, log=logged.append, env={"SCOUT_TEST_VALUE": "v",
                                                                                   "PATH": os.environ["PATH"]})
    ok.submit({"kind": "sdc", "b": 1, "a": [2]})
    _until_idle(ok)
    assert seen.read_text() == '{"a": [2], "b": 1, "kind": "sdc"}\nsdc v\n' and logged == []
    assert ok.counts == {**dict.fromkeys(OUTCOMES, 0), "succeeded": 1}
    failing = OnReportRunner(["sh", "-c", "printf '%0600d' 0; echo ' last words  '; exit 7", "x" * 300],
                             timeout_s=5, log=logged.append)
    failing.submit({"step": 1})  # no kind: named "?"
    _until_idle(failing)
    command = " ".join(failing.argv)[:200]
    tail = "0" * (500 - len(" last words  \n")) + " last words"  # the last 500 characters, stripped
    assert logged == [f"on_report: {command} for a ? report exited with code 7; its output ended: {tail}"]
    assert failing.counts == {**dict.fromkeys(OUTCOMES, 0), "failed": 1}
    logged.clear()
    quiet = OnReportRunner(["false"], timeout_s=5, log=logged.append)
    quiet.submit({"kind": "hang"})
    _until_idle(quiet)
    assert logged == ["on_report: false for a hang report exited with code 1"]


def _wait_for_output(runner: OnReportRunner) -> None:
    deadline = time.monotonic() + 20
    while runner._running.output.total_bytes == 0:  # noqa: SLF001 (its first words reach the pipe)
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_OPS_4_a_command_is_killed_at_its_timeout_and_what_is_queued_at_close_is_dropped(tmp_path: Path) -> None:
    logged: list[str] = []
    now = [1000.0]
    runner = OnReportRunner(["sh", "-c", "echo started; exec sleep 60"], timeout_s=2, log=logged.append,
                            clock=lambda: now[0])
    for step in range(3):
        runner.submit({"kind": "hang", "step": step})
    runner.poll()
    process = runner._running.process  # noqa: SLF001 (the command's own process, to see it end)
    now[0] += 1.99
    runner.poll()
    assert process.poll() is None and runner.counts["timed_out"] == 0
    _wait_for_output(runner)
    now[0] += 0.01  # exactly timeout_s after its start
    runner.poll()
    assert process.poll() is not None and runner.counts["timed_out"] == 1
    assert logged == ["on_report: sh -c echo started; exec sleep 60 for a hang report still running after 2 s; "
                      "killed; its output ended: started"]
    second = runner._running.process  # noqa: SLF001
    _wait_for_output(runner)
    runner.close(now[0])  # the deadline is now: the running one is killed, the queued one dropped
    assert second.poll() is not None and runner.idle
    assert runner.counts == {**dict.fromkeys(OUTCOMES, 0), "timed_out": 2, "dropped": 1}
    assert logged[1] == ("on_report: sh -c echo started; exec sleep 60 for a hang report still running when the "
                         "sidecar stopped; killed; its output ended: started")
    assert logged[2] == "on_report: 1 report(s) not run: the sidecar stopped"
    missing = OnReportRunner([str(tmp_path / "nothing")], timeout_s=5, log=logged.append)
    missing.submit({"kind": "sdc"})
    missing.poll()
    assert missing.idle and missing.counts["not_started"] == 1
    assert logged[3].startswith(f"on_report: could not start {str(tmp_path / 'nothing')!r} for a sdc report: ")


def test_OPS_4_the_output_tail_keeps_the_last_bytes_only() -> None:
    with pytest.raises(ValueError, match="keep_bytes must be >= 1, got 0"):
        OutputTail(0, keep_bytes=0)
    read_end, write_end = os.pipe()
    tail = OutputTail(read_end, keep_bytes=5)
    os.write(write_end, b"0123456789")
    os.write(write_end, b"abc")
    os.close(write_end)
    assert tail.close() == b"89abc" and tail.total_bytes == 13


# -- the page's reading of the run (OPS-6, OPS-14, OPS-15) ---------------------------------------


def test_OPS_15_the_newest_lines_are_found_from_the_end_and_the_ones_before_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "reports.jsonl"
    assert web._newest_lines(path, 3) == (0, 0)
    path.write_bytes(b"")
    assert web._newest_lines(path, 3) == (0, 0)
    lines = [b"a" * (i + 1) + b"\n" for i in range(10)]
    path.write_bytes(b"".join(lines))
    offsets = [sum(len(line) for line in lines[:i]) for i in range(11)]
    monkeypatch.setattr(web, "SCAN_CHUNK_BYTES", 7)  # the scan crosses chunks (and lines within them)
    for count in (1, 3, 9):
        assert web._newest_lines(path, count) == (offsets[10 - count], 10 - count), count
    assert web._newest_lines(path, 10) == (0, 0) and web._newest_lines(path, 50) == (0, 0)
    path.write_bytes(b"".join(lines) + b"torn")  # a last line without its newline is the newest
    assert web._newest_lines(path, 1) == (offsets[10], 10)
    assert web._newest_lines(path, 2) == (offsets[9], 9)
    monkeypatch.setattr(web, "SCAN_CHUNK_BYTES", 1 << 20)
    assert web._newest_lines(path, 2) == (offsets[9], 9)


def test_OPS_15_the_page_keeps_the_newest_reports_and_says_what_its_answer_covers(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="is not a run directory"):
        web.RunPage(tmp_path / "none")
    with pytest.raises(ValueError, match="records_kept must be >= 1, got 0"):
        web.RunPage(tmp_path, records_kept=0)
    path = tmp_path / reports.REPORTS_FILE
    path.write_bytes(b"".join(_line(step) for step in range(6)) + b"not a report\n")
    page = web.RunPage(tmp_path, records_kept=3)
    state = page.state(0)
    assert [r["step"] for r in state["reports"]] == [4, 5]
    assert {k: state[k] for k in ("since", "next", "total", "kept_from", "records_kept", "skipped_lines")} == \
        {"since": 4, "next": 6, "total": 6, "kept_from": 4, "records_kept": 3, "skipped_lines": 1}
    assert state["run_dir"] == str(tmp_path) and state["name"] == tmp_path.name and state["nodes"] == []
    assert (state["checkpoints"], state["manifest_problem"], state["exclude_hosts"]) == ([], None, [])
    with path.open("ab") as file:
        file.write(b"".join(_line(step) for step in (6, 7)))
    state = page.state(5)
    assert [r["step"] for r in state["reports"]] == [5, 6, 7]
    assert (state["since"], state["next"], state["total"], state["kept_from"]) == (5, 8, 8, 5)
    state = page.state(7)
    assert [r["step"] for r in state["reports"]] == [7] and (state["since"], state["next"]) == (7, 8)
    assert page.state(8)["reports"] == [] and page.state(8)["next"] == 8
    assert (page.state(100)["since"], page.state(100)["next"]) == (5, 8), "a cursor past the end: from kept_from"
    monkeypatch.setattr(web, "RECORDS_PER_ANSWER", 2)
    state = page.state(0)
    assert [r["step"] for r in state["reports"]] == [5, 6] and (state["since"], state["next"]) == (5, 7)
    (tmp_path / "exclude_hosts.txt").write_bytes(b"gpu1\ngpu2 \xff\n")
    paths.write_state(paths.node_status_path(tmp_path, "h/1", 4), {"host": "h/1"})
    paths.write_state(paths.node_status_path(tmp_path, "a", 0), {"host": "a"})
    (tmp_path / paths.OPS_DIR / "node-bad-r1.json").write_text("[1]")
    state = page.state(0)
    assert state["exclude_hosts"] == ["gpu1", "gpu2", "\ufffd"] and state["nodes"] == [{"host": "a"}, {"host": "h/1"}]


def test_OPS_14_the_page_answers_only_for_the_names_of_its_address() -> None:
    loopback = frozenset(web.LOOPBACK_NAMES)
    assert web.allowed_host_names("127.0.0.1") == loopback
    assert web.allowed_host_names("127.0.0.2") == loopback | {"127.0.0.2"}
    assert web.allowed_host_names("[::1]", ("Scout.Example", "")) == loopback | {"scout.example"}
    machine = {name.lower() for name in (socket.gethostname(), socket.getfqdn())}
    assert web.allowed_host_names("10.1.2.3") == frozenset({"10.1.2.3", *machine})
    wildcard = web.allowed_host_names("0.0.0.0")
    assert wildcard >= loopback | machine | {"0.0.0.0"} and "" not in web.allowed_host_names("")
    for header, name in (("127.0.0.1:8765", "127.0.0.1"), (" LocalHost ", "localhost"), ("[::1]:8765", "::1"),
                         ("[::1]", "::1"), ("[::1", "[::1"), ("::1", "::1"), ("h:1:2", "h:1:2"), ("", "")):
        assert web._host_name(header) == name, header


def _ask(port: int, method: str, target: str, host: str | None = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, target, skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def test_OPS_6_OPS_14_the_page_server_answers_reads_for_its_names_and_refuses_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for kwargs, message in (({"port": 65536}, r"port must be in \[0, 65535\], got 65536"),
                            ({"port": -1}, r"port must be in \[0, 65535\], got -1"),
                            ({"read_timeout_s": 0}, r"read_timeout_s must be in \(0, 3600\] seconds, got 0"),
                            ({"read_timeout_s": 3601}, r"read_timeout_s must be in \(0, 3600\] seconds, got 3601"),
                            ({"allow_hosts": ("ok", "a/b")}, r"--allow-host takes a host name or address without a "
                                                             r"port or a path, got \['a/b'\]")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            web.make_server(tmp_path, **{"host": "127.0.0.1", **kwargs})
    for bad in ("", "a b", "a\tb", "a\rb", "a\nb"):
        with pytest.raises(ValueError, match="--allow-host"):
            web.make_server(tmp_path, allow_hosts=(bad,))
    reports.append_record(tmp_path / reports.REPORTS_FILE, _report("hang", "behind-majority", 0, [1], ["h"]))
    server = web.make_server(tmp_path, "127.0.0.1", 0, read_timeout_s=3600, allow_hosts=("Scout.Example",))
    assert server.request_queue_size == web.LISTEN_BACKLOG and server.read_timeout_s == 3600
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        status, headers, body = _ask(port, "GET", "/")
        assert (status, body) == (200, web.page_html())
        assert headers["content-type"] == "text/html; charset=utf-8" and headers["cache-control"] == "no-store"
        assert headers["content-security-policy"] == web.CONTENT_SECURITY_POLICY
        assert headers["x-content-type-options"] == "nosniff" and headers["content-length"] == str(len(body))
        assert _ask(port, "GET", "/index.html", "localhost:1")[:1] == (200,)
        status, headers, body = _ask(port, "GET", "/api/state?since=-5", "scout.example")
        state = json.loads(body)
        assert status == 200 and headers["content-type"] == "application/json" and state["since"] == 0
        assert [r["kind"] for r in state["reports"]] == ["hang"]
        assert json.loads(_ask(port, "GET", "/api/state")[2])["next"] == 1
        status, headers, body = _ask(port, "HEAD", "/api/state?since=0")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0
        assert _ask(port, "GET", "/api/state?since=x") == (400, ANY_HEADERS, b"since must be an int\n")
        assert _ask(port, "GET", "/reports.jsonl")[::2] == (404, b"not found\n")
        for host in ("evil.example", None, "127.0.0.1.evil.example"):
            status, headers, body = _ask(port, "GET", "/api/state", host)
            assert (status, body) == (421, b"scout serve does not answer for this Host; if the name is meant, start "
                                           b"it with --allow-host NAME\n"), host
            assert headers["content-type"] == "text/plain; charset=utf-8"
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            status, headers, body = _ask(port, method, "/api/state")
            assert (status, headers["allow"], headers["content-length"], body) == (405, "GET, HEAD", "0", b"")
        monkeypatch.setattr(server, "slots", threading.BoundedSemaphore(1))
        server.slots.acquire()
        assert _ask(port, "GET", "/")[::2] == (503, b"busy\n")
        server.slots.release()
        assert _ask(port, "GET", "/")[0] == 200, "the slot is given back"
        # OPS-15: one connection past the bound is answered 503 at once; a silent one is closed
        # after the read timeout, and its place is given back.
        deadline = time.monotonic() + 10
        while server.connections._value != web.CONNECTIONS_MAX:  # noqa: SLF001 (the answers above give
            assert time.monotonic() < deadline                   # their places back after their close)
            time.sleep(0.01)
        for _ in range(web.CONNECTIONS_MAX - 1):  # every place but one taken
            assert server.connections.acquire(timeout=10)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            deadline = time.monotonic() + 10
            while server.connections._value != 0:  # noqa: SLF001 (the silent one is accepted)
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                assert extra.recv(1024) == (b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 5\r\n"
                                            b"Connection: close\r\n\r\nbusy\n")
        deadline = time.monotonic() + 10
        while server.connections._value != 1:  # noqa: SLF001 (the handler thread gives its place back)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        monkeypatch.setattr(server, "read_timeout_s", 0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            started = time.monotonic()
            assert silent.recv(1024) == b"" and time.monotonic() - started < 5
        deadline = time.monotonic() + 10
        while server.connections._value != 1:  # noqa: SLF001
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _ask(port, "GET", "/")[0] == 200
        for _ in range(web.CONNECTIONS_MAX - 1):
            server.connections.release()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _AnyHeaders(dict):  # type: ignore[type-arg]
    def __eq__(self, other: object) -> bool:
        return isinstance(other, dict)


ANY_HEADERS = _AnyHeaders()


# -- the ops files and the trainer's side (OPS-1, OPS-5) -----------------------------------------


def test_OPS_5_an_ops_file_is_replaced_whole_and_read_only_when_it_is_a_bounded_json_object(tmp_path: Path) -> None:
    path = paths.rank_stats_path(tmp_path, 3)
    assert path == tmp_path / "ops" / "rank-3.json"
    assert paths.rounds_path(str(tmp_path), 2) == tmp_path / "ops" / "rounds-2.json"
    assert paths.node_status_path(tmp_path, "gpu-1.x_y", 4) == tmp_path / "ops" / "node-gpu-1.x_y-r4.json"
    assert paths.node_status_path(tmp_path, "a/b c", 0).name == "node-a_b_c-r0.json"
    assert paths.node_status_path(tmp_path, "", 0).name == "node-host-r0.json"
    assert paths.node_status_path(tmp_path, "h" * 200, 1).name == f"node-{'h' * 120}-r1.json"
    assert paths.read_state(path) is None
    paths.write_state(path, {"b": [1, 2], "a": "é"})
    assert path.read_text(encoding="utf-8") == '{"a":"\\u00e9","b":[1,2]}'
    assert os.listdir(path.parent) == ["rank-3.json"], "no temporary file is left"
    assert paths.read_state(str(path)) == {"a": "é", "b": [1, 2]}
    path.write_bytes(b" " * (paths.STATE_BYTES_MAX - 2) + b"{}")
    assert paths.read_state(path) == {}, "exactly the bound is read"
    path.write_bytes(b" " * (paths.STATE_BYTES_MAX - 1) + b"{}")
    assert paths.read_state(path) is None
    for text in (b"[1]", b"{", b"\xff", b"null"):
        path.write_bytes(text)
        assert paths.read_state(path) is None, text


def test_OPS_1_a_ranks_stats_file_is_written_at_most_once_a_second_and_a_failed_write_stops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [50.0]
    monkeypatch.setattr(launch.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(launch.time, "time", lambda: 1234.5)
    ops = NodeOps(rank=2, run_dir=tmp_path, write_stats=True, process=None, metrics_address=None)
    path = paths.rank_stats_path(tmp_path, 2)
    ops.after_step(0, {"replay_s": 0.1}, {})
    assert not path.exists()
    now[0] = 50.25
    ops.after_step(1, {"replay_s": 0.2}, {"device": None})
    assert paths.read_state(path) == {"rank": 2, "step": 1, "wall_s": 0.25, "costs": {"replay_s": 0.2},
                                      "stragglers": {}, "time": 1234.5}
    now[0] = 51.2499
    ops.after_step(2, {}, {})
    assert paths.read_state(path)["step"] == 1
    now[0] = 51.25  # a second after the last write
    ops.after_step(3, {}, {})
    assert paths.read_state(path)["step"] == 3 and paths.read_state(path)["wall_s"] == 1.25
    quiet = NodeOps(rank=1, run_dir=tmp_path, write_stats=False, process=None, metrics_address=None)
    quiet.after_step(0, {}, {})
    now[0] = 60.0
    quiet.after_step(1, {}, {})
    assert not paths.rank_stats_path(tmp_path, 1).exists()
    (tmp_path / "blocked").write_text("")
    broken = NodeOps(rank=0, run_dir=tmp_path / "blocked", write_stats=True, process=None, metrics_address=None)
    broken.after_step(0, {}, {})
    now[0] = 70.0
    with caplog.at_level(logging.WARNING, logger="scout"):
        broken.after_step(1, {}, {})
    assert not broken.write_stats
    assert [r.getMessage() for r in caplog.records] == [
        f"scout: could not write rank 0's ops stats: [Errno 20] Not a directory: '{tmp_path / 'blocked' / 'ops'}'"]


def test_OPS_1_a_node_key_joins_the_host_the_launcher_agent_and_the_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    monkeypatch.setenv("GROUP_RANK", "3")
    assert launch._node_key("h1") == f"h1|3|{boot}"
    monkeypatch.delenv("GROUP_RANK")
    assert launch._node_key("h1") == f"h1||{boot}"


# -- the sidecar, driven in this process (OPS-1, OPS-3, OPS-4, OPS-5, OPS-12) ---------------------


def test_OPS_5_a_sidecar_tick_counts_hooks_reads_the_ranks_files_and_writes_its_node_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scout.observer.progress import ProgressPublisher, RecordIdentity, process_start_ticks
    from scout.ops import sidecar

    publisher = ProgressPublisher(RecordIdentity(f"ops-rules-{os.getpid()}", 0, 5))
    try:
        publisher.begin_step(12)
        seen = tmp_path / "hooked"
        entry = {"rank": 5, "record_name": publisher.name, "record_token": publisher.token.hex(),
                 "pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()) or 0}
        dead = {"rank": 7, "record_name": "ops-rules-none", "record_token": "00", "pid": 0, "start_ticks": 0}
        with pytest.raises(ValueError, match="the sidecar's spec names no rank of its node"):
            sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h", "ranks": [], "job_id": "j", "generation": 0})
        path = tmp_path / reports.REPORTS_FILE
        reports.append_record(path, _report("hang", "behind-majority", 5, [5], ["h"]))  # before it started: not hooked
        car = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h/x", "ranks": [entry, dead], "job_id": "j",
                               "generation": 2, "on_report": f"sh -c 'cat >> {seen}; echo \"$SCOUT_RUN_DIR\" >> {seen}'",
                               "on_report_timeout_s": 5})
        assert car.state.local_ranks == {5, 7} and not car.state.has_rank_zero and car.state.generation == 2
        mine = _report("sdc", "minority", 7, [7], ["h"]) | {"time": "2026-01-02T03:04:05Z"}
        with path.open("a") as file:
            file.write(json.dumps(mine) + "\n" + json.dumps(_report("hang", "stuck", 1, [1])) + "\n")
        paths.write_state(paths.rank_stats_path(tmp_path, 5), {"step": 12, "wall_s": 4.0, "costs": {"replay_s": 1.0}})
        paths.write_state(paths.rounds_path(tmp_path, 5), {"rounds": 3, "recent": [0.002, 0.2, True, 0.3]})
        car.tick()
        assert car.state.reports == {("sdc", "minority"): 1}
        assert car.state.last_report_unix_s == {"sdc": 1767323045.0}
        assert car.state.stats[5].wall_s == 4.0 and car.state.stats[5].replay_cost_ratio == 0.25
        assert car.state.rounds.total == 2 and car.state.rounds.sum_s == pytest.approx(0.5), "the newest 3, a bool skipped"
        progress = car.state.progress[5]
        assert (progress.step, progress.alive, progress.closed) == (12, True, False) and 7 not in car.state.progress
        node = paths.read_state(paths.node_status_path(tmp_path, "h/x", 5))
        assert node is not None and {k: node[k] for k in ("host", "job_id", "generation", "metrics_address")} == \
            {"host": "h/x", "job_id": "j", "generation": 2, "metrics_address": None}
        assert node["ranks"]["5"]["step"] == 12 and node["ranks"]["5"]["alive"] and node["pid"] == os.getpid()
        paths.write_state(paths.rounds_path(tmp_path, 5), {"rounds": 4, "recent": [0.002, 0.2, 0.3, 0.004]})
        car.refresh()
        assert car.state.rounds.total == 3, "only the round not seen yet"
        assert not car.trainers_gone(), "rank 5 runs"
        publisher.begin_step(13)
        publisher.close()
        deadline = time.monotonic() + 20
        car.finish(time.monotonic() + 20)
        assert time.monotonic() < deadline and car.trainers_gone() and car.state.progress[5].closed
        assert seen.read_text() == json.dumps(mine, sort_keys=True) + "\n" + str(tmp_path) + "\n"
        assert car.hooks is not None and car.hooks.counts["succeeded"] == 1
        node = paths.read_state(paths.node_status_path(tmp_path, "h/x", 5))
        assert node["ranks"]["5"] == {"step": 13, "age_s": node["ranks"]["5"]["age_s"], "alive": False}
    finally:
        publisher.close()
    assert sidecar._unix_time("2026-01-02T03:04:05+00:00") == 1767323045.0
    assert sidecar._unix_time(5) is None and sidecar._unix_time("yesterday") is None


# -- the exposition (OPS-5): every family, help, label and value, compared whole ----------------------


def _metrics_state() -> NodeState:
    state = NodeState("job-7", 3, "h0", frozenset({0, 1, 2}), True)
    state.reports.update({("hang", "behind-majority"): 2, ("sdc", "minority"): 1})
    state.rank_faults.update({(1, "h0", "hang"): 2, (10, "", "sdc"): 1})
    state.last_report_unix_s.update({"sdc": 1700000000.5, "hang": 1600000000.0})
    state.restarts.update({"sdc": 1, "restored": 2})
    state.straggler_confirmed.update({(2, "loop"): False, (1, "device"): True})
    state.progress.update({0: RankProgress(12, 0.25, True, False), 1: RankProgress(11, 7.5, False, False),
                           2: RankProgress(13, 3.0, True, True)})
    state.set_stats(1, {"step": 11, "wall_s": 20.0, "costs": {"replay_s": 0.5},
                        "stragglers": {"device": {"performance_ratio": 1.5, "score": 4},
                                       "loop": {"performance_ratio": math.nan, "score": True},
                                       "forward": {"performance_ratio": 2, "score": math.inf}}})
    state.set_stats(0, {"step": 12, "wall_s": 0})
    state.set_checkpoints([(0, 40, "RECOVERY_VERIFIED"), (1, 30, "RECOVERY_VERIFIED"), (0, 80, "CANDIDATE")])
    for latency_s in (0.004, 0.2, 1.0, 7.0):
        state.rounds.observe(latency_s)
    return state



EXPOSITION = """\
# HELP scout_job_info The job this node's scout serves (value 1).
# TYPE scout_job_info gauge
scout_job_info{host="h0",job_id="job-7"} 1.0
# HELP scout_restart_generation The attempt this node runs: 0, then one more at every launcher restart.
# TYPE scout_restart_generation gauge
scout_restart_generation 3.0
# HELP scout_reports_total Reports written since this node's scout started, by kind and reason (OPS-3: each report counted by one node).
# TYPE scout_reports_total counter
scout_reports_total{kind="hang",reason="behind-majority"} 2.0
scout_reports_total{kind="sdc",reason="minority"} 1.0
# HELP scout_rank_reports_total Reports naming a rank at fault, by rank, its host and the report kind.
# TYPE scout_rank_reports_total counter
scout_rank_reports_total{host="h0",kind="hang",rank="1"} 2.0
scout_rank_reports_total{host="",kind="sdc",rank="10"} 1.0
# HELP scout_last_report_timestamp_seconds Unix time of the newest report of each kind.
# TYPE scout_last_report_timestamp_seconds gauge
scout_last_report_timestamp_seconds{kind="hang"} 1.6e+09
scout_last_report_timestamp_seconds{kind="sdc"} 1.7000000005e+09
# HELP scout_restarts_total Restart reports: a fault policy stopped the job (sdc, hang, ...) or a restarted attempt restored a checkpoint (restored).
# TYPE scout_restarts_total counter
scout_restarts_total{reason="restored"} 2.0
scout_restarts_total{reason="sdc"} 1.0
# HELP scout_straggler_ratio A rank's time over its replica group's centre (1.0 on par, 1.5 half again as slow), median over its recent checks.
# TYPE scout_straggler_ratio gauge
scout_straggler_ratio{kind="device",rank="1"} 1.5
scout_straggler_ratio{kind="forward",rank="1"} 2.0
# HELP scout_straggler_score A rank's confirmation score in the sequential straggler test (spec/straggler.md); confirmed at the configured evidence.
# TYPE scout_straggler_score gauge
scout_straggler_score{kind="device",rank="1"} 4.0
# HELP scout_straggler_confirmed 1 while a rank is a confirmed straggler of that kind (from its straggler reports), 0 once it recovered.
# TYPE scout_straggler_confirmed gauge
scout_straggler_confirmed{kind="device",rank="1"} 1.0
scout_straggler_confirmed{kind="loop",rank="2"} 0.0
# HELP scout_checkpoints Checkpoints in the gate's manifest by trust state.
# TYPE scout_checkpoints gauge
scout_checkpoints{trust="CAPTURED"} 0.0
scout_checkpoints{trust="CANDIDATE"} 1.0
scout_checkpoints{trust="RECOVERY_VERIFIED"} 2.0
scout_checkpoints{trust="QUARANTINED"} 0.0
scout_checkpoints{trust="SUPERSEDED"} 0.0
scout_checkpoints{trust="LOST"} 0.0
# HELP scout_recovery_verified_step The newest recovery-verified checkpoint's training step (what a restart after SDC restores).
# TYPE scout_recovery_verified_step gauge
scout_recovery_verified_step 40.0
# HELP scout_progress_step The step each rank of this node is in (its progress record).
# TYPE scout_progress_step gauge
scout_progress_step{rank="0"} 12.0
scout_progress_step{rank="1"} 11.0
scout_progress_step{rank="2"} 13.0
# HELP scout_progress_age_seconds Seconds since each rank last published progress; grows while it is stuck, whatever the trainer does (OPS-1).
# TYPE scout_progress_age_seconds gauge
scout_progress_age_seconds{rank="0"} 0.25
# HELP scout_trainer_up 1 while the rank's trainer process runs.
# TYPE scout_trainer_up gauge
scout_trainer_up{rank="0"} 1.0
scout_trainer_up{rank="1"} 0.0
scout_trainer_up{rank="2"} 0.0
# HELP scout_replay_cost_ratio Replay's share of the rank's wall time since its first step (0.01: 1 %).
# TYPE scout_replay_cost_ratio gauge
scout_replay_cost_ratio{rank="1"} 0.025
# HELP scout_replay_seconds_total Seconds the rank spent in replay.
# TYPE scout_replay_seconds_total counter
scout_replay_seconds_total{rank="0"} 0.0
scout_replay_seconds_total{rank="1"} 0.5
# HELP scout_training_seconds_total Wall seconds since the rank's first step.
# TYPE scout_training_seconds_total counter
scout_training_seconds_total{rank="0"} 0.0
scout_training_seconds_total{rank="1"} 20.0
# HELP scout_observer_round_duration_seconds Observer consensus rounds of this node's observers, from the request to the decision (answers or deadline).
# TYPE scout_observer_round_duration_seconds histogram
scout_observer_round_duration_seconds_bucket{le="0.001"} 0.0
scout_observer_round_duration_seconds_bucket{le="0.0025"} 0.0
scout_observer_round_duration_seconds_bucket{le="0.005"} 1.0
scout_observer_round_duration_seconds_bucket{le="0.01"} 1.0
scout_observer_round_duration_seconds_bucket{le="0.025"} 1.0
scout_observer_round_duration_seconds_bucket{le="0.05"} 1.0
scout_observer_round_duration_seconds_bucket{le="0.1"} 1.0
scout_observer_round_duration_seconds_bucket{le="0.25"} 2.0
scout_observer_round_duration_seconds_bucket{le="0.5"} 2.0
scout_observer_round_duration_seconds_bucket{le="1"} 3.0
scout_observer_round_duration_seconds_bucket{le="2.5"} 3.0
scout_observer_round_duration_seconds_bucket{le="5"} 3.0
scout_observer_round_duration_seconds_bucket{le="+Inf"} 4.0
scout_observer_round_duration_seconds_count 4.0
scout_observer_round_duration_seconds_sum 8.204
# HELP scout_on_report_total on_report commands by outcome (OPS-4).
# TYPE scout_on_report_total counter
scout_on_report_total{outcome="succeeded"} 2.0
scout_on_report_total{outcome="failed"} 1.0
"""


def test_OPS_5_the_exposition_is_every_family_with_its_help_labels_and_values() -> None:
    from prometheus_client.exposition import generate_latest

    from scout.ops.metrics import NodeCollector, registry_for

    lock = threading.Lock()
    refreshed: list[bool] = []
    state = _metrics_state()
    collector = NodeCollector(state, lock, lambda: refreshed.append(lock.locked()),
                              lambda: {"succeeded": 2, "failed": 1})
    assert generate_latest(registry_for(collector)).decode() == EXPOSITION
    assert refreshed == [False], "a scrape reads first, without holding the state's lock"
    bare = NodeState("j", 0, "h1", frozenset({2}), False)
    text = generate_latest(registry_for(NodeCollector(bare, lock, lambda: None))).decode()
    assert "scout_on_report" not in text and "scout_checkpoints" not in text and "scout_recovery" not in text
    bare.set_checkpoints([(0, 8, "CANDIDATE")])
    text = generate_latest(registry_for(NodeCollector(bare, lock, lambda: None))).decode()
    assert 'scout_checkpoints{trust="CANDIDATE"} 1.0' in text and "scout_recovery_verified_step" not in text


# -- the gate's checkpoints as the sidecar and the page read them (OPS-5, OPS-6) --------------------


def test_OPS_6_the_page_reads_the_gates_checkpoints_once_per_change_and_names_a_damaged_one(tmp_path: Path) -> None:
    page = web.RunPage(tmp_path)
    assert page._read_gate() == ([], None)  # noqa: SLF001 (no gate yet)
    _gate_with_a_verified_checkpoint(tmp_path)
    checkpoints, problem = page._read_gate()  # noqa: SLF001
    assert problem is None
    assert [{k: v for k, v in c.items() if k != "certificate"} for c in checkpoints] == [
        {"checkpoint": "t0/s8", "timeline": 0, "step": 8, "trust": "RECOVERY_VERIFIED",
         "reason": "recovery-verified at step 16: cycles 1 and 2 complete and clean"},
        {"checkpoint": "t0/s16", "timeline": 0, "step": 16, "trust": "CANDIDATE",
         "reason": "candidate: captured at the end of complete clean cycle 2; verified if cycle 3 completes clean"}]
    assert checkpoints[0]["certificate"]["checkpoint"] == {"timeline": 0, "step": 8}
    assert checkpoints[1]["certificate"] is None
    assert page._read_gate()[0] is checkpoints, "an unchanged gate is not read again"  # noqa: SLF001
    entries = list(os.scandir(tmp_path / "gate"))
    assert web._entries_key(entries) == (len(entries), max(e.stat().st_mtime_ns for e in entries))
    for name in os.listdir(tmp_path / "gate"):
        (tmp_path / "gate" / name).write_bytes(b"\x00damaged")
    checkpoints, problem = page._read_gate()  # noqa: SLF001
    assert checkpoints == [] and problem is not None
    assert problem.startswith(f"{tmp_path / 'gate'}: no manifest generation verifies"), problem


def test_OPS_5_a_sidecar_serves_its_metrics_and_reads_the_gate_at_its_interval(tmp_path: Path) -> None:
    import urllib.request

    from scout.ops import sidecar

    entry = {"rank": 0, "record_name": "ops-rules-none", "record_token": "00", "pid": 0, "start_ticks": 0}
    quiet = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h", "ranks": [entry], "job_id": "j", "generation": 0})
    quiet.serve_metrics()
    assert quiet.metrics_address is None and quiet.hooks is None and quiet.state.has_rank_zero
    assert quiet.trainers_gone(), "a trainer whose process is not there is gone"
    car = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h", "ranks": [entry], "job_id": "j", "generation": 0,
                           "metrics_port": 0, "metrics_addr": "127.0.0.1", "has_rank_zero": False})
    assert not car.state.has_rank_zero
    car.serve_metrics()
    try:
        assert car.metrics_address is not None and car.metrics_address[0] == "127.0.0.1"
        _gate_with_a_verified_checkpoint(tmp_path)
        car._read_gate(100.0)  # noqa: SLF001
        assert car.state.checkpoints == ((0, 8, "RECOVERY_VERIFIED"), (0, 16, "CANDIDATE"))
        car.state.checkpoints = ()
        car._read_gate(101.9)  # noqa: SLF001 (within GATE_INTERVAL_S: not looked at)
        assert car.state.checkpoints == ()
        car._read_gate(102.0)  # noqa: SLF001 (looked at, unchanged: not read again)
        assert car.state.checkpoints == ()
        car._read_gate(102.0, force=True)  # noqa: SLF001
        assert car.state.checkpoints == ()
        reports.append_record(tmp_path / reports.REPORTS_FILE, _report("hang", "behind-majority", 0, [0], ["h"]))
        url = f"http://127.0.0.1:{car.metrics_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        assert 'scout_reports_total{kind="hang",reason="behind-majority"} 1.0' in text, "a scrape reads first"
        assert 'scout_checkpoints{trust="CANDIDATE"} 0.0' in text and "scout_on_report" not in text
        car._write_node_file(5.0)  # noqa: SLF001
        node = paths.node_status_path(tmp_path, "h", 0)
        assert paths.read_state(node)["metrics_address"] == list(car.metrics_address)
        node.unlink()
        car._write_node_file(5.9)  # noqa: SLF001 (within NODE_FILE_INTERVAL_S)
        assert not node.exists()
        car._write_node_file(6.0)  # noqa: SLF001
        assert node.exists()
    finally:
        car.stop_serving()
    assert car._server is None  # noqa: SLF001
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def _run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spec_line: bytes,
              close: bool = True) -> tuple[int, list[Any], list[int], str]:
    """The sidecar's main in this process: the spec on a pipe as its stdin, signals recorded."""
    from scout.ops import sidecar

    read_end, write_end = os.pipe()
    os.write(write_end, spec_line)
    if close:
        os.close(write_end)

    class Stdin:
        def fileno(self) -> int:
            return read_end

    handled: list[int] = []
    monkeypatch.setattr(sidecar.sys, "stdin", Stdin())
    monkeypatch.setattr(sidecar.signal, "signal", lambda signum, _handler: handled.append(signum))
    try:
        code = sidecar.main()
    finally:
        os.close(read_end)
        if not close:
            os.close(write_end)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], handled, err


def test_OPS_2_the_sidecar_answers_ready_or_why_not_and_ends_once_its_trainers_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import signal as signals

    from scout.ops import sidecar

    dead = {"rank": 0, "record_name": "ops-rules-none", "record_token": "00", "pid": 0, "start_ticks": 0}
    spec = {"run_dir": str(tmp_path), "host": "h", "ranks": [dead], "job_id": "j", "generation": 0,
            "poll_interval_s": 0.01, "on_report": "true", "on_report_timeout_s": 1}
    code, said, handled, err = _run_main(monkeypatch, capsys, json.dumps(spec).encode() + b"\nrest")
    assert (code, said) == (0, [{"ready": True, "metrics_address": None, "metrics_error": None}]), err
    assert handled == [signals.SIGTERM, signals.SIGINT]
    assert paths.read_state(paths.node_status_path(tmp_path, "h", 0))["ranks"] == {}, "its last node file"
    code, said, _, _ = _run_main(monkeypatch, capsys, json.dumps({**spec, "ranks": []}).encode() + b"\n")
    assert code == sidecar.EXIT_FAILED == 3
    assert said == [{"error": "a spec it cannot use: ValueError(\"the sidecar's spec names no rank of its node\")"}]
    code, said, _, _ = _run_main(monkeypatch, capsys, json.dumps({"host": "h"}).encode() + b"\n")
    assert (code, said) == (3, [{"error": "a spec it cannot use: KeyError('run_dir')"}])
    monkeypatch.setattr(sidecar, "SPEC_TIMEOUT_S", 0.2)
    for line, close in ((b"[1]\n", True), (b"{", True), (b"{\"a\": 1}", False)):
        code, said, _, err = _run_main(monkeypatch, capsys, line, close)
        assert (code, said) == (3, []), line
        assert err == "scout: ops sidecar: no spec from the trainer on stdin within 0.2 s\n", line
    monkeypatch.setattr(sidecar, "SPEC_BYTES_MAX", 10)
    code, _, _, err = _run_main(monkeypatch, capsys, b"{\"a\": \"" + b"x" * 20 + b"\"}\n")
    assert code == 3 and "no spec" in err
    # A port it cannot serve on: ready all the same, the metrics off and said why (OPS-9).
    monkeypatch.setattr(sidecar, "SPEC_BYTES_MAX", 1 << 20)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        taken_spec = {**spec, "metrics_port": port, "metrics_addr": "127.0.0.1"}
        code, said, _, err = _run_main(monkeypatch, capsys, json.dumps(taken_spec).encode() + b"\n")
        assert code == 0 and said[0]["ready"] and said[0]["metrics_address"] is None
        assert said[0]["metrics_error"].startswith(f"cannot serve metrics on 127.0.0.1:{port}: ")
        assert err.startswith(f"scout: ops sidecar on h: cannot serve metrics on 127.0.0.1:{port}: ")
        assert err.endswith("; metrics are off on this node, on_report still runs (OPS-9)\n")
        code, said, _, err = _run_main(monkeypatch, capsys, json.dumps({**taken_spec, "on_report": None}).encode()
                                       + b"\n")
        assert code == 0 and err.endswith("; metrics are off on this node, its node file is still written (OPS-9)\n")


def test_OPS_1_the_lowest_rank_starts_its_nodes_sidecar_and_close_waits_for_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch.distributed as dist

    from scout.job.config import load_config
    from scout.observer.progress import ProgressPublisher, RecordIdentity

    off = load_config(None, None, environ={})
    assert not launch.ops_enabled(off) and launch.observer_rounds_path(off, tmp_path, 3) is None
    assert NodeOps.start(off, run_dir=tmp_path, publisher=None, group=None, rank=0, host="h") is None  # type: ignore[arg-type]
    config = load_config(None, None, environ={"SCOUT_METRICS_PORT": "0", "SCOUT_ON_REPORT": "true"})
    assert launch.ops_enabled(config) and launch.observer_rounds_path(config, tmp_path, 3) == tmp_path / "ops" / "rounds-3.json"
    assert launch.ops_enabled(load_config(None, None, environ={"SCOUT_ON_REPORT": "true"}))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    publisher = ProgressPublisher(RecordIdentity(f"ops-rules-start-{os.getpid()}", 3, 0))
    ops = None
    try:
        publisher.begin_step(1)
        with caplog.at_level(logging.INFO, logger="scout"):
            ops = NodeOps.start(config, run_dir=tmp_path, publisher=publisher, group=None, rank=0, host="h")
        assert ops is not None and ops.process is not None and ops.write_stats and ops.rank == 0
        assert ops.metrics_address is not None and ops.metrics_address[0] == "127.0.0.1"
        assert f"scout: metrics of h at http://127.0.0.1:{ops.metrics_address[1]}/metrics" in caplog.text
        node = paths.node_status_path(tmp_path, "h", 0)
        deadline = time.monotonic() + 30
        while paths.read_state(node) is None:
            assert time.monotonic() < deadline, "no node file from the sidecar"
            time.sleep(0.05)
        value = paths.read_state(node)
        assert (value["job_id"], value["generation"], value["metrics_address"]) == \
            (publisher.identity.job_id, 3, list(ops.metrics_address))
        process = ops.process
        publisher.close()  # the trainer's record closed: its sidecar ends by itself (OPS-2)
        ops.close(wait_s=30)
        assert ops.process is None and process.returncode == 0 and process.stdout.closed and process.stdin.closed
        ops.close()  # a second close does nothing
    finally:
        publisher.close()
        if ops is not None and ops.process is not None and ops.process.poll() is None:
            ops.process.kill()
        dist.destroy_process_group()


def test_OPS_2_a_sidecar_that_cannot_start_is_logged_and_the_job_runs_without_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="scout"):
        assert launch._start_sidecar({"host": "h9", "ranks": []}) == (None, None)
    assert caplog.messages == ["scout: the ops sidecar on h9 did not start (a spec it cannot use: KeyError('run_dir')); "
                               "metrics and on_report are off on this node"]


# -- the boundaries the first mutation runs showed unpinned -----------------------------------------


def test_OPS_8_the_requeue_waits_60_s_by_default_and_takes_any_positive_timeout_and_a_job_without_a_list() -> None:
    job = Slurm(completing_shows=1000)
    now = [0.0]

    def sleep(_s: float) -> None:
        now[0] += 15.0

    with pytest.raises(SlurmError, match=r"^job 42 was not pending 60 s after the requeue"):
        requeue_excluding("42", ["node2"], run=job, clock=lambda: now[0], sleep=sleep)
    assert requeue_excluding("42", ["gpuX1"], run=Slurm(), timeout_s=0.5, sleep=no_sleep).added == ("gpuX1",)
    bare = Slurm()

    def no_list(arguments: Sequence[str]) -> str:  # scontrol shows no ExcNodeList field at all
        text = bare(arguments)
        return text.replace(" ExcNodeList=(null)", "") if tuple(arguments[:2]) == ("show", "job") else text

    prefix = len("ExcNodeList=")
    exact = "a" * (EXCLUDE_LIST_BYTES_MAX - prefix)  # exactly the bound, nothing listed before
    assert requeue_excluding("42", [exact], run=no_list, sleep=no_sleep).added == (exact,)
    assert bare.verbs()[:2] == ["show job -o 42", "requeuehold 42"]
    assert f"update JobId=42 ExcNodeList={exact}" in bare.verbs()
    for shown in ("(null)", ""):  # Slurm's "no list", in both spellings, takes no room in the bound
        assert requeue_excluding("42", [exact], run=Slurm(excluded=shown), sleep=no_sleep).added == (exact,), shown
    ignored = Slurm()

    def no_list_ever(arguments: Sequence[str]) -> str:  # the update does not take and no list is shown
        if arguments[0] == "update":
            return ""
        text = ignored(arguments)
        return text.replace(" ExcNodeList=(null)", "") if tuple(arguments[:2]) == ("show", "job") else text

    with pytest.raises(SlurmError) as raised:
        requeue_excluding("42", ["node2"], run=no_list_ever, sleep=no_sleep)
    assert str(raised.value).startswith("job 42's ExcNodeList is [] after the update, without ['node2']")
    assert "show hostnames" not in " ".join(ignored.verbs())


def test_OPS_7_OPS_10_the_host_name_reads_this_processs_environment_and_the_exclude_file_read_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "gpu42")
    assert slurm.host_name() == "gpu42"
    monkeypatch.delenv("SLURMD_NODENAME")
    assert slurm.host_name() == socket.gethostname()

    class Endless:  # a device or a pipe named by mistake: it has no end
        def __enter__(self) -> Endless:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def read(self, size: int | None = None) -> bytes:
            if size is None or size < 0:
                raise MemoryError("an unbounded read of an endless file")
            return b"g" * size

    monkeypatch.setattr(slurm, "open", lambda *_a, **_k: Endless(), raising=False)
    with pytest.raises(SlurmError, match=f"is over {EXCLUDE_FILE_BYTES_MAX} bytes"):
        read_exclude_file(tmp_path / "endless")


def test_OPS_1_a_ranks_straggler_values_are_those_of_the_trackers_that_hold_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Tracker:
        def __init__(self, ranks: tuple[int, ...], ratios: list[float], scores: list[float], confirmed: set[int]):
            self.ranks, self._ratios, self.confirmed = ranks, ratios, confirmed
            self.state = types.SimpleNamespace(scores=scores)

        def performance_ratios(self) -> list[float]:
            return self._ratios

    trackers = {"loop": Tracker((0, 1), [1.0, 1.1], [0.0, 1.0], set()),  # does not hold rank 5
                "device": Tracker((4, 5), [1.0, 1.5], [0.5, 4.0], {1}),
                "communication": None,
                "forward": Tracker((5, 6), [1.25, 1.0], [2.0, 0.0], set())}
    assert launch._straggler_values(5, trackers) == {
        "device": {"performance_ratio": 1.5, "score": 4, "confirmed": True},
        "forward": {"performance_ratio": 1.25, "score": 2, "confirmed": False}}
    now = [0.0]  # a clock that starts at zero: the second step still writes at once
    monkeypatch.setattr(launch.time, "monotonic", lambda: now[0])
    ops = NodeOps(rank=5, run_dir=tmp_path, write_stats=True, process=None, metrics_address=None)
    ops.after_step(0, {}, trackers)
    now[0] = 0.25
    ops.after_step(1, {}, trackers)
    value = paths.read_state(paths.rank_stats_path(tmp_path, 5))
    assert value is not None and value["stragglers"] == launch._straggler_values(5, trackers)
    (tmp_path / "file").write_text("")
    broken = NodeOps(rank=0, run_dir=tmp_path / "file", write_stats=True, process=None, metrics_address=None)
    broken.after_step(0, {}, {})
    now[0] = 9.0
    broken.after_step(1, {}, {})
    assert broken.write_stats is False


def test_OPS_1_a_node_key_without_a_boot_id_is_the_host_and_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoBootId:
        def __init__(self, _path: str) -> None:
            pass

        def read_text(self, encoding: str | None = None) -> str:
            raise FileNotFoundError("no /proc here")

    monkeypatch.setattr(launch, "Path", NoBootId)
    monkeypatch.setenv("GROUP_RANK", "2")
    assert launch._node_key("h1") == "h1|2|"


def test_OPS_1_the_sidecar_reads_progress_without_the_observers_slot_and_a_stuck_ranks_age_grows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.observer.progress import (
        ProgressPublisher,
        ProgressReader,
        RecordIdentity,
        process_start_ticks,
    )
    from scout.ops import sidecar

    publisher = ProgressPublisher(RecordIdentity(f"ops-rules-age-{os.getpid()}", 0, 3))
    try:
        publisher.begin_step(4)
        entry = {"rank": 3, "record_name": publisher.name, "record_token": publisher.token.hex(),
                 "pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()) or 0}
        car = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h", "ranks": [entry], "job_id": "j",
                               "generation": 0, "on_report": "false", "on_report_timeout_s": 5})
        source = car.ranks[0]
        first = source.progress(time.monotonic_ns())
        assert first is not None and first.step == 4 and 0.0 <= first.age_s < 1.0
        observer = ProgressReader(publisher.name, publisher.token)  # the observer's slot is still free
        observer.close()
        publish_ns = source.reader.last_snapshot.publish_ns
        assert source.progress(publish_ns + 10**18).age_s == 1e9
        assert source.progress(publish_ns - 10**9).age_s == 0.0
        source.reader.read = lambda: None  # every attempt overlapped a publish: the last snapshot serves
        assert source.progress(publish_ns + 5 * 10**9).age_s == 5.0
        # A reader whose close fails is let go all the same.
        for error in (sidecar.ProgressError("gone"), OSError("gone")):
            class Failing:
                def close(self, error: Exception = error) -> None:
                    raise error

            source.reader = Failing()
            source.close()
            assert source.reader is None
        # Rounds files: wrong types are ignored; a rewrite with no new round adds nothing.
        rounds = paths.rounds_path(tmp_path, 3)
        for value in ({"rounds": "3", "recent": [0.1]}, {"rounds": 5, "recent": 7}, {"rounds": 2, "recent": [0.1, 0.2]},
                      {"rounds": 2, "recent": [0.1, 0.2]}):
            paths.write_state(rounds, value)
            os.utime(rounds, ns=(time.time_ns(), time.time_ns() + 10**9 * len(str(value))))
            car._read_rank_files(source)  # noqa: SLF001
        assert car.state.rounds.total == 2
        # A report it cannot count is logged and the next is counted and hooked.
        path = tmp_path / reports.REPORTS_FILE
        records = [_report("hang", "stuck", 3, [3], ["h"]), _report("sdc", "minority", 3, [3], ["h"])]
        original = car.state.add_record

        def add_record(self: NodeState, record: dict[str, Any], unix_s: float | None = None) -> bool:
            if record["kind"] == "hang":
                raise ValueError("cannot count this one")
            return original(record, unix_s)

        monkeypatch.setattr(NodeState, "add_record", add_record)
        with path.open("a") as file:
            file.write("".join(json.dumps(r) + "\n" for r in records))
        car.tick()
        assert car.state.reports == {("sdc", "minority"): 1}
        deadline = time.monotonic() + 20
        while not car.hooks.idle:
            assert time.monotonic() < deadline
            car.tick()
            time.sleep(0.01)
        err = capsys.readouterr().err
        assert f"scout: ops sidecar on h: a report it cannot count was skipped (ValueError('cannot count this one')): " \
               f"{str(records[0])[:200]}\n" in err
        assert "scout: ops sidecar on h: on_report: false for a sdc report exited with code 1\n" in err
        car.state.progress[3] = RankProgress(9, 1.23456, True, False)
        car._write_node_file(0.0, force=True)  # noqa: SLF001
        node = paths.read_state(paths.node_status_path(tmp_path, "h", 3))
        assert node["ranks"] == {"3": {"step": 9, "age_s": 1.235, "alive": True}}
        assert abs(node["time"] - time.time()) < 60
        (tmp_path / "ops").rename(tmp_path / "ops.moved")
        (tmp_path / "ops").write_text("")
        car._write_node_file(0.0, force=True)  # noqa: SLF001
        assert capsys.readouterr().err == \
            f"scout: ops sidecar on h: could not write its node file: [Errno 17] File exists: '{tmp_path / 'ops'}'\n"
        (tmp_path / "ops").unlink()
        _gate_with_a_verified_checkpoint(tmp_path)
        fresh = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "fresh", "ranks": [entry], "job_id": "j",
                                 "generation": 0})
        fresh._read_gate(0.0)  # noqa: SLF001 (the first look and the first write are at once, whatever the clock)
        fresh._write_node_file(0.0)  # noqa: SLF001
        assert fresh.state.checkpoints_known and paths.node_status_path(tmp_path, "fresh", 3).exists()
        assert not car.state.checkpoints_known
        car._gate_checked_s = time.monotonic() + 60  # noqa: SLF001 (as if it had looked a moment ago)
        publisher.close()
        car.finish(time.monotonic() + 5)  # its last look at the gate is forced
        assert car.state.checkpoints == ((0, 8, "RECOVERY_VERIFIED"), (0, 16, "CANDIDATE"))
        car.refresh()  # after finish: the record is read again from scratch (it is gone)
        quiet = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h", "ranks": [entry], "job_id": "j",
                                 "generation": 0})
        quiet.tick()  # no hooks to poll
        quiet.finish(time.monotonic())
    finally:
        publisher.close()


def test_OPS_5_ops_files_are_written_under_a_run_directory_not_made_yet(tmp_path: Path) -> None:
    path = paths.rank_stats_path(tmp_path / "new" / "run", 0)
    paths.write_state(path, {"step": 1})
    assert paths.read_state(path) == {"step": 1}


def test_OPS_3_a_ranks_faults_are_counted_per_report() -> None:
    state = NodeState("j", 0, "h0", frozenset({0}), True)
    for _ in range(3):
        state.add_record(_report("hang", "stuck", 0, [1], ["h1"]))
    assert state.rank_faults == {(1, "h1", "hang"): 3}


# -- the sidecar's protocol with its trainer, and its loop (OPS-2) ------------------------------------


def test_OPS_2_the_spec_is_one_json_line_read_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.ops import sidecar

    def read(chunks: Sequence[bytes], *, close: bool = True, delay_s: float = 0.0, timeout_s: float = 5.0) -> Any:
        read_end, write_end = os.pipe()

        def write() -> None:
            for chunk in chunks:
                time.sleep(delay_s)
                os.write(write_end, chunk)
            if close:
                os.close(write_end)

        class Stdin:
            def fileno(self) -> int:
                return read_end

        monkeypatch.setattr(sidecar.sys, "stdin", Stdin())
        writer = threading.Thread(target=write)
        writer.start()
        try:
            return sidecar._read_spec(timeout_s)
        finally:
            writer.join()
            os.close(read_end)
            if not close:
                os.close(write_end)

    assert read([b'{"a": 1}\n'], close=False) == {"a": 1}, "one line is enough: it does not wait for the end"
    assert read([b'{"a": 1}']) == {"a": 1}, "the end of its input ends the line"
    assert read([b'{"a": ', b'1}\n'], delay_s=0.05) == {"a": 1}, "a line that comes in pieces, later"
    assert read([b'{"a": 1}\n{"b": 2}\nmore']) == {"a": 1}
    monkeypatch.setattr(sidecar, "SPEC_BYTES_MAX", 10)
    assert read([b'{"a": 123}']) == {"a": 123}, "exactly the bound"
    assert read([b'{"a": 1234}']) is None


def test_OPS_2_what_the_sidecar_says_is_sorted_json_lines_and_a_closed_stream_is_no_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.ops import sidecar

    class Stream:
        def __init__(self, error: Exception | None = None) -> None:
            self.text, self.flushed, self.error = "", 0, error

        def write(self, text: str) -> int:
            if self.error is not None:
                raise self.error
            self.text += text
            return len(text)

        def flush(self) -> None:
            self.flushed += 1

    out, err = Stream(), Stream()
    monkeypatch.setattr(sidecar.sys, "stdout", out)
    monkeypatch.setattr(sidecar.sys, "stderr", err)
    sidecar._say({"ready": True, "error": None})
    sidecar._log("h", "said")
    assert out.text == '{"error": null, "ready": true}\n' and out.flushed == 1
    assert err.text == "scout: ops sidecar on h: said\n" and err.flushed == 1
    for error in (OSError("broken pipe"), ValueError("I/O operation on closed file")):
        monkeypatch.setattr(sidecar.sys, "stdout", Stream(error))
        monkeypatch.setattr(sidecar.sys, "stderr", Stream(error))
        sidecar._say({"ready": True})
        sidecar._log("h", "said")


def test_OPS_2_on_sigterm_the_loop_ends_and_its_hooks_get_a_short_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from scout.observer.progress import ProgressPublisher, RecordIdentity, process_start_ticks
    from scout.ops import sidecar

    publisher = ProgressPublisher(RecordIdentity(f"ops-rules-stop-{os.getpid()}", 0, 0))
    handlers: dict[int, Any] = {}
    slept: list[float] = []
    finished: list[float] = []
    real_sleep, real_finish = time.sleep, sidecar.Sidecar.finish

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            handlers[signal.SIGTERM](signal.SIGTERM, None)
        real_sleep(min(seconds, 0.01))

    def finish(self: sidecar.Sidecar, hooks_deadline_s: float) -> None:
        finished.append(hooks_deadline_s - time.monotonic())
        real_finish(self, hooks_deadline_s)

    monkeypatch.setattr(sidecar.signal, "signal", lambda signum, handler: handlers.__setitem__(signum, handler))
    monkeypatch.setattr(sidecar.time, "sleep", sleep)
    monkeypatch.setattr(sidecar.Sidecar, "finish", finish)
    try:
        publisher.begin_step(1)
        entry = {"rank": 0, "record_name": publisher.name, "record_token": publisher.token.hex(),
                 "pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()) or 0}
        spec = {"run_dir": str(tmp_path), "host": "h", "ranks": [entry], "job_id": "j", "generation": 0}
        for extra, poll_s, grace_s in (({}, 0.25, 1.0), ({"poll_interval_s": 0.05, "on_report_timeout_s": 0.5},
                                                         0.05, 0.5)):
            slept.clear()
            finished.clear()
            code, said, _, _ = _run_main_keeping_signals(monkeypatch, capsys, json.dumps({**spec, **extra}).encode()
                                                          + b"\n")
            assert code == 0 and said[0]["ready"]
            assert slept[:3] == [poll_s] * 3, "it loops at its poll interval until the signal"
            assert len(finished) == 1 and grace_s - 0.5 < finished[0] <= grace_s
        # With its trainers gone (no signal) its hooks get their whole time: 10 s unless told.
        slept.clear()
        finished.clear()
        dead = {**entry, "pid": 0, "start_ticks": 0}
        code, _, _, _ = _run_main_keeping_signals(monkeypatch, capsys, json.dumps({**spec, "ranks": [dead]}).encode()
                                                  + b"\n")
        assert code == 0 and slept == [] and 9.0 < finished[0] <= 10.0
    finally:
        publisher.close()


def _run_main_keeping_signals(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                              spec_line: bytes) -> tuple[int, list[Any], None, str]:
    from scout.ops import sidecar

    read_end, write_end = os.pipe()
    os.write(write_end, spec_line)
    os.close(write_end)

    class Stdin:
        def fileno(self) -> int:
            return read_end

    monkeypatch.setattr(sidecar.sys, "stdin", Stdin())
    try:
        code = sidecar.main()
    finally:
        os.close(read_end)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], None, err


def test_OPS_6_a_head_answer_has_no_body_whatever_its_status_and_busy_is_plain_text(tmp_path: Path) -> None:
    server = web.make_server(tmp_path, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]

    def raw(request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(request)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
            return answer

    try:
        for request in (b"HEAD / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", b"HEAD / HTTP/1.0\r\nHost: evil\r\n\r\n"):
            head, _, body = raw(request).partition(b"\r\n\r\n")
            assert body == b"" and int(re.search(rb"Content-Length: (\d+)", head).group(1)) > 0, head
        assert raw(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").endswith(web.page_html())
        for _ in range(web.CONCURRENT_MAX):
            server.slots.acquire()
        try:
            head, _, body = raw(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").partition(b"\r\n\r\n")
            assert b" 503 " in head and b"Content-Type: text/plain; charset=utf-8" in head and body == b"busy\n"
            head, _, body = raw(b"HEAD / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").partition(b"\r\n\r\n")
            assert b" 503 " in head and body == b""
        finally:
            for _ in range(web.CONCURRENT_MAX):
                server.slots.release()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_OPS_6_a_gate_entry_gone_before_its_stat_is_skipped_and_the_rest_counted() -> None:
    class Entry:
        def __init__(self, mtime_ns: int | None) -> None:
            self.mtime_ns = mtime_ns

        def stat(self) -> Any:
            if self.mtime_ns is None:
                raise FileNotFoundError("renamed into place")
            return types.SimpleNamespace(st_mtime_ns=self.mtime_ns)

    assert web._entries_key([Entry(None), Entry(5), Entry(3)]) == (2, 5)  # type: ignore[list-item]
    assert web._entries_key([]) == (0, 0)


def test_OPS_8_scontrol_is_found_on_the_path_by_default() -> None:
    try:
        answer = run_scontrol(["--version"])
    except SlurmError as error:  # without Slurm, or without its configuration: the default command named
        assert str(error).startswith(("'scontrol' was not found", "scontrol --version failed")), error
    else:
        assert answer.startswith("slurm ")


def test_OPS_15_empty_lines_and_chunk_edges_do_not_move_the_newest_lines(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "reports.jsonl"
    data = b"\n" * 20
    path.write_bytes(data)
    for chunk in (1, 2, 3, 7, 1 << 20):
        monkeypatch.setattr(web, "SCAN_CHUNK_BYTES", chunk)
        for count in (1, 2, 5, 19):
            assert web._newest_lines(path, count) == (20 - count, 20 - count), (chunk, count)
        assert web._newest_lines(path, 20) == (0, 0)
    path.write_bytes(b"x\n\n")
    assert web._newest_lines(path, 1) == (2, 1)


def test_OPS_6_the_page_shows_a_bounded_exclude_list_and_keeps_exactly_its_records(tmp_path: Path) -> None:
    path = tmp_path / "exclude_hosts.txt"
    path.write_bytes(b"a" * (1 << 20) + b" b\n")
    assert web._exclude_hosts(tmp_path) == ["a" * (1 << 20)], "the first MiB is read"
    path.write_text(" ".join(f"h{i}" for i in range(10_001)))
    assert web._exclude_hosts(tmp_path) == [f"h{i}" for i in range(10_000)]
    reports_path = tmp_path / reports.REPORTS_FILE
    reports_path.write_bytes(_line(1) + _line(2))
    page = web.RunPage(tmp_path, records_kept=2)
    state = page.state(0)
    assert [r["step"] for r in state["reports"]] == [1, 2] and state["kept_from"] == 0
    assert abs(state["time"] - time.time()) < 60
    assert [r["step"] for r in web.RunPage(tmp_path, records_kept=1).state(0)["reports"]] == [2]


def test_OPS_14_wildcard_and_named_addresses_add_the_machines_names(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback = frozenset(web.LOOPBACK_NAMES)
    machine = {name.lower() for name in (socket.gethostname(), socket.getfqdn())}
    asked: list[Any] = []

    def getaddrinfo(host: Any, port: Any) -> list[Any]:
        asked.append((host, port))
        return [(0, 0, 0, "", ("FE80::1", 0, 0, 0)), (0, 0, 0, "", ("10.0.0.7", 0))]

    monkeypatch.setattr(web.socket, "getaddrinfo", getaddrinfo)
    for bound in ("", "0.0.0.0", "::", "[::]"):
        assert web.allowed_host_names(bound) == loopback | machine | {"fe80::1", "10.0.0.7"} | ({bound.strip("[]")} - {""})
    assert asked == [(socket.gethostname(), None)] * 4
    assert web.allowed_host_names("LocalHost") == loopback
    assert web.allowed_host_names("Xbox") == machine | {"xbox"}

    def failing(host: Any, port: Any) -> list[Any]:
        raise OSError("no resolver")

    monkeypatch.setattr(web.socket, "getaddrinfo", failing)
    assert web.allowed_host_names("0.0.0.0") == loopback | machine | {"0.0.0.0"}
    assert web._host_name("[a]b]") == "a"


def test_OPS_6_the_server_takes_its_documented_bounds_and_every_answer_says_its_type(tmp_path: Path) -> None:
    for kwargs in ({"read_timeout_s": 0.5}, {"allow_hosts": ("X", "gpuX")}):
        server = web.make_server(tmp_path, **kwargs)
        try:
            assert server.server_address[0] == "127.0.0.1" and server.server_address[1] not in (0, 1)
        finally:
            server.server_close()
    server = web.make_server(tmp_path)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]

    def raw(request: bytes) -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(request)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        return head, body

    try:
        for target in (b"/api/state", b"/api/state?since=x", b"/nothing", b"/index.html"):
            head, body = raw(b"HEAD " + target + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            assert body == b"", target
        for target, status, content_type in ((b"/api/state?since=x", b"400", b"text/plain; charset=utf-8"),
                                             (b"/nothing", b"404", b"text/plain; charset=utf-8"),
                                             (b"/api/state", b"200", b"application/json")):
            head, body = raw(b"GET " + target + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 " + status) and b"Content-Type: " + content_type + b"\r\n" in head + \
                b"\r\n", target
        _, body = raw(b"GET /api/state HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        assert body == json.dumps(json.loads(body), sort_keys=True).encode(), "the answer's keys are sorted"
        for _ in range(web.CONNECTIONS_MAX):
            assert server.connections.acquire(timeout=10)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                answer = b""
                while chunk := extra.recv(1024):  # answered, then closed by the server
                    answer += chunk
            assert answer.endswith(b"\r\n\r\nbusy\n")
        finally:
            for _ in range(web.CONNECTIONS_MAX):
                server.connections.release()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_OPS_4_OPS_5_the_metrics_count_the_hooks_outcomes_on_the_default_address(tmp_path: Path) -> None:
    import urllib.request

    from scout.ops import sidecar

    entry = {"rank": 0, "record_name": "ops-rules-none", "record_token": "00", "pid": 0, "start_ticks": 0}
    car = sidecar.Sidecar({"run_dir": str(tmp_path), "host": "h", "ranks": [entry], "job_id": "j", "generation": 0,
                           "metrics_port": 0, "on_report": "true", "on_report_timeout_s": 5})
    car.serve_metrics()
    try:
        assert car.metrics_address is not None and car.metrics_address[0] == "127.0.0.1"
        car.hooks.counts["failed"] = 2
        with urllib.request.urlopen(f"http://127.0.0.1:{car.metrics_address[1]}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        assert 'scout_on_report_total{outcome="failed"} 2.0' in text
        assert 'scout_on_report_total{outcome="succeeded"} 0.0' in text
    finally:
        car.stop_serving()


def test_OPS_12_the_tail_counts_each_skipped_line_lets_an_overlong_one_go_and_follows_a_longer_replacement(
        tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    path.write_bytes(b"[1]\n[2]\n" + _line(1))
    tail = ReportTail(path, from_end=False)
    assert [r["step"] for r in tail.read()] == [1] and tail.skipped == 2
    assert tail.read(1) == [], "a read of one byte at the end is a read"
    with path.open("ab") as file:
        file.write(_line(2) + b'{"torn')
    assert [r["step"] for r in tail.read()] == [2] and tail.skipped == 2, "a partial line is not read yet"
    size = path.stat().st_size
    assert tail.offset == size - len(b'{"torn')
    with path.open("ab") as file:
        file.write(b"x" * 60 + b"\n")
    before = tail.offset
    assert tail.read(50) == [] and tail.offset == before + 50, "50 bytes without a newline are let go"
    # A file replaced by a longer one is read from its start (its size does not tell).
    started = ReportTail(path, from_end=True)
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(b"".join(_line(step) for step in range(10, 20)))
    os.replace(replacement, path)
    assert [r["step"] for r in started.read()] == list(range(10, 20))
    replacement.write_bytes(b"".join(_line(step) for step in range(20, 40)))
    os.replace(replacement, path)
    assert [r["step"] for r in started.read()] == list(range(20, 40))
