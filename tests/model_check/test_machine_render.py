"""Generated spec documents: the block is derived from the table alone, spliced between its
markers without touching prose, and ``scout spec --check`` fails on any stale document."""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs
import pytest

from scout.cli import main as scout_main
from scout.core.machine import SpecError, load_table, render_block, splice
from scout.core.machine.render import begin_marker, end_marker
from tests.model_check.toy import TOY_DIR, TOY_DOCUMENT_PATH, TOY_TABLE_PATH, write_toy_variant

PROSE_BEFORE = "# Toy\n\nHand-written introduction | with a pipe.\n\n"
PROSE_AFTER = "\n## Notes\n\nHand-written notes.\n"


def test_block_shows_every_state_event_row_and_invariant_and_is_deterministic() -> None:
    table = load_table(TOY_TABLE_PATH)
    block = render_block(table)
    assert block == render_block(load_table(TOY_TABLE_PATH))
    assert block.startswith(begin_marker("toy") + "\n") and block.endswith(end_marker("toy") + "\n")
    for state in table.states:
        assert f"| `{state.name}` | {state.meaning} |" in block
    for row in table.rows:
        assert f"| {row.number} | `{row.source}` | `{row.trigger}` |" in block and row.why in block
    for invariant in table.invariants:
        assert (
            f"| {invariant.id} | {invariant.kind} | {invariant.scope} | `{invariant.predicate}` |"
            in block
        )
    assert "stateDiagram-v2\n    [*] --> IDLE\n" in block
    assert "    COUNTING --> DONE: tick [at_limit] / report\n" in block
    # Ignore rows stay out of the diagram but are marked in the table.
    assert "DONE --> DONE" not in block and "| `DONE` | (ignored) |" in block


def test_markdown_cells_escape_pipes_and_fold_newlines() -> None:
    table = load_table(TOY_TABLE_PATH)
    row = attrs.evolve(table.rows[0], why="a | b\nc")
    block = render_block(attrs.evolve(table, rows=(row, *table.rows[1:])))
    assert "| a \\| b c |" in block


def test_splice_replaces_only_the_block_and_keeps_prose_byte_for_byte() -> None:
    block = render_block(load_table(TOY_TABLE_PATH))
    stale = (
        PROSE_BEFORE
        + begin_marker("toy")
        + "\nold content\n"
        + end_marker("toy")
        + "\n"
        + PROSE_AFTER
    )
    fresh = splice(stale, block, "toy", "toy.md")
    assert fresh == PROSE_BEFORE + block + PROSE_AFTER
    assert splice(fresh, block, "toy", "toy.md") == fresh


def test_splice_appends_a_block_to_a_document_without_markers() -> None:
    block = render_block(load_table(TOY_TABLE_PATH))
    assert splice(PROSE_BEFORE, block, "toy", "toy.md") == PROSE_BEFORE + block
    assert splice("# Toy", block, "toy", "toy.md") == "# Toy\n\n" + block


def test_splice_leaves_other_machines_blocks_alone() -> None:
    block = render_block(load_table(TOY_TABLE_PATH))
    other = begin_marker("other") + "\nkept\n" + end_marker("other") + "\n"
    assert splice(other, block, "toy", "toy.md") == other + "\n" + block


@pytest.mark.parametrize(
    "document",
    [
        "prose\n" + begin_marker("toy") + "\nno end\n",
        "prose\n" + end_marker("toy") + "\n",
        begin_marker("toy")
        + "\n"
        + end_marker("toy")
        + "\n"
        + begin_marker("toy")
        + "\n"
        + end_marker("toy")
        + "\n",
        end_marker("toy") + "\n" + begin_marker("toy") + "\n",
    ],
    ids=["begin_only", "end_only", "two_blocks", "end_before_begin"],
)
def test_splice_refuses_broken_markers_naming_the_document(document: str) -> None:
    with pytest.raises(SpecError, match=r"spec/toy\.md: expected one line"):
        splice(document, "block\n", "toy", "spec/toy.md")


def copy_toy(spec_dir: Path, *, with_document: bool = True) -> Path:
    spec_dir.mkdir(exist_ok=True)
    shutil.copy(TOY_TABLE_PATH, spec_dir / "toy.toml")
    if with_document:
        shutil.copy(TOY_DOCUMENT_PATH, spec_dir / "toy.md")
    return spec_dir


def scout_spec(spec_dir: Path, *extra: str) -> int:
    return scout_main(["spec", "--spec-dir", str(spec_dir), *extra])


def test_committed_toy_document_is_current() -> None:
    assert scout_spec(TOY_DIR, "--check") == 0


def test_check_detects_a_stale_document_and_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_dir = copy_toy(tmp_path / "spec")
    write_toy_variant(spec_dir, "nothing to abandon", "no count to abandon")
    document_before = (spec_dir / "toy.md").read_text()
    assert scout_spec(spec_dir, "--check") == 1
    err = capsys.readouterr().err
    assert f"{spec_dir / 'toy.md'} is stale" in err and "Run `scout spec`" in err
    assert "+| 5 | `IDLE` | `reset` |  | `IDLE` | (ignored) | no count to abandon |" in err
    assert (spec_dir / "toy.md").read_text() == document_before  # --check writes nothing

    assert scout_spec(spec_dir) == 0
    regenerated = (spec_dir / "toy.md").read_text()
    assert "no count to abandon" in regenerated
    assert scout_spec(spec_dir, "--check") == 0
    # The hand-written prose on both sides of the block survived.
    assert (
        regenerated.split(begin_marker("toy"))[0] == document_before.split(begin_marker("toy"))[0]
    )
    assert regenerated.split(end_marker("toy"))[1] == document_before.split(end_marker("toy"))[1]


def test_missing_document_fails_check_and_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_dir = copy_toy(tmp_path / "spec", with_document=False)
    assert scout_spec(spec_dir, "--check") == 1
    assert "toy.md is missing" in capsys.readouterr().err
    assert scout_spec(spec_dir) == 0
    created = (spec_dir / "toy.md").read_text()
    assert created.startswith("# Machine `toy`") and begin_marker("toy") in created
    assert scout_spec(spec_dir, "--check") == 0


def test_zero_machine_tables_is_success(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "decisions.toml").write_text('[decision]\nrule = "not a machine"\n')
    assert scout_spec(tmp_path, "--check") == 0
    out = capsys.readouterr().out
    assert "no [machine] table, skipped" in out and "no machine tables" in out


def test_invalid_table_fails_check_with_the_loader_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_dir = copy_toy(tmp_path / "spec")
    write_toy_variant(spec_dir, 'initial = "IDLE"', 'initial = "START"')
    assert scout_spec(spec_dir, "--check") == 1
    assert "'START'" in capsys.readouterr().err


def test_missing_spec_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scout_spec(tmp_path / "absent", "--check") == 2
    assert "no spec directory" in capsys.readouterr().err
