"""The torch binding with NCCL on real GPUs, under torchrun (tests/gpu/run_gpu_tests.sh).

The same cases as tests/transport/test_conformance_torch.py, with tensors on CUDA and the
evidence path on torchrun's agent store. Skipped, with the reason, where there is no CUDA GPU.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.gpu import replay_worker
from tests.transport import binding_cases as cases
from tests.transport.process_runs import REPO, RankRun, run_ranks
from tests.transport.torch_cases import TORCH_CASES

pytestmark = pytest.mark.gpu

RUN_TIMEOUT_S = 600.0


def _gpu_count() -> int:
    """CUDA GPUs on this host, asked of nvidia-smi (cheap: no torch import)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listing = processes.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory: pytest.TempPathFactory) -> RankRun:
    gpus = _gpu_count()
    if gpus == 0:
        pytest.skip(
            "no CUDA GPU on this machine (nvidia-smi absent or lists no GPU): the NCCL tests "
            "need one; run tests/gpu/run_gpu_tests.sh on a GPU host"
        )
    torch = pytest.importorskip("torch", reason="the NCCL tests need torch with CUDA")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} cannot use the GPU (a CPU-only build?)")
    out_dir = tmp_path_factory.mktemp("nccl")
    command = ["bash", str(REPO / "tests" / "gpu" / "run_gpu_tests.sh"), str(out_dir)]
    return run_ranks(command, out_dir, gpus, "torch", RUN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(cases.CASES))
def test_binding_case_nccl(nccl_run: RankRun, name: str) -> None:
    nccl_run.check(name, cases.CASES)


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_torch_case_nccl(nccl_run: RankRun, name: str) -> None:
    nccl_run.check(name, TORCH_CASES)


def test_FAULT_1_REPLAY_6_SIG_7_replay_sdc_bit_flip_nccl(nccl_run: RankRun) -> None:
    """The replay SDC scenario on the GPUs, NCCL for training and replay (replay_worker.py):
    with 3 or more GPUs the faulty rank is attributed within one cycle."""
    replay_worker.check_results(replay_worker.load(nccl_run.out_dir, nccl_run.size), nccl_run.size)


TORCHRUN_CPU_CASES = (
    "exchange_everyone",
    "exchange_silent_peer",
    "collectives_everyone",
    "torch_tensors",
    "torch_tensor_silent_peer",
)


@pytest.mark.torchdist
def test_torchrun_launch_on_cpu(tmp_path: Path) -> None:
    """The same script and worker under torchrun with gloo on CPU: checks the launch, the
    default store (torchrun's agent store, found through MASTER_ADDR) and a few cases, so the
    GPU path's plumbing is exercised on every machine."""
    pytest.importorskip("torch", reason="needs torch: pip install 'scout-localize[torch]'")
    env_cases = ",".join(TORCHRUN_CPU_CASES)
    command = [
        "env",
        "SCOUT_TORCHRUN_DEVICE=cpu",
        "SCOUT_GPUS=3",
        f"SCOUT_CASES={env_cases}",
        f"PYTHON={sys.executable}",
        "GLOO_SOCKET_IFNAME=lo",
        "bash",
        str(REPO / "tests" / "gpu" / "run_gpu_tests.sh"),
        str(tmp_path),
    ]
    run = run_ranks(command, tmp_path, 3, "torch", RUN_TIMEOUT_S)
    all_cases = {**cases.CASES, **TORCH_CASES}
    for name in TORCHRUN_CPU_CASES:
        run.check(name, all_cases)


@pytest.mark.slow
@pytest.mark.torchdist
def test_FAULT_1_replay_sdc_case_under_torchrun_on_cpu(tmp_path: Path) -> None:
    """The replay case of the GPU suite, launched the same way with gloo on CPU (4 ranks), so
    its plumbing is exercised on machines without a GPU."""
    pytest.importorskip("torch", reason="needs torch: pip install 'scout-localize[torch]'")
    command = [
        "env",
        "SCOUT_TORCHRUN_DEVICE=cpu",
        "SCOUT_GPUS=4",
        f"SCOUT_CASES={replay_worker.CASE}",
        f"PYTHON={sys.executable}",
        "GLOO_SOCKET_IFNAME=lo",
        "bash",
        str(REPO / "tests" / "gpu" / "run_gpu_tests.sh"),
        str(tmp_path),
    ]
    run = run_ranks(command, tmp_path, 4, "torch", RUN_TIMEOUT_S)
    per_rank = replay_worker.load(run.out_dir, 4)
    assert all(entry["backend"] == "gloo" for entry in per_rank)
    replay_worker.check_results(per_rank, 4)


def test_run_script_refuses_without_gpu() -> None:
    """Without nvidia-smi the script says why it cannot run instead of failing obscurely."""
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this host has nvidia-smi")
    completed = processes.run(
        ["bash", str(Path(REPO) / "tests" / "gpu" / "run_gpu_tests.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert completed.returncode == 2
    assert "no CUDA GPU" in completed.stderr
