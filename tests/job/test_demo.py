"""``scout demo`` (the README's first command) drives the example under torchrun and reads the
run directory as a user would; one scenario here, the rest are the attach tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchdist
REPO = Path(__file__).resolve().parents[2]


def test_DEMO_the_hang_scenario_is_localized_and_its_run_directory_kept(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "scout.cli", "demo", "--phase", "hang", "--json", "--keep",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (scenario,) = json.loads(run.stdout)["scenarios"]
    assert scenario["scenario"] == "hang" and scenario["localized"] is True
    assert (tmp_path / "hang" / "run" / "reports.jsonl").is_file()
