"""Every public entry point checks types and ranges at the boundary, with an error naming the
value: the verdict's evidence (VERDICT-8, -12, -19, -20), the gate's events (GATE-35), manifest
files (GATE-34) and the command line (scout simulate, scout certificate)."""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from scout.cli import build_parser, main
from scout.core.verdict import MISSING, Reason, Status, classify_exact, classify_timing
from scout.gate.codec import CodecError, state_from_json, state_to_json
from scout.gate.manifest import ManifestUnreadable, read_manifest_set, read_regular_file
from scout.gate.model import (
    STEP_MAX,
    CheckpointCaptured,
    CycleBoundary,
    GroupVerdict,
    Outcome,
    RecipeVerdicts,
    Restart,
)
from scout.gate.recorder import GateRecorder, GateWriter, MemoryRecorder
from scout.gate.step import GateInputError, initial_state, step
from scout.scenarios.registry import ScenarioParams
from tests.gate_story import CONFIG, clean_cycle, story, verdicts

# ------------------------------------------------------------------------------------------
# The verdict's evidence
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("abc", "got a str"),
        (b"\x01\x02", "got a bytes"),
        ({0: 1, 1: 1}, "got a dict, which has no peer order"),
        ({1, 2, 3}, "got a set, which has no peer order"),
        (frozenset({1}), "got a frozenset"),
        (np.ones((2, 2)), "got a 2-D ndarray"),
        (np.float64(3.0), "got a 0-D float64"),
        (7, "got int 7"),
        (None, "got NoneType"),
    ],
)
@pytest.mark.parametrize("classify", [classify_exact, classify_timing])
def test_VERDICT_8_a_group_that_is_not_an_ordered_sequence_is_refused_naming_its_type(classify, values, message) -> None:
    with pytest.raises(TypeError, match=message):
        classify(values)


def test_VERDICT_8_one_dimensional_arrays_are_groups_of_scalars() -> None:
    exact = classify_exact(np.array([7, 7, 9], dtype=np.int64))
    assert (exact.status, exact.outliers, type(exact.evidence[0])) == (Status.ATTRIBUTED, (2,), int)
    timing = classify_timing(np.array([100.0, 100.0, 500.0], dtype=np.float32))
    assert (timing.status, timing.outliers) == (Status.ATTRIBUTED, (2,))
    assert classify_exact((5, 5, 5)).status is Status.AGREE
    assert classify_exact(v for v in [5, 5, 5]).status is Status.AGREE


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_VERDICT_12_a_nan_of_any_float_type_is_invalid_even_when_every_peer_gives_the_same_one(dtype) -> None:
    nan = dtype("nan")
    same_object = classify_exact([nan, nan, nan])
    assert (same_object.status, same_object.outliers, same_object.reason) == (Status.INCONCLUSIVE, (), Reason.NO_EVIDENCE)
    assert same_object.invalid == (0, 1, 2)
    one = dtype(1.0)
    attributed = classify_exact([one, one, one, nan])
    assert (attributed.status, attributed.outliers, attributed.invalid) == (Status.ATTRIBUTED, (3,), (3,))
    timing = classify_timing([dtype(10.0), dtype(10.0), nan])
    assert (timing.status, timing.invalid, timing.reason) == (Status.INCONCLUSIVE, (2,), Reason.INVALID_EVIDENCE)
    # A NaN never holds the majority, whatever object carries it.
    assert classify_exact([complex("nan")] * 3).reason is Reason.NO_EVIDENCE


def test_VERDICT_19_evidence_that_does_not_compare_by_value_is_refused() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError, match="compares by identity"):
        classify_exact([Opaque(), Opaque(), Opaque()])
    with pytest.raises(TypeError, match="numpy.ndarray, whose == gives ndarray, not a bool"):
        classify_exact([np.zeros(2), np.zeros(2)])
    assert classify_exact([MISSING, MISSING]).reason is Reason.NO_EVIDENCE


def test_VERDICT_19_20_tensors_are_refused_as_one_peers_evidence_and_accepted_as_the_group() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"torch\.Tensor, whose == gives Tensor, not a bool"):
        classify_exact([torch.tensor(1), torch.tensor(1), torch.tensor(1)])
    with pytest.raises(TypeError, match="peer 0 gave Tensor"):
        classify_timing([torch.tensor(1.0), torch.tensor(1.0)])
    assert classify_exact(torch.tensor([3, 3, 4])).outliers == (2,)
    assert classify_timing(torch.tensor([100.0, 100.0, 500.0])).outliers == (2,)
    with pytest.raises(TypeError, match="2-D Tensor"):
        classify_timing(torch.ones(2, 2))


def test_VERDICT_20_timing_takes_numpy_scalars_of_any_width_and_refuses_bools() -> None:
    verdict = classify_timing([np.float16(100), np.int32(100), np.float64(100.0)])
    assert verdict.status is Status.AGREE
    with pytest.raises(TypeError, match="peer 1 gave bool"):
        classify_timing([1.0, np.bool_(True)])


# ------------------------------------------------------------------------------------------
# The gate's events (GATE-35)
# ------------------------------------------------------------------------------------------


def test_GATE_35_an_outcome_given_as_a_string_is_refused_not_read_as_unchecked() -> None:
    with pytest.raises(TypeError, match=r"outcome must be a scout\.gate\.model\.Outcome member.*'ATTRIBUTED'"):
        GroupVerdict("dp0", "ATTRIBUTED", (1,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="outliers must be a tuple of peer positions"):
        GroupVerdict("dp0", Outcome.ATTRIBUTED, (-1,))
    with pytest.raises(TypeError, match="outliers must be a tuple"):
        GroupVerdict("dp0", Outcome.ATTRIBUTED, [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ascending without repeats"):
        GroupVerdict("dp0", Outcome.ATTRIBUTED, (2, 1))
    with pytest.raises(TypeError, match="group must be a non-empty str"):
        GroupVerdict("", Outcome.AGREE)
    with pytest.raises(TypeError, match="verdicts must be GroupVerdict values"):
        RecipeVerdicts("hidden", 1, 10, ("AGREE", "AGREE"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="verdicts must be a sequence of GroupVerdict"):
        RecipeVerdicts("hidden", 1, 10, "AGREE")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: CheckpointCaptured(10**15),
        lambda: CycleBoundary(STEP_MAX + 1),
        lambda: Restart(10**15),
        lambda: CycleBoundary(-1),
        lambda: CheckpointCaptured(True),
        lambda: CycleBoundary(3.0),
        lambda: RecipeVerdicts("hidden", 1, 10**15, verdicts()),
        lambda: RecipeVerdicts("hidden", 10**15, 10, verdicts()),
    ],
)
def test_GATE_35_steps_beyond_the_stated_bound_are_refused_naming_the_value(make) -> None:
    with pytest.raises((ValueError, TypeError), match=r"0\.\.999999999999|10{15}|-1|True|3\.0"):
        make()


def test_GATE_35_the_largest_step_is_accepted_and_step_refuses_an_event_built_around_the_checks() -> None:
    gate = GateWriter.in_memory(CONFIG)
    gate.apply(CycleBoundary(0))
    gate.apply(CycleBoundary(STEP_MAX))  # the bound itself is a valid step
    event = CycleBoundary(5)
    object.__setattr__(event, "step", 10**15)  # bypasses the constructor: step() still refuses
    with pytest.raises(GateInputError, match="GATE-35"):
        GateWriter(MemoryRecorder(), initial_state(CONFIG)).apply(event)


def test_GATE_35_a_manifest_whose_verdict_outcome_is_not_a_member_does_not_decode() -> None:
    state = initial_state(CONFIG)
    for event in story()[:10]:
        state, _ = step(state, event)
    encoded = state_to_json(state)
    encoded["replays"][0]["verdicts"][0]["outcome"] = "attributed"
    with pytest.raises(CodecError, match=r"outcome: 'attributed' is not one of AGREE"):
        state_from_json(encoded)
    encoded["replays"][0]["verdicts"][0]["outcome"] = "AGREE"
    encoded["replays"][0]["verdicts"][0]["outliers"] = [-2]
    with pytest.raises(CodecError, match="outliers"):
        state_from_json(encoded)


def test_GATE_35_the_story_still_runs_with_checked_events() -> None:
    gate = GateWriter.in_memory(CONFIG)
    for event in (CycleBoundary(0), *clean_cycle(1, 0)):
        gate.apply(event)
    assert gate.state.context.covered == CONFIG.recipe_ids


# ------------------------------------------------------------------------------------------
# Manifest files (GATE-34)
# ------------------------------------------------------------------------------------------


def test_GATE_34_a_fifo_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.000000000001.json"
    os.mkfifo(fifo)
    outcome: list[object] = []

    def read() -> None:
        try:
            read_regular_file(fifo)
        except ManifestUnreadable as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5.0)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "is a FIFO, not a regular file" in str(outcome[0])
    # In a manifest directory it counts as a damaged generation: the reader fails closed.
    found = read_manifest_set(tmp_path, None)
    assert [lost.generation for lost in found.lost] == [1] and "FIFO" in found.lost[0].why


def test_GATE_34_a_device_or_an_oversized_file_is_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(ManifestUnreadable, match="is a character device, not a regular file"):
        read_regular_file("/dev/zero")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(ManifestUnreadable, match="2048 bytes, over the 1024-byte limit"):
        read_regular_file(big, max_bytes=1024)
    with pytest.raises(ManifestUnreadable, match="is a directory"):
        read_regular_file(tmp_path)
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1"):
        read_regular_file(big, max_bytes=0)


def test_GATE_34_permission_errors_are_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    recorder, _ = GateRecorder.open(tmp_path, CONFIG)
    recorder.close()
    real_open, real_listdir = os.open, os.listdir

    def denied_open(path, flags, *args):
        if str(path).endswith(".json") and not flags & os.O_WRONLY:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    on_file = build_parser().parse_args(["certificate", str(tmp_path / "manifest.000000000001.json")])
    on_directory = build_parser().parse_args(["certificate", str(tmp_path)])
    monkeypatch.setattr(os, "open", denied_open)
    with pytest.raises(ManifestUnreadable, match=r"permission denied; give the reading user read access"):
        read_regular_file(tmp_path / "manifest.000000000001.json")
    assert on_file.func(on_file) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "permission denied" in err and "Traceback" not in err

    def denied_listdir(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(os, "open", real_open)
    monkeypatch.setattr(os, "listdir", denied_listdir)
    assert on_directory.func(on_directory) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "permission denied listing the manifest directory" in err
    monkeypatch.setattr(os, "listdir", real_listdir)


def test_GATE_34_certificate_cli_on_a_fifo_and_on_dev_zero_exits_2(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert main(["certificate", str(fifo)]) == 2
    assert "is a FIFO, not a regular file" in capsys.readouterr().err
    assert main(["certificate", "/dev/zero"]) == 2
    assert "is a character device" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "observer-behind", "--seed", "-3"], "--seed must be in 0..18446744073709551615, got -3"),
        (["simulate", "observer-behind", "--ranks", "0"], "--ranks must be >= 1, got 0"),
        (["simulate", "observer-behind", "--group-size", "1"], "group_size must be >= 2"),
        (["simulate", "observer-behind", "--rounds", "-1"], "--rounds must be >= 1, got -1"),
        (["simulate", "observer-behind", "--trace", "-5"], "--trace must be >= 0, got -5"),
    ],
)
def test_cli_ranges_are_refused_naming_the_value(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "observer-behind", "--seed", "x1"], "--seed must be an integer, got 'x1'"),
        (["simulate", "observer-behind", "--ranks", "1e6"], "--ranks must be an integer, got '1e6'"),
        (["certificate", "somewhere", "-4"], r"STEP must be a training step \(an int >= 0\), got -4"),
        (["certificate", "somewhere", "ten"], r"STEP must be a training step \(an int >= 0\), got 'ten'"),
    ],
)
def test_cli_arguments_that_do_not_parse_are_one_usage_error(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err


def test_seeds_are_non_negative_so_s_and_minus_s_are_never_the_same_run() -> None:
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -7"):
        ScenarioParams(ranks=8, seed=-7)
    with pytest.raises(ValueError, match="group_size must be an int, got 2.5"):
        ScenarioParams(ranks=8, seed=1, group_size=2.5)  # type: ignore[arg-type]


# An int too large for a float (10**400) is a real number that no float holds: every boundary
# that takes seconds or milliseconds refuses it naming the value, never with an OverflowError.
HUGE = 10**400


@pytest.mark.parametrize("n", [3, 200])  # the plain path and the numpy path (n >= 128)
def test_VERDICT_20_timing_evidence_too_large_for_a_float_is_refused_naming_the_peer(n: int) -> None:
    values: list[object] = [1.0] * (n - 1) + [HUGE]
    with pytest.raises(ValueError, match=rf"^timing evidence must fit a float: peer {n - 1} gave int {HUGE}$"):
        classify_timing(values)


def test_VERDICT_20_timing_config_too_large_for_a_float_is_refused_naming_the_field() -> None:
    from scout.core.verdict import TimingConfig

    with pytest.raises(ValueError, match=rf"^TimingConfig.kappa must fit a float, got {HUGE}$"):
        TimingConfig(kappa=HUGE)


@pytest.mark.parametrize("field", ["stall_threshold_s", "round_deadline_s", "settle_idle_s"])
def test_OBS_observer_thresholds_too_large_for_a_float_are_refused_naming_the_field(field: str) -> None:
    from scout.core.observer.model import ObserverConfig

    with pytest.raises(ValueError, match=rf"^ObserverConfig.{field} must be a finite number of seconds > 0, got {HUGE}$"):
        ObserverConfig(0, 4, **{field: HUGE})


def test_attach_config_seconds_too_large_for_a_float_are_refused_naming_the_key() -> None:
    from scout.job.config import Config, ConfigError

    with pytest.raises(ConfigError, match=rf"^stall_threshold_s must be a number of seconds in \(0, 604800\], got {HUGE}$"):
        Config(stall_threshold_s=HUGE)
