"""The innocence property on the emulated NCCL backend (spec/observer.md COMPLETION-9..12,
scout/scenarios/innocence.py): hosts that run ahead of their devices, and a named rank is always
the culprit. CI runs ``scout campaign --quick --part innocence`` as a user would: the issue's
run-ahead hang -- rank 0 drains every 10 steps for its logging, the others run two steps ahead,
rank 1's stream stalls at step 19 -- on the default group, a ``new_group``, both dimensions of a
2-D DeviceMesh and a pipeline's point-to-point pairs, and one random schedule, in one job of
4 ranks with their observers. The full part (>= 500 schedules) is in docs/campaign.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scout.scenarios import innocence
from scout.scenarios.campaign import Outcome
from tests import processes

pytestmark = [pytest.mark.torchdist, pytest.mark.light]
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 420


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("innocence") / "campaign.json"
    completed = processes.run([sys.executable, "-m", "scout.cli", "campaign", "--quick", "--part", "innocence",
                               "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    found: dict = json.loads(out.read_text())  # type: ignore[type-arg]
    found["returncode"], found["stdout"] = completed.returncode, completed.stdout + completed.stderr[-3000:]
    return found


def test_COMPLETION_9_no_schedule_names_an_innocent_rank(document: dict) -> None:  # type: ignore[type-arg]
    cases = [case for case in document["cases"] if case["part"] == "innocence"]
    assert len(cases) == 4 + 1, document["stdout"]
    wrong = [case for case in cases if case["outcome"] in (Outcome.MISATTRIBUTED.value, Outcome.FALSE_ATTRIBUTION.value)]
    assert not wrong, "\n".join(case["detail"] for case in wrong)
    assert document["returncode"] == 0 and document["ok"], document["stdout"]
    assert "innocence (COMPLETION-9..12): 5 schedules" in document["stdout"]


def test_COMPLETION_12_the_issues_run_ahead_hang_names_rank_1_on_tracked_groups_and_never_rank_0(
    document: dict,  # type: ignore[type-arg]
) -> None:
    """The default group and a ``new_group`` (3+ voters) name rank 1 by its completion evidence;
    the mesh's dimensions and the pipeline's pairs (2 voters, point-to-point) cannot name anyone,
    and do not: inconclusive or nothing. Rank 0, which drained, is named nowhere."""
    issue = {case["kind"]: case for case in document["cases"][:4]}
    assert set(issue) == {"default stream", "new_group stream", "mesh stream", "p2p stream"}
    for kind in ("default stream", "new_group stream"):
        assert (issue[kind]["outcome"], issue[kind]["named"]) == ("localized", [1]), issue[kind]["detail"]
        assert "reason=behind-majority" in issue[kind]["detail"]
    for kind in ("mesh stream", "p2p stream"):
        assert issue[kind]["outcome"] in ("inconclusive", "missed") and issue[kind]["named"] == [], issue[kind]["detail"]
    assert all(0 not in case["named"] for case in issue.values())


def test_innocence_episodes_are_checked_and_disjoint() -> None:
    episodes = innocence.random_episodes(50, seed=3)
    assert len({e.first_step for e in episodes}) == 50
    assert all(e.first_step + e.steps + 8 < e.first_step + innocence.STEP_SPACING for e in episodes)
    with pytest.raises(ValueError, match="unknown group kind 'ring'"):
        innocence.Episode(0, "ring", steps=10, ahead=2, drain_ranks=(), drain_every=3)
    with pytest.raises(ValueError, match="stall_step 11 outside its 10 steps"):
        innocence.Episode(0, "default", steps=10, ahead=2, drain_ranks=(), drain_every=3, stall_rank=1, stall_step=11)
    assert innocence.random_episodes(5, seed=3) == innocence.random_episodes(5, seed=3)
