"""bench/fixed_cost.py's arithmetic on synthetic pair results (the figures themselves are the
benchmark's business, bench/results/): the ``parts`` section prices each part of the work at every
step by the defaults against the defaults with that part off, in the same rounds as the whole."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _fixed_cost() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("fixed_cost_under_test", BENCH / "fixed_cost.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _run(step_ms: float, cpu_ms: float, steps: int = 5, scout: bool = True) -> dict[str, Any]:
    run: dict[str, Any] = {"parameters": 183104, "layers": 3, "step_s": [step_ms / 1e3] * steps,
                           "turn_cpu_s": [cpu_ms / 1e3] * steps, "step_cpu_s": [cpu_ms / 2e3] * steps,
                           "replayed": [False] * steps}
    if scout:
        run.update({"job_step_s": [0.15e-3] * steps, "hook_s": [0.3e-3] * steps, "replay_interval_steps": 1_000_000,
                    "loop_check_steps": 150, "cadence_decisions": [{"status": "over-budget"}]})
    return run


def _round(index: int, runs: dict[str, Any], overhead: dict[str, float]) -> dict[str, Any]:
    """One round as attach_overhead.paired returns it; the side that steps first alternates."""
    return {"round": index, "first": "reference" if index % 2 == 0 else "arm", "runs": runs, "overhead": overhead,
            "load_before": [1, 1, 1], "load_after": [1, 1, 1]}


def test_parts_section_prices_each_part_against_the_defaults_with_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fixed_cost()
    # Each part's CPU a rank-step (ms): the defaults' run spends it beside its reference without the part.
    part_cpu_ms = {"observer": 0.02, "instrumentation": 0.2, "completion": 0.05, "ddp_hook": 0.3, "loop_timer": 0.1}
    asked: list[Any] = []

    def paired(pairs: Any, **keywords: Any) -> list[dict[str, Any]]:
        asked.append(([(reference.name, arm.name, arm.off, reference.off) for reference, arm in pairs], keywords))
        rounds = []
        for index in range(keywords["rounds"]):
            runs = {"all": _run(31.0, 16.0), "off@all": _run(30.0, 15.0, scout=False)}
            overhead = {"all": 31.0 / 30.0 - 1}
            for part, cpu_ms in part_cpu_ms.items():
                runs[f"with-{part}"] = _run(31.0, 16.0)
                runs[f"no-{part}@with-{part}"] = _run(31.0 - 2 * cpu_ms, 16.0 - cpu_ms)
                overhead[f"with-{part}"] = 31.0 / (31.0 - 2 * cpu_ms) - 1
            runs["alike"], runs["alike-ref@alike"] = _run(31.2, 16.05), _run(31.0, 16.0)
            overhead["alike"] = 31.2 / 31.0 - 1
            rounds.append(_round(index, runs, overhead))
        return rounds

    monkeypatch.setattr(module.attach_overhead, "paired", paired)
    section = module.run_parts(3, 5, lambda _line: None)
    (pairs, keywords), = asked
    # The whole against no scout, then each part: the defaults (named with-<part>) against the part off.
    assert pairs[0] == ("off", "all", (), ())
    assert [(reference, arm, off) for reference, arm, _, off in pairs[1:-1]] == [
        (f"no-{part}", f"with-{part}", (part,)) for part in module.TINY_PARTS]
    # ... and their noise: the defaults against the defaults (scout on both sides).
    assert pairs[-1] == ("alike-ref", "alike", (), ())
    assert all(arm_off == () for _, _, arm_off, _ in pairs)
    assert keywords["size"] == "tiny3" and keywords["nproc"] == 4 and keywords["rounds"] == 3
    assert set(section["parts"]) == set(module.TINY_PARTS) == set(part_cpu_ms)
    for part, cpu_ms in part_cpu_ms.items():
        row = section["parts"][part]
        assert row["cpu_ms"]["median"] == pytest.approx(cpu_ms) and row["cpu_ms"]["n"] == 3
        assert row["thread_cpu_ms"]["median"] == pytest.approx(cpu_ms / 2)
        assert row["cost"]["median"] == pytest.approx(31.0 / (31.0 - 2 * cpu_ms) - 1)
    assert section["all"]["cpu_ms"]["median"] == pytest.approx(1.0)
    assert section["noise"]["cost"]["median"] == pytest.approx(31.2 / 31.0 - 1)
    assert section["noise"]["cpu_ms"]["median"] == pytest.approx(0.05)
    assert section["off_step_ms"]["median"] == pytest.approx(30.0)
    assert section["hooks_ms"]["median"] == pytest.approx(0.3) and section["job_step_ms"]["median"] == pytest.approx(0.15)
    assert section["cadence"][0]["loop_check_steps"] == 150


def test_a_run_of_the_parts_alone_does_not_replace_the_goals_file(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    module = _fixed_cost()
    written: list[str] = []
    monkeypatch.setattr(module, "run_parts", lambda rounds, steps, log: {"rounds": rounds})
    monkeypatch.setattr(module, "write_results",
                        lambda name, document, found, output: written.append(name) or tmp_path / f"{name}.json")
    monkeypatch.setattr(sys, "argv", ["fixed_cost.py", "--sections", "parts", "--rounds", "1"])
    assert module.main() == 0
    assert written == ["fixed_cost_parts"]


def test_floor_section_prices_the_step_marks_alone_against_no_scout(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fixed_cost()
    # Each arm's CPU a rank-step (ms) beside its own run without scout.
    arm_cpu_ms = {"all": 1.0, "marks": 0.3, "bare": 0.2}
    asked: list[Any] = []

    def paired(pairs: Any, **keywords: Any) -> list[dict[str, Any]]:
        asked.append(([(r.name, r.scout, a.name, a.scout, a.off, a.settings) for r, a in pairs], keywords))
        rounds = []
        for index in range(keywords["rounds"]):
            runs: dict[str, Any] = {}
            overhead: dict[str, float] = {}
            for arm, cpu_ms in arm_cpu_ms.items():
                runs[arm], runs[f"off-{arm}@{arm}"] = _run(30.0 + 2 * cpu_ms, 15.0 + cpu_ms), _run(30.0, 15.0, scout=False)
                overhead[arm] = (30.0 + 2 * cpu_ms) / 30.0 - 1
            runs["alike"], runs["alike-ref@alike"] = _run(30.1, 15.0, scout=False), _run(30.0, 15.0, scout=False)
            overhead["alike"] = 30.1 / 30.0 - 1
            rounds.append(_round(index, runs, overhead))
        return rounds

    monkeypatch.setattr(module.attach_overhead, "paired", paired)
    section = module.run_floor(3, 5, lambda _line: None)
    (pairs, keywords), = asked
    # Every arm against a run of its own without scout; the marks alone have every hook on the
    # step's path off and keep the observer and replay; bare is the same without replay.
    assert pairs == [("off-all", False, "all", True, (), ()),
                     ("off-marks", False, "marks", True, module.FLOOR_OFF, ()),
                     ("off-bare", False, "bare", True, module.FLOOR_OFF, (("replay", False),)),
                     ("alike-ref", False, "alike", False, (), ())]
    assert set(module.FLOOR_OFF) == {"instrumentation", "completion", "ddp_hook", "loop_timer"}
    assert keywords["size"] == "tiny3" and keywords["nproc"] == 4 and keywords["rounds"] == 3
    for arm, cpu_ms in arm_cpu_ms.items():
        assert section[arm]["cpu_ms"]["median"] == pytest.approx(cpu_ms) and section[arm]["cpu_ms"]["n"] == 3
        assert section[arm]["thread_cpu_ms"]["median"] == pytest.approx(cpu_ms / 2)
        assert section[arm]["cost"]["median"] == pytest.approx((30.0 + 2 * cpu_ms) / 30.0 - 1)
    assert section["noise"]["cost"]["median"] == pytest.approx(30.1 / 30.0 - 1)
    assert section["off_step_ms"]["median"] == pytest.approx(30.0)
