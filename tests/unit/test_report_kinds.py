"""Report kinds: one home (scout/reports/kinds.py) for what every ``kind`` means -- its source,
whether it is a fault, the failure class a restart recovers from, the observer's restart set,
the trainer's warnings and the picture's mark -- and nothing else in scout keeps a list."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scout import reports
from scout.core.failure import FAILURE_ORDER, FailureClass, deciding_failure
from scout.core.observer.model import Finding, StallKind
from scout.core.straggler.tracking import StragglerKind
from scout.gate.model import Trust
from scout.reports.kinds import (
    STRAGGLER_KINDS,
    CheckpointReason,
    FinishedReason,
    MarkStyle,
    ObserverReason,
    ReportKind,
    RestartReason,
    SdcReason,
    Source,
    StragglerReason,
    UncheckedReason,
    attempt_failure,
    observer_kind,
    observer_reason,
    trust_reason,
)

REASON_FAMILIES = (ObserverReason, RestartReason, FinishedReason, CheckpointReason, SdcReason, UncheckedReason,
                   StragglerReason)

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


#: A report's kind and reason codes, and the kinds of straggler (a timing line's ``kind``): what
#: only kinds.py may spell.
KIND_VALUES = frozenset(kind.value for kind in ReportKind)
REASON_VALUES = frozenset(reason.value for family in REASON_FAMILIES for reason in family)


def _field(node: ast.expr) -> str | None:
    """``"kind"`` or ``"reason"`` if ``node`` reads that field of a record (``r["kind"]``,
    ``r.get("kind")``) or is a variable of that name (not an attribute: ``fault.kind`` is a
    fault's kind)."""
    key: object = None
    if isinstance(node, ast.Name):
        key = node.id
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = node.slice.value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
          and node.args and isinstance(node.args[0], ast.Constant)):
        key = node.args[0].value
    return key if key in ("kind", "reason") else None


def _values(node: ast.expr | None) -> list[str]:
    """The string constants ``node`` is or holds (a tuple, list or set display, an if-else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in _values(element)]
    if isinstance(node, ast.IfExp):
        return _values(node.body) + _values(node.orelse)
    return []


def _spelled(field: str, node: ast.expr | None) -> list[str]:
    vocabulary = KIND_VALUES | set(STRAGGLER_KINDS) if field == "kind" else REASON_VALUES
    return [value for value in _values(node) if value in vocabulary]


def vocabulary_spellings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each place ``tree`` spells a report kind or reason code as a string
    where a report's kind or reason is meant: compared with a record's ``kind``/``reason``, as a
    ``"kind"``/``"reason"`` entry of a dict display, a ``kind=``/``reason=`` argument or a
    ``kind``/``reason`` variable; and any display of two or more report kinds, or of the
    kinds of straggler (a second list of kinds)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for field in {_field(side) for side in sides} - {None}:
                found += [(node.lineno, f"{field} compared with {v!r}") for side in sides
                          for v in _spelled(str(field), side)]
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in ("kind", "reason"):
                    found += [(node.lineno, f"{key.value!r}: {v!r}") for v in _spelled(key.value, value)]
        elif isinstance(node, ast.Call):
            found += [(node.lineno, f"{kw.arg}={v!r}") for kw in node.keywords if kw.arg in ("kind", "reason")
                      for v in _spelled(kw.arg, kw.value)]
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("make_record", "record"):  # make_record(kind, ...), a reporter's record(kind, reason, ...)
                for field, argument in zip(("kind", "reason"), node.args[:2], strict=False):
                    found += [(node.lineno, f"{name}({field}={v!r})") for v in _spelled(field, argument)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                if name in ("kind", "reason"):
                    found += [(node.lineno, f"{name} = {v!r}") for v in _spelled(name, node.value)]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = _values(node)
            if len(values) >= 2 and (set(values) <= KIND_VALUES or set(values) <= set(STRAGGLER_KINDS)):
                found.append((node.lineno, f"a list of kinds {values}"))
    return found


def test_REPORT_no_module_but_the_kinds_spells_a_report_kind_or_reason() -> None:
    """One fact, one home: ``record["kind"] == "sdc"``, ``reason="restored"``, ``{"kind":
    "straggler"}`` or a tuple of kinds outside scout/reports/kinds.py is a second vocabulary that
    nothing keeps in step with the first. Spell ``ReportKind.SDC``, ``RestartReason.RESTORED``."""
    offenders = []
    for path in sorted(SCOUT.rglob("*.py")):
        where = str(path.relative_to(SCOUT.parent))
        if where == "scout/reports/kinds.py":
            continue
        for line, what in vocabulary_spellings(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{where}:{line}: {what}")
    assert not offenders, "report kinds or reasons spelled as strings:\n" + "\n".join(offenders)


@pytest.mark.parametrize(("source", "spelled"), [
    ('if record["kind"] == "sdc": pass', True),
    ('if r.get("reason") in ("started", "x"): pass', True),
    ('make_record("hang", reason="behind-majority", job_id="j", generation=0)', True),
    ('args = {"kind": "straggler", "reason": f"{k}-slow"}', True),
    ('reason = "closed" if ok else "exception"', True),
    ('if kind == "restart" and reason != "started": pass', True),
    ('reporter.record(ReportKind.RESTART, "restored" if c else "started", step=1)', True),
    ('KINDS = ("device", "communication", "loop")', True),
    ('if fault.kind == "desync": pass', False),  # a fault's kind, not a report's
    ('FAILURES = ("sdc", "hang", "data-stall")', False),  # failure classes, not report kinds
    ('if record["kind"] == ReportKind.SDC: pass', False),
])
def test_REPORT_the_vocabulary_scan_finds_spellings_and_only_them(source: str, spelled: bool) -> None:
    assert bool(vocabulary_spellings(ast.parse(source))) is spelled


def test_REPORT_reason_codes_parse_back_and_name_their_parts() -> None:
    assert RestartReason.parse("restored") is RestartReason.RESTORED
    assert RestartReason.parse("from-a-newer-schema") is None and RestartReason.parse(None) is None
    assert StragglerReason.parse("recovered-loop-slow") is StragglerReason.RECOVERED_LOOP_SLOW
    assert {(r.straggler, r.change) for r in StragglerReason} == {
        (kind, change) for kind in STRAGGLER_KINDS for change in ("confirmed", "recovered", "localized")}
    for reason in StragglerReason:
        assert StragglerReason.of(reason.straggler, reason.change) is reason
    with pytest.raises(ValueError, match="no straggler reason for kind 'gpu'"):
        StragglerReason.of("gpu", "confirmed")
    assert len(REASON_VALUES) == sum(len(family) for family in REASON_FAMILIES)  # no code in two families


def test_REPORT_every_machine_vocabulary_translates_by_table_not_by_value() -> None:
    """The kinds of straggler are StragglerKind's, in its order; every observer finding that is
    reported, every stall kind and every trust state has its own row."""
    assert tuple(kind.value for kind in StragglerKind) == STRAGGLER_KINDS
    assert {observer_kind(Finding.BEHIND, stall) for stall in StallKind} == {
        ReportKind.HANG, ReportKind.DATA_STALL, ReportKind.CHECKPOINT_STALL, ReportKind.DESYNC}
    reported = set(Finding) - {Finding.BEHIND, Finding.UNSETTLED}
    assert {observer_kind(finding, StallKind.HANG) for finding in reported} == {
        ReportKind.DESYNC, ReportKind.GROUP_STALL, ReportKind.UNRESPONSIVE, ReportKind.INCONCLUSIVE}
    with pytest.raises(ValueError, match="never reported"):
        observer_kind(Finding.UNSETTLED, StallKind.HANG)
    assert observer_reason(Finding.BEHIND, (3,), (3,)) is ObserverReason.AHEAD_OF_MAJORITY
    assert observer_reason(Finding.BEHIND, (3,), ()) is ObserverReason.BEHIND_MAJORITY
    assert {trust_reason(trust).value for trust in Trust} == {
        trust.value.lower().replace("_", "-") for trust in Trust}
