"""Slurm: the host names scout reports, and the restart that never lands on a host scout named
(spec/ops.md OPS-7, OPS-8; docs/cluster.md has the sbatch script).

*Host names.* Under Slurm a host is reported by its Slurm node name (``SLURMD_NODENAME``), the
name ``--exclude`` and ``ExcNodeList`` accept; elsewhere by ``socket.gethostname()``.

*Requeue.* :func:`requeue_excluding` requeues a batch job so that its next run excludes the hosts
of ``run_dir/exclude_hosts.txt``. Slurm only lets a *pending* job's ``ExcNodeList`` change, and a
requeued job may start as soon as it is pending, so the order matters: requeue it *held*
(``scontrol requeuehold``: pending, and it cannot start), wait until it is pending, add the hosts
to its ``ExcNodeList``, read the job back and check that every host is excluded, and only then
release it (``StartTime=now`` clears the delay Slurm puts on a requeued job's begin time). If any
step fails the job stays held, and the error says how to release it by hand. Run it where
``scontrol`` reaches the controller and not inside the job itself: requeueing a job ends its
processes, this command included.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

__all__ = ["RequeueResult", "SlurmError", "excluded_hosts", "host_name", "requeue_excluding"]

SCONTROL_TIMEOUT_S: Final = 30.0
PENDING_POLL_S: Final = 0.2
_JOB_ID: Final = re.compile(r"^[0-9]+(_[0-9]+)?$")
_FIELD: Final = re.compile(r"(\w+)=(\S*)")


class SlurmError(RuntimeError):
    """A Slurm command failed or the job is not in a state this operation can use."""


def host_name(environ: Mapping[str, str] | None = None) -> str:
    """OPS-7: the name this host is reported by -- Slurm's node name under Slurm."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def excluded_hosts(path: str | os.PathLike[str]) -> list[str]:
    """The hosts of an exclude-hosts file (one per line, as scout writes it), in order, once each."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return list(dict.fromkeys(text.split()))


Runner = Callable[[Sequence[str]], str]


def run_scontrol(arguments: Sequence[str], scontrol: str = "scontrol") -> str:
    """One ``scontrol`` call, bounded by ``SCONTROL_TIMEOUT_S``; its stdout, or SlurmError."""
    command = [scontrol, *arguments]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{scontrol!r} was not found: run this where Slurm's commands are installed") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(command)} did not answer within {SCONTROL_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise SlurmError(f"{shlex.join(command)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout


def job_fields(job_id: str, run: Runner) -> dict[str, str]:
    """``scontrol show job -o JOB``'s fields (the first record: an array job's own)."""
    lines = [line for line in run(["show", "job", "-o", job_id]).splitlines() if line.strip()]
    if not lines:
        raise SlurmError(f"scontrol knows no job {job_id}")
    return dict(_FIELD.findall(lines[0]))


def expand_hosts(hostlist: str, run: Runner) -> list[str]:
    """A Slurm host list (``node[1-3],gpu7``) as names; ``(null)`` or empty is none."""
    if hostlist in ("", "(null)"):
        return []
    return run(["show", "hostnames", hostlist]).split()


@attrs.frozen
class RequeueResult:
    job_id: str
    state_before: str
    excluded: tuple[str, ...]  # the job's ExcNodeList after the update, expanded
    added: tuple[str, ...]  # hosts of the exclude file that were not excluded before


def requeue_excluding(job_id: str, hosts: Sequence[str], *, run: Runner = run_scontrol, timeout_s: float = 60.0,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> RequeueResult:
    """OPS-8: requeue batch job ``job_id`` held, exclude ``hosts`` (added to its ExcNodeList),
    check, release. Raises SlurmError (the job then stays held) when a step fails."""
    if not _JOB_ID.match(job_id):
        raise SlurmError(f"job id {job_id!r} is not a Slurm job id (digits, or JOB_TASK for an array task)")
    if not 0 < timeout_s <= 3600:
        raise SlurmError(f"timeout_s must be in (0, 3600] seconds, got {timeout_s!r}")
    bad = [host for host in hosts if not host or any(c in host for c in ",[]= \t\n")]
    if bad:
        raise SlurmError(f"host names {bad!r} cannot go into a Slurm host list")
    fields = job_fields(job_id, run)
    state = fields.get("JobState", "?")
    if fields.get("BatchFlag") == "0":
        raise SlurmError(f"job {job_id} is not a batch job (srun/salloc): only sbatch jobs can be requeued")
    if state == "PENDING":
        run(["hold", job_id])
    else:
        run(["requeuehold", job_id])
    held_note = f"job {job_id} is held; release it by hand with: scontrol release {job_id}"
    deadline = clock() + timeout_s
    while True:
        fields = job_fields(job_id, run)
        if fields.get("JobState") == "PENDING":
            break
        if clock() >= deadline:
            raise SlurmError(f"job {job_id} was not pending {timeout_s:g} s after the requeue "
                             f"(state {fields.get('JobState')}); {held_note}")
        sleep(PENDING_POLL_S)
    before = expand_hosts(fields.get("ExcNodeList", ""), run)
    wanted = list(dict.fromkeys([*before, *hosts]))
    added = tuple(host for host in hosts if host not in before)
    if added:
        run(["update", f"JobId={job_id}", f"ExcNodeList={','.join(wanted)}"])
    excluded = expand_hosts(job_fields(job_id, run).get("ExcNodeList", ""), run)
    missing = [host for host in hosts if host not in excluded]
    if missing:
        raise SlurmError(f"job {job_id}'s ExcNodeList is {excluded} after the update, without {missing}; {held_note}")
    # Slurm delays a requeued job's begin time (about two minutes); the hosts are excluded, so
    # it may start now.
    run(["update", f"JobId={job_id}", "StartTime=now"])
    run(["release", job_id])
    return RequeueResult(job_id, state, tuple(excluded), added)
