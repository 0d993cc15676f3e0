"""Named simulated scenarios: what ``scout simulate NAME`` runs.

A scenario is a function ``(ScenarioParams) -> ScenarioOutcome`` registered with one line::

    @scenario("observer-hang", summary="a trainer hangs in a collective; observers report it")
    def observer_hang(params: ScenarioParams) -> ScenarioOutcome: ...

It builds a :class:`~scout.transport.sim.cluster.SimCluster` from ``params`` (ranks, seed,
replica group size, rounds), runs it, and returns a table (columns and rows) plus the checks
that say whether the run behaved as the contract promises. :func:`run_scenario` times the run,
digests the trace and wraps everything in a :class:`ScenarioReport`, which renders as a table
or as JSON and always carries the seed and the command that reproduces it.

Scenarios living in other packages are found by listing their module in ``SCENARIO_MODULES``;
importing it registers them.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import attrs

from scout.core.guards import whole_number
from scout.transport.sim.cluster import SimulationResult
from scout.transport.sim.errors import reproduce_line

__all__ = [
    "SCENARIO_MODULES",
    "Check",
    "Scenario",
    "ScenarioOutcome",
    "ScenarioParams",
    "ScenarioReport",
    "UnknownScenario",
    "check_memory",
    "get_scenario",
    "load_scenarios",
    "memory_budget_bytes",
    "memory_estimate_bytes",
    "run_scenario",
    "scenario",
    "scenario_names",
]

# Modules whose import registers scenarios. Add a line here for each new scenario module.
SCENARIO_MODULES: list[str] = [
    "scout.scenarios.exchange",
    "scout.scenarios.observer",
    "scout.scenarios.gate_campaign",
    "scout.scenarios.localization",
    "scout.scenarios.restarts",
]

DEFAULT_GROUP_SIZE = 8
DEFAULT_ROUNDS = 6
MAX_RANKS = 1_000_000  # a bound on what one process is asked to simulate
MAX_ROUNDS = 100_000

# Memory (docs/simulator.md, "Memory"). A run needs a fixed base (the interpreter, numpy, the
# scout modules) plus, per simulated rank, its programs' generator frames, its share of the
# bounded event queue, messages in flight and trace records. Every per-rank structure is
# bounded (mailboxes, buffered rounds, the trace), so the per-rank figure is a constant per
# scenario. The figures below are peak resident memory measured at 2048 and 8192 ranks
# (slope between them, default group size 8), rounded up by at least a quarter; a scenario
# not listed gets the default. Traffic per rank grows with the group size, so the figure is
# scaled by group_size / 8 above the default size.
BASE_MEMORY_BYTES = 64 * 2**20  # measured: 37-39 MiB
DEFAULT_BYTES_PER_RANK = 96 * 2**10
BYTES_PER_RANK: dict[str, int] = {
    # measured KiB per rank (2048 -> 8192 ranks): 8.9-9.7
    "corrupt-evidence": 12 * 2**10,
    "crash-during-allgather": 12 * 2**10,
    "exchange-healthy": 12 * 2**10,
    "exchange-partition": 12 * 2**10,
    "exchange-silent-peer": 12 * 2**10,
    "exchange-straggler": 12 * 2**10,
    # measured 11.0 (and 745 MiB at 65,536 ranks: 11.2)
    "observer-behind": 14 * 2**10,
    "observer-desync": 14 * 2**10,
    "observer-frozen": 14 * 2**10,
    "observer-group-stall": 14 * 2**10,
    "observer-process-frozen": 14 * 2**10,
    "observer-trainer-dead": 14 * 2**10,
    "observer-observer-dead": 14 * 2**10,  # measured 11.0
    "observer-partition": 14 * 2**10,  # measured 11.2
    # the campaign's product-path scenarios (scout/scenarios/replay_job.py: a pipeline, a replay
    # check and its straggler tests per rank), measured 51-57 between 128 and 1,024 ranks
    "sdc-in-evidence": 64 * 2**10,
    "straggler-timing": 64 * 2**10,
    "straggler-healthy": 64 * 2**10,
    # measured 28.5: forty steps of polling leave the most trace per rank
    "observer-healthy": 36 * 2**10,
    # measured 74
    "gate-campaign": 96 * 2**10,
    # the restarts part (scout/scenarios/restarts.py: every rank's pipeline for every step of every
    # attempt, the garbage of an ended attempt kept while the collector is paused), measured
    # between 256 and 1,024 ranks: 113 with three losses and a restart, 94 with one restart or none
    "restart-lost-checkpoint": 144 * 2**10,
    "restart-nothing-left": 144 * 2**10,
    "save-failed-stop": 120 * 2**10,
    "save-failed-continue": 120 * 2**10,
    "save-no-space": 120 * 2**10,
    "manifest-failed": 120 * 2**10,
    "saves-healthy": 120 * 2**10,
}
MEMORY_BUDGET_ENV = "SCOUT_SIM_MEMORY_MIB"


@attrs.frozen
class ScenarioParams:
    """What every scenario is parametrised by. ``group_size`` is the replica group size: ranks
    are split into consecutive groups of that many (the remainder joins the last group), the
    peers that compare evidence with each other."""

    ranks: int
    seed: int
    group_size: int = DEFAULT_GROUP_SIZE
    rounds: int = DEFAULT_ROUNDS

    def __attrs_post_init__(self) -> None:
        if not whole_number(self.ranks) or self.ranks < 1:
            raise ValueError(f"ranks must be an int >= 1, got {self.ranks!r}")
        if self.ranks > MAX_RANKS:
            raise ValueError(f"ranks must be <= {MAX_RANKS}, got {self.ranks}")
        if not whole_number(self.seed) or self.seed < 0:
            # Negative seeds are refused: random.Random(-s) replays the run of seed s.
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not whole_number(self.group_size):
            raise ValueError(f"group_size must be an int, got {self.group_size!r}")
        if not whole_number(self.rounds):
            raise ValueError(f"rounds must be an int, got {self.rounds!r}")
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2 (a group of one has no peer to compare with), "
                f"got {self.group_size}"
            )
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds must be in 1..{MAX_ROUNDS}, got {self.rounds}")


@attrs.frozen
class Check:
    """One expectation of a scenario: ``ok`` and a sentence saying what was seen."""

    name: str
    ok: bool
    detail: str = ""


@attrs.frozen
class ScenarioOutcome:
    """What a scenario function returns: its table, its checks, and the run."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    checks: list[Check]
    faults: list[str]
    result: SimulationResult


@attrs.frozen(eq=False)
class ScenarioReport:
    scenario: str
    summary: str
    params: ScenarioParams
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    checks: list[Check]
    faults: list[str]
    result: SimulationResult
    wall_s: float
    trace_digest: str

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def reproduce(self) -> str:
        line = reproduce_line(self.params.seed, self.scenario, self.params.ranks)
        if self.params.group_size != DEFAULT_GROUP_SIZE:
            line += f" --group-size {self.params.group_size}"
        if self.params.rounds != DEFAULT_ROUNDS:
            line += f" --rounds {self.params.rounds}"
        return line

    @property
    def events_per_s(self) -> float:
        """Events handled per second of the simulation loop (setup and checks excluded)."""
        run_s = self.result.wall_s
        return self.result.events / run_s if run_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """Plain data (lists, dicts, numbers, strings): the ``--json`` output."""
        return {
            "scenario": self.scenario,
            "summary": self.summary,
            "ranks": self.params.ranks,
            "seed": self.params.seed,
            "group_size": self.params.group_size,
            "rounds": self.params.rounds,
            "ok": self.ok,
            "faults": list(self.faults),
            "columns": list(self.columns),
            "rows": [[_jsonable(cell) for cell in row] for row in self.rows],
            "checks": [
                {"name": check.name, "ok": check.ok, "detail": check.detail}
                for check in self.checks
            ],
            "events": self.result.events,
            "messages_sent": self.result.messages_sent,
            "messages_delivered": self.result.messages_delivered,
            "messages_dropped": self.result.messages_dropped,
            "virtual_time_s": self.result.virtual_time_s,
            "wall_s": self.wall_s,
            "run_wall_s": self.result.wall_s,
            "events_per_s": self.events_per_s,
            "trace_records": len(self.result.trace),
            "trace_digest": self.trace_digest,
            "reproduce": self.reproduce,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(value) if isinstance(value, (frozenset, set)) else value
        return [_jsonable(item) for item in items]
    return value


ScenarioFunction = Callable[[ScenarioParams], ScenarioOutcome]


@attrs.frozen
class Scenario:
    name: str
    summary: str
    run: ScenarioFunction
    min_ranks: int = 1
    min_rounds: int = 1


class UnknownScenario(KeyError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown scenario {self.name!r}; known scenarios: {', '.join(self.known)}"


_REGISTRY: dict[str, Scenario] = {}


def scenario(
    name: str, *, summary: str, min_ranks: int = 1, min_rounds: int = 1
) -> Callable[[ScenarioFunction], ScenarioFunction]:
    """Register the decorated function as scenario ``name`` (kebab-case, unique)."""
    if not name or name != name.strip().lower() or " " in name:
        raise ValueError(f"a scenario name is lower-case kebab-case, got {name!r}")

    def register(function: ScenarioFunction) -> ScenarioFunction:
        if name in _REGISTRY and _REGISTRY[name].run is not function:
            raise ValueError(f"scenario {name!r} is registered twice")
        _REGISTRY[name] = Scenario(name, summary, function, min_ranks, min_rounds)
        return function

    return register


def load_scenarios() -> None:
    for module in SCENARIO_MODULES:
        importlib.import_module(module)


def scenario_names() -> list[str]:
    load_scenarios()
    return sorted(_REGISTRY)


def get_scenario(name: str) -> Scenario:
    load_scenarios()
    found = _REGISTRY.get(name)
    if found is None:
        raise UnknownScenario(name, sorted(_REGISTRY))
    return found


def memory_estimate_bytes(name: str, params: ScenarioParams) -> int:
    """Peak memory a run of scenario ``name`` with ``params`` is expected to need."""
    per_rank = BYTES_PER_RANK.get(name, DEFAULT_BYTES_PER_RANK)
    scale = max(1.0, params.group_size / DEFAULT_GROUP_SIZE)
    return BASE_MEMORY_BYTES + math.ceil(params.ranks * per_rank * scale)


def memory_budget_bytes() -> int:
    """What a run may use: ``SCOUT_SIM_MEMORY_MIB`` if set, else the memory the kernel reports
    available (``MemAvailable``), else total physical memory."""
    configured = os.environ.get(MEMORY_BUDGET_ENV, "").strip()
    if configured:
        try:
            mib = float(configured)
        except ValueError:
            raise ValueError(
                f"{MEMORY_BUDGET_ENV}={configured!r} is not a number of MiB; unset it or give "
                "e.g. 2048"
            ) from None
        if not math.isfinite(mib) or mib <= 0:
            raise ValueError(f"{MEMORY_BUDGET_ENV} must be a positive number of MiB, got {configured!r}")
        return int(mib * 2**20)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 2**63 - 1  # unknown: do not refuse


def check_memory(name: str, params: ScenarioParams) -> None:
    """ValueError, with the figures, if the run would need more memory than the budget."""
    needed = memory_estimate_bytes(name, params)
    budget = memory_budget_bytes()
    if needed <= budget:
        return
    per_rank = BYTES_PER_RANK.get(name, DEFAULT_BYTES_PER_RANK)
    scale = max(1.0, params.group_size / DEFAULT_GROUP_SIZE)
    fit = max(0, int((budget - BASE_MEMORY_BYTES) / (per_rank * scale)))
    raise ValueError(
        f"scenario {name!r} at {params.ranks} ranks needs about {needed / 2**20:,.0f} MiB "
        f"({per_rank * scale / 1024:.1f} KiB per rank + {BASE_MEMORY_BYTES / 2**20:.0f} MiB), "
        f"more than the {budget / 2**20:,.0f} MiB available; at most {fit:,} ranks fit "
        f"(set {MEMORY_BUDGET_ENV} to change the budget)"
    )


def run_scenario(name: str, params: ScenarioParams) -> ScenarioReport:
    """Run scenario ``name``; ValueError if ``params`` do not suit it or the run would need
    more memory than ``memory_budget_bytes()`` (refused before anything is built)."""
    spec = get_scenario(name)
    if params.ranks < spec.min_ranks:
        raise ValueError(
            f"scenario {name!r} needs at least {spec.min_ranks} ranks, got {params.ranks}"
        )
    if params.rounds < spec.min_rounds:
        raise ValueError(
            f"scenario {name!r} needs at least {spec.min_rounds} rounds, got {params.rounds}"
        )
    check_memory(name, params)
    started = time.perf_counter()
    outcome = spec.run(params)
    wall_s = time.perf_counter() - started
    return ScenarioReport(
        scenario=name,
        summary=spec.summary,
        params=params,
        columns=outcome.columns,
        rows=outcome.rows,
        checks=outcome.checks,
        faults=outcome.faults,
        result=outcome.result,
        wall_s=wall_s,
        trace_digest=outcome.result.trace.digest(),
    )
