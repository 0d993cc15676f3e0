"""``scout simulate``, run in-process through scout.cli.main."""

from __future__ import annotations

import json

import pytest

from scout.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--list")
    assert code == 0
    for name in (
        "exchange-healthy",
        "exchange-silent-peer",
        "exchange-partition",
        "crash-during-allgather",
        "corrupt-evidence",
    ):
        assert name in out


def test_table_shows_rounds_missing_ranks_and_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "exchange-silent-peer", "--ranks", "8", "--seed", "7")
    assert code == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("round"))
    assert header.split() == ["round", "answered", "missing", "partial", "t_virtual_s"]
    row3 = next(line for line in lines if line.startswith("3 "))
    assert row3.split()[1] == "7" and "[" in row3  # 7 of 8 answered; the frozen rank named
    assert "seed=7" in lines[1]
    assert (
        lines[-1]
        == "ok: seed=7; reproduce with: scout simulate exchange-silent-peer --ranks 8 --seed 7"
    )


def test_same_seed_same_output(capsys: pytest.CaptureFixture[str]) -> None:
    _, first, _ = run_cli(capsys, "--json", "exchange-partition", "--ranks", "6", "--seed", "3")
    _, second, _ = run_cli(capsys, "--json", "exchange-partition", "--ranks", "6", "--seed", "3")
    one, two = json.loads(first), json.loads(second)
    for document in (one, two):
        for timing in ("wall_s", "run_wall_s", "events_per_s"):
            document.pop(timing)
    assert one == two


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "corrupt-evidence", "--ranks", "5", "--seed", "2", "--json", "--trace", "3"
    )
    assert code == 0
    document = json.loads(out)
    assert document["scenario"] == "corrupt-evidence" and document["seed"] == 2
    assert document["ok"] is True and all(check["ok"] for check in document["checks"])
    assert document["columns"][3] == "corrupted_from"
    assert len(document["rows"]) == 6 and len(document["trace"]) == 3
    assert (
        document["reproduce"]
        == "reproduce with: scout simulate corrupt-evidence --ranks 5 --seed 2"
    )


def test_a_seed_is_drawn_and_printed_when_none_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "exchange-healthy", "--ranks", "3", "--json")
    document = json.loads(out)
    assert code == 0 and isinstance(document["seed"], int)
    assert f"--seed {document['seed']}" in document["reproduce"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("nope",), "unknown scenario 'nope'; known scenarios: corrupt-evidence"),
        (("exchange-healthy", "--ranks", "0"), "--ranks must be >= 1, got 0"),
        (("exchange-partition", "--ranks", "1"), "needs at least 2 ranks, got 1"),
        (("exchange-healthy", "--group-size", "1"), "group_size must be >= 2"),
        (("exchange-silent-peer", "--rounds", "2"), "needs at least 4 rounds"),
        ((), "name a scenario, or pass --list"),
    ],
)
def test_bad_arguments_are_clear_errors(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert fragment in err


def test_a_failed_check_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout.scenarios import exchange as scenarios

    monkeypatch.setattr(scenarios, "TIMEOUT_S", 1e-6)  # nothing can answer in time now
    code, out, _ = run_cli(capsys, "exchange-healthy", "--ranks", "4", "--seed", "1")
    assert code == 1
    assert "FAIL" in out
    assert out.splitlines()[-1].startswith(
        "FAILED: seed=1; reproduce with: scout simulate exchange-healthy"
    )
