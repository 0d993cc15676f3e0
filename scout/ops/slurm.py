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
step fails the job stays held, and the error says how to release it by hand (OPS-10: whatever
failed, a ``scontrol`` that could not even be started included). What can be checked before the
job is touched is checked first: the exclude file (:func:`read_exclude_file`: missing, a
directory, not UTF-8, too large -- each a :class:`SlurmError` naming it) and the length of the
``ExcNodeList`` argument, which one ``scontrol`` argument can hold. Run it where ``scontrol``
reaches the controller and not inside the job itself: requeueing a job ends its processes, this
command included.
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

__all__ = ["EXCLUDE_FILE_BYTES_MAX", "EXCLUDE_LIST_BYTES_MAX", "RequeueResult", "SlurmError", "excluded_hosts",
           "host_name", "read_exclude_file", "requeue_excluding"]

SCONTROL_TIMEOUT_S: Final = 30.0
PENDING_POLL_S: Final = 0.2
#: OPS-10: an exclude file larger than this is refused (scout writes one short line per host).
EXCLUDE_FILE_BYTES_MAX: Final = 1 << 20
#: OPS-10: the ``ExcNodeList=...`` argument at most; Linux refuses one argument over 128 KiB
#: (MAX_ARG_STRLEN) with "argument list too long", so a longer list is refused before the hold.
EXCLUDE_LIST_BYTES_MAX: Final = 100_000
#: How much of a failed command line an error quotes.
COMMAND_CHARS_SHOWN: Final = 300
_JOB_ID: Final = re.compile(r"^[0-9]+(_[0-9]+)?\Z")  # \Z, not $: "$" also matches before a final newline
_FIELD: Final = re.compile(r"(\w+)=(\S*)")


class SlurmError(RuntimeError):
    """A Slurm command failed or the job is not in a state this operation can use."""


def host_name(environ: Mapping[str, str] | None = None) -> str:
    """OPS-7: the name this host is reported by -- Slurm's node name under Slurm."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def excluded_hosts(path: str | os.PathLike[str]) -> list[str]:
    """The hosts of an exclude-hosts file (one per line, as scout writes it), in order, once
    each; a missing file has none. Any other problem is a SlurmError naming it (OPS-10)."""
    try:
        return read_exclude_file(path)
    except FileNotFoundError:
        return []


def read_exclude_file(path: str | os.PathLike[str]) -> list[str]:
    """OPS-10: the hosts of an exclude-hosts file, in order, once each. A missing file raises
    FileNotFoundError (the caller decides what that means); a directory, a file that is not
    UTF-8 text, one over ``EXCLUDE_FILE_BYTES_MAX`` or one that cannot be read is a SlurmError
    that names it and says what to do."""
    target = Path(path)
    try:
        with open(target, "rb") as file:
            data = file.read(EXCLUDE_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise SlurmError(f"{target} is a directory, not an exclude-hosts file (one host name per line); remove it "
                         "or pass --exclude-file") from None
    except OSError as error:
        raise SlurmError(f"cannot read the exclude-hosts file {target}: {error.strerror or error}") from None
    if len(data) > EXCLUDE_FILE_BYTES_MAX:
        raise SlurmError(f"{target} is over {EXCLUDE_FILE_BYTES_MAX} bytes: not an exclude-hosts file scout wrote "
                         "(one host name per line); check it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SlurmError(f"{target} is not UTF-8 text (byte {error.start}: {data[error.start:error.start + 1]!r}): "
                         "scout writes host names one per line; fix or remove it") from None
    return list(dict.fromkeys(text.split()))


Runner = Callable[[Sequence[str]], str]


def run_scontrol(arguments: Sequence[str], scontrol: str = "scontrol") -> str:
    """One ``scontrol`` call, bounded by ``SCONTROL_TIMEOUT_S``; its stdout, or SlurmError."""
    command = [scontrol, *arguments]
    shown = shlex.join(command)
    shown = shown if len(shown) <= COMMAND_CHARS_SHOWN else shown[:COMMAND_CHARS_SHOWN] + f"... ({len(shown)} chars)"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{scontrol!r} was not found: run this where Slurm's commands are installed") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shown} did not answer within {SCONTROL_TIMEOUT_S:g} s") from None
    except OSError as error:  # "argument list too long" (E2BIG) and the like: OPS-10
        raise SlurmError(f"{shown} could not be started: {error.strerror or error}") from None
    if done.returncode != 0:
        raise SlurmError(f"{shown} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[:2000]}")
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
    # OPS-10: a list one scontrol argument cannot hold is refused before the job is touched.
    _check_list_length(job_id, [*_listed(fields.get("ExcNodeList", "")), *hosts])
    if state == "PENDING":
        run(["hold", job_id])
    else:
        run(["requeuehold", job_id])
    held_note = f"job {job_id} is held; release it by hand with: scontrol release {job_id}"
    try:
        return _exclude_and_release(job_id, hosts, state, run, timeout_s, clock, sleep, held_note)
    except SlurmError as error:
        # OPS-10: whatever failed after the hold, the message says the job is held and how to release it.
        if held_note in str(error):
            raise
        raise SlurmError(f"{error}; {held_note}") from None


def _listed(hostlist: str) -> list[str]:
    """The names of a host list without expanding its ranges (enough to bound its length)."""
    return [] if hostlist in ("", "(null)") else [hostlist]


def _check_list_length(job_id: str, names: Sequence[str], *, held: bool = False) -> None:
    length = len("ExcNodeList=") + len(",".join(names))
    if length > EXCLUDE_LIST_BYTES_MAX:
        raise SlurmError(
            f"excluding these {len(names)} host(s) from job {job_id} takes an ExcNodeList of {length} bytes, over the "
            f"{EXCLUDE_LIST_BYTES_MAX} one scontrol argument may hold (the kernel refuses longer ones: argument list "
            f"too long){'' if held else '; the job was not touched'}. Shorten the exclude file (a Slurm range such "
            "as node[1-40] is one entry) or drain the hosts instead (scontrol update NodeName=... State=DRAIN)")


def _exclude_and_release(job_id: str, hosts: Sequence[str], state: str, run: Runner, timeout_s: float,
                         clock: Callable[[], float], sleep: Callable[[float], None], held_note: str) -> RequeueResult:
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
        _check_list_length(job_id, wanted, held=True)
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
