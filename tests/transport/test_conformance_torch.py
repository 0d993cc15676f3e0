"""The torch.distributed binding on real processes: 4 gloo ranks on CPU.

``python -m tests.transport.torch_worker`` imports torch once, forks the ranks and hosts their
TCPStore (a process that is not a trainer). One run per session executes every case; each test
below checks one case on the per-rank results. The guarantees checked are those of
scout/transport/base.py; the torch-specific cases are in torch_cases.py.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from tests import processes
from tests.transport import binding_cases as cases
from tests.transport.process_runs import REPO, RankRun, run_ranks, worker_env
from tests.transport.scenario_checks import check_scenario_run
from tests.transport.scenarios import SCENARIOS
from tests.transport.torch_cases import TORCH_CASES

pytestmark = [pytest.mark.torchdist, pytest.mark.light]

SIZE = 4
RUN_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> RankRun:
    pytest.importorskip(
        "torch", reason="the torch binding needs torch: pip install 'scout-localize[torch]'"
    )
    out_dir = tmp_path_factory.mktemp("torch_gloo")
    command = [
        sys.executable,
        "-m",
        "tests.transport.torch_worker",
        str(out_dir),
        "--nproc",
        str(SIZE),
        "--timeout-s",
        str(RUN_TIMEOUT_S - 20),
    ]
    return run_ranks(command, out_dir, SIZE, "torch", RUN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(cases.CASES))
def test_binding_case(torch_run: RankRun, name: str) -> None:
    torch_run.check(name, cases.CASES)


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_torch_case(torch_run: RankRun, name: str) -> None:
    torch_run.check(name, TORCH_CASES)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_shared_scenario(torch_run: RankRun, name: str) -> None:
    check_scenario_run(name, [r["scenarios"][name] for r in torch_run.results], torch_run.size)


def test_closed_transports_leave_at_most_their_last_round(torch_run: RankRun) -> None:
    """After every transport closed, each rank left at most its newest key per stream and group
    (a slower peer may still read it) and one tensor notice per group."""
    launcher = json.loads((torch_run.out_dir / "launcher.json").read_text())
    per_slot: Counter[str] = Counter()
    for key in launcher["scout_keys_left"]:
        parts = key.split("/")
        if parts[-3] == "t":  # scout/<namespace>/t/<group>/<rank>
            per_slot[key] += 1
        else:  # scout/<namespace>/<stream>/<group>/<number>/<rank>: drop the number
            per_slot["/".join(parts[:-2] + parts[-1:])] += 1
    assert per_slot, "expected the last round's keys to stay"
    crowded = {slot: count for slot, count in per_slot.items() if count > 1}
    assert not crowded, f"more than one key per (transport, stream, group, rank): {crowded}"


def test_missing_torch_says_how_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "try:\n"
        "    import scout.transport.nccl\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    completed = processes.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "scout-localize[torch]" in completed.stdout, completed.stdout + completed.stderr
