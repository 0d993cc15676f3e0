"""The TorchTitan integration (scout/integrations/torchtitan.py; docs/integrations.md).

Pure parts run everywhere. The tests that use TorchTitan's own classes need the ``torchtitan``
extra (``pip install 'scout-localize[torchtitan]'``: torchtitan 0.3.0 and triton, which its
modules import) and are skipped without it. TorchTitan 0.3 cannot train on CPU (no attention
backend with a CPU backward), so its trainer path runs in ``tests/gpu/torchtitan_train.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from scout.integrations.torchtitan import (
    ScoutSettings,
    TitanDegrees,
    replica_partitions,
    with_scout,
)


def test_PEER_1_dense_peers_are_the_replicas_of_one_shard_and_expert_peers_keep_ep() -> None:
    # HSDP 2 x 2: replicas of each FSDP shard.
    dense, experts = replica_partitions(TitanDegrees(dp_replicate=2, dp_shard=2))
    assert dense == ((0, 2), (1, 3)) and experts == ((0, 2), (1, 3))
    # DDP over 4: one group; experts (ep=1) replicated on every rank.
    dense, experts = replica_partitions(TitanDegrees(dp_replicate=4))
    assert dense == ((0, 1, 2, 3),) and experts == ((0, 1, 2, 3),)
    # dp_replicate 3 x dp_shard 2 with ep 2 (efsdp 1): experts of ep coordinate j on ranks 2i+j.
    dense, experts = replica_partitions(TitanDegrees(dp_replicate=3, dp_shard=2, ep=2))
    assert dense == ((0, 2, 4), (1, 3, 5)) and experts == ((0, 2, 4), (1, 3, 5))
    # Tensor parallel 2 inside: the tp coordinate is kept; pp stages never mix.
    dense, _ = replica_partitions(TitanDegrees(pp=2, dp_replicate=2, tp=2))
    assert dense == ((0, 2), (1, 3), (4, 6), (5, 7))


def test_bad_degrees_are_errors_naming_the_value() -> None:
    with pytest.raises(ValueError, match="dp_shard must be an int >= 1"):
        TitanDegrees(dp_shard=0)
    with pytest.raises(ValueError, match="ep=3 must divide"):
        TitanDegrees(dp_shard=2, ep=3)


def test_with_scout_keeps_the_models_own_hook_and_attaches_only_when_enabled() -> None:
    @dataclasses.dataclass
    class Spec:  # the fields of TorchTitan's ModelSpec that with_scout touches
        name: str
        post_optimizer_build_fn: object

    calls = []
    spec = Spec("toy", lambda *args: calls.append(args))
    disabled = with_scout(spec, ScoutSettings(enable=False))
    disabled.post_optimizer_build_fn("optimizers", ["model"], "dims")
    assert calls == [("optimizers", ["model"], "dims")] and spec.post_optimizer_build_fn is not disabled.post_optimizer_build_fn
    enabled = with_scout(spec, ScoutSettings(enable=True))
    with pytest.raises(ValueError, match="one model part"):  # attach runs, and refuses pipeline stages
        enabled.post_optimizer_build_fn("optimizers", ["stage0", "stage1"], "dims")


_HAS_TITAN = importlib.util.find_spec("torchtitan") is not None and importlib.util.find_spec("triton") is not None


@pytest.mark.torchdist
@pytest.mark.skipif(not _HAS_TITAN, reason="needs the torchtitan extra (torchtitan 0.3.0 and triton)")
def test_MOE_1_MOE_6_torchtitan_grouped_experts_bit_flip_is_attributed_and_fused_templates_are_not_qualified(
    tmp_path: Path,
) -> None:
    from tests.replay.test_replay_distributed import run

    ranks = run(tmp_path, scenario="tests.replay._moe_scenarios:titan_experts", same_results=True,
                flip_rank=2, flip_expert=5)
    results = ranks[0]["results"]
    attributed = [r for r in results if r[2] == "ATTRIBUTED"]
    assert attributed and all(r[0].startswith("expert.5@") and r[3] == [2] for r in attributed)
    assert all(r[2] == "AGREE" for r in results if not r[0].startswith("expert.5@"))
    # torch._grouped_mm is one fused launch for the whole count vector: heterogeneous routing
    # does not decompose into per-expert executions, so no template is qualified (MOE-6).
    assert ranks[0]["templates"] and not any(qualified for _, qualified, _ in ranks[0]["templates"])
    assert ranks[0]["keys"] <= ranks[0]["exact"]
