"""scout.core, the pure part of scout.gate, and the transport contract import without torch
or mpi4py (docs/design.md §1, a must); so do the observer process (a light interpreter beside
every trainer: it must never load torch), the ops sidecar and page server (spec/ops.md), the
reports, attach's configuration and the run summary, and the job's check pipeline (the
simulator runs it without torch). Proven in a fresh interpreter where both are blocked. The
product's path never imports ``transitions`` (the tests' oracle of the machine tables)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests import processes

pytestmark = pytest.mark.spawns

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = {"torch", "mpi4py", "mpich"}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    import scout.core, scout.gate
    names = ["scout.transport", "scout.transport.base", "scout.transport.codec", "scout.transport._binding",
             "scout.transport.program", "scout.transport.sim", "scout.reports", "scout.observer.process",
             "scout.observer.launch", "scout.observer.driver", "scout.observer.channel", "scout.observer.rendezvous",
             "scout.observer.wire", "scout.observer.progress", "scout.observer.instrument", "scout.observer.mpi",
             "scout.job.config", "scout.reports.summary", "scout.scenarios.registry", "scout.ops.sidecar",
             "scout.ops.state", "scout.ops.tail", "scout.ops.hooks", "scout.ops.paths", "scout.ops.slurm",
             "scout.ops.web", "scout.commands.serve", "scout.commands.slurm_requeue", "scout.job.pipeline",
             "scout.job.restore", "scout.job.save", "scout.job.aggregate", "scout.job.gate_driver", "scout.scenarios.replay_job",
             "scout.scenarios.localization", "scout.scenarios.sim_storage", "scout.scenarios.restarts"]
    for package in (scout.core, scout.gate):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.append(info.name)
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("imported", len(names), "modules:", " ".join(sorted(names)))
    """
)


def test_core_gate_and_contract_import_without_torch_or_mpi() -> None:
    result = processes.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "scout.core.verdict" in result.stdout


def test_the_block_really_blocks() -> None:
    """Guard against a vacuous pass: with the block on, importing torch must fail."""
    script = SCRIPT.split("sys.meta_path.insert(0, Block())")[0] + (
        "sys.meta_path.insert(0, Block())\nimport torch\n"
    )
    result = processes.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "blocked" in result.stderr


def test_the_machines_run_without_the_transitions_oracle() -> None:
    script = (
        "import sys\n"
        "from scout.gate.step import gate_machine\n"
        "from scout.core.machine import packaged_machine\n"
        "from scout.core.straggler import straggler_machine\n"
        "gate_machine(); packaged_machine('observer'); straggler_machine()\n"
        "import scout.observer.driver, scout.job.pipeline\n"
        "assert 'transitions' not in sys.modules, sorted(m for m in sys.modules if 'transitions' in m)\n"
        "assert gate_machine().transitions_machine.states and 'transitions' in sys.modules  # built when asked\n"
    )
    result = processes.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_observer_process_imports_no_numpy() -> None:
    """The observer is started beside every trainer; numpy cost ~0.11 s of its start's CPU
    (four per 4-rank job) and only the verdict's paths for groups of 128 or more need it, which
    import it themselves: an observer that judges a large group loads it then."""
    script = (
        "import sys\n"
        "import scout.observer.process, scout.observer.driver, scout.observer.wire\n"
        "from scout.core.verdict import classify_exact, classify_timing\n"
        "assert classify_exact([1, 1, 2]).outliers == (2,) and classify_timing([5.0, 5.0, 50.0]).outliers == (2,)\n"
        "assert 'numpy' not in sys.modules, sorted(m for m in sys.modules if 'numpy' in m)[:5]\n"
        "assert classify_exact([7] * 200 + [8] * 20).outliers == tuple(range(200, 220))  # numpy's path\n"
        "assert classify_timing([5.0] * 199 + [50.0]).outliers == (199,) and 'numpy' in sys.modules\n"
    )
    result = processes.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
