"""GATE-41: which sdc findings become reports (scout/core/sdc_reports.py), exhaustively over short
runs of findings against the rule read literally."""

from __future__ import annotations

import itertools
import math

import pytest

from scout.core.sdc_reports import SdcReportCounter


def test_GATE_41_a_fault_at_n_checks_is_written_1_plus_floor_log2_n_times() -> None:
    for n in (1, 2, 3, 7, 8, 18, 100):
        counter = SdcReportCounter()
        written = [k for k in range(1, n + 1) if counter.observe("expert.3@64", (5,), 10 * k).report]
        assert written == [2**i for i in range(int(math.log2(n)) + 1)], n
        assert len(written) == 1 + int(math.floor(math.log2(n)))


def test_GATE_41_every_run_of_findings_over_two_recipes_and_three_ranks_follows_the_rule() -> None:
    """Every sequence of up to 5 findings, each naming one of the non-empty rank sets of {0, 1, 2}
    for one of two recipes, against a reference that keeps the rule's two conditions apart."""
    findings = [(recipe, ranks) for recipe in ("hidden.0", "output")
                for size in (1, 2) for ranks in itertools.combinations(range(3), size)]
    for length in range(1, 5):
        for run in itertools.product(findings, repeat=length):
            counter = SdcReportCounter()
            count: dict[tuple[int, str], int] = {}
            reported: dict[tuple[int, str], int] = {}
            for step, (recipe, ranks) in enumerate(run):
                for rank in ranks:
                    count[rank, recipe] = count.get((rank, recipe), 0) + 1
                new_rank = any((rank, recipe) not in reported for rank in ranks)
                doubled = any(count[rank, recipe] >= 2 * reported.get((rank, recipe), 0) for rank in ranks)
                decision = counter.observe(recipe, ranks, step)
                assert decision.report == (new_rank or doubled), run
                assert decision.counts == tuple(count[rank, recipe] for rank in ranks)
                if decision.report:
                    reported.update({(rank, recipe): count[rank, recipe] for rank in ranks})


def test_GATE_41_a_finding_without_ranks_is_counted_by_its_recipe_and_bad_input_is_refused() -> None:
    counter = SdcReportCounter()
    assert [counter.observe("canary", (), s).report for s in range(1, 6)] == [True, True, False, True, False]
    assert counter.observe("canary", (), 6).counts == ()
    with pytest.raises(ValueError, match="recipe id"):
        counter.observe("", (1,), 1)
    with pytest.raises(ValueError, match="step >= 0"):
        counter.observe("hidden.0", (1,), -1)
    with pytest.raises(ValueError, match=r"names ranks \[1, 1\]"):
        counter.observe("hidden.0", (1, 1), 1)
