"""LOOP-6 and LOOP-7: what ``scout report`` makes of ``timing.jsonl`` (scout/reports/loop_timing.py),
compared whole: the summary's ``loop_timing`` object, the lines of its "loop timing" section and
the series of the picture's loop strip. Pure functions on records as ``read_timing`` returns them
(a missing generation, int ratios, null ratios and a null slow ratio are all valid there)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scout.reports.loop_timing import (
    PICTURE_RANKS_MAX,
    TIMING_RANKS_SHOWN,
    LoopSeries,
    loop_ranks,
    loop_series,
    loop_timing_json,
    loop_timing_lines,
)


def _line(kind: str, step: int, ratios: Sequence[float | None], *, generation: int | None = 0,
          slow_ratio: float | None = None, status: str = "AGREE", ranks: Sequence[int] | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": kind, "step": step, "status": status,
                              "ranks": list(range(len(ratios)) if ranks is None else ranks),
                              "performance_ratio": list(ratios), "slow_ratio": slow_ratio}
    if generation is not None:
        record["generation"] = generation
    return record


def _records() -> list[dict[str, Any]]:
    return [
        _line("loop", 10, [1.0, 1.2, None], slow_ratio=1.2),
        _line("loop", 20, [1.1, 1.5, 0.75]),  # no slow ratio on this line
        _line("loop", 10, [1, 2, 1.25], generation=1, slow_ratio=1.25, status="INCONCLUSIVE"),  # a restart
        _line("device", 4, [1.0, 1.5, 1.0], slow_ratio=1.3),
        _line("device", 6, [1.0, 1.0, 1.0], slow_ratio=1.3),
        _line("communication", 4, [None, None, None], slow_ratio=1.5),  # never decided
    ]


def _stragglers() -> list[dict[str, Any]]:
    return [
        {"kind": "straggler", "reason": "loop-slow", "ranks": [1], "step": 20, "generation": 1,
         "evidence": {"performance_ratio": 2}},
        {"kind": "straggler", "reason": "recovered-loop-slow", "ranks": [1], "step": 40, "generation": 1,
         "evidence": {"performance_ratio": 1.0}},
        {"kind": "straggler", "reason": "device-slow", "ranks": [2], "step": 30},  # no generation, no evidence
    ]


def test_LOOP_6_each_ranks_median_max_last_and_checks_strictly_above_the_last_slow_ratio() -> None:
    # rank 0: 1.0, 1.1, 1 -- rank 1: 1.2, 1.5, 2 -- rank 2: (none), 0.75, 1.25; the last slow ratio 1.25
    ranks = loop_ranks(_records())
    assert [(r.rank, r.checks, r.median, r.max, r.last, r.above) for r in ranks] == [
        (1, 3, 1.5, 2.0, 2.0, 2),   # the slowest first
        (0, 3, 1.0, 1.1, 1.0, 0),   # equal medians: the lower rank first
        (2, 2, 1.0, 1.25, 1.25, 0),  # at the slow ratio is not above it
    ]
    assert all(isinstance(r.last, float) for r in ranks)
    device = loop_ranks(_records(), "device")
    assert [(r.rank, r.checks, r.median, r.max, r.last, r.above) for r in device][0] == (1, 2, 1.25, 1.5, 1.0, 1)
    assert loop_ranks(_records(), "communication") == []
    assert loop_ranks([_line("loop", 1, [1.5, 1.0])]) and loop_ranks([_line("loop", 1, [1.5, 1.0])])[0].above == 0


def test_LOOP_6_a_record_whose_ratios_do_not_pair_with_its_ranks_is_refused() -> None:
    bad = {**_line("loop", 1, [1.0, 1.2]), "ranks": [0, 1, 2]}
    with pytest.raises(ValueError):
        loop_ranks([bad])


def test_LOOP_6_the_summary_object_whole() -> None:
    summary = loop_timing_json(_records(), 2, _stragglers())
    assert summary == {
        "checks": 3,  # (generation, step): step 10 of two attempts are two checks
        "records": 3,
        "inconclusive": 1,
        "steps": [10, 20],
        "slow_ratio": 1.25,
        "skipped_lines": 2,
        "ranks": [
            {"rank": 1, "checks": 3, "median": 1.5, "max": 2.0, "last": 2.0, "above": 2},
            {"rank": 0, "checks": 3, "median": 1.0, "max": 1.1, "last": 1.0, "above": 0},
            {"rank": 2, "checks": 2, "median": 1.0, "max": 1.25, "last": 1.25, "above": 0},
        ],
        "ranks_not_shown": 0,
        "confirmed": [  # a recovery is not a confirmation
            {"ranks": [1], "kind": "loop-slow", "step": 20, "generation": 1, "performance_ratio": 2.0},
            {"ranks": [2], "kind": "device-slow", "step": 30, "generation": None, "performance_ratio": None},
        ],
        "replay": {
            "device": {"checks": 2, "slow_ratio": 1.3,
                       "slowest": {"rank": 1, "checks": 2, "median": 1.25, "max": 1.5, "last": 1.0, "above": 1}},
            "communication": {"checks": 1, "slow_ratio": 1.5, "slowest": None},
        },
    }
    assert isinstance(summary["confirmed"][0]["performance_ratio"], float)


def test_LOOP_6_the_summary_exists_with_loop_lines_skipped_lines_or_replay_lines_only() -> None:
    assert loop_timing_json([], 0, _stragglers()) is None
    assert loop_timing_json([], 3, []) == {
        "checks": 0, "records": 0, "inconclusive": 0, "steps": [None, None], "slow_ratio": None, "skipped_lines": 3,
        "ranks": [], "ranks_not_shown": 0, "confirmed": [], "replay": {}}
    replay_only = loop_timing_json([_line("forward", 3, [1.0, 1.5], slow_ratio=1.1)], 0, [])
    assert replay_only is not None and replay_only["records"] == 0 and replay_only["replay"] == {
        "forward": {"checks": 1, "slow_ratio": 1.1,
                    "slowest": {"rank": 1, "checks": 1, "median": 1.5, "max": 1.5, "last": 1.5, "above": 1}}}


def test_LOOP_6_the_report_section_whole() -> None:
    assert loop_timing_lines(None) == []
    assert loop_timing_lines(loop_timing_json(_records(), 2, _stragglers())) == [
        "loop timing: 3 check(s), steps 10..20, 1 inconclusive; slow ratio 1.25; 2 unreadable line(s) of "
        "timing.jsonl skipped",
        "    rank  median     max    last  above slow ratio",
        "       1    1.50    2.00    2.00  2/3",
        "       0    1.00    1.10    1.00  0/3",
        "       2    1.00    1.25    1.25  0/2",
        "replay device timing: 2 check(s); slowest rank 1: median 1.25, max 1.50, above the slow ratio at 1/2",
        "replay communication timing: 1 check(s); no ratio (never decided)",
        "straggler confirmed loop-slow: rank(s) [1] at step 20 (ratio 2.00)",
        "straggler confirmed device-slow: rank(s) [2] at step 30",
    ]
    assert loop_timing_lines(loop_timing_json([], 3, [])) == [
        "loop timing: 0 check(s), 0 inconclusive; 3 unreadable line(s) of timing.jsonl skipped"]


def test_LOOP_7_the_forward_checks_are_reported_as_timed_live() -> None:
    lines = loop_timing_lines(loop_timing_json([_line("forward", 3, [1.0, 1.5], slow_ratio=1.1)], 0, []))
    assert lines == ["loop timing: 0 check(s), 0 inconclusive",
                     "live forward timing: 1 check(s); slowest rank 1: median 1.50, max 1.50, above the slow ratio at 1/1"]


def test_LOOP_6_the_section_counts_the_ranks_and_confirmations_it_does_not_show() -> None:
    ranks = TIMING_RANKS_SHOWN + 2
    records = [_line("loop", 5, [1.0 + 0.01 * r for r in range(ranks)], slow_ratio=2.0)]

    def confirmations(count: int) -> list[dict[str, Any]]:
        return [{"reason": "loop-slow", "ranks": [r], "step": 5, "evidence": {"performance_ratio": 1.5}}
                for r in range(count)]

    summary = loop_timing_json(records, 0, confirmations(TIMING_RANKS_SHOWN))
    assert summary is not None and summary["ranks_not_shown"] == 2
    assert [r["rank"] for r in summary["ranks"]] == list(range(ranks - 1, 1, -1))
    lines = loop_timing_lines(summary)
    assert lines[2 + TIMING_RANKS_SHOWN] == "  ... 2 more rank(s), each with a lower median ratio"
    assert lines[-1] == f"straggler confirmed loop-slow: rank(s) [{TIMING_RANKS_SHOWN - 1}] at step 5 (ratio 1.50)"
    over = loop_timing_lines(loop_timing_json(records, 0, confirmations(TIMING_RANKS_SHOWN + 3)))
    assert over[-2:] == [f"straggler confirmed loop-slow: rank(s) [{TIMING_RANKS_SHOWN - 1}] at step 5 (ratio 1.50)",
                         "... 3 more confirmation(s) in reports.jsonl"]


def test_LOOP_6_the_picture_draws_one_run_per_attempt_for_each_rank_and_for_the_median() -> None:
    records = [_line("loop", 10, [1.0, 1.25], generation=None, slow_ratio=1.1), _line("loop", 20, [1.0, None]),
               _line("loop", 10, [0.5, 1.5], generation=1), _line("device", 10, [9.0, 9.0])]
    series, slow = loop_series(records)
    assert slow == 1.1
    assert series == [
        LoopSeries("rank 0", 0, (((10, 1.0), (20, 1.0)), ((10, 0.5),))),
        LoopSeries("rank 1", 1, (((10, 1.25),), ((10, 1.5),))),
    ]
    assert loop_series(records, "device") == ([LoopSeries("rank 0", 0, (((10, 9.0),),)),
                                               LoopSeries("rank 1", 1, (((10, 9.0),),))], None)


def test_LOOP_6_the_picture_of_many_ranks_draws_the_highest_peaks_above_the_slow_ratio_and_the_median() -> None:
    # PICTURE_RANKS_MAX ranks: every one drawn, no median line.
    every = loop_series([_line("loop", 10, [1.0] * PICTURE_RANKS_MAX, slow_ratio=1.1)])[0]
    assert [s.rank for s in every] == list(range(PICTURE_RANKS_MAX))
    # One more: only those whose peak is above (not at) the slow ratio, and each check's median.
    ratios = [1.0] * (PICTURE_RANKS_MAX + 1)
    ratios[3], ratios[9] = 1.1, 1.3
    few = loop_series([_line("loop", 10, ratios, slow_ratio=1.1), _line("loop", 20, ratios, generation=1)])[0]
    assert few == [LoopSeries("rank 9", 9, (((10, 1.3),), ((20, 1.3),))),
                   LoopSeries("median of each check", None, (((10, 1.0),), ((20, 1.0),)))]
    # More above than are drawn: the highest peaks (ties: the lower rank), drawn in rank order.
    ratios = [1.2, 1.2, 1.1, 1.0] + [1.5] * (PICTURE_RANKS_MAX - 1) + [1.0]
    many = loop_series([_line("loop", 10, ratios, slow_ratio=1.1)])[0]
    assert [s.rank for s in many] == [0, *range(4, 4 + PICTURE_RANKS_MAX - 1), None]
    # No slow ratio: nothing is above it, the median alone.
    assert [s.label for s in loop_series([_line("loop", 10, ratios)])[0]] == ["median of each check"]


def test_LAYOUT_3_LOOP_6_a_layout_with_the_loop_check_off_says_so_instead_of_zero_checks() -> None:
    why = "the loop and forward straggler checks are off: a rank that waits ... would look slow itself"
    replay_only = loop_timing_json([_line("device", 3, [1.0, 1.5], slow_ratio=1.1)], 0, [], off=why)
    assert replay_only is not None and replay_only["off"] == why
    lines = loop_timing_lines(replay_only)
    assert lines[0] == f"loop timing: {why} (docs/layouts.md)"
    assert lines[1].startswith("replay device timing: 1 check(s)")
    assert loop_timing_lines(loop_timing_json([], 0, [], off=why)) == [f"loop timing: {why} (docs/layouts.md)"]
    # Where the loop check ran (an earlier attempt's checks, say), its checks are what is said.
    assert loop_timing_lines(loop_timing_json(_records(), 0, [], off=why))[0].startswith("loop timing: 3 check(s)")
    assert "off" not in loop_timing_json(_records(), 0, [])  # and the object is as before without it
