"""Small rank programs and runners shared by the simulator tests."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import attrs

from scout.transport.base import Group
from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim import SimCluster, SimContext, SimulationResult
from scout.transport.sim.process import WAIT_RECEIVE, Process
from scout.transport.sim.runner import BLOCKED, ProgramRunner
from scout.transport.sim.scheduler import Scheduler
from scout.transport.sim.trace import Trace

Program = Callable[[SimContext], Generator[Any, Any, Any]]


def run(
    program: Program, ranks: int = 4, *, seed: int = 0, faults: Any = (), **options: Any
) -> SimulationResult:
    cluster = SimCluster(ranks, seed=seed, **options)
    cluster.spawn(program)
    cluster.inject(*faults)
    return cluster.run()


def exchange_rounds(rounds: int, timeout_s: float = 1.0, period_s: float = 0.0) -> Program:
    """Each rank exchanges (rank, round) ``rounds`` times; returns [(round, missing, t_s)]."""

    def program(ctx: SimContext) -> Generator[Any, Any, list[tuple[int, tuple[int, ...], float]]]:
        out = []
        for round_id in range(1, rounds + 1):
            if period_s:
                now_s = yield Now()
                if now_s < round_id * period_s:
                    yield Sleep(round_id * period_s - now_s)
            result = yield Exchange((ctx.rank, round_id), round_id=round_id, timeout_s=timeout_s)
            now_s = yield Now()
            out.append((round_id, result.missing, now_s))
        return out

    return program


def bare_runner(ranks: int = 2, **options: Any) -> ProgramRunner:
    """A program runner on a scheduler of its own, with no other part of the simulator wired."""
    settings = {"max_ops_without_wait": 1000, "max_payload_bytes": 1 << 20, "reproduce": "seed=0"}
    settings.update(options)
    return ProgramRunner(Scheduler(0), Trace(), Group(tuple(range(ranks)), "world"), **settings)


def run_programs(runner: ProgramRunner, until_s: float | None = None) -> None:
    runner.start()
    runner.scheduler.run(until_s)


@attrs.frozen
class Wait:
    """A toy op: wait up to ``timeout_s`` for the toy part to wake the program."""

    timeout_s: float


class ToyPart:
    """Registers an op and a wait kind with the runner, the way messaging and collectives do."""

    def __init__(self, runner: ProgramRunner) -> None:
        self.runner = runner
        self.waiting: list[Process] = []
        self.expired: list[tuple[float, int]] = []
        runner.op_handlers[Wait] = self._op_wait
        runner.expirers[WAIT_RECEIVE] = self._expire

    def _op_wait(self, process: Process, op: Wait) -> Any:
        self.waiting.append(process)
        self.runner.block(process, WAIT_RECEIVE, op.timeout_s, "wait")
        return BLOCKED

    def _expire(self, process: Process) -> None:
        self.expired.append((self.runner.scheduler.now_s, process.rank))
        self.runner.wake(process, "expired", None)
