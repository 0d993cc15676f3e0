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


def test_PEER_2_docs_replay_builds_its_mesh_as_the_layout_the_tests_run() -> None:
    """docs/replay.md's HSDP block builds the mesh and peers with the very lines of
    docs/attach.md's layout block, which tests/job/hsdp_job.py runs as written."""
    layout = (REPO / "docs" / "attach.md").read_text().split("<!-- layout: begin -->", 1)[1]
    layout = layout.split("<!-- layout: end -->", 1)[0]
    replay = (REPO / "docs" / "replay.md").read_text()
    block = next(b for b in replay.split("```python")[1:] if "fully_shard" in b).split("```", 1)[0]
    code = [line.split("#", 1)[0].rstrip() for line in block.splitlines()]
    wanted = [line.split("#", 1)[0].rstrip() for line in layout.splitlines()
              if line.strip() and not line.startswith(("```", "from ", "import "))]
    assert [line for line in wanted if line not in code] == []
    assert "from scout.replay import TorchPeerGroup, attach_replay" in block
