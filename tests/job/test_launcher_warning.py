"""attach's launcher warning reads torchrun's rendezvous backend from the agent's command line
(docs/attach.md "torch 2.13 and torchrun restarts")."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout.job.assemble import _rendezvous_backend

pytestmark = pytest.mark.spawns


@pytest.mark.parametrize(("arguments", "backend"), [
    (["/venv/bin/torchrun", "--nproc-per-node", "4", "--master-port", "29500", "train.py"], "static"),
    (["/venv/bin/torchrun", "--standalone", "train.py"], "c10d"),
    (["/venv/bin/torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "train.py"], "c10d"),
    (["-m", "torch.distributed.run", "--rdzv_backend=etcd", "train.py"], "etcd"),
    (["train.py", "--steps", "3"], None),
])
def test_ATTACH_the_rendezvous_backend_is_read_from_the_agents_command_line(arguments: list[str],
                                                                             backend: str | None) -> None:
    # A stand-in agent: a process whose command line carries the arguments (sys.argv after -c).
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *arguments],
                          stdin=subprocess.PIPE) as agent:
        try:
            cmdline = Path(f"/proc/{agent.pid}/cmdline")
            deadline = time.monotonic() + 10.0
            while sys.executable.encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)  # its command line appears once the new interpreter has started
            assert _rendezvous_backend(agent.pid) == backend
        finally:
            assert agent.stdin is not None
            agent.stdin.close()
            agent.wait(30)
    assert _rendezvous_backend(agent.pid) is None  # gone: nothing to read
