"""Reports (``scout.report/1``): one schema for every kind, a JSON Schema file in the package,
and every report any test writes is validated against it at the end of the session
(tests/conftest.py)."""

from __future__ import annotations

import json
import os
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from scout import reports

pytestmark = pytest.mark.spawns


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(resources.files("scout.reports").joinpath("report.schema.json").read_text())
    return loaded


def schema_errors(record: Any) -> list[str]:
    """What the JSON Schema says is wrong with ``record`` (empty: valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    return [f"{'/'.join(map(str, error.path)) or '<root>'}: {error.message}" for error in validator.iter_errors(record)]


def test_REPORT_the_schema_file_is_a_valid_json_schema_naming_every_kind() -> None:
    import jsonschema

    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["kind"]["enum"] == list(reports.KINDS)
    assert schema["properties"]["source"]["enum"] == list(reports.SOURCES)
    assert schema["properties"]["schema"]["const"] == reports.SCHEMA


@pytest.mark.parametrize("kind", reports.KINDS)
def test_REPORT_every_kind_built_by_make_record_validates(kind: str) -> None:
    record = reports.make_record(kind, reason="a-reason", job_id="j", generation=1, ranks=[3],
                                 hosts=["h"], step=7, evidence={"x": 1}, reporter_rank=0)
    assert schema_errors(record) == []


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [("kind", "hung", "kind"), ("source", "elsewhere", "source"), ("reason", "Not A Code", "reason"),
     ("ranks", [-1], "ranks"), ("ranks", "01", "ranks"), ("step", -2, "step"), ("generation", True, "generation"),
     ("hosts", [1], "hosts"), ("evidence", [], "evidence"), ("job_id", "", "job_id")],
)
def test_REPORT_a_bad_field_is_refused_naming_it(field: str, value: Any, named: str) -> None:
    fields: dict[str, Any] = dict(source="observer", reason="ok", job_id="j", generation=0)
    kind = "hang"
    if field == "kind":
        kind = value
    else:
        fields[field] = value
    with pytest.raises(reports.ReportError, match=named):
        reports.make_record(kind, **fields)


def test_REPORT_the_schema_refuses_what_make_record_refuses() -> None:
    good = reports.make_record("sdc", source="replay", reason="replay-mismatch", job_id="j", generation=0, ranks=[1])
    assert schema_errors(good) == []
    for field, value in (("kind", "hung"), ("ranks", [-1]), ("reason", "Bad Reason"), ("time", "yesterday")):
        assert schema_errors({**good, field: value}), field
    assert schema_errors({**good, "extra": 1})


def test_REPORT_concurrent_appends_from_threads_and_processes_never_tear_a_line(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    record = reports.make_record("hang", source="observer", reason="behind-majority", job_id="j", generation=0,
                                 ranks=[2], evidence={"pad": "x" * 5000})

    def append(count: int) -> None:
        for _ in range(count):
            reports.append_record(path, record)

    pids = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                append(30)
            finally:
                os._exit(0)
        pids.append(pid)
    threads = [threading.Thread(target=append, args=(30,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for pid in pids:
        os.waitpid(pid, 0)
    assert reports.read_records(path) == [record] * 180
    assert len(path.read_text().splitlines()) == 180
