"""attach's configuration (docs/attach.md): defaults < file < SCOUT_* environment < keywords,
every value checked with an error naming the key, the value and where it came from; and the
job's identity from the launcher."""

from __future__ import annotations

from pathlib import Path

import pytest

from scout.job.config import Config, ConfigError, load_config, unknown_variables
from scout.job.startup import check_directory, summary
from scout.observer.progress import RecordIdentity, launcher_job_id


def test_CONFIG_defaults_serve_a_real_job() -> None:
    config = load_config(None, None, environ={})
    assert (config.stall_threshold_s, config.replay_interval_steps, config.checkpoint_every_cycles) == (10.0, None, 5)
    assert config.overhead_budget == 0.01  # BUDGET-1: the cadence is chosen by the budget unless set
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
        ({"overhead_budget": 0}, "overhead_budget"),
        ({"overhead_budget": 0.8}, "overhead_budget"),
        ({"overhead_budget": "1%"}, "overhead_budget"),
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
    with pytest.raises(ConfigError, match=r"unknown\.toml: unknown key\(s\) 'threshold';"):
        load_config(unknown, None, environ={})


def test_CONFIG_a_misspelt_key_or_variable_says_what_it_probably_meant(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'stall_treshold_s' \(did you mean 'stall_threshold_s'\?\)"):
        load_config(None, {"stall_treshold_s": 3}, environ={})
    for typo, meant in (("SCOUT_STALL_TRESHOLD_S", "SCOUT_STALL_THRESHOLD_S"), ("SCOUT_ONSDC", "SCOUT_ON_SDC"),
                        ("SCOUT_ON_HANGS", "SCOUT_ON_HANG")):
        with pytest.raises(ConfigError, match=rf"^environment variable {typo} is not a scout setting; did you mean "
                                              rf"{meant}\?"):
            load_config(None, None, environ={typo: "1"})
    # Not a setting and not like one: ignored, and listed for attach's one warning.
    environ = {"SCOUT_UNRELATED": "x", "SCOUT_JOB_ID": "j", "SCOUT_TEST_SCRATCH": "/tmp", "SCOUT_REPLAY": "1"}
    assert load_config(None, None, environ=environ).replay is True
    assert unknown_variables(environ) == ["SCOUT_UNRELATED"]


def test_CONFIG_an_error_names_where_the_value_came_from(tmp_path: Path) -> None:
    path = tmp_path / "scout.toml"
    path.write_text('# settings\n[scout]\nreplay_rows = 2\n\nstall_threshold_s = -1\n')
    with pytest.raises(ConfigError, match=rf"^config file {path}:5: stall_threshold_s must be"):
        load_config(path, None, environ={})
    with pytest.raises(ConfigError, match=r"^scout.attach keyword on_sdc: on_sdc must be one of"):
        load_config(None, {"on_sdc": "reboot"}, environ={})
    with pytest.raises(ConfigError, match=r"^environment variable SCOUT_REPLAY_ROWS: replay_rows must be an int"):
        load_config(None, None, environ={"SCOUT_REPLAY_ROWS": "-2"})
    with pytest.raises(ConfigError, match=r"^config mapping key canary: canary must be true or false"):
        load_config({"canary": "on"}, None, environ={})
    # A rule between two keys names both sources.
    with pytest.raises(ConfigError, match=r"round_deadline_s from environment variable SCOUT_ROUND_DEADLINE_S; "
                                          r"stall_threshold_s from scout.attach keyword stall_threshold_s"):
        load_config(None, {"stall_threshold_s": 2.0}, environ={"SCOUT_ROUND_DEADLINE_S": "3"})


def test_CONFIG_a_file_with_top_level_keys_and_a_scout_table_is_refused(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.toml"
    mixed.write_text('on_sdc = "restart"\n[scout]\nstall_threshold_s = 5\n')
    with pytest.raises(ConfigError, match=r"has a \[scout\] table and top-level keys \['on_sdc'\]"):
        load_config(mixed, None, environ={})
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('scout = 3\n')
    with pytest.raises(ConfigError, match=r"scout must be a \[scout\] table, got int"):
        load_config(wrong, None, environ={})


def test_CONFIG_directories_are_checked_with_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"^run_dir '.*file/run' cannot be created: Not a directory; pass"):
        check_directory(tmp_path / "file" / "run", "run_dir")
    made = check_directory(tmp_path / "new" / "ckpt", "checkpoint_dir")
    assert made.is_dir() and list(made.iterdir()) == []  # the write probe is gone


def test_CONFIG_rank_problems_are_summarised_once_with_their_ranks() -> None:
    assert summary([None, None], 2) is None
    assert summary(["bad"] * 4, 4) == "bad [every rank]"
    assert summary([None, "x", None, "x"], 4) == "x [ranks 1, 3]"
    assert summary(["a", None, "b"], 3) == "a [rank 0]; b [rank 2]"


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


def test_BUDGET_1_BUDGET_8_the_budget_and_an_explicit_cadence_from_every_source(tmp_path: Path) -> None:
    assert load_config(None, None, environ={"SCOUT_OVERHEAD_BUDGET": "0.02"}).overhead_budget == 0.02
    assert load_config(None, None, environ={"SCOUT_REPLAY_INTERVAL_STEPS": "7"}).replay_interval_steps == 7
    path = tmp_path / "scout.toml"
    path.write_text("overhead_budget = 0.005\nreplay_interval_steps = 3\n")
    config = load_config(path, None, environ={})
    assert (config.overhead_budget, config.replay_interval_steps) == (0.005, 3)
    with pytest.raises(ConfigError, match=r"overhead_budget must be a share of a step in \(0, 0.5\] \(0.01 is 1 %\), "
                                          r"got 1.5"):
        load_config(None, {"overhead_budget": 1.5}, environ={})
    with pytest.raises(ConfigError, match=r"replay_interval_steps must be an int in \[1, 1000000\], or unset "
                                          r"\(chosen by overhead_budget\); got 0"):
        load_config(None, {"replay_interval_steps": 0}, environ={})
    with pytest.raises(ConfigError, match="SCOUT_REPLAY_INTERVAL_STEPS: 'two' is not a valid int"):
        load_config(None, None, environ={"SCOUT_REPLAY_INTERVAL_STEPS": "two"})
