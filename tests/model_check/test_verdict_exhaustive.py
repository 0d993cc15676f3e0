"""Exhaustive conformance of classify_exact with the clause-by-clause reference.

Every equality pattern of exact evidence (restricted growth strings, so each pattern is
enumerated once up to value renaming) for n <= 9 with MISSING peers, and for n <= 7 with NaN
peers as well. Each pattern is also checked under a seeded permutation and a value renaming
(VERDICT-7).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from scout.core.verdict import MISSING, Status, Verdict, classify_exact
from tests.model_check.naive_verdict import naive_exact

MISSING_SYMBOL = -1
NAN_SYMBOL = -2


def patterns(n: int, with_nan: bool) -> Iterator[tuple[int, ...]]:
    """Every sequence over {MISSING, NaN?, 0, 1, ...} where block ids appear in first-use order."""
    specials = (MISSING_SYMBOL, NAN_SYMBOL) if with_nan else (MISSING_SYMBOL,)

    def extend(prefix: list[int], next_block: int) -> Iterator[tuple[int, ...]]:
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for symbol in (*specials, *range(next_block + 1)):
            prefix.append(symbol)
            yield from extend(prefix, max(next_block, symbol + 1))
            prefix.pop()

    yield from extend([], 0)


def materialise(pattern: tuple[int, ...], names: dict[int, Any]) -> list[Any]:
    out: list[Any] = []
    for symbol in pattern:
        if symbol == MISSING_SYMBOL:
            out.append(MISSING)
        elif symbol == NAN_SYMBOL:
            out.append(math.nan)
        else:
            out.append(names[symbol])
    return out


def summary(verdict: Verdict) -> tuple[Any, ...]:
    return verdict.status, verdict.outliers, verdict.reason, verdict.missing, verdict.invalid


def check_pattern(pattern: tuple[int, ...], rng: random.Random, float_values: bool) -> None:
    blocks = sorted({s for s in pattern if s >= 0})
    names = {b: (float(b) + 0.5 if float_values else b * 7919) for b in blocks}
    values = materialise(pattern, names)
    verdict = classify_exact(values)
    assert summary(verdict) == naive_exact(values), (pattern, verdict)
    # VERDICT-2 invariants that hold for every verdict.
    if verdict.status is Status.ATTRIBUTED:
        assert verdict.outliers and verdict.reason is None
        assert 2 * (len(pattern) - len(verdict.outliers) - len(verdict.missing)) > len(pattern)
    if verdict.status is Status.AGREE:
        assert not (verdict.outliers or verdict.missing or verdict.invalid)
    if verdict.status is Status.INCONCLUSIVE:
        assert not verdict.outliers and verdict.reason is not None
    assert not set(verdict.outliers) & set(verdict.missing)

    # VERDICT-7: value renaming changes nothing.
    renamed_values = rng.sample(range(10**6), len(blocks))
    renamed = {b: (float(v) if float_values else v) for b, v in zip(blocks, renamed_values, strict=True)}
    assert summary(classify_exact(materialise(pattern, renamed))) == summary(verdict)

    # VERDICT-7: permuting the peers permutes the positions, nothing else.
    order = list(range(len(pattern)))
    rng.shuffle(order)  # new position j holds old peer order[j]
    permuted = classify_exact([values[old] for old in order])
    new_of_old = {old: new for new, old in enumerate(order)}
    assert permuted.status is verdict.status and permuted.reason is verdict.reason
    assert permuted.outliers == tuple(sorted(new_of_old[p] for p in verdict.outliers))
    assert permuted.missing == tuple(sorted(new_of_old[p] for p in verdict.missing))
    assert permuted.invalid == tuple(sorted(new_of_old[p] for p in verdict.invalid))


@pytest.mark.parametrize("n", range(1, 10))
def test_VERDICT_13_exact_every_equality_pattern_with_missing(n: int) -> None:
    rng = random.Random(n)
    count = 0
    for pattern in patterns(n, with_nan=False):
        check_pattern(pattern, rng, float_values=False)
        count += 1
    # Bell(n + 1): the number of set partitions of n peers plus one "missing" block.
    bell = [1, 1, 2, 5, 15, 52, 203, 877, 4140, 21147, 115975]
    assert count == bell[n + 1]


@pytest.mark.parametrize("n", range(1, 8))
def test_VERDICT_12_exact_every_pattern_with_missing_and_nan(n: int) -> None:
    rng = random.Random(1000 + n)
    for pattern in patterns(n, with_nan=True):
        check_pattern(pattern, rng, float_values=True)


def test_VERDICT_3_empty_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        classify_exact([])


def test_VERDICT_10_mixed_types_name_the_position() -> None:
    with pytest.raises(TypeError, match=r"peer 2 gave float"):
        classify_exact([1, 1, 1.0])
    with pytest.raises(TypeError, match=r"peer 1 gave int"):
        classify_exact([True, 1])
    with pytest.raises(TypeError, match=r"peer 0 gave unhashable list"):
        classify_exact([[1], [1]])
    with pytest.raises(TypeError, match=r"peer 0 gave unhashable tuple"):
        classify_exact([([1],), ([1],)])
