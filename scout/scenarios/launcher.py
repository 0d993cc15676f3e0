"""One way to start a ``torchrun`` job, shared by the campaigns, the benches and the tests: the
command, the environment, and a bounded run that kills the job whole.

* :func:`torchrun_command` -- ``python -m torch.distributed.run`` (this interpreter's torch) with
  ``--nproc-per-node``, ``--standalone`` or a c10d :class:`Rendezvous` for several "nodes",
  ``--max-restarts``, then the script (or ``-m module``) and its arguments;
* :func:`torchrun_env` -- the caller's environment with one thread per rank
  (``OMP_NUM_THREADS=1``: a 2-core box runs many ranks), torch's rendezvous store not shared with
  the workers (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: torch 2.13 shares it, and a restarted
  attempt then reads the previous attempt's addresses, pytorch issue 135712), scout's settings as ``SCOUT_*``
  variables, and what the caller adds or drops;
* :func:`run_in_session` -- ``subprocess.run`` with the command in a session of its own (a new
  process group: the agent, its ranks and their observers), killed whole at the timeout (then
  ``TimeoutExpired``), on any exception, and at the command's exit (whatever it left running in
  its group goes with it). :func:`launch` runs a job with it and returns :class:`Finished`
  (``returncode`` None when it was killed at the timeout), never raising for a slow job.

No torch here: the job imports it, the launcher does not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.core.guards import whole_number

__all__ = ["Finished", "Rendezvous", "launch", "run_in_session", "setting_variable", "torchrun_command",
           "torchrun_env"]

#: Always set for a job's ranks (see the module's docstring for why).
JOB_ENV: Final = {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
#: How often a bounded run looks at its command and the clock.
POLL_S: Final = 0.2
#: How long the output of a killed job may take to drain.
KILL_WAIT_S: Final = 10.0


@attrs.frozen
class Rendezvous:
    """A c10d rendezvous of ``nodes`` torchrun agents at ``endpoint`` (``host:port``), instead of
    ``--standalone``: each agent is one "node" of a multi-node job."""

    endpoint: str
    run_id: str
    nodes: int

    def arguments(self) -> list[str]:
        return ["--nnodes", str(self.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint,
                "--rdzv-id", self.run_id]


def torchrun_command(script: str | Path, ranks: int, args: Sequence[object] = (), *, module: bool = False,
                     max_restarts: int | None = None, rendezvous: Rendezvous | None = None) -> list[str]:
    """The command that runs ``script`` (a path, or with ``module`` a module name) on ``ranks``
    ranks of this node under torchrun, with ``args`` after it."""
    if not whole_number(ranks) or ranks < 1:
        raise ValueError(f"ranks must be a whole number >= 1 (the ranks of this node), got {ranks!r}")
    if max_restarts is not None and (not whole_number(max_restarts) or max_restarts < 0):
        raise ValueError(f"max_restarts must be a whole number >= 0 or None (torchrun's default), got {max_restarts!r}")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    command += ["--standalone"] if rendezvous is None else rendezvous.arguments()
    if max_restarts is not None:
        command += ["--max-restarts", str(max_restarts)]
    command += ["-m", str(script)] if module else [str(script)]
    return command + [str(argument) for argument in args]


def setting_variable(name: str) -> str:
    """The environment variable of scout's setting ``name`` (``stall_threshold_s`` ->
    ``SCOUT_STALL_THRESHOLD_S``)."""
    if not name.isidentifier() or name.upper().startswith("SCOUT_"):
        raise ValueError(f"a setting is named as in scout's configuration (stall_threshold_s), without the "
                         f"SCOUT_ prefix; got {name!r}")
    return f"SCOUT_{name.upper()}"


def torchrun_env(settings: Mapping[str, object] | None = None, *, extra: Mapping[str, str] | None = None,
                 drop_prefixes: Sequence[str] = (), keep: Collection[str] = (), pythonpath: Sequence[str | Path] = (),
                 share_store: bool = False, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ``base`` (default this process's) less the variables whose names
    start with one of ``drop_prefixes`` (unless named in ``keep``), then :data:`JOB_ENV` (without
    the store variable when ``share_store``), ``extra``, scout's ``settings`` as ``SCOUT_*``
    variables, and ``pythonpath`` put in front of ``PYTHONPATH``."""
    env = {key: value for key, value in (os.environ if base is None else base).items()
           if key in keep or not key.startswith(tuple(drop_prefixes))}
    env.update(JOB_ENV)
    if share_store:
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    env.update(extra or {})
    env.update({setting_variable(name): str(value) for name, value in (settings or {}).items()})
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*(str(path) for path in pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_in_session(command: Sequence[str], *, timeout_s: float, input: Any = None, check: bool = False,
                   capture_output: bool = False, **popen: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` with ``command`` in a session of its own, killed whole: at ``timeout_s``
    (then ``TimeoutExpired``, as ``subprocess.run`` raises), on any exception, and at the
    command's exit (anything it left running in its group goes with it)."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0: every run is bounded; got {timeout_s!r}")
    if capture_output:
        popen["stdout"] = subprocess.PIPE
        popen["stderr"] = subprocess.PIPE
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(list(command), start_new_session=True, **popen) as process:
        try:
            while True:
                try:
                    stdout, stderr = process.communicate(input, timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    input = None  # communicate sent it already
                    if process.poll() is not None:
                        _kill_group(process.pid)  # it exited, but something it started holds its pipes
                    elif time.monotonic() >= deadline:
                        _kill_group(process.pid)
                        stdout, stderr = process.communicate(timeout=KILL_WAIT_S)
                        raise subprocess.TimeoutExpired(process.args, timeout_s, stdout, stderr) from None
        except BaseException:
            _kill_group(process.pid)
            raise
        finally:
            _kill_group(process.pid)
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        completed.check_returncode()
    return completed


@attrs.frozen
class Finished:
    """A job that ran: its exit code (None: killed at ``timeout_s``), its output and wall time."""

    command: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timeout_s: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


def launch(command: Sequence[str], env: Mapping[str, str], *, timeout_s: float, cwd: str | Path | None = None,
           log_path: Path | None = None, merge_stderr: bool = False) -> Finished:
    """Run a job (:func:`torchrun_command`, :func:`torchrun_env`) in its own session, bounded by
    ``timeout_s``. Its output is captured (stderr into stdout with ``merge_stderr``), or with
    ``log_path`` written there, both streams, and read back as ``stdout``. A job killed at the
    timeout says so at the end of its ``stderr`` (``stdout`` when merged or logged)."""
    started = time.monotonic()
    streams: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT if merge_stderr else subprocess.PIPE}
    with contextlib.ExitStack() as stack:
        if log_path is not None:
            streams = {"stdout": stack.enter_context(log_path.open("w", encoding="utf-8")), "stderr": subprocess.STDOUT}
        try:
            done = run_in_session(command, timeout_s=timeout_s, cwd=cwd, env=dict(env), text=True, **streams)
            code: int | None = done.returncode
            stdout, stderr = _text(done.stdout), _text(done.stderr)
        except subprocess.TimeoutExpired as expired:
            code, stdout, stderr = None, _text(expired.stdout), _text(expired.stderr)
    if log_path is not None:
        stdout = log_path.read_text(encoding="utf-8", errors="replace")
    if code is None:
        note = f"\nscout launcher: the job ran past timeout_s={timeout_s} and its process group was killed\n"
        if log_path is not None or merge_stderr:
            stdout += note
        else:
            stderr += note
    return Finished(tuple(command), code, stdout, stderr, time.monotonic() - started, timeout_s)
