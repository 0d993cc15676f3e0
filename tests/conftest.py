"""Shared pytest configuration, and process hygiene (tests/processes.py): pytest is a child
subreaper for the session, and a test that leaves a process behind fails, after its processes
are killed."""

from __future__ import annotations

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


def pytest_configure(config: pytest.Config) -> None:
    # Orphans (a rank whose launcher died, an observer whose trainer died) come back to pytest
    # instead of init, so the fixture below sees them.
    config.stash[_SUBREAPER] = processes.become_subreaper()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Nothing outlives the run: kill whatever is left below pytest (helpers exit with it)."""
    everything = processes.descendants()
    left = [info for info in everything.values() if not processes.is_helper(info, everything)]
    if left:
        processes.kill(left)
    processes.reap_zombies()


_SUBREAPER = pytest.StashKey[bool]()


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
        processes.kill(left)
        pytest.fail(
            f"{request.node.nodeid} left {len(left)} process(es) running {processes.EXIT_GRACE_S} s after it "
            "ended (now killed):\n  " + "\n  ".join(info.describe() for info in left),
            pytrace=False,
        )
