"""Process hygiene for the test suite: every process a test starts is killed whole, and a test
that leaves one behind fails.

- :func:`run` replaces ``subprocess.run`` for tests: the command starts its own session (a new
  process group), and the whole group -- the command and everything it forked, such as the ranks
  of a launcher -- is killed when the command times out, when the test is interrupted, and when
  the command exits while anything it started is still running.
- :func:`die_with_parent` is the first call of every child program a test starts through
  ``multiprocessing`` (its ranks, its publishers): ``PR_SET_PDEATHSIG`` kills it when its parent
  (the test process or the forkserver) goes away, whatever state it is in.
- :func:`run_forked` runs a program's ``main`` like :func:`run` runs a command, but in a process
  forked from multiprocessing's forkserver, which imported torch and the rank programs once
  (:data:`FORKSERVER_PRELOAD`): a launch of four gloo ranks costs a fork instead of a Python start
  and a torch import (about 1.5 s of a 4 s test on this 2-core box).
- The session makes pytest a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so a process whose
  parent died is re-parented to pytest instead of init and stays visible; after every test,
  :func:`leftovers` lists the test's descendants still alive after ``EXIT_GRACE_S``; the
  conftest fixture kills them (their process group, then each) and fails the test naming them.

Linux only (``/proc``, ``prctl``); elsewhere the checks are skipped, never faked.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from scout.scenarios import launcher

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: How long a test's children may take to exit after the test body ended (reaped, flushed).
EXIT_GRACE_S = 5.0
POLL_S = 0.05
#: Long-lived helpers multiprocessing starts once per test process and stops at its exit.
HELPER_MARKERS = ("from multiprocessing.forkserver import main", "from multiprocessing.resource_tracker import main")
KILL_WAIT_S = 10.0
#: What the forkserver imports once, for every rank and launcher forked from it: torch, and the
#: programs of tests.replay._launch and the observer tests. One list for every user, because the
#: first context to start the server decides what it holds.
FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "scout.observer.instrument",
                      "tests.replay._launch", "tests.replay._scenarios", "tests.replay._moe_scenarios",
                      "tests.layouts._scenarios", "tests.job.guard_job", "tests.job.idle_loops_job",
                      "tests.job.warnings_job", "tests.unit.dcp_gate_job")


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def die_with_parent(signal_number: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``signal_number`` to this process when its parent dies."""
    _prctl(PR_SET_PDEATHSIG, signal_number)
    # The parent may already be gone (then we were re-parented before the call took effect).
    if os.getppid() == 1:
        os.kill(os.getpid(), signal_number)


@contextlib.contextmanager
def fail_on_start(message: str) -> Iterator[None]:
    """While inside, starting a process -- ``subprocess``, ``multiprocessing`` (fork or spawn),
    ``os.fork``, ``os.posix_spawn`` -- fails the test with ``message``, at the start itself and
    again on the way out (in case the code under test swallowed the first)."""
    import _posixsubprocess

    import pytest

    started: list[str] = []

    def refusing(name: str, original: Any) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            # multiprocessing's resource tracker and forkserver: one per test process, not a job.
            if any(marker in str(argument) for argument in args[:2] for marker in HELPER_MARKERS):
                return original(*args, **kwargs)
            started.append(name)
            pytest.fail(f"{message} (it called {name})", pytrace=False)
        return refuse

    # subprocess holds its own reference to fork_exec (``subprocess._fork_exec``); multiprocessing's
    # spawn calls the module's.
    patched = [(subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"), (os, "fork"), (os, "posix_spawn"),
               (os, "posix_spawnp")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patched if hasattr(owner, name)]
    for owner, name, original in saved:
        setattr(owner, name, refusing(f"{owner.__name__}.{name}", original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    if started:
        pytest.fail(f"{message} (it called {started[0]})", pytrace=False)


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process (so they can be found and reaped)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


@attrs.frozen
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int
    state: str
    command: str

    def describe(self) -> str:
        """One line; while the process lives, with the kernel function it sleeps in (wchan), which
        tells a futex from a pipe or a FIFO when a leftover has to be explained."""
        try:
            with open(f"/proc/{self.pid}/wchan", encoding="utf-8") as file:
                wchan = f", in {file.read() or '?'}"
        except OSError:
            wchan = ""
        return (f"pid {self.pid} (parent {self.ppid}, group {self.pgid}, state {self.state}{wchan}): "
                f"{self.command[:160]}")


def _info(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read().decode("utf-8", "replace")
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses; split after the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessInfo(pid, int(fields[1]), int(fields[2]), fields[0], command)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as file:
                found.extend(int(item) for item in file.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def descendants(root: int | None = None) -> dict[int, ProcessInfo]:
    """Every process below ``root`` (default: this one), by pid."""
    root = os.getpid() if root is None else root
    found: dict[int, ProcessInfo] = {}
    pending = _children(root)
    while pending and len(found) < 100_000:
        pid = pending.pop()
        if pid in found:
            continue
        info = _info(pid)
        if info is None:
            continue
        found[pid] = info
        pending.extend(_children(pid))
    return found


def is_helper(info: ProcessInfo, processes: dict[int, ProcessInfo] | None = None) -> bool:
    """multiprocessing's forkserver or resource tracker itself. A process the forkserver forked
    (a rank) carries the server's command line too; its parent is the server, so it is not one."""
    if not any(marker in info.command for marker in HELPER_MARKERS):
        return False
    parent = (processes or {}).get(info.ppid) or _info(info.ppid)
    return parent is None or HELPER_MARKERS[0] not in parent.command or HELPER_MARKERS[1] in info.command


def reap_zombies(pids: Sequence[int] | None = None) -> None:
    """Collect exited children of this process: ``pids`` (orphans re-parented to us, leftovers),
    or every one at the end of the session. Only named ones during the session: a child that a
    test's Popen or Process object still owns must be left for it to wait on."""
    if pids is not None:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        return
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _alive(info: ProcessInfo) -> bool:
    return info.state not in ("Z", "X")


def leftovers(before: set[int], grace_s: float = EXIT_GRACE_S) -> list[ProcessInfo]:
    """Descendants that are not in ``before``, not multiprocessing's helpers, and still alive
    after ``grace_s`` (zombie children are reaped on the way)."""
    deadline = time.monotonic() + grace_s
    while True:
        everything = descendants()
        current = [info for pid, info in everything.items() if pid not in before and not is_helper(info, everything)]
        reap_zombies([info.pid for info in current if info.state == "Z" and info.ppid == os.getpid()])
        alive = [info for info in current if _alive(info)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)


def kill(processes: Sequence[ProcessInfo]) -> None:
    """SIGKILL each process and its group (when that is not the test process's own); then wait a
    bounded time for them to be gone and reap what is ours."""
    own_group = os.getpgrp()
    for info in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(info.pid, signal.SIGKILL)  # delivered to a stopped process too
        if info.pgid not in (own_group, 0):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(info.pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    pids = {info.pid for info in processes}
    while time.monotonic() < deadline:
        reap_zombies(sorted(pids))
        remaining = [pid for pid in pids if (info := _info(pid)) is not None and _alive(info)]
        if not remaining:
            # One that died between the reap above and the look (a stopped process takes a moment
            # to act on SIGKILL) is a zombie now: reap it too, or it stays listed as ours.
            reap_zombies(sorted(pids))
            return
        time.sleep(POLL_S)


def run(command: Sequence[str], *, timeout: float, input: Any = None, check: bool = False,
        capture_output: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` with the command in a session of its own, killed whole: at the timeout
    (then ``TimeoutExpired``, as ``subprocess.run`` raises), on any exception, and at the
    command's exit (anything it left running in its group goes with it). The product's launcher
    (scout/scenarios/launcher.py) does it, for the tests as for the campaigns and benches."""
    return launcher.run_in_session(command, timeout_s=timeout, input=input, check=check,
                                   capture_output=capture_output, **kwargs)


def forkserver_context() -> Any:
    """multiprocessing's forkserver, preloading :data:`FORKSERVER_PRELOAD` (where it has not
    started yet); one thread per process, as on the rest of this box."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return context


def _forked_main(target: str, arguments: Sequence[str], env: Mapping[str, str], cwd: str, stdout_path: str,
                 stderr_path: str) -> None:
    """In the forked process: a session of its own (killed whole, like :func:`run`'s command), the
    caller's environment, directory and arguments, standard output and error to files; then
    ``module:function()``, whose return value is the exit code."""
    os.setsid()
    die_with_parent()
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    module_name, _, function = target.partition(":")
    sys.argv = [module_name, *arguments]
    sys.exit(getattr(importlib.import_module(module_name), function)())


def run_forked(target: str, arguments: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """``run([python, -m, module, *arguments], capture_output=True, text=True)`` for a program
    whose ``main()`` reads ``sys.argv`` -- ``target`` is ``"module:main"`` -- forked from the
    forkserver instead of started: the same session of its own killed whole (at the timeout, then
    ``TimeoutExpired``; on any exception; at its exit), the same exit code and captured output."""
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0: every run is bounded; got {timeout!r}")
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    command = [target, *arguments]
    environment = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="scout-forked-") as scratch:
        stdout_path, stderr_path = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        process = forkserver_context().Process(
            target=_forked_main, args=(target, list(arguments), environment, str(cwd or os.getcwd()), stdout_path,
                                       stderr_path))
        process.start()
        try:
            process.join(timeout)
            timed_out = process.exitcode is None
        finally:
            # Its session: the program and every rank it forked, whether it ended, timed out or
            # the test was interrupted.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.join(KILL_WAIT_S)
        output = [Path(path).read_text(encoding="utf-8", errors="replace") if os.path.exists(path) else ""
                  for path in (stdout_path, stderr_path)]
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, output[0], output[1])
    return subprocess.CompletedProcess(command, process.exitcode, output[0], output[1])
