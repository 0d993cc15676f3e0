"""The benchmark's private switches (scout/job/bench_switches.py): parsed in one place, a bad name
refused with the value, and not mistaken by attach's configuration for a misspelt setting."""

from __future__ import annotations

import pytest

from scout.job import bench_switches
from scout.job.config import load_config, unknown_variables


def test_parts_off_reads_the_comma_separated_list() -> None:
    assert bench_switches.parts_off({}) == frozenset()
    assert bench_switches.parts_off({"SCOUT_BENCH_OFF": " ddp_hook, gate ,"}) == {"ddp_hook", "gate"}


def test_an_unknown_part_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"SCOUT_BENCH_OFF='ddp_hook,gates'.*\['gates'\]"):
        bench_switches.parts_off({"SCOUT_BENCH_OFF": "ddp_hook,gates"})


def test_the_switch_is_not_a_setting_nor_a_misspelt_one() -> None:
    environ = {"SCOUT_BENCH_OFF": "gate"}
    assert unknown_variables(environ) == []
    load_config(None, None, environ)  # no "did you mean" error
