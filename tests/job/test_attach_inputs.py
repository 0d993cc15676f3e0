"""What attach takes from a framework (spec/frameworks.md FRAME-1..3): known wrappers unwrapped,
anything else refused naming its type and what to pass, and a failed attach leaves no process
and no progress record behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from scout.job.config import ConfigError
from scout.job.inputs import checked_state, unwrap_model, unwrap_optimizer

pytestmark = [pytest.mark.processes, pytest.mark.light]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "job" / "attach_inputs_job.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], dict[str, Any]]:
    """One torchrun job (2 ranks) attaching three times: every case's result per rank."""
    tmp_path = tmp_path_factory.mktemp("inputs")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCOUT_")}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    run = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--standalone", str(JOB), str(tmp_path / "run")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    found = [json.loads(path.read_text()) for path in sorted((tmp_path / "run").glob("result-*.json"))]
    results = {(r["case"], r["rank"]): r for r in found}
    assert len(results) == 6, (run.stdout[-2000:], run.stderr[-3000:])
    return results


def test_FRAME_1_accelerate_wrappers_are_unwrapped_on_a_real_job(cases: dict[tuple[str, int], dict[str, Any]]) -> None:
    for rank in (0, 1):
        result = cases["accelerate", rank]
        assert result["wrappers"] == ["AcceleratedOptimizer", "AcceleratedScheduler"]
        assert (result["attached_to"], result["state"]) == ("AdamW", {"lr": "LinearLR"}), result
        assert result["records"] == [] and result["children"] == [], "job.close() leaves nothing either"


def test_FRAME_1_an_unknown_optimizer_wrapper_is_one_config_error_before_anything_starts(
        cases: dict[tuple[str, int], dict[str, Any]]) -> None:
    refused = cases["foreign-wrapper", 0]
    assert refused["error"].startswith("ConfigError: the optimizer is a __main__.Wrapped"), refused
    assert "pass the torch.optim.Optimizer that it wraps" in refused["error"] and "[every rank]" in refused["error"]
    assert cases["foreign-wrapper", 1]["exit"] == 2
    for rank in (0, 1):
        assert cases["foreign-wrapper", rank]["records"] == [] and cases["foreign-wrapper", rank]["children"] == []


def test_FRAME_2_an_attach_that_fails_after_its_observer_started_leaves_no_process_and_no_record(
        cases: dict[tuple[str, int], dict[str, Any]]) -> None:
    for rank in (0, 1):
        failed = cases["hooks-fail", rank]
        assert failed["error"] == "RuntimeError: this optimizer takes no step pre-hooks", failed
        assert failed["records"] == [], "the progress record in /dev/shm is removed"
        assert failed["children"] == [], "the observer process is stopped"


class Holder(torch.optim.Optimizer):
    def __init__(self, inner: torch.optim.Optimizer) -> None:  # never runs Optimizer.__init__
        self.optimizer = inner


def test_FRAME_1_unwrapping_rules() -> None:
    from accelerate.optimizer import AcceleratedOptimizer
    from pytorch_lightning.core.optimizer import LightningOptimizer

    model = nn.Linear(2, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert unwrap_optimizer(None) is None and unwrap_optimizer(sgd) is sgd
    accelerated = AcceleratedOptimizer.__new__(AcceleratedOptimizer)  # its __init__ needs an Accelerator
    accelerated.optimizer = sgd
    assert unwrap_optimizer(accelerated) is sgd
    assert unwrap_optimizer(LightningOptimizer(sgd)) is sgd
    with pytest.raises(ConfigError, match=r"tests\.job\.test_attach_inputs\.Holder.*pass optimizer\.optimizer"):
        unwrap_optimizer(Holder(sgd))
    with pytest.raises(ConfigError, match="is a builtins.str, which scout cannot attach to: it is not a torch"):
        unwrap_optimizer("adam")
    assert unwrap_model(model) is model
    with pytest.raises(ConfigError, match="the model is a builtins.dict, not a torch.nn.Module"):
        unwrap_model({"model": model})


def test_FRAME_3_registered_state_must_be_stateful_under_identifier_names() -> None:
    sgd = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(sgd, 3)
    assert checked_state({"lr": scheduler}) == {"lr": scheduler} and checked_state(None) == {}
    with pytest.raises(ConfigError, match=r"state\['data'\] is a builtins.list, which has no state_dict\(\) and no"):
        checked_state({"data": [1, 2]})
    with pytest.raises(ConfigError, match="state name 'my lr' must be a Python identifier"):
        checked_state({"my lr": scheduler})
    with pytest.raises(ConfigError, match="state must be a mapping"):
        checked_state([scheduler])  # type: ignore[arg-type]
