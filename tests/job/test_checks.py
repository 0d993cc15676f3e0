"""What `scout.attach` says about its checks at attach (spec/replay.md CAP-9, REC-8), in one
process: the BatchNorm-style layers it warns about, and the cycle line rank 0 prints."""

from __future__ import annotations

from torch import nn

from scout.job.assemble import _cycle_line
from scout.job.checks import Cycle, running_statistics
from scout.job.config import Config


def test_CAP_9_hidden_layers_with_running_statistics_are_named_and_syncbatchnorm_is_not() -> None:
    def block(norm: nn.Module) -> nn.Module:
        return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), norm, nn.ReLU())

    hidden = [block(nn.BatchNorm2d(4)), block(nn.GroupNorm(2, 4)), block(nn.SyncBatchNorm(4)),
              block(nn.BatchNorm2d(4, track_running_stats=False)), nn.InstanceNorm2d(4, track_running_stats=True)]
    assert running_statistics(hidden) == ["hidden.0.1", "hidden.4.InstanceNorm2d"]
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(nn.ModuleList(hidden[:1]))
    assert running_statistics(list(converted)) == []  # what the warning tells the user to do


def test_REC_8_the_cycle_line_says_the_cycle_what_sets_it_and_the_checkpoint_interval() -> None:
    cycle = Cycle(16, "16 expert recipe(s), one every 1 step(s)", note="the dense recipes' cycle is 8 steps")
    config = Config(checkpoint_every_cycles=3, replay_interval_steps=1)  # BUDGET-8: an explicit cadence
    assert _cycle_line(cycle, config, checkpoints=True) == (
        "scout: replay cycle 16 steps (set by 16 expert recipe(s), one every 1 step(s); the dense recipes' cycle is "
        "8 steps); a checkpoint every 48 steps (checkpoint_every_cycles=3), verified one cycle later")
    assert _cycle_line(Cycle(6, "3 hidden recipe(s), one every 2 step(s)"), config, checkpoints=False) == (
        "scout: replay cycle 6 steps (set by 3 hidden recipe(s), one every 2 step(s))")
    # BUDGET-5: without an explicit interval the first cycle calibrates, and the line says so.
    calibrating = _cycle_line(cycle, Config(checkpoint_every_cycles=3), checkpoints=True)
    assert "calibrating" in calibrating and "overhead_budget=1 %" in calibrating
