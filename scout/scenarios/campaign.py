"""The fault campaign behind ``scout campaign``: inject faults, count what scout names.

Three parts, each a matrix of cases; every case is classified exactly once:

1. **Simulated** (this module): every fault kind the simulator models -- hang, desync, frozen
   trainer, frozen rank, dead trainer, dead observer, group stall, partition, SDC in exchanged
   evidence, straggler -- at 8 to 4096 ranks, each case a registered scenario
   (``scout simulate``) run with a seed drawn from the campaign seed; and the **restarts** part:
   lost checkpoints, failed saves and restarts (:mod:`scout.scenarios.restarts`: the product's
   restore and save programs) at 256 to 1024 ranks.
2. **Real processes** (:mod:`scout.scenarios.real_campaign`): the fault kinds the real path
   supports, in 4-rank gloo jobs forked from one torch import; the NCCL-semantics matrix
   (:mod:`scout.scenarios.device_campaign`); pipeline, tensor and data parallel jobs
   (:mod:`scout.scenarios.layout_campaign`).
3. **Healthy** runs with jitter, simulated and real: any rank named is a false attribution.

Classification of a faulty case (the columns of the paper's Table 3):

- ``localized``: every expectation of the case holds -- the faulty rank (or group) and only it is
  named, with the expected finding, in time (the scenario's checks, or the job's);
- ``misattributed``: some rank that was not faulty is named;
- ``inconclusive``: something was reported or voted, but the faulty rank was not (only) named;
- ``missed``: nothing was reported at all.

A failing case carries the command that reproduces it. Results are plain JSON (``to_json``) and
a table (:func:`render`).
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import attrs

from scout.scenarios import localization, observer, restarts
from scout.scenarios.exchange import replica_groups
from scout.scenarios.registry import ScenarioParams, ScenarioReport, run_scenario

__all__ = [
    "CaseResult",
    "CampaignResult",
    "Outcome",
    "RESTART_HEALTHY",
    "RESTART_KINDS",
    "SIM_KINDS",
    "campaign_plan",
    "render",
    "run_sim_case",
    "sim_cases",
]


class Outcome(str, enum.Enum):
    LOCALIZED = "localized"
    MISATTRIBUTED = "misattributed"
    INCONCLUSIVE = "inconclusive"
    MISSED = "missed"
    # Healthy runs:
    CLEAN = "clean"
    FALSE_ALARM = "false-alarm"  # something reported, nobody named
    FALSE_ATTRIBUTION = "false-attribution"


FAULTY_OUTCOMES: Final = (Outcome.LOCALIZED, Outcome.MISATTRIBUTED, Outcome.INCONCLUSIVE, Outcome.MISSED)
HEALTHY_OUTCOMES: Final = (Outcome.CLEAN, Outcome.FALSE_ALARM, Outcome.FALSE_ATTRIBUTION)


@attrs.frozen
class CaseResult:
    """One case of the campaign and what scout named."""

    part: str  # "sim" or "real"
    kind: str
    ranks: int
    seed: int
    outcome: Outcome
    injected: tuple[int, ...]  # the faulty rank(s); empty for a healthy run
    named: tuple[int, ...]  # the ranks scout named
    detail: str
    reproduce: str
    wall_s: float
    group_size: int = 0
    healthy: bool = False
    # The innocence part (scout.scenarios.innocence): only a wrong name fails; saying nothing or
    # "inconclusive" is sound where the evidence cannot name the culprit.
    innocence: bool = False

    @property
    def failed(self) -> bool:
        if self.innocence:
            return self.outcome in (Outcome.MISATTRIBUTED, Outcome.FALSE_ATTRIBUTION)
        return self.outcome not in (Outcome.LOCALIZED, Outcome.CLEAN, Outcome.FALSE_ALARM)

    def to_json(self) -> dict[str, Any]:
        return {
            "part": self.part, "kind": self.kind, "ranks": self.ranks, "group_size": self.group_size,
            "seed": self.seed, "healthy": self.healthy, "outcome": self.outcome.value,
            "injected": list(self.injected), "named": list(self.named), "detail": self.detail,
            "reproduce": self.reproduce, "wall_s": round(self.wall_s, 3),
        }


# ------------------------------------------------------------------------------------------
# The simulated part
# ------------------------------------------------------------------------------------------


@attrs.frozen
class SimKind:
    """A fault kind on the simulator: the scenario that injects it and the rank(s) it injects
    into (from the scenario's own seeded choice)."""

    kind: str
    scenario: str
    injected: Callable[[ScenarioParams], tuple[int, ...]]
    min_ranks: int = 3


def _one(name: str, module: Any = observer) -> Callable[[ScenarioParams], tuple[int, ...]]:
    return lambda params: (module.faulty_rank(params, name),)


def _group_of_faulty(params: ScenarioParams) -> tuple[int, ...]:
    rank = observer.faulty_rank(params, "observer-group-stall")
    return next(group.ranks for group in replica_groups(params.ranks, params.group_size) if rank in group.ranks)


SIM_KINDS: Final = (
    SimKind("hang", "observer-behind", _one("observer-behind")),
    SimKind("desync", "observer-desync", _one("observer-desync")),
    SimKind("frozen trainer", "observer-frozen", _one("observer-frozen")),
    SimKind("frozen rank", "observer-process-frozen", _one("observer-process-frozen")),
    SimKind("dead trainer", "observer-trainer-dead", _one("observer-trainer-dead")),
    SimKind("dead observer", "observer-observer-dead", _one("observer-observer-dead")),
    SimKind("group stall", "observer-group-stall", _group_of_faulty),
    SimKind("partition", "observer-partition", _one("observer-partition")),
    SimKind("SDC in evidence", "sdc-in-evidence", _one("sdc-in-evidence", localization)),
    SimKind("straggler", "straggler-timing", _one("straggler-timing", localization)),
)

def _restart(name: str) -> Callable[[ScenarioParams], tuple[int, ...]]:
    return lambda params: restarts.faulty_ranks(name, params)


#: The restarts part: storage faults and restarts through the product's restore and save programs.
#: Localized: every check of the scenario holds (what is reported, lost, restored and saved, on
#: every rank alike), and the only ranks named are the SDC's or the failed write's (rank 0 for the
#: manifest, nobody for a free-space refusal).
RESTART_KINDS: Final = (
    SimKind("lost checkpoint", "restart-lost-checkpoint", _restart("restart-lost-checkpoint")),
    SimKind("every chosen checkpoint lost", "restart-nothing-left", _restart("restart-nothing-left")),
    SimKind("failed save, stop", "save-failed-stop", _restart("save-failed-stop"), min_ranks=2),
    SimKind("failed save, continue", "save-failed-continue", _restart("save-failed-continue"), min_ranks=2),
    SimKind("no free space", "save-no-space", _restart("save-no-space"), min_ranks=2),
    SimKind("manifest record failed", "manifest-failed", _restart("manifest-failed"), min_ranks=2),
)
RESTART_HEALTHY: Final = (SimKind("healthy saves", "saves-healthy", lambda params: (), min_ranks=2),)
SIM_HEALTHY: Final = (
    SimKind("healthy observers", "observer-healthy", lambda params: (), min_ranks=2),
    SimKind("healthy timing", "straggler-healthy", lambda params: (), min_ranks=2),
)

# (ranks, cases per kind). Full: >= 1000 faulty scenarios at 8..4096 ranks, most of them small
# (a case at 4096 ranks costs about a second); quick: the CI-sized matrix.
FULL_SIZES: Final = ((8, 30), (16, 20), (32, 15), (64, 12), (128, 8), (256, 6), (512, 4), (1024, 3),
                     (2048, 1), (4096, 1))
QUICK_SIZES: Final = ((8, 10), (16, 6), (32, 4), (64, 3), (256, 1))
FULL_HEALTHY_SIZES: Final = ((8, 20), (64, 10), (512, 4), (2048, 1))
QUICK_HEALTHY_SIZES: Final = ((8, 6), (64, 3))
#: The restarts part at 256+ ranks (a case at 256 ranks takes about 5 s on the shared box, at 1024
#: about 30 s: every rank runs the replay pipeline for every step of every attempt).
FULL_RESTART_SIZES: Final = ((256, 3), (512, 1), (1024, 1))
QUICK_RESTART_SIZES: Final = ((256, 1),)
GROUP_SIZES: Final = (4, 8, 16)


def _seed(campaign_seed: int, *parts: object) -> int:
    # Deterministic across processes (no hash randomization): a string seed of random.Random.
    return random.Random(":".join(map(str, (campaign_seed, *parts)))).getrandbits(32)


def sim_cases(kinds: Iterable[SimKind], sizes: Sequence[tuple[int, int]], campaign_seed: int) -> list[tuple[SimKind, ScenarioParams]]:
    cases = []
    for kind in kinds:
        for ranks, count in sizes:
            for index in range(count):
                seed = _seed(campaign_seed, kind.scenario, ranks, index)
                group_size = GROUP_SIZES[seed % len(GROUP_SIZES)] if ranks >= 16 else 8
                cases.append((kind, ScenarioParams(ranks=max(ranks, kind.min_ranks), seed=seed, group_size=group_size)))
    return cases


def _named(report: ScenarioReport) -> tuple[int, ...]:
    """The ranks a scenario's reports or votes named (not those merely missing from an
    inconclusive report: that names nobody)."""
    columns = report.columns
    named: set[int] = set()
    for row in report.rows:
        cells = dict(zip(columns, row, strict=True))
        if "attributed" in cells:
            named.update(cells["attributed"] or ())
            if cells.get("outcome") == "unresponsive":
                named.update(cells["missing"] or ())
        else:
            named.update(cells.get("named") or ())
            named.update(cells.get("confirmed") or ())
    return tuple(sorted(named))


def _reported(report: ScenarioReport) -> bool:
    columns = report.columns
    if "attributed" in columns:
        return bool(report.rows)
    return any("INCONCLUSIVE" in str(dict(zip(columns, row, strict=True)).get("votes", "")) for row in report.rows) \
        or bool(_named(report))


def classify(injected: tuple[int, ...], named: tuple[int, ...], ok: bool, reported: bool, healthy: bool) -> Outcome:
    if healthy:
        if named:
            return Outcome.FALSE_ATTRIBUTION
        return Outcome.CLEAN if ok and not reported else Outcome.FALSE_ALARM
    if set(named) - set(injected):
        return Outcome.MISATTRIBUTED
    if ok:
        return Outcome.LOCALIZED
    return Outcome.INCONCLUSIVE if reported else Outcome.MISSED


def run_sim_case(kind: SimKind, params: ScenarioParams, healthy: bool = False, part: str = "sim") -> CaseResult:
    started = time.perf_counter()
    try:
        report = run_scenario(kind.scenario, params)
    except Exception as error:  # a run that broke is a failed case, with its reproduce line
        line = f"reproduce with: scout simulate {kind.scenario} --ranks {params.ranks} --seed {params.seed} " \
               f"--group-size {params.group_size}"
        return CaseResult(part, kind.kind, params.ranks, params.seed,
                          Outcome.FALSE_ATTRIBUTION if healthy else Outcome.MISSED, kind.injected(params), (),
                          f"the run failed: {type(error).__name__}: {error}", line, time.perf_counter() - started,
                          params.group_size, healthy)
    injected = kind.injected(params)
    named = _named(report)
    outcome = classify(injected, named, report.ok, _reported(report), healthy)
    failed = [f"{check.name}: {check.detail}" for check in report.checks if not check.ok]
    detail = "; ".join(failed) if failed else "every check holds"
    reproduce = report.reproduce
    if "--group-size" not in reproduce:
        reproduce += f" --group-size {params.group_size}"
    return CaseResult(part, kind.kind, params.ranks, params.seed, outcome, injected, named, detail, reproduce,
                      time.perf_counter() - started, params.group_size, healthy)


# ------------------------------------------------------------------------------------------
# The whole campaign
# ------------------------------------------------------------------------------------------


@attrs.frozen
class CampaignPlan:
    quick: bool
    seed: int
    sim: tuple[tuple[SimKind, ScenarioParams], ...]
    sim_healthy: tuple[tuple[SimKind, ScenarioParams], ...]
    restarts: tuple[tuple[SimKind, ScenarioParams], ...] = ()
    restarts_healthy: tuple[tuple[SimKind, ScenarioParams], ...] = ()


def campaign_plan(*, quick: bool, seed: int) -> CampaignPlan:
    return CampaignPlan(
        quick, seed,
        tuple(sim_cases(SIM_KINDS, QUICK_SIZES if quick else FULL_SIZES, seed)),
        tuple(sim_cases(SIM_HEALTHY, QUICK_HEALTHY_SIZES if quick else FULL_HEALTHY_SIZES, seed)),
        tuple(sim_cases(RESTART_KINDS, QUICK_RESTART_SIZES if quick else FULL_RESTART_SIZES, seed)),
        tuple(sim_cases(RESTART_HEALTHY, QUICK_RESTART_SIZES if quick else FULL_RESTART_SIZES, seed)),
    )


@attrs.define
class CampaignResult:
    quick: bool
    seed: int
    cases: list[CaseResult] = attrs.field(factory=list)
    wall_s: float = 0.0
    problems: list[str] = attrs.field(factory=list)  # a part that could not run, and why

    @property
    def faulty(self) -> list[CaseResult]:
        return [case for case in self.cases if not case.healthy]

    @property
    def healthy_runs(self) -> list[CaseResult]:
        return [case for case in self.cases if case.healthy]

    @property
    def failures(self) -> list[CaseResult]:
        return [case for case in self.cases if case.failed]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.problems and bool(self.faulty)

    def table(self) -> list[dict[str, Any]]:
        """One row per (part, kind): the Table 3 counts."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for case in self.cases:
            key = (case.part, case.kind)
            row = rows.setdefault(key, {"part": case.part, "kind": case.kind, "healthy": case.healthy, "cases": 0,
                                        "ranks": [case.ranks, case.ranks],
                                        **{o.value: 0 for o in (HEALTHY_OUTCOMES if case.healthy else FAULTY_OUTCOMES)}})
            row["cases"] += 1
            row[case.outcome.value] = row.get(case.outcome.value, 0) + 1
            row["ranks"] = [min(row["ranks"][0], case.ranks), max(row["ranks"][1], case.ranks)]
        return list(rows.values())

    def totals(self) -> dict[str, Any]:
        faulty = self.faulty
        healthy = self.healthy_runs
        localized = sum(case.outcome is Outcome.LOCALIZED for case in faulty)
        return {
            "injected": len(faulty),
            "localized": localized,
            "misattributed": sum(case.outcome is Outcome.MISATTRIBUTED for case in faulty),
            "inconclusive": sum(case.outcome is Outcome.INCONCLUSIVE for case in faulty),
            "missed": sum(case.outcome is Outcome.MISSED for case in faulty),
            "localized_fraction": localized / len(faulty) if faulty else 0.0,
            "healthy_runs": len(healthy),
            "false_attributions": sum(case.outcome is Outcome.FALSE_ATTRIBUTION for case in self.cases)
            + sum(case.outcome is Outcome.MISATTRIBUTED for case in faulty),
            "false_alarms": sum(case.outcome is Outcome.FALSE_ALARM for case in healthy),
            "sim_scenarios": sum(case.part == "sim" for case in self.cases),
            "restart_scenarios": sum(case.part == "restarts" for case in self.cases),
            "real_jobs": sum(case.part == "real" for case in self.cases),
            "device_cases": sum(case.part == "device" for case in self.cases),
            "innocence_schedules": sum(case.part == "innocence" for case in self.cases),
            "layout_jobs": sum(case.part == "layouts" for case in self.cases),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "scout.campaign/1",
            "quick": self.quick,
            "seed": self.seed,
            "ok": self.ok,
            "wall_s": round(self.wall_s, 3),
            "totals": self.totals(),
            "table": self.table(),
            "problems": list(self.problems),
            "failures": [case.to_json() for case in self.failures],
            "cases": [case.to_json() for case in self.cases],
        }


def render(result: CampaignResult) -> str:
    """The table (Table 3's columns), the healthy runs, every failing case with its command."""
    totals = result.totals()
    lines = [
        f"scout campaign ({'quick' if result.quick else 'full'}, seed {result.seed}): "
        f"{totals['sim_scenarios']} simulated scenarios, {totals['restart_scenarios']} restart scenarios, "
        f"{totals['real_jobs']} real-process jobs, "
        f"{totals['device_cases']} device-semantics cases, {totals['layout_jobs']} layout jobs, "
        f"{totals['innocence_schedules']} innocence schedules, "
        f"{result.wall_s:.0f} s",
        "",
    ]
    header = ("part", "fault kind", "ranks", "injected", "localized", "misattributed", "inconclusive", "missed")
    table = [header]
    for row in result.table():
        if row["healthy"]:
            continue
        ranks = f"{row['ranks'][0]}-{row['ranks'][1]}" if row["ranks"][0] != row["ranks"][1] else str(row["ranks"][0])
        table.append((row["part"], row["kind"], ranks, str(row["cases"]), str(row["localized"]),
                      str(row["misattributed"]), str(row["inconclusive"]), str(row["missed"])))
    table.append(("all", "", "", str(totals["injected"]),
                  f"{totals['localized']} ({100 * totals['localized_fraction']:.1f}%)",
                  str(totals["misattributed"]), str(totals["inconclusive"]), str(totals["missed"])))
    lines += _aligned(table)
    lines.append("")
    healthy = [("part", "healthy runs", "ranks", "runs", "false attributions", "false alarms")]
    for row in result.table():
        if not row["healthy"]:
            continue
        ranks = f"{row['ranks'][0]}-{row['ranks'][1]}" if row["ranks"][0] != row["ranks"][1] else str(row["ranks"][0])
        healthy.append((row["part"], row["kind"], ranks, str(row["cases"]), str(row["false-attribution"]),
                        str(row["false-alarm"])))
    lines += _aligned(healthy)
    lines.append("")
    lines.append(f"false attributions (healthy runs and misattributed faults): {totals['false_attributions']}")
    innocent = [case for case in result.cases if case.innocence]
    if innocent:
        counts = {outcome: sum(case.outcome is outcome for case in innocent) for outcome in Outcome}
        lines.append(
            f"innocence (COMPLETION-9..12): {len(innocent)} schedules -- named right {counts[Outcome.LOCALIZED]}, "
            f"inconclusive {counts[Outcome.INCONCLUSIVE]}, said nothing {counts[Outcome.MISSED]}, healthy clean "
            f"{counts[Outcome.CLEAN]}, named wrong {counts[Outcome.MISATTRIBUTED] + counts[Outcome.FALSE_ATTRIBUTION]}")
    for problem in result.problems:
        lines.append(f"PROBLEM: {problem}")
    for case in result.failures:
        lines.append(f"FAIL {case.part} {case.kind} ranks={case.ranks} seed={case.seed}: {case.outcome.value}, "
                     f"named {list(case.named)}, injected {list(case.injected)}: {case.detail[:300]}")
        lines.append(f"     {case.reproduce}")
    lines.append(("ok: no false attribution, every fault localized or (innocence part) soundly unnamed" if innocent
                  else "ok: every injected fault localized, no false attribution") if result.ok else "FAILED")
    return "\n".join(lines)


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if index < 2 else cell.rjust(width)
                      for index, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def run_sim_part(plan: CampaignPlan, result: CampaignResult, log: Callable[[str], None] | None = None) -> None:
    say = log or (lambda line: None)
    started = time.perf_counter()
    for index, (kind, params) in enumerate(plan.sim):
        result.cases.append(run_sim_case(kind, params))
        if index % 100 == 99:
            say(f"  simulated {index + 1} of {len(plan.sim)} faulty scenarios ({time.perf_counter() - started:.0f} s)")
    for kind, params in plan.sim_healthy:
        result.cases.append(run_sim_case(kind, params, healthy=True))
    say(f"  simulated part: {len(plan.sim)} faulty and {len(plan.sim_healthy)} healthy scenarios in "
        f"{time.perf_counter() - started:.0f} s")


def run_restarts_part(plan: CampaignPlan, result: CampaignResult, log: Callable[[str], None] | None = None) -> None:
    """The restarts part: each case a registered scenario of :mod:`scout.scenarios.restarts`."""
    say = log or (lambda line: None)
    started = time.perf_counter()
    for kind, params in plan.restarts:
        result.cases.append(run_sim_case(kind, params, part="restarts"))
    for kind, params in plan.restarts_healthy:
        result.cases.append(run_sim_case(kind, params, healthy=True, part="restarts"))
    say(f"  restarts part: {len(plan.restarts) + len(plan.restarts_healthy)} scenarios at {sorted({p.ranks for _, p in plan.restarts})} ranks in "
        f"{time.perf_counter() - started:.0f} s")


PARTS: Final = ("sim", "restarts", "real", "device")
#: Parts run only when asked for by name: the layouts part's jobs need 6 and 8 ranks and take
#: minutes each on 2 cores; the innocence part's random run-ahead schedules (scout.scenarios.
#: innocence) take about an hour at full size (docs/campaign.md).
NAMED_PARTS: Final = ("layouts", "innocence")
#: The innocence part's sizes: random schedules beside the issue's four (quick: one, so that CI's
#: job -- each schedule holds its stall 6.5 s -- stays near 40 s; the property's breadth is the
#: full part's 500).
INNOCENCE_SCHEDULES: Final = 500
INNOCENCE_SCHEDULES_QUICK: Final = 1


def run_campaign(result: CampaignResult, parts: Sequence[str] = PARTS,
                 log: Callable[[str], None] | None = None) -> None:
    """Every part of the campaign asked for, at ``result``'s seed and size, into ``result``:
    ``scout campaign``, bench/campaign.py and bench/evaluate.py run this one function. The real
    and device parts import torch in the processes they fork; without torch they are a problem
    of the result, not an error."""
    unknown = sorted(set(parts) - set(PARTS) - set(NAMED_PARTS))
    if unknown:
        raise ValueError(f"unknown campaign part(s) {unknown}; the parts are {', '.join(PARTS + NAMED_PARTS)}")
    import importlib.util

    plan = campaign_plan(quick=result.quick, seed=result.seed)
    if "sim" in parts:
        run_sim_part(plan, result, log)
    if "restarts" in parts:
        run_restarts_part(plan, result, log)
    has_torch = importlib.util.find_spec("torch") is not None  # found, not imported (the forkserver imports it)
    if "real" in parts:
        if not has_torch:
            result.problems.append("the real-process part needs torch (pip install 'scout-localize[torch]'); "
                                   "run --part sim without it")
        else:
            from scout.scenarios import real_campaign

            result.cases += real_campaign.run_real_part(real_campaign.real_cases(quick=result.quick, seed=result.seed),
                                                        log)
    if "innocence" in parts:
        if not has_torch:
            result.problems.append("the innocence part needs torch (pip install 'scout-localize[torch]')")
        else:
            from scout.scenarios import innocence

            count = INNOCENCE_SCHEDULES_QUICK if result.quick else INNOCENCE_SCHEDULES
            result.cases += innocence.run_innocence_part(count, result.seed, log, per_job=5 if result.quick else 12)
    if "device" in parts:
        if not has_torch:
            result.problems.append("the device-semantics part needs torch (pip install 'scout-localize[torch]')")
        else:
            from scout.scenarios import device_campaign

            result.cases += device_campaign.run_device_part(
                device_campaign.device_cases(quick=result.quick, seed=result.seed), log, seed=result.seed)
            if not result.quick:
                result.cases += device_campaign.run_healthy_job(result.seed, log)
    if "layouts" in parts:
        from scout.scenarios import layout_campaign

        if not has_torch or layout_campaign.example_path() is None:
            result.problems.append("the layouts part runs examples/train_3d.py under torchrun: it needs torch and a "
                                   "source checkout of scout")
        else:
            result.cases += layout_campaign.run_layout_part(
                layout_campaign.layout_cases(quick=result.quick, seed=result.seed), log)
