"""Shared pytest configuration, and process hygiene (tests/processes.py): pytest is a child
subreaper for the session, and a test that leaves a process behind fails, after its processes
are killed."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest

from tests import processes


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite-examples",
        action="store_true",
        default=False,
        help="rewrite the '->' lines of spec/examples/*.txt with the current answers",
    )
    parser.addoption(
        "--rewrite-traces",
        action="store_true",
        default=False,
        help="rewrite the expected output of tests/model_check/traces/*.txt with what the machines do now",
    )


# Every report any process of the test session writes (trainers, observers, the CLI) is copied
# to one audit file (scout.reports.append_record honours SCOUT_REPORT_AUDIT_FILE) and validated
# against the JSON Schema at the end: a report that breaks scout.report/1 fails the session.
_AUDIT_ENV = "SCOUT_REPORT_AUDIT_FILE"
BUDGET_PIN = "SCOUT_REPLAY_INTERVAL_STEPS"
_SUBREAPER = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    import os
    import tempfile

    # Orphans (a rank whose launcher died, an observer whose trainer died) come back to pytest
    # instead of init, so the fixture below sees them. Not under mutmut (./dev mutate), which runs
    # pytest inside its own process and waits for its forked workers with os.wait(): a subreaper
    # there also gets the orphans of a worker killed at its timeout, and mutmut stops on their
    # pids (KeyError in wait_for_result).
    config.stash[_SUBREAPER] = "mutmut" not in sys.modules and processes.become_subreaper()
    # The suite's jobs replay at the fixed cadence they were written for -- one hidden layer every
    # 2 steps, so an SDC of the example GPT is found within 8 steps -- set as a user sets it
    # (spec/budget.md BUDGET-8: an explicit cadence wins). Left unset, scout chooses the cadence
    # from overhead_budget, which for a tiny model on a loaded 2-core box is a cycle of a thousand
    # steps or more; the tests of the budget unset it (tests/job/test_budget_torchrun.py).
    os.environ.setdefault(BUDGET_PIN, "2")
    if _AUDIT_ENV not in os.environ and not hasattr(config, "workerinput"):
        handle, path = tempfile.mkstemp(prefix="scout-report-audit-", suffix=".jsonl")
        os.close(handle)
        os.environ[_AUDIT_ENV] = path
        config._scout_report_audit = path  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Nothing outlives the run: kill whatever is left below pytest (helpers exit with it); then
    audit every report the session wrote."""
    everything = processes.descendants()
    left = [info for info in everything.values() if not processes.is_helper(info, everything)]
    if left:
        processes.kill(left)
    processes.reap_zombies()
    _audit_reports(session)


def _audit_reports(session: pytest.Session) -> None:
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


# Tests that start processes carry a mark. `processes` (torchdist and mpi imply it): jobs of real
# ranks, sidecars, observers, anything with a deadline or a timing -- `./dev test` runs these one at
# a time, after the others: a job of 4 ranks on 2 cores already uses the box, and its deadlines and
# straggler checks were written for a box it does not share. `spawns`: short helpers (a CLI, a
# compiler, crosshair) that may run beside another test, with the in-process tests on both cores.
# `light`: process tests that mostly wait -- measured under a quarter to four fifths of a core
# (the emulated-NCCL innocence and device campaigns, the transport conformance fixtures, the ops
# servers' abuse) -- and assert no timing tighter than seconds: `./dev test` runs these two at a
# time, each file on one worker (its module's job is shared), so two of them take at most ~1.5 cores.
_IMPLY_PROCESSES = ("torchdist", "mpi", "light")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in _IMPLY_PROCESSES):
            item.add_marker(pytest.mark.processes)


def _fail_unmarked_starts(item: pytest.Item) -> contextlib.AbstractContextManager[None]:
    """A test marked neither `processes` nor `spawns` that starts a process (in its setup -- a
    module's job fixture -- or its body) fails, naming the marks: under `./dev test` it would run
    beside another test, and a job beside a job is not the box its timings were written for."""
    if item.get_closest_marker("processes") is not None or item.get_closest_marker("spawns") is not None:
        return contextlib.nullcontext()
    return processes.fail_on_start(
        f"{item.nodeid} started a process but is marked neither `processes` (a job, or anything whose "
        "timing matters: ./dev test runs these one at a time) nor `spawns` (short helpers -- a CLI, a "
        "compiler, crosshair -- that may run beside another test): mark the test or its module")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _fail_unmarked_starts(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _fail_unmarked_starts(item):
        return (yield)


@pytest.fixture(autouse=True)
def no_process_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that leaves a process running (after a grace period for exits in flight);
    the processes are killed either way."""
    if not request.config.stash.get(_SUBREAPER, False):
        yield
        return
    before = set(processes.descendants())
    yield
    left = processes.leftovers(before)
    if left:
        described = [info.describe() for info in left]  # before the kill: where each one sleeps
        processes.kill(left)
        pytest.fail(
            f"{request.node.nodeid} left {len(left)} process(es) running {processes.EXIT_GRACE_S} s after it "
            "ended (now killed):\n  " + "\n  ".join(described),
            pytrace=False,
        )
