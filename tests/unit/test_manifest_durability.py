"""GATE-M1, the machine-crash half: the order of durability calls, seen by intercepting them.

SIGKILL (test_manifest_crash.py) kills the writing process but never the kernel, so the page
cache survives and a writer without any ``fsync`` passes every kill test. What survives a power
loss is the order of durability calls: the new file's bytes are fsynced while it is still a
temporary file, then it is renamed onto its final name, then the directory holding that name is
fsynced -- all before ``commit`` returns. These tests record every ``fsync``/``fdatasync`` and
every rename the writer makes and check that order; they do not (and cannot, here) check that
the storage stack honours fsync.

The recorder identifies files by inode, not by name or descriptor, so it does not depend on how
the writer opens, names or writes its files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from scout.gate.manifest import ManifestWriter, generation_path, load_manifest
from tests.gate_story import CONFIG, story_payloads

JOB = CONFIG.job_id


class DurabilityLog:
    """Every fsync (what it synced: inode, kind, size at that moment) and every rename."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[Any, ...]] = []
        real_fsync, real_fdatasync = os.fsync, os.fdatasync
        real_replace, real_rename = os.replace, os.rename

        def note_sync(name: str, fd: int) -> None:
            status = os.fstat(fd)
            kind = "dir" if stat.S_ISDIR(status.st_mode) else "file"
            self.events.append(("sync", kind, status.st_ino, status.st_size, name))

        def fsync(fd: Any) -> None:
            fd_number = fd if isinstance(fd, int) else fd.fileno()
            real_fsync(fd)
            note_sync("fsync", fd_number)

        def fdatasync(fd: Any) -> None:
            fd_number = fd if isinstance(fd, int) else fd.fileno()
            real_fdatasync(fd)
            note_sync("fdatasync", fd_number)

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_replace(src, dst, *args, **kwargs)
            self.events.append(("rename", Path(os.fsdecode(src)), Path(os.fsdecode(dst))))

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_rename(src, dst, *args, **kwargs)
            self.events.append(("rename", Path(os.fsdecode(src)), Path(os.fsdecode(dst))))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)

    def mark(self, label: str) -> None:
        self.events.append(("mark", label))


def check_commit_order(events: list[tuple[Any, ...]], directory: Path, final: Path) -> None:
    """The committed file was fsynced whole before it got its final name, and the directory was
    fsynced after that rename; ``events`` are the calls made inside one commit."""
    final_status = final.stat()
    directory_inode = directory.stat().st_ino
    file_syncs = [
        index
        for index, event in enumerate(events)
        if event[0] == "sync" and event[1] == "file" and event[2] == final_status.st_ino
    ]
    assert file_syncs, f"the committed file {final.name} was never fsynced: {events}"
    complete = [i for i in file_syncs if events[i][3] == final_status.st_size]
    assert complete, f"{final.name} was fsynced before all its {final_status.st_size} bytes were written"
    renames = [
        index for index, event in enumerate(events) if event[0] == "rename" and event[2] == final
    ]
    assert len(renames) == 1, f"expected one rename onto {final.name}: {events}"
    (renamed_at,) = renames
    assert complete[0] < renamed_at, f"renamed onto {final.name} before its bytes were fsynced: {events}"
    assert events[renamed_at][1].parent == directory, "the temporary file must live in the same directory"
    directory_syncs = [
        index
        for index, event in enumerate(events)
        if event[0] == "sync" and event[1] == "dir" and event[2] == directory_inode and index > renamed_at
    ]
    assert directory_syncs, f"the directory was not fsynced after the rename onto {final.name}: {events}"


def test_GATE_M1_every_commit_fsyncs_file_then_renames_then_fsyncs_directory_before_returning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DurabilityLog(monkeypatch)
    payloads = story_payloads()[:5]
    with ManifestWriter(tmp_path, JOB) as writer:
        for payload in payloads:
            start = len(log.events)
            generation = writer.commit(payload)
            # Inspected at return: everything the commit relies on has already happened.
            check_commit_order(log.events[start:], tmp_path, generation_path(tmp_path, generation))
    loaded = load_manifest(tmp_path, JOB)
    assert loaded is not None and loaded.payload == payloads[-1]


def test_GATE_M1_the_order_holds_in_a_nested_directory_the_writer_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "run" / "manifest"
    log = DurabilityLog(monkeypatch)
    with ManifestWriter(directory, JOB) as writer:
        generation = writer.commit(story_payloads()[0])
    check_commit_order(log.events, directory, generation_path(directory, generation))


def test_GATE_M1_resume_that_sets_damaged_files_aside_fsyncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting a damaged newer generation aside is a rename; it is made durable (directory
    fsync) before the writer commits. The next number is above every number a file names, the
    damaged one included (GATE-32: no number is ever reused)."""
    payloads = story_payloads()[:3]
    with ManifestWriter(tmp_path, JOB) as writer:
        for payload in payloads:
            writer.commit(payload)
    newest = generation_path(tmp_path, 3)
    newest.write_bytes(newest.read_bytes()[:-7])  # torn
    log = DurabilityLog(monkeypatch)
    with pytest.warns(UserWarning), ManifestWriter(tmp_path, JOB) as writer:
        log.mark("resumed")
        generation = writer.commit(payloads[0])
    assert generation == 4
    resumed_at = log.events.index(("mark", "resumed"))
    aside = [i for i, e in enumerate(log.events[:resumed_at]) if e[0] == "rename" and e[1] == newest]
    assert aside, f"the damaged file was not set aside: {log.events}"
    directory_inode = tmp_path.stat().st_ino
    assert any(
        e[0] == "sync" and e[1] == "dir" and e[2] == directory_inode for e in log.events[aside[0] : resumed_at]
    ), f"setting {newest.name} aside was not made durable before the writer opened: {log.events}"
