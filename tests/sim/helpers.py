"""Small rank programs and runners shared by the simulator tests."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from scout.transport.program import Exchange, Now, Sleep
from scout.transport.sim import SimCluster, SimContext, SimulationResult

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
