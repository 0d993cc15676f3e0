"""What ``run_dir/timing.jsonl`` says about the straggler checks (spec/replay.md LOOP-6), for
``scout report``: per rank its median, max and last performance ratio and how many checks it
was above the test's slow ratio (:func:`loop_ranks`; the loop checks by default, the replay's
device and communication checks by ``kind``), the lines of the summary's "loop timing" section
(:func:`loop_timing_lines`), and the series the picture draws (:func:`loop_series`).
Bounded for large groups: the summary lists the slowest ``TIMING_RANKS_SHOWN`` ranks and counts
the rest; the picture draws every rank of a small job, else only the ranks ever above the slow
ratio (the slowest ``PICTURE_RANKS_MAX``) and the median of every check. No torch, no matplotlib.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from scout.core.straggler.tracking import StragglerKind

__all__ = ["PICTURE_RANKS_MAX", "TIMING_RANKS_SHOWN", "LoopRank", "LoopSeries", "loop_ranks", "loop_series",
           "loop_timing_json", "loop_timing_lines"]

#: The summary lists at most this many ranks (the slowest by median ratio), then a count.
TIMING_RANKS_SHOWN: Final = 8
#: The picture draws one line per rank up to this many ranks; beyond, the ranks ever above the
#: slow ratio (at most this many, the slowest first) and the median of each check.
PICTURE_RANKS_MAX: Final = 16


def _loop_records(records: Sequence[Mapping[str, Any]], kind: str = "loop") -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("kind") == kind]


def _slow_ratio(records: Sequence[Mapping[str, Any]]) -> float | None:
    values = [r.get("slow_ratio") for r in records]
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return numbers[-1] if numbers else None


def _ratios(record: Mapping[str, Any]) -> list[tuple[int, float | None]]:
    """(global rank, performance ratio or None) of each peer of one record."""
    ratios = record["performance_ratio"]
    return [(int(rank), float(ratio) if isinstance(ratio, (int, float)) else None)
            for rank, ratio in zip(record["ranks"], ratios, strict=True)]


@attrs.frozen
class LoopRank:
    """One rank over the loop checks: its ratios' median, max and last, and how many of its
    checks with a ratio were above the slow ratio."""

    rank: int
    checks: int  # checks that gave it a ratio
    median: float
    max: float
    last: float
    above: int


def loop_ranks(records: Sequence[Mapping[str, Any]], kind: str = "loop") -> list[LoopRank]:
    """Every rank with a ratio in a record of ``kind``, the slowest (by median ratio) first."""
    loops = _loop_records(records, kind)
    slow = _slow_ratio(loops)
    by_rank: dict[int, list[float]] = {}
    for record in loops:
        for rank, ratio in _ratios(record):
            if ratio is not None:
                by_rank.setdefault(rank, []).append(ratio)
    ranks = [LoopRank(rank, len(values), statistics.median(values), max(values), values[-1],
                      sum(slow is not None and v > slow for v in values)) for rank, values in by_rank.items()]
    return sorted(ranks, key=lambda r: (-r.median, r.rank))


def loop_timing_json(records: Sequence[Mapping[str, Any]], skipped: int,
                     stragglers: Sequence[Mapping[str, Any]], off: str | None = None) -> dict[str, Any] | None:
    """The summary's ``loop_timing`` object (None without a loop record). ``off``: why the job's
    layout had the loop check off (LAYOUT-3), said as ``off`` where it is given."""
    loops = _loop_records(records)
    replay = {kind.value: _replay_json(records, kind.value)
              for kind in (StragglerKind.FORWARD, StragglerKind.DEVICE, StragglerKind.COMMUNICATION)}
    if not loops and not skipped and not any(replay.values()) and off is None:
        return None
    ranks = loop_ranks(loops)
    return {
        "checks": len({(r.get("generation"), r.get("step")) for r in loops}),
        "records": len(loops),
        "inconclusive": sum(r.get("status") == "INCONCLUSIVE" for r in loops),
        "steps": [min((r["step"] for r in loops), default=None), max((r["step"] for r in loops), default=None)],
        "slow_ratio": _slow_ratio(loops),
        "skipped_lines": skipped,
        "ranks": [attrs.asdict(r) for r in ranks[:TIMING_RANKS_SHOWN]],
        "ranks_not_shown": max(0, len(ranks) - TIMING_RANKS_SHOWN),
        "confirmed": [_confirmation(r) for r in stragglers if not str(r["reason"]).startswith("recovered")],
        "replay": {kind: value for kind, value in replay.items() if value is not None},
        **({"off": off} if off is not None else {}),
    }


def _replay_json(records: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any] | None:
    """A replay timing kind in brief: how many checks, and its slowest rank."""
    lines = _loop_records(records, kind)
    if not lines:
        return None
    ranks = loop_ranks(lines, kind)
    return {"checks": len({(r.get("generation"), r.get("step")) for r in lines}),
            "slow_ratio": _slow_ratio(lines), "slowest": attrs.asdict(ranks[0]) if ranks else None}


def _confirmation(record: Mapping[str, Any]) -> dict[str, Any]:
    evidence = record.get("evidence") or {}
    ratio = evidence.get("performance_ratio")
    return {"ranks": list(record["ranks"]), "kind": str(record["reason"]), "step": record.get("step"),
            "generation": record.get("generation"),
            "performance_ratio": float(ratio) if isinstance(ratio, (int, float)) else None}


def loop_timing_lines(summary: Mapping[str, Any] | None) -> list[str]:
    """The "loop timing" section of ``scout report`` from :func:`loop_timing_json`."""
    if summary is None:
        return []
    slow = summary["slow_ratio"]
    first, last = summary["steps"]
    where = f", steps {first}..{last}" if first is not None else ""
    head = (f"loop timing: {summary['checks']} check(s){where}, {summary['inconclusive']} inconclusive"
            + (f"; slow ratio {slow:.2f}" if slow is not None else ""))
    if summary.get("off") is not None and not summary["checks"]:  # LAYOUT-3: none was ever due
        head = f"loop timing: {summary['off']} (docs/layouts.md)"
    if summary["skipped_lines"]:
        head += f"; {summary['skipped_lines']} unreadable line(s) of timing.jsonl skipped"
    lines = [head]
    if summary["ranks"]:
        lines.append(f"  {'rank':>6}  {'median':>6}  {'max':>6}  {'last':>6}  above slow ratio")
        for rank in summary["ranks"]:
            lines.append(f"  {rank['rank']:>6}  {rank['median']:>6.2f}  {rank['max']:>6.2f}  {rank['last']:>6.2f}  "
                         f"{rank['above']}/{rank['checks']}")
        if summary["ranks_not_shown"]:
            lines.append(f"  ... {summary['ranks_not_shown']} more rank(s), each with a lower median ratio")
    for kind, replay in summary["replay"].items():
        slowest = replay["slowest"]
        what = "live forward" if kind == StragglerKind.FORWARD else f"replay {kind}"  # LOOP-7's is timed live
        lines.append(f"{what} timing: {replay['checks']} check(s)" + (
            f"; slowest rank {slowest['rank']}: median {slowest['median']:.2f}, max {slowest['max']:.2f}, above the "
            f"slow ratio at {slowest['above']}/{slowest['checks']}" if slowest else "; no ratio (never decided)"))
    # Every kind's confirmations last: loop, device and communication alike (reports.jsonl).
    confirmations = summary["confirmed"]
    for confirmed in confirmations[:TIMING_RANKS_SHOWN]:
        ratio = confirmed["performance_ratio"]
        lines.append(f"straggler confirmed {confirmed['kind']}: rank(s) {confirmed['ranks']} at step "
                     f"{confirmed['step']}" + (f" (ratio {ratio:.2f})" if ratio is not None else ""))
    if len(confirmations) > TIMING_RANKS_SHOWN:
        lines.append(f"... {len(confirmations) - TIMING_RANKS_SHOWN} more confirmation(s) in reports.jsonl")
    return lines


@attrs.frozen
class LoopSeries:
    """One line of the picture's loop strip: a rank's (or the checks' median's) ratio by step,
    one run of points per attempt (a restart resumes at an earlier step)."""

    label: str
    rank: int | None  # None: the median of each check
    runs: tuple[tuple[tuple[int, float], ...], ...]


def loop_series(records: Sequence[Mapping[str, Any]], kind: str = "loop") -> tuple[list[LoopSeries], float | None]:
    """What the picture's loop strip (or, by ``kind``, its forward strip: LOOP-7) draws, and the
    slow ratio to mark."""
    loops = _loop_records(records, kind)
    slow = _slow_ratio(loops)
    points: dict[int | None, dict[int, list[tuple[int, float]]]] = {}
    for record in loops:
        generation, step = int(record.get("generation") or 0), int(record["step"])
        ratios = [(rank, ratio) for rank, ratio in _ratios(record) if ratio is not None]
        for rank, ratio in ratios:
            points.setdefault(rank, {}).setdefault(generation, []).append((step, ratio))
        if ratios:
            centre = statistics.median(ratio for _, ratio in ratios)
            points.setdefault(None, {}).setdefault(generation, []).append((step, centre))
    ranks = [rank for rank in points if rank is not None]
    if len(ranks) <= PICTURE_RANKS_MAX:
        shown: list[int | None] = [*sorted(ranks)]
    else:
        peaks = {rank: max(r for run in points[rank].values() for _, r in run) for rank in ranks}
        above = sorted((rank for rank in ranks if slow is not None and peaks[rank] > slow),
                       key=lambda rank: (-peaks[rank], rank))[:PICTURE_RANKS_MAX]
        shown = [*sorted(above), None]
    series = [LoopSeries("median of each check" if rank is None else f"rank {rank}", rank,
                         tuple(tuple(points[rank][g]) for g in sorted(points[rank]))) for rank in shown]
    return series, slow
