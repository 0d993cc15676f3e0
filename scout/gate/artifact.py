"""The framework's checkpoints on disk: their content digest and the quarantine mark
(spec/frameworks.md FRAME-7, FRAME-9). The gate decides trust (scout.gate.machine); this module
only reads and marks the files. No torch.

The digest (FRAME-7) is ``blake2b-256:`` and the hex BLAKE2b (32-byte digest) of, for each
regular file under the checkpoint (the file itself when the checkpoint is one file), in the
order of the relative paths' UTF-8 bytes, skipping scout's own marks (names beginning
``SCOUT_``) and symbolic links: the relative path in UTF-8, a NUL byte, the size as 8 bytes
big-endian, then the bytes. So two checkpoints have the same digest exactly when they hold the
same files with the same contents, and renaming a file inside changes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

__all__ = ["DIGEST_PREFIX", "MARK_NAME", "content_digest", "mark_path", "mark_quarantined", "remove_mark"]

DIGEST_PREFIX: Final = "blake2b-256:"
#: FRAME-9: the file that says "do not resume from this checkpoint".
MARK_NAME: Final = "SCOUT_QUARANTINED"
#: Files are read in chunks of this many bytes (bounded memory whatever a file's size).
CHUNK_BYTES: Final = 4 << 20


def _files(root: Path) -> Iterator[tuple[str, Path]]:
    if root.is_file():
        yield root.name, root
        return
    found: list[tuple[bytes, str, Path]] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories.sort()
        for name in names:
            path = Path(directory) / name
            if name.startswith("SCOUT_") or path.is_symlink() or not path.is_file():
                continue
            relative = path.relative_to(root).as_posix()
            found.append((relative.encode(), relative, path))
    for _key, relative, path in sorted(found):
        yield relative, path


def content_digest(path: str | os.PathLike[str]) -> str:
    """FRAME-7: the content digest of the checkpoint at ``path`` (a directory or one file).
    Raises FileNotFoundError when nothing is there."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no checkpoint at {root}")
    digest = hashlib.blake2b(digest_size=32)
    for relative, file in _files(root):
        with file.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            digest.update(relative.encode() + b"\0" + size.to_bytes(8, "big"))
            while chunk := stream.read(CHUNK_BYTES):
                digest.update(chunk)
    return DIGEST_PREFIX + digest.hexdigest()


def mark_path(path: str | os.PathLike[str]) -> Path:
    """FRAME-9: inside a directory checkpoint; beside a one-file checkpoint (``step=30.ckpt`` gets
    ``step=30.ckpt.SCOUT_QUARANTINED``)."""
    root = Path(path)
    return root / MARK_NAME if root.is_dir() else root.with_name(f"{root.name}.{MARK_NAME}")


def mark_quarantined(path: str | os.PathLike[str], details: dict[str, Any]) -> Path | None:
    """FRAME-9: write the mark (atomically: a temporary file renamed into place, then synced).
    None when the checkpoint is gone (a framework's rotation removed it: nothing to mark)."""
    if not Path(path).exists():
        return None
    mark = mark_path(path)
    temporary = mark.with_name(f".{mark.name}.tmp")
    text = json.dumps({"scout": "quarantined", **details}, indent=2, sort_keys=True) + "\n"
    with temporary.open("w", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, mark)
    with contextlib.suppress(OSError):
        directory = os.open(mark.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return mark


def remove_mark(path: str | os.PathLike[str]) -> bool:
    """FRAME-9: a new checkpoint written where a quarantined one was (a restarted run saves the
    same step again) is not quarantined: its stale mark goes. True when there was one."""
    mark = mark_path(path)
    try:
        mark.unlink()
    except FileNotFoundError:
        return False
    return True
