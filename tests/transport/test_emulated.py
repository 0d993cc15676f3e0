"""The emulated NCCL backend (scout/transport/nccl/emulated.py, spec/observer.md INSTR-14), and
completion tracking's sources on it and on a gloo group with the Flight Recorder (INSTR-10,
INSTR-12): two real processes on loopback, every check in one run
(tests/transport/emulated_worker.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.transport.process_runs import REPO, worker_env

pytestmark = pytest.mark.torchdist
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("emulated")
    init_file = directory / "init"
    env = {**worker_env(), "TORCH_FR_BUFFER_SIZE": "64"}  # for the gloo group's Flight Recorder check
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.transport.emulated_worker", str(rank), str(init_file),
                               str(directory)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = []
    for process in ranks:
        try:
            outputs.append(process.communicate(timeout=RUN_TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
                other.communicate()
            raise
    results = []
    for rank in (0, 1):
        path = directory / f"rank{rank}.json"
        assert path.exists(), "\n".join(o[-3000:] for o in outputs)
        results.append(json.loads(path.read_text()))
    return results


def test_INSTR_14_a_collective_returns_at_enqueue_and_completes_later(seen: list[dict[str, Any]]) -> None:
    zero, one = seen
    assert zero["backend"] == "scoutemu"
    assert zero["completion_source"] == one["completion_source"] == "the emulated backend's recorder"  # INSTR-10
    # Rank 0 enqueued while rank 1 was still asleep: it returned at once, not completed.
    assert zero["completed_at_enqueue"] is False and zero["enqueue_s"] < 0.2
    assert zero["all_reduce"] == one["all_reduce"] == [3.0, 3.0, 3.0]
    assert zero["all_gather_into_tensor"] == one["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]


def test_INSTR_14_a_synchronous_call_returns_at_enqueue_and_the_host_syncs_explicitly(
    seen: list[dict[str, Any]],
) -> None:
    """NCCL's contract from torch 2.8: ``all_reduce(async_op=False)`` returns at enqueue on both
    ranks while rank 1's stream is stalled for 1 s; the result is there after synchronize()."""
    for rank in seen:
        assert rank["sync_return_s"] < 0.5 and rank["sync_done_at_return"] is False
        assert rank["sync_after_synchronize"] == [3.0, 3.0]


def test_INSTR_11_14_markers_run_end_to_end_on_the_emulated_backend(seen: list[dict[str, Any]]) -> None:
    """The mark clock is the group's stream: rank 1's stalled stream leaves its collective
    enqueued, rank 0's started; both complete after the stall."""
    zero, one = seen
    assert zero["markers_source"] == one["markers_source"] == "markers"
    assert (zero["markers_while_stalled"], one["markers_while_stalled"]) == (2, 1)  # STARTED, ENQUEUED
    assert zero["markers_after"] == one["markers_after"] == [1, 1]


def test_INSTR_14_16_point_to_point_runs_on_the_stream_without_deadlock(seen: list[dict[str, Any]]) -> None:
    zero, one = seen
    assert (zero["p2p_received"], one["p2p_received"]) == ([1.0, 1.0], [0.0, 0.0])
    assert one["p2p_blocking"] == [7.0, 7.0]


def test_INSTR_14_a_stalled_stream_never_starts_the_collective_its_peer_started(seen: list[dict[str, Any]]) -> None:
    zero, one = seen
    assert (zero["hang_state"], one["hang_state"]) == ("STARTED", "ENQUEUED")
    assert one["hang_status"]["last_enqueued_collective"] == one["hang_status"]["last_started_collective"] + 1
    assert zero["hang_completed"] and one["hang_completed"]  # released: the job goes on
    assert (zero["withheld_state"], one["withheld_state"]) == ("ENQUEUED", "STARTED")


def test_INSTR_14_ddp_runs_on_it(seen: list[dict[str, Any]]) -> None:
    zero, one = seen
    assert zero["ddp_weight_grad"] == one["ddp_weight_grad"] == [[1.5, 1.5], [1.5, 1.5]]
    assert zero["ddp_buffer"] == one["ddp_buffer"] == [0.0, 0.0, 0.0]  # broadcast from rank 0


def test_INSTR_14_a_timed_wait_that_expires_aborts_the_communicator(seen: list[dict[str, Any]]) -> None:
    zero, _ = seen
    assert "did not complete within 0.5 s; the communicator was aborted" in zero["timed_wait"]
    assert zero["aborted"] is True and "was aborted" in zero["after_abort"]


def test_INSTR_10_12_on_gloo_with_the_flight_recorder_a_collective_from_cpp_is_seen_pending(
    seen: list[dict[str, Any]],
) -> None:
    """A gloo group with ``TORCH_FR_BUFFER_SIZE``: the source is PyTorch's Flight Recorder, and a
    broadcast called straight from C++ (no scout wrapper) is pending on rank 0 while rank 1 is
    late, then completed."""
    zero, one = seen
    assert zero["fr_source"] == one["fr_source"] == "PyTorch's Flight Recorder"
    assert zero["fr_while_waiting"] == [2, 1, 3]  # PendingState.UNKNOWN: gloo cannot tell started
    assert zero["fr_after"] == [2, 2, 0]
