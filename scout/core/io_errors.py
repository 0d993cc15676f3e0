"""Write errors that say which file and what to do (spec/ops.md OPS-13).

A full disk raises ``OSError(ENOSPC, "No space left on device")`` from ``os.write`` or
``os.fsync``, with no file named: the operator of a job stopped by it cannot tell which file
system filled up. :func:`name_write_error` adds the file and the remedy to such an error, in
place (same class, same errno, same traceback), so callers that handle OSError still do.
Pure: no I/O.
"""

from __future__ import annotations

import errno
import os

__all__ = ["name_write_error"]

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def _advice(error_number: int | None, path: str) -> str:
    folder = os.path.dirname(path) or "."
    if error_number in _FULL:
        return f"the file system holding {folder} is full (or over quota): free space there, or point run_dir elsewhere"
    if error_number in _DENIED:
        return f"this process may not write {folder}: check its permissions and the mount"
    return f"check {folder} and the file system holding it"


def name_write_error(error: OSError, path: str | os.PathLike[str], doing: str) -> OSError:
    """``error``, now naming ``path``, what was being done (``doing``: "appending a report") and
    what to do. An error with an errno is changed in place and returned (raise it again); one
    without (a message only) is returned as a new OSError carrying the same words."""
    where = os.fspath(path)
    if error.errno is None:
        return OSError(f"{doing} to {where} failed: {error}; {_advice(None, where)}")
    why = error.strerror or os.strerror(error.errno)
    if not why.endswith(_advice(error.errno, where)):
        error.strerror = f"{why} ({doing}); {_advice(error.errno, where)}"
    error.filename = where
    return error
