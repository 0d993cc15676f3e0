"""Shared pytest configuration."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite-examples",
        action="store_true",
        default=False,
        help="rewrite the '->' lines of spec/examples/*.txt with the current answers",
    )


# Every report any process of the test session writes (trainers, observers, the CLI) is copied
# to one audit file (scout.reports.append_record honours SCOUT_REPORT_AUDIT_FILE) and validated
# against the JSON Schema at the end: a report that breaks scout.report/1 fails the session.
_AUDIT_ENV = "SCOUT_REPORT_AUDIT_FILE"


def pytest_configure(config: pytest.Config) -> None:
    import os
    import tempfile

    if _AUDIT_ENV not in os.environ and not hasattr(config, "workerinput"):
        handle, path = tempfile.mkstemp(prefix="scout-report-audit-", suffix=".jsonl")
        os.close(handle)
        os.environ[_AUDIT_ENV] = path
        config._scout_report_audit = path  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import json
    import os

    path = getattr(session.config, "_scout_report_audit", None)
    if path is None:
        return
    try:
        from tests.unit.test_report_schema import schema_errors

        with open(path, encoding="utf-8") as file:
            lines = [line for line in file if line.strip()]
        problems = [f"{error}: {line[:300]}" for line in lines for error in schema_errors(json.loads(line))]
    finally:
        os.unlink(path)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"scout report schema: {len(lines)} report(s) written by this session, "
                            f"{len(problems)} invalid")
    if problems:
        if reporter is not None:
            for problem in problems[:20]:
                reporter.write_line(f"  invalid report: {problem}", red=True)
        session.exitstatus = 1
