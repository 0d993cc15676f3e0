"""The mark rule of tests/conftest.py: a test that starts a process without a ``processes`` or
``spawns`` mark fails at the start, naming the marks (``./dev test`` would run it beside another
test). Checked on ``processes.fail_on_start`` itself: every way a test could start a process is
refused, nothing is started, and everything is as before afterwards."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from multiprocessing import resource_tracker

import pytest

from tests import processes

MESSAGE = "started a process but is marked neither"


def _started() -> set[int]:
    """This process's descendants, less multiprocessing's helpers (which the rule allows)."""
    everything = processes.descendants()
    return {pid for pid, info in everything.items() if not processes.is_helper(info, everything)}


def _refused(start: Callable[[], object]) -> str:
    before = _started()
    with pytest.raises(pytest.fail.Exception) as refused, processes.fail_on_start(MESSAGE):
        start()
    # Only new processes count: a descendant left by an earlier test in this worker may end meanwhile.
    assert _started() - before == set(), "a refused start started nothing"
    return str(refused.value)


def test_subprocess_is_refused_and_named() -> None:
    said = _refused(lambda: subprocess.run([sys.executable, "-c", "pass"], check=False))
    assert MESSAGE in said and "subprocess._fork_exec" in said, said


def test_fork_is_refused() -> None:
    assert "os.fork" in _refused(lambda: os.fork())  # looked up inside the block


def test_posix_spawn_is_refused() -> None:
    assert "os.posix_spawn" in _refused(lambda: os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], {}))


def test_multiprocessing_spawn_is_refused() -> None:
    resource_tracker.ensure_running()  # a helper the rule allows: started here, not inside the block
    process = multiprocessing.get_context("spawn").Process(target=print)
    assert "fork_exec" in _refused(process.start)


def test_a_refusal_swallowed_by_the_code_under_test_still_fails_on_the_way_out() -> None:
    with (pytest.raises(pytest.fail.Exception) as refused, processes.fail_on_start(MESSAGE),
          contextlib.suppress(BaseException)):  # the code under test hides everything
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    assert MESSAGE in str(refused.value)


def test_everything_is_restored_after_the_block() -> None:
    originals = (subprocess._fork_exec, os.fork, os.posix_spawn)  # type: ignore[attr-defined]
    with processes.fail_on_start(MESSAGE):
        pass
    assert (subprocess._fork_exec, os.fork, os.posix_spawn) == originals  # type: ignore[attr-defined]
