"""A single-host Slurm cluster for tests: one ``slurmctld`` and two ``slurmd`` on loopback, each
slurmd playing one node (``scoutnode1``, ``scoutnode2``: two node names on the one host), from a
generated ``slurm.conf`` in the test's directory, with Slurm's ``auth/none`` (no munge daemon
to start; it is a test cluster on loopback that nothing else can reach). Every daemon runs in the
foreground in a session of its own and is ended by the test. :func:`start` raises
:class:`Unavailable` with a one-line reason where Slurm is not installed or does not start."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from tests.ops.services import free_port

NODES = ("scoutnode1", "scoutnode2")
#: Each daemon runs under a reaper of its orphans (tests/ops/reaper.py says why).
REAPER = (sys.executable, "-m", "tests.ops.reaper")
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
DAEMONS = ("slurmctld", "slurmd")
COMMANDS = ("sbatch", "scontrol", "sinfo", "srun", "scancel")


class Unavailable(RuntimeError):
    """Slurm cannot run here; the message is the reason, one line."""


@attrs.frozen
class Cluster:
    work: Path
    env: dict[str, str]  # SLURM_CONF and PATH for every Slurm command and job

    def scontrol(self, *arguments: str, timeout_s: float = 30.0) -> str:
        done = subprocess.run(["scontrol", *arguments], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(arguments)}: {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        import re

        return dict(re.findall(r"(\w+)=(\S*)", self.scontrol("show", "job", "-o", job_id)))

    def log_tail(self, chars: int = 3000) -> str:
        logs = sorted((self.work / "log").glob("*"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)


def _which() -> str | None:
    for name in (*DAEMONS, *COMMANDS):
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists():
            return f"no {name} (Debian package 'slurm-wlm'; .ci/run installs it)"
    return None


def _config(work: Path, controller_port: int, node_ports: tuple[int, ...]) -> str:
    host = socket.gethostname()
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=100 "
                      "State=UNKNOWN" for name, port in zip(NODES, node_ports, strict=True))
    return f"""\
ClusterName=scouttest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={controller_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={work}/state
SlurmdSpoolDir={work}/spool-%n
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/slurmd-%n.pid
SlurmctldLogFile={work}/log/slurmctld.log
SlurmdLogFile={work}/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=600
{nodes}
PartitionName=scout Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@contextlib.contextmanager
def start(logs: Path, path_first: str) -> Iterator[Cluster]:
    """Start the cluster; ``path_first`` goes first on the jobs' PATH. Its state lives in a short
    directory under /tmp (slurmstepd's socket paths must fit 108 bytes), copied to ``logs`` at
    the end."""
    reason = _which()
    if reason:
        raise Unavailable(reason)
    if os.geteuid() != 0:
        raise Unavailable("slurmd must run as root to start jobs as their user; this test runs as a user")
    work = Path(tempfile.mkdtemp(prefix="scout-slurm-", dir="/tmp"))
    for folder in ("state", "log", *(f"spool-{n}" for n in NODES)):
        (work / folder).mkdir(parents=True, exist_ok=True)
    conf = work / "slurm.conf"
    conf.write_text(_config(work, free_port(), tuple(free_port() for _ in NODES)))
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": f"{path_first}:{os.environ.get('PATH', '')}:/usr/sbin"}
    daemons: list[subprocess.Popen[Any]] = []
    cluster = Cluster(work, env)
    try:
        with (work / "log" / "slurmctld.out").open("w") as out:
            daemons.append(subprocess.Popen([*REAPER, "slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO))
        for name in NODES:
            with (work / "log" / f"slurmd-{name}.out").open("w") as out:
                daemons.append(subprocess.Popen([*REAPER, "slurmd", "-D", "-N", name, "-f", str(conf)], env=env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
                                  timeout=10, check=False)
            states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in NODES):
                break
            dead = [d.args[len(REAPER)] for d in daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                last = cluster.log_tail(300).strip().splitlines()
                raise Unavailable(f"single-host Slurm did not start ({', '.join(dead) or 'nodes ' + str(states)}): "
                                  f"{last[-1] if last else 'no log'}")
            time.sleep(0.2)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--partition=scout"], env=env, capture_output=True, timeout=10,
                           check=False)
        for daemon in reversed(daemons):
            _stop(daemon)
        shutil.copytree(work / "log", logs, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
