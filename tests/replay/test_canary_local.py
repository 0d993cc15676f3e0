"""The golden canary in one process (spec/canary.md CANARY-1, CANARY-2, CANARY-8; spec/replay.md
FAULT-7). The job-wide checks with real gloo ranks are in tests/replay/test_moe_distributed.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from scout.core.canary import CanaryOutcome, decide_canary
from scout.replay.canary import Canary, CanaryMonitor
from scout.replay.faults import faulty_kernel


def _three_equal_ranks(value: Any) -> list[Any]:
    return [value] * 3  # three ranks that read and compute the same: rank 0's value, three times


def test_CANARY_2_every_class_is_a_fixed_computation_with_a_stable_signature() -> None:
    first, second = Canary().signatures(), Canary().signatures()
    assert set(first) == {c.value for c in Canary.CLASSES}
    assert first == second
    assert len(set(first.values())) == len(first), "two classes computed the same thing"
    # The signature covers the backward too: a different seed changes every class.
    other = Canary(seed=1).signatures()
    assert all(other[c] != first[c] for c in first)
    # The job's dtype is the canary's dtype.
    assert Canary(dtype=torch.bfloat16).signatures() != first


def test_CANARY_2_a_bad_class_list_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="non-empty subset"):
        Canary(())


def test_FAULT_7_CANARY_1_a_miscomputing_kernel_changes_the_canary_that_a_vote_of_equals_cannot_see() -> None:
    golden = Canary().signatures()
    fault = faulty_kernel("gelu")
    try:
        changed = Canary().signatures()
    finally:
        fault.remove()
    assert changed["hidden"] != golden["hidden"]
    assert Canary().signatures() == golden, "the fault outlived its handle"
    # Every rank shares the fault: a vote among them agrees (CANARY-1), the past does not.
    decision = decide_canary(golden, [dict(changed)] * 4)
    assert decision.outcome is CanaryOutcome.COMMON_MODE and decision.ranks == (0, 1, 2, 3)


def test_CANARY_8_the_golden_survives_a_restart_and_another_environment_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "canary" / "golden.json"
    monitor = CanaryMonitor(Canary(), _three_equal_ranks, rank=0, golden_path=path)
    assert monitor.golden is None
    assert monitor.check(step=4).outcome is CanaryOutcome.RECORDED
    written = json.loads(path.read_text())
    assert written["signatures"] == Canary().signatures() and written["step"] == 4

    restarted = CanaryMonitor(Canary(), _three_equal_ranks, rank=0, golden_path=path)
    assert restarted.golden == written["signatures"]
    assert restarted.check(step=6).outcome is CanaryOutcome.UNCHANGED

    written["environment"]["torch"] = "0.0.1"
    path.write_text(json.dumps(written))
    with pytest.raises(ValueError, match=r"0\.0\.1") as refused:
        CanaryMonitor(Canary(), _three_equal_ranks, rank=0, golden_path=path)
    assert torch.__version__ in str(refused.value)


def test_CANARY_8_a_damaged_golden_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "golden.json"
    path.write_text('{"schema": "scout.canary/1", "environ')
    with pytest.raises(ValueError, match="golden.json cannot be read"):
        CanaryMonitor(Canary(), _three_equal_ranks, rank=0, golden_path=path)
