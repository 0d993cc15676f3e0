"""attach's configuration (docs/attach.md): defaults < file < SCOUT_* environment < keywords,
every value checked with an error naming the key, the value and where it came from; and the
job's identity from the launcher."""

from __future__ import annotations

from pathlib import Path

import pytest

from scout.job.config import Config, ConfigError, load_config
from scout.observer.progress import RecordIdentity, launcher_job_id


def test_CONFIG_defaults_serve_a_real_job() -> None:
    config = load_config(None, None, environ={})
    assert (config.stall_threshold_s, config.replay_interval_steps, config.checkpoint_every_cycles) == (10.0, 2, 5)
    assert (config.on_sdc, config.on_hang) == ("report", "report")
    assert config.observer_fields()["stall_threshold_s"] == 10.0


def test_CONFIG_keywords_beat_environment_beat_file_beat_defaults(tmp_path: Path) -> None:
    path = tmp_path / "scout.toml"
    path.write_text('[scout]\nstall_threshold_s = 7\nreplay_interval_steps = 3\non_sdc = "restart"\n')
    environ = {"SCOUT_REPLAY_INTERVAL_STEPS": "4", "SCOUT_OBSERVER": "false", "SCOUT_UNRELATED": "x"}
    config = load_config(path, {"stall_threshold_s": 5.0}, environ=environ)
    assert (config.stall_threshold_s, config.replay_interval_steps, config.on_sdc, config.observer) == (
        5.0, 4, "restart", False)
    top_level = tmp_path / "flat.toml"
    top_level.write_text("checkpoint_every_cycles = 9\n")
    assert load_config(top_level, None, environ={}).checkpoint_every_cycles == 9
    assert load_config({"on_hang": "restart"}, None, environ={}).on_hang == "restart"
    assert load_config(Config(kill_grace_s=2.0), None, environ={}).kill_grace_s == 2.0


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ({"stall_threshold_s": -1}, "stall_threshold_s"),
        ({"stall_threshold_s": float("nan")}, "stall_threshold_s"),
        ({"replay_interval_steps": 0}, "replay_interval_steps"),
        ({"replay_interval_steps": True}, "replay_interval_steps"),
        ({"on_sdc": "reboot"}, "on_sdc"),
        ({"observer": "yes"}, "observer"),
        ({"stall_threshold_s": 1.0, "round_deadline_s": 1.0}, "round_deadline_s"),
        ({"stal_threshold_s": 3}, "stal_threshold_s"),
        ({"job_id": ""}, "job_id"),
    ],
)
def test_CONFIG_a_bad_keyword_names_the_key_and_value(source: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(None, source, environ={})


def test_CONFIG_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="SCOUT_STALL_THRESHOLD_S"):
        load_config(None, None, environ={"SCOUT_STALL_THRESHOLD_S": "ten"})
    with pytest.raises(ConfigError, match="SCOUT_REPLAY"):
        load_config(None, None, environ={"SCOUT_REPLAY": "maybe"})


def test_CONFIG_a_bad_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", None, environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("stall_threshold_s = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken, None, environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[scout]\nthreshold = 3\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['threshold'\]"):
        load_config(unknown, None, environ={})


def test_IDENTITY_the_job_id_comes_from_the_launcher_and_survives_restarts() -> None:
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    identity = RecordIdentity.from_environment(3, torchrun)
    assert (identity.job_id, identity.generation, identity.rank) == ("abc", 2, 3)
    # torchrun's default run id "none" is qualified by the endpoint: two jobs on one host differ.
    first = launcher_job_id({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    second = launcher_job_id({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "2"})
    assert first == "none@h:1" and first != second
    assert launcher_job_id({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}) == "77.0"
    assert launcher_job_id({"SCOUT_JOB_ID": "mine", "TORCHELASTIC_RUN_ID": "abc"}) == "mine"
    assert RecordIdentity.from_environment(0, torchrun, job_id="given").job_id == "given"
