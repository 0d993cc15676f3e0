"""Real pipeline, tensor and data parallel jobs under torchrun on CPU (gloo): examples/train_3d.py,
written only against the public API, with ``scout.attach(..., layout=mesh)`` and faults injected as
in life (spec/replay.md LAYOUT-1..LAYOUT-6, TP-1..TP-5; docs/layouts.md). What a user reads
afterwards -- ``reports.jsonl``, the checkpoints' trust, the attach lines -- is what is checked.

Each job serves many assertions (a module-scoped fixture); the 6-rank jobs beyond one pipeline
job, and the 8-rank one, are in the slow tier."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from scout import reports
from scout.reports.summary import load_run, summary_text
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_3d.py"
FAULT_KINDS = {"hang", "data_stall", "checkpoint_stall", "desync", "group_stall", "unresponsive", "inconclusive",
               "observer_failure", "sdc", "straggler"}
THRESHOLD_S = 3.0
# A sleeper sleeps a second past the latest report these tests accept (threshold + 1 s): long
# enough to be named, and no test waits on a rank asleep after its evidence is in.
HOLD_S = THRESHOLD_S + 2


@attrs.frozen
class Run:
    returncode: int | None  # None: killed at its timeout
    stdout: str
    stderr: str
    records: list[dict[str, Any]]
    run_dir: Path

    def faults(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] in FAULT_KINDS and (kind is None or r["kind"] == kind)]

    def trust(self) -> dict[str, str]:
        """Each checkpoint's last trust, from the ``checkpoint`` reports."""
        found: dict[str, str] = {}
        for record in self.records:
            if record["kind"] == "checkpoint" and "after" in record["evidence"]:
                found[record["evidence"]["checkpoint"]] = record["evidence"]["after"]
        return found

    def struck_at(self, kind: str) -> float:
        (found,) = re.findall(rf"EXAMPLE-FAULT {kind} rank \d+ step \d+ at ([0-9.]+)", self.stderr)
        return float(found)


def torchrun(work: Path, ranks: int, *arguments: str, fault: str = "", timeout_s: float = 420.0,
             **settings: Any) -> Run:
    run_dir, checkpoint_dir = work / "run", work / "ckpt"
    work.mkdir(parents=True, exist_ok=True)
    command = torchrun_command(EXAMPLE, ranks, [*arguments, "--run-dir", run_dir, "--checkpoint-dir", checkpoint_dir,
                                                "--fault", fault])
    done = launch(command, torchrun_env(settings), cwd=work, timeout_s=timeout_s)
    return Run(done.returncode, done.stdout, done.stderr, reports.read_records(run_dir / reports.REPORTS_FILE),
               run_dir)


def _time(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp()


def _named_in_time(run: Run, rank: int, kind: str = "hang-before-forward") -> dict[str, Any]:
    """The hang report naming ``rank``, emitted by another rank within the threshold + 1 s."""
    (hang,) = [r for r in run.faults("hang") if r["ranks"] == [rank]]
    assert hang["reason"] == "behind-majority" and hang["reporter_rank"] != rank, hang
    latency_s = _time(hang) - run.struck_at(kind)
    assert THRESHOLD_S - 0.1 <= latency_s <= THRESHOLD_S + 1.0, latency_s
    return hang


# -- pipeline: 2 stages x 3 replicas, 1F1B, an SDC in stage 0 and a hang in stage 1 ------------------

SDC_STEP, HANG_STEP = 12, 16


@pytest.fixture(scope="module")
def pipeline_faults(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Rank 0 (stage 0, replica 0) computes a wrong bit in its second block from step 12 on;
    rank 4 (stage 1, replica 1) sleeps before its forward of step 16."""
    run = torchrun(tmp_path_factory.mktemp("pp"), 6, "--pp", "2", "--schedule", "1f1b", "--steps", "19",
                   fault=f"sdc:0:{SDC_STEP},hang-before-forward:4:{HANG_STEP}:{HOLD_S}:until-named",
                   stall_threshold_s=THRESHOLD_S, recheck_interval_s=2.0, checkpoint_every_cycles=1)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_LAYOUT_2_LAYOUT_5_a_pipeline_job_runs_every_stage_s_recipes_and_says_its_layout_once(
    pipeline_faults: Run,
) -> None:
    said = [line for line in pipeline_faults.stderr.splitlines() if line.startswith("scout: layout")]
    assert said == ["scout: layout pp 2 x dp 3 x tp 1 (6 ranks): 2 replica group(s) of 3 rank(s) holding the same "
                    "pipeline stage; replay names a faulty rank in each group, the observer names a hung one"]
    assert pipeline_faults.stderr.count("loop and forward straggler checks are off") == 1
    started = next(r for r in pipeline_faults.records if r["kind"] == "restart")
    assert started["evidence"]["groups"] == [[0, 1, 2], [3, 4, 5]]
    # LAYOUT-3: the run directory says it too, so that scout report does, not only the console.
    assert started["evidence"]["loop_check_off"].startswith("the loop and forward straggler checks are off")
    summary = summary_text(load_run(pipeline_faults.run_dir))
    assert "loop timing: the loop and forward straggler checks are off: a rank that waits for a slow" in summary
    assert "loop timing: 0 check(s)" not in summary
    # The gate's catalog: stage 0's embedding, stage 1's head, both stages' layers (LAYOUT-2).
    assert "step 10 loss" in pipeline_faults.stdout


def test_LAYOUT_2_an_sdc_in_stage_0_is_named_at_its_step_and_nothing_trained_on_it_is_certified(
    pipeline_faults: Run,
) -> None:
    sdc = pipeline_faults.faults("sdc")
    assert sdc and {tuple(r["ranks"]) for r in sdc} == {(0,)}, sdc
    first = min(sdc, key=lambda r: r["step"])
    assert (first["step"], first["evidence"]["group"], first["evidence"]["recipe"]) == (SDC_STEP, "pp0", "hidden.1")
    trust = pipeline_faults.trust()
    # A boundary and a checkpoint every 4 steps: 4 verified at 8; 8 was awaiting its next clean
    # cycle when the SDC came (step 12), so it is quarantined, and so is every later one.
    assert trust["t0/s4"] == "RECOVERY_VERIFIED"
    assert [c for c, t in trust.items() if t == "RECOVERY_VERIFIED" and int(c.split("/s")[1]) >= 8] == []
    assert trust["t0/s8"] == trust["t0/s12"] == trust["t0/s16"] == "QUARANTINED"


def test_LAYOUT_3_a_hang_in_stage_1_is_named_by_its_replicas_within_the_threshold(pipeline_faults: Run) -> None:
    hang = _named_in_time(pipeline_faults, 4)
    assert hang["evidence"]["group_ranks"] == [3, 4, 5] and hang["step"] == HANG_STEP
    # COMPLETION-10, COMPLETION-11, INSTR-16: the stage-0 rank of the same replica (rank 1) waits
    # for rank 4 in a point-to-point transfer: its replicas see it waiting there, never behind.
    others = [r for r in pipeline_faults.faults() if r["kind"] != "sdc" and r is not hang]
    assert not [r for r in others if r["ranks"]], others


# -- tensor parallel: 2 shards x 2 replicas (detects only) ------------------------------------------


@pytest.fixture(scope="module")
def tensor_two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Rank 2 (replica 1, shard 0) computes a wrong bit in its second block from step 12 on."""
    run = torchrun(tmp_path_factory.mktemp("tp"), 4, "--tp", "2", "--steps", "16", fault="sdc:2:12")
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_TP_1_LAYOUT_4_tensor_parallel_blocks_replay_alike_and_two_replicas_only_detect(
    tensor_two_replicas: Run,
) -> None:
    assert "DETECT ONLY" in tensor_two_replicas.stderr
    unchecked = [r for r in tensor_two_replicas.records if r["kind"] == "unchecked"]
    # Every replay of a tensor-parallel block agreed but hidden.1's after the fault (steps 4, 12).
    assert [(r["step"], r["reason"], r["evidence"]["recipes"], r["evidence"]["groups"]) for r in unchecked] == [
        (12, "replay-detect-only", ["hidden.1"], ["tp0"])]
    assert tensor_two_replicas.faults() == []  # two replicas name nobody


# -- the slow tier: every case of issue 36's "done when" ---------------------------------------------


def _healthy(run: Run, verified: list[str]) -> None:
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.faults() == [], [reports.record_line(r) for r in run.faults()]
    assert [r for r in run.records if r["kind"] == "unchecked"] == []
    assert [c for c, t in run.trust().items() if t == "RECOVERY_VERIFIED"] == verified


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_LAYOUT_2_LAYOUT_6_pipeline_2_stages_x_3_replicas_healthy_100_steps(tmp_path: Path, schedule: str) -> None:
    run = torchrun(tmp_path, 6, "--pp", "2", "--schedule", schedule, "--steps", "100")
    _healthy(run, ["t0/s20", "t0/s40", "t0/s60", "t0/s80"])  # a cycle of 4 steps, a checkpoint every 5


@pytest.mark.slow
def test_TP_2_LAYOUT_6_tensor_2_x_3_replicas_healthy_100_steps(tmp_path: Path) -> None:
    run = torchrun(tmp_path, 6, "--tp", "2", "--steps", "100")
    _healthy(run, ["t0/s40", "t0/s80"])  # a cycle of 8 steps, a checkpoint every 5


@pytest.mark.slow
def test_TP_3_tensor_2_x_3_replicas_an_sdc_in_one_shard_is_named_at_its_step_and_a_hang_is_named(
    tmp_path: Path,
) -> None:
    run = torchrun(tmp_path, 6, "--tp", "2", "--steps", "34",
                   fault=f"sdc:2:20,hang-before-forward:5:30:{HOLD_S}", stall_threshold_s=THRESHOLD_S,
                   recheck_interval_s=2.0, checkpoint_every_cycles=1)
    assert run.returncode == 0, run.stderr[-3000:]
    sdc = run.faults("sdc")
    assert {tuple(r["ranks"]) for r in sdc} == {(2,)} and min(r["step"] for r in sdc) == 20, sdc
    assert run.trust()["t0/s16"] == "QUARANTINED" and run.trust()["t0/s8"] == "RECOVERY_VERIFIED"
    hang = _named_in_time(run, 5)
    # COMPLETION-10, INSTR-17: rank 4, its tensor-parallel partner, waits in DTensor's all-reduce:
    # its replicas see it waiting there, never behind.
    others = [r for r in run.faults() if r["kind"] != "sdc" and r is not hang]
    assert not [r for r in others if r["ranks"]], others


@pytest.mark.slow
def test_TP_4_LAYOUT_3_tensor_2_x_3_replicas_a_rank_1_5_times_slower_is_named_by_replay_timing(tmp_path: Path) -> None:
    run = torchrun(tmp_path, 6, "--tp", "2", "--steps", "40", fault="slow:2:1.5")
    assert run.returncode == 0, run.stderr[-3000:]
    stragglers = run.faults("straggler")
    assert stragglers and {tuple(r["ranks"]) for r in stragglers} == {(2,)}, stragglers
    assert stragglers[0]["reason"] == "device-slow" and stragglers[0]["step"] <= 2 * 5 + 4  # within 5 checks


@pytest.mark.slow
def test_LAYOUT_4_pipeline_2_x_tensor_2_x_data_2_healthy_and_a_hang_detected_says_detect_only(
    tmp_path: Path,
) -> None:
    healthy = torchrun(tmp_path / "healthy", 8, "--pp", "2", "--tp", "2", "--steps", "44")
    _healthy(healthy, ["t0/s20", "t0/s40"])  # a cycle of 4 steps, a checkpoint every 20
    assert "DETECT ONLY" in healthy.stderr
    hung = torchrun(tmp_path / "hang", 8, "--pp", "2", "--tp", "2", "--steps", "24",
                    fault=f"hang-before-forward:5:20:{THRESHOLD_S + 8}", stall_threshold_s=THRESHOLD_S,
                    recheck_interval_s=2.0)
    assert hung.returncode == 0, hung.stderr[-3000:]
    found = hung.faults()
    assert found and all(r["kind"] == "inconclusive" and r["reason"] == "detect-only" for r in found), found
    assert any(5 in r["evidence"]["group_ranks"] for r in found)
