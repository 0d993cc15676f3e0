"""A toy machine for the spec machinery's own tests: a bounded counter that reports once it
reaches its limit. Small enough to read, rich enough to use every feature of the format."""

from __future__ import annotations

from pathlib import Path

TOY_DIR = Path(__file__).parent
TOY_TABLE_PATH = TOY_DIR / "toy.toml"
TOY_DOCUMENT_PATH = TOY_DIR / "toy.md"


def write_toy_variant(directory: Path, old: str, new: str, *, count: int = 1) -> Path:
    """Copy toy.toml into ``directory`` with ``old`` replaced by ``new`` (``count`` times, and
    ``old`` must occur), so each bad-table test states exactly what it breaks."""
    text = TOY_TABLE_PATH.read_text(encoding="utf-8")
    assert text.count(old) >= count, f"toy.toml no longer contains {old!r}; update the test"
    path = directory / "toy.toml"
    path.write_text(text.replace(old, new, count), encoding="utf-8")
    return path
