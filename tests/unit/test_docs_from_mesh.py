"""One `TorchPeerGroup.from_mesh` signature in every document (spec/replay.md PEER-2): the
replicate dimensions as a tuple of names, as `scout.attach`'s own warning writes it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_PEER_2_every_document_writes_from_mesh_with_a_tuple_of_replicate_dimensions() -> None:
    documents = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*.py"))]
    calls = [(path.name, m.group(0)) for path in documents
             for m in re.finditer(r"from_mesh\(\s*mesh\s*,\s*[^\s)]+", path.read_text())]
    assert calls, "no document shows from_mesh"
    assert [c for c in calls if not re.search(r"from_mesh\(mesh, \(\"\w+\",( \"\w+\",?)*\)?", c[1])] == []
