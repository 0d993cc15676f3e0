"""Report kinds: one home (scout/reports/kinds.py) for what every ``kind`` means -- its source,
whether it is a fault, the failure class a restart recovers from, the observer's restart set,
the trainer's warnings and the picture's mark -- and nothing else in scout keeps a list."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scout import reports
from scout.core.failure import FAILURE_ORDER, FailureClass, deciding_failure
from scout.reports.kinds import MarkStyle, ReportKind, Source, attempt_failure

SCOUT = Path(__file__).resolve().parents[2] / "scout"


def _record(kind: str, reason: str = "a-reason") -> dict[str, object]:
    return reports.make_record(kind, reason=reason, job_id="j", generation=0)


def test_REPORT_every_kind_has_one_source_and_make_record_refuses_another() -> None:
    assert {kind.source for kind in ReportKind} == set(Source)
    for kind in ReportKind:
        assert _record(kind.value)["source"] == kind.source.value
        other = next(source for source in Source if source is not kind.source)
        with pytest.raises(reports.ReportError, match=f"source {other.value!r} does not write kind"):
            reports.make_record(kind, source=other, reason="x", job_id="j", generation=0)


def test_REPORT_the_kinds_that_name_a_failure_are_the_faults_but_observer_failure() -> None:
    faults = {kind for kind in ReportKind if kind.is_fault}
    assert {kind for kind in ReportKind if kind.failure is not None} == faults - {ReportKind.OBSERVER_FAILURE}
    assert ReportKind.SDC.failure is FailureClass.SDC
    assert ReportKind.UNRESPONSIVE.failure is FailureClass.INACCESSIBLE
    assert {ReportKind.DESYNC.failure, ReportKind.GROUP_STALL.failure, ReportKind.INCONCLUSIVE.failure} == {
        FailureClass.HANG}
    # on_hang = "restart" acts on every observer finding that names a failure, and on nothing else.
    assert {kind for kind in ReportKind if kind.on_hang_restart} == {
        kind for kind in faults if kind.source is Source.OBSERVER and kind.failure is not None}


def test_REPORT_every_kind_the_picture_marks_per_rank_has_a_symbol() -> None:
    for kind in ReportKind:
        if kind.mark.style in (MarkStyle.RANKS, MarkStyle.STEP):
            assert kind.mark.symbol, kind


def test_RECOVERY_the_deciding_failure_is_the_one_that_rules_out_the_most() -> None:
    assert set(FAILURE_ORDER) == set(FailureClass) and len(FAILURE_ORDER) == len(FailureClass)
    assert deciding_failure([]) is None
    assert deciding_failure([FailureClass.STRAGGLER, FailureClass.HANG, FailureClass.DATA_STALL]) is FailureClass.HANG
    assert deciding_failure([FailureClass.HANG, FailureClass.SDC]) is FailureClass.SDC


def test_RECOVERY_an_attempts_failure_comes_from_the_reports_after_its_start() -> None:
    assert attempt_failure([]) is None  # no attempt ever started
    started = _record("restart", "started")
    assert attempt_failure([started]) is FailureClass.UNCERTAIN  # it stopped and nobody saw why
    hang, sdc, slow = _record("hang"), _record("sdc"), _record("straggler")
    assert attempt_failure([started, slow, hang]) is FailureClass.HANG
    assert attempt_failure([started, sdc, _record("restart", "sdc"), hang]) is FailureClass.SDC
    # Only the last attempt counts: the SDC belonged to the attempt before the restore.
    assert attempt_failure([started, sdc, _record("restart", "restored"), slow]) is FailureClass.STRAGGLER
    assert attempt_failure([started, _record("checkpoint", "recovery-verified"),
                            _record("unchecked")]) is FailureClass.UNCERTAIN
    assert attempt_failure([started, {**hang, "kind": "from-a-newer-schema"}]) is FailureClass.UNCERTAIN


def test_REPORT_no_module_but_the_kinds_compares_a_report_kind_with_a_string() -> None:
    """One fact, one home: ``record["kind"] == "sdc"`` (or ``in ("sdc", ...)``) outside
    scout/reports/kinds.py is a second list of kinds."""
    offenders = []
    for path in sorted(SCOUT.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if '"kind"' not in text:
            continue  # no subscript by "kind" to look at
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            keyed = any(isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Constant)
                        and s.slice.value == "kind" for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) and s.value in reports.KINDS
                          or isinstance(s, (ast.Tuple, ast.Set, ast.List))
                          and any(isinstance(e, ast.Constant) and e.value in reports.KINDS for e in s.elts)
                          for s in sides)
            if keyed and literal:
                offenders.append(f"{path.relative_to(SCOUT.parent)}:{node.lineno}")
    assert not offenders, "report kinds compared with string literals:\n" + "\n".join(offenders)
