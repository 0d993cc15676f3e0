"""One default per fact (issue 39): the observer's timing defaults have one home, whichever way
the observers are started, and docs/cluster.md's MPI snippet says the threshold; under a real
``mpiexec`` the job id is what docs/attach.md ("Job identity") says it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from scout.core.observer import model
from scout.core.observer.model import ObserverConfig
from scout.job.config import Config
from tests.transport.test_conformance_mpi import _mpiexec

REPO = Path(__file__).resolve().parents[2]
TIMINGS = ("stall_threshold_s", "data_stall_threshold_s", "checkpoint_stall_threshold_s", "round_deadline_s",
           "recheck_interval_s")


def test_IDENTITY_the_observer_timings_have_one_default_for_attach_and_a_bare_observer() -> None:
    # The bare observer's stall threshold was 30 s, attach's 10 s: docs/cluster.md's MPI snippet
    # missed a 30 s hang because of it.
    bare, attached = ObserverConfig(0, 2), Config()
    for name in TIMINGS:
        assert getattr(bare, name) == getattr(attached, name), (name, getattr(bare, name), getattr(attached, name))
        home = getattr(model, f"{name.upper()}_DEFAULT")
        assert attrs.fields_dict(Config)[name].default == attrs.fields_dict(ObserverConfig)[name].default == home
    snippet = (REPO / "docs" / "cluster.md").read_text().split("## mpiexec", 1)[1].split("```", 2)[1]
    assert "start_mpi_observer(" in snippet
    assert f"stall_threshold_s after it began: {model.STALL_THRESHOLD_S_DEFAULT:g} s by default" in snippet, snippet
    table = (REPO / "docs" / "attach.md").read_text()
    for name in TIMINGS:
        assert re.search(rf"^\| `{name}` \| {getattr(attached, name):g} \|", table, re.M), name


WORKER = """
import json, os, sys
from scout.observer.progress import RecordIdentity, launcher_job_id
rank = int(os.environ["PMI_RANK"])
print(json.dumps({"rank": rank, "launcher": launcher_job_id(os.environ),
                  "record": RecordIdentity.from_environment(rank).job_id}), flush=True)
"""


@pytest.mark.mpi
def test_IDENTITY_under_mpiexec_the_job_id_is_what_the_docs_say(tmp_path: Path) -> None:
    import json

    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec found: pip install mpich")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SCOUT_", "TORCHELASTIC_", "SLURM_", "PMIX_", "OMPI_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")

    def ids(*options: str) -> set[str]:
        done = subprocess.run([mpiexec, "-n", "2", *options, sys.executable, "-c", WORKER], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        # Hydra forwards both ranks' output on one stream; two lines can arrive joined, so read
        # every JSON object in it, not every line.
        lines = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", done.stdout)]
        assert sorted(line["rank"] for line in lines) == [0, 1], done.stdout
        return {line["launcher"] for line in lines} | {line["record"] for line in lines}

    # Hydra (the mpich wheel's mpiexec) exports no name for the job: the endpoint, marked mpi@.
    assert ids() == {"mpi@127.0.0.1:29517"}
    # The MPI namespace where the launcher exports one (Open MPI 5, PRRTE), and SCOUT_JOB_ID first.
    assert ids("-genv", "PMIX_NAMESPACE", "prterun-node-4242@1") == {"prterun-node-4242@1"}
    assert ids("-genv", "PMIX_NAMESPACE", "ns", "-genv", "SCOUT_JOB_ID", "mine") == {"mine"}
    docs = " ".join((REPO / "docs" / "attach.md").read_text().split())
    assert "`mpi@MASTER_ADDR:MASTER_PORT`" in docs and "`PMIX_NAMESPACE`" in docs
