"""Simulated scenarios whose checks are the fault campaign's localization criteria (``scout
campaign``, :mod:`scout.scenarios.campaign`), beside those of :mod:`.observer` and :mod:`.exchange`.

* ``sdc-in-evidence``: from step ``SDC_ROUND`` on, one rank's replay output is wrong (one bit of
  its OUTPUT signature flipped: SDC in its own computation). The job runs the product's check
  pipeline (:mod:`.replay_job`: the replay round, the step's one exchange, the gate's writer,
  reports and the fault policy ``on_sdc = "restart"``): the SDC report must name exactly that
  rank at that step, every rank must stop there, and the gate must be tainted with nothing
  unverified left restorable.
* ``straggler-timing`` / ``straggler-healthy``: the same job, every replay computing for
  ``COMPUTE_MS`` with 1 % Gaussian jitter, the straggler ``factor`` times slower from step
  ``STRAGGLER_ROUND`` on; the replay's own device straggler test (spec/straggler.md STRAG-2,
  STRAG-4, at its defaults: ``CONFIRM_ROUNDS`` checks for a straggler 1.5x or slower) must report
  it device-slow within ``CONFIRM_ROUNDS`` steps of the fault, nobody else ever; healthy,
  nobody is ever reported.
* ``observer-observer-dead``: one rank's *observer* dies, then its trainer hangs: the peers'
  observers must still name it (unresponsive: it no longer answers rounds).
* ``observer-partition``: one rank's host is cut off from the network (every message to and from
  it is lost) mid-step: the trainers of its group block, the reachable observers name it
  unresponsive; the cut-off observer, which cannot tell who is at fault, may only report
  inconclusive without naming anyone.

Every run is a pure function of the scenario, ranks and seed (``scout simulate NAME --ranks N
--seed S`` replays it).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any, Final

from scout.gate.model import UNVERIFIED_RESTORABLE
from scout.job.pipeline import CheckOutput
from scout.reports.kinds import ReportKind, StragglerReason
from scout.scenarios import observer as observer_scenarios
from scout.scenarios.registry import Check, ScenarioOutcome, ScenarioParams, scenario
from scout.scenarios.replay_job import Faults, JobRun, SimReplayCheck, run_replay_job
from scout.transport.sim.faults import Crash, Partition

__all__ = ["faulty_rank", "straggler_factor"]

SDC_ROUND: Final = 3
COMPUTE_MS: Final = 40.0  # replay compute per round, before jitter
JITTER: Final = 0.01  # relative standard deviation of a healthy compute time
STRAGGLER_ROUND: Final = 2
#: The sequential test at its defaults (spec/straggler.md STRAG-4, the replay's default) confirms
#: a straggler 1.5x or slower in this many checks: each adds ln(clip 1.5) - ln(allowance 1.1) =
#: 0.31 nepers towards the bound of 1.0, so 4 checks; the noise guard (STRAG-2) scales down the
#: second slow check, whose spread estimate over three values still spans the change of level, so
#: it takes a fifth (measured: round 6 at every seed and factor).
CONFIRM_ROUNDS: Final = 5
STRAGGLER_FACTORS: Final = (1.5, 2.0, 3.0)


def faulty_rank(params: ScenarioParams, name: str) -> int:
    """The rank a scenario injects its fault into: drawn from the seed with a generator of its
    own (so the run's generator is untouched), the same way as :mod:`.observer`'s scenarios."""
    return random.Random(f"{name}:{params.seed}").randrange(params.ranks)


def straggler_factor(params: ScenarioParams) -> float:
    return random.Random(f"straggler-factor:{params.seed}").choice(STRAGGLER_FACTORS)


VOTE_COLUMNS: Final = ("round", "votes", "named", "confirmed")


def _logging_check(log: list[tuple[int, int, str]]) -> Callable[..., SimReplayCheck]:
    """The simulated replay check, noting each group leader's results (step, group, status)
    for the scenario's table; the check itself is the product's."""

    class Logged(SimReplayCheck):
        def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
            output = yield from super().run(step)
            if output is not None and self.layout.leader:
                log.extend((step, self.layout.index, result.status.value) for result in output.results)
            return output

    return Logged


def _rows(run: JobRun, log: list[tuple[int, int, str]], steps: int) -> list[tuple[Any, ...]]:
    rows = []
    for step in range(1, steps + 1):
        statuses: dict[str, int] = {}
        for at, _group, status in log:
            if at == step:
                statuses[status] = statuses.get(status, 0) + 1
        named = {rank for r in run.records if r["kind"] == ReportKind.SDC and r["step"] == step for rank in r["ranks"]}
        confirmed = {rank for r in run.records if r["kind"] == ReportKind.STRAGGLER and r["step"] == step
                     and r["evidence"].get("change") == "confirmed" for rank in r["ranks"]}
        if statuses or named or confirmed:
            rows.append((step, " ".join(f"{k}={v}" for k, v in sorted(statuses.items())), tuple(sorted(named)),
                         tuple(sorted(confirmed))))
    return rows


def _finished(run: JobRun) -> Check:
    unfinished = [rank for rank, outcome in enumerate(run.outcomes) if outcome is None]
    return Check("every rank's pipeline ran to its end", not unfinished and run.pipelines == len(run.outcomes),
                 f"unfinished ranks: {unfinished[:8]}")


def _job(params: ScenarioParams, name: str, faults: Faults) -> tuple[JobRun, list[tuple[int, int, str]]]:
    log: list[tuple[int, int, str]] = []
    run = run_replay_job(ranks=params.ranks, group_size=params.group_size, seed=params.seed, steps=params.rounds,
                         faults=faults, scenario=name, compute_ms=COMPUTE_MS, jitter=JITTER,
                         make_check=_logging_check(log))
    return run, log


@scenario("sdc-in-evidence", summary="one rank's replay output is wrong (one bit flipped) from step "
          f"{SDC_ROUND} on; the product's pipeline reports SDC naming exactly it, quarantines and stops every rank "
          "at that step", min_ranks=3, min_rounds=SDC_ROUND)
def sdc_in_evidence(params: ScenarioParams) -> ScenarioOutcome:
    victim = faulty_rank(params, "sdc-in-evidence")
    bit = random.Random(f"sdc-bit:{params.seed}").randrange(32)
    run, log = _job(params, "sdc-in-evidence", Faults(sdc_rank=victim, sdc_step=SDC_ROUND, sdc_bit=bit))
    sdc = [r for r in run.records if r["kind"] == ReportKind.SDC]
    stops = {outcome.stop.step if outcome is not None and outcome.stop is not None else None
             for outcome in run.outcomes}
    final = run.storage.generations[-1].context if run.storage.generations else None
    unverified = [str(e.id) for e in (final.checkpoints if final else ()) if e.trust in UNVERIFIED_RESTORABLE]
    checks = [
        _finished(run),
        Check(f"the SDC reports name exactly rank {victim}, first at step {SDC_ROUND}",
              bool(sdc) and all(r["ranks"] == [victim] for r in sdc) and sdc[0]["step"] == SDC_ROUND,
              f"sdc reports (ranks, step): {[(r['ranks'], r['step']) for r in sdc][:6]}"),
        Check(f"every rank stops at step {SDC_ROUND} (on_sdc = restart), naming rank {victim}'s host",
              stops == {SDC_ROUND} and list(run.excluded_hosts) == [f"host{victim // 4}"],
              f"stop steps: {sorted(stops, key=str)}; excluded hosts: {list(run.excluded_hosts)}"),
        Check("the gate is tainted and no unverified checkpoint stays restorable (GATE-4)",
              final is not None and final.sdc is not None and not unverified,
              f"sdc record: {None if final is None else final.sdc}; restorable unverified: {unverified}"),
    ]
    faults = [f"rank {victim}: bit {bit} of its replay output flipped from step {SDC_ROUND} on"]
    return ScenarioOutcome(VOTE_COLUMNS, _rows(run, log, params.rounds), checks, faults, run.simulation)


def _timing_scenario(params: ScenarioParams, name: str, straggler: int | None, factor: float) -> ScenarioOutcome:
    run, log = _job(params, name, Faults(straggler_rank=straggler, straggler_step=STRAGGLER_ROUND,
                                         straggler_factor=factor))
    confirmed = [r for r in run.records if r["kind"] == ReportKind.STRAGGLER and r["evidence"].get("change") == "confirmed"]
    wrong = [(r["ranks"], r["step"], r["reason"]) for r in run.records
             if r["kind"] in (ReportKind.SDC, ReportKind.STRAGGLER) and r["ranks"] != [straggler]]
    checks = [
        _finished(run),
        Check("no healthy rank is ever reported (sdc or straggler)", not wrong, f"reports naming others: {wrong[:6]}"),
        Check("no replay is unchecked or attributed", all(status == "AGREE" for _, _, status in log),
              f"statuses: {sorted({status for _, _, status in log})}"),
    ]
    faults: list[str] = []
    if straggler is not None:
        deadline = STRAGGLER_ROUND + CONFIRM_ROUNDS - 1
        first = min((r["step"] for r in confirmed if r["ranks"] == [straggler]), default=None)
        checks.append(Check(
            f"rank {straggler} is reported device-slow by step {deadline} ({CONFIRM_ROUNDS} checks after the "
            "slowdown, the sequential test's bound at its defaults)",
            first is not None and first <= deadline and confirmed[0]["reason"] == StragglerReason.DEVICE_SLOW,
            f"first confirmation at step {first}"))
        faults.append(f"rank {straggler}: replay compute {factor}x slower from step {STRAGGLER_ROUND} on")
    else:
        faults.append(f"none: every rank computes {COMPUTE_MS} ms with {JITTER:.0%} jitter")
    return ScenarioOutcome(VOTE_COLUMNS, _rows(run, log, params.rounds), checks, faults, run.simulation)


@scenario("straggler-timing", summary="one rank's replay compute is 1.5-3x slower from step "
          f"{STRAGGLER_ROUND} on; the product's pipeline reports it device-slow within {CONFIRM_ROUNDS} checks",
          min_ranks=3, min_rounds=STRAGGLER_ROUND + CONFIRM_ROUNDS - 1)
def straggler_timing(params: ScenarioParams) -> ScenarioOutcome:
    return _timing_scenario(params, "straggler-timing", faulty_rank(params, "straggler-timing"),
                            straggler_factor(params))


def straggler_confirmation_round(params: ScenarioParams, factor: float) -> tuple[int, int | None]:
    """The straggler-timing job with a chosen slowdown ``factor`` (bench/evaluate.py: the checks
    the sequential test needs at 1.2x, 1.5x, 2x): the straggler's rank and the step of the first
    report confirming it device-slow (None if none came within ``params.rounds`` steps). The
    straggler is slow from step ``STRAGGLER_ROUND`` on, and every step is a check."""
    if not factor >= 1.0:
        raise ValueError(f"factor must be >= 1.0 (a slowdown), got {factor!r}")
    straggler = faulty_rank(params, "straggler-timing")
    run, _log = _job(params, "straggler-timing", Faults(straggler_rank=straggler, straggler_step=STRAGGLER_ROUND,
                                                        straggler_factor=factor))
    steps = [r["step"] for r in run.records if r["kind"] == ReportKind.STRAGGLER and r["ranks"] == [straggler]
             and r["evidence"].get("change") == "confirmed" and r["reason"] == StragglerReason.DEVICE_SLOW]
    return straggler, min(steps, default=None)


@scenario("straggler-healthy", summary=f"every rank's replay compute has {JITTER:.0%} jitter and no straggler: "
          "the product's pipeline reports nobody", min_ranks=2)
def straggler_healthy(params: ScenarioParams) -> ScenarioOutcome:
    return _timing_scenario(params, "straggler-healthy", None, 1.0)


@scenario("observer-observer-dead", summary="one rank's observer dies, then its trainer hangs: the peers' "
          "observers name it unresponsive", min_ranks=3)
def observer_observer_dead(params: ScenarioParams) -> ScenarioOutcome:
    name = "observer-observer-dead"
    rank = observer_scenarios.faulty_rank(params, name)
    crash = Crash(rank, at_s=observer_scenarios.FREEZE_AT_S, programs=("observer",))
    return observer_scenarios.single_rank_outcome(
        params, name, rank, (crash,), "unresponsive",
        behaviour=lambda r, step: "hold" if r == rank and step == observer_scenarios.FAULT_STEP else "normal",
        latency_max_s=observer_scenarios.unresponsive_latency_max_s(),
        described=[crash.describe(), f"rank {rank}: hold at step {observer_scenarios.FAULT_STEP}"],
        quiet_rank=rank)


@scenario("observer-partition", summary="one rank's host is cut off from the network mid-step: its group's "
          "reachable observers name it unresponsive; the cut-off one names nobody", min_ranks=3)
def observer_partition(params: ScenarioParams) -> ScenarioOutcome:
    name = "observer-partition"
    rank = observer_scenarios.faulty_rank(params, name)
    cut = Partition({rank}, frozenset(range(params.ranks)) - {rank}, start_s=observer_scenarios.FREEZE_AT_S,
                    duration_s=observer_scenarios.HOLD_S)
    return observer_scenarios.single_rank_outcome(
        params, name, rank, (cut,), "unresponsive", latency_max_s=observer_scenarios.unresponsive_latency_max_s(),
        described=[cut.describe()], isolated=rank, stall_s=cut.start_s)
