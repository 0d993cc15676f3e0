"""The manifest's frames and checksums, byte by byte (docs/gate.md GATE-M2, GATE-M4; spec/gate.md
GATE-31, GATE-34; scout/gate/manifest.py).

A generation file and the head are ``MAGIC sha256=<hex> bytes=<n>`` then exactly ``n`` bytes; a
trust-log line is ``scout-trust sha256=<hex> <JSON>`` and a newline. The rule (issue 26): a file
or line with one byte more than its frame declares is refused -- as damaged, with the reason --
never read as if the extra byte were not there. Here also: the exact bytes each frame is made
of, the exact reason each malformed frame is refused with, and how a file is read (a regular
file only, never waited on, capped while read: GATE-34). Mutation target ``gate-manifest``
(tests/mutation/)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from pathlib import Path

import pytest

from scout.gate import manifest as manifest_module
from scout.gate.manifest import (
    GENERATION_MAX,
    HEAD_NAME,
    LOG_NAME,
    MAX_FILE_BYTES,
    NESTING_MAX,
    WRITE_STAGES,
    ManifestBusy,
    ManifestDamaged,
    ManifestError,
    ManifestFallbackWarning,
    ManifestFormatTooNew,
    ManifestJobMismatch,
    ManifestRepairWarning,
    ManifestUnreadable,
    ManifestWriter,
    _Damaged,
    _json_document,
    _parse_log,
    _Undecodable,
    decode_manifest,
    encode_manifest,
    load_manifest,
    log_line,
    read_manifest_set,
    read_regular_file,
)

JOB = "job-frames"
PATH = Path("manifest.000000000007.json")


def _damage(data: bytes, path: Path = PATH, job_id: str | None = JOB) -> str:
    with pytest.raises(_Damaged) as error:
        decode_manifest(data, path, job_id)
    return str(error.value)


def _frame(magic: str, body: bytes, declared: int | None = None, digest: str | None = None) -> bytes:
    digest = hashlib.sha256(body).hexdigest() if digest is None else digest
    size = len(body) if declared is None else declared
    return f"{magic} sha256={digest} bytes={size}\n".encode() + body


def test_GATE_M2_a_generation_file_is_its_header_and_exactly_its_canonical_json() -> None:
    body = (b'{\n "format_version": 1,\n "generation": 7,\n "job_id": "job-frames",\n "payload": {\n'
            b'  "a": [\n   1,\n   "x"\n  ],\n  "b": null\n }\n}\n')
    assert encode_manifest(JOB, 7, {"b": None, "a": [1, "x"]}) == _frame("scout-gate-manifest", body)
    loaded = decode_manifest(_frame("scout-gate-manifest", body), PATH, JOB)
    assert (loaded.path, loaded.generation, loaded.job_id, loaded.format_version, loaded.payload, loaded.skipped,
            loaded.sha256) == (PATH, 7, JOB, 1, {"b": None, "a": [1, "x"]}, (), hashlib.sha256(body).hexdigest())
    # Any job is accepted when none is asked for (inspection tools).
    assert decode_manifest(_frame("scout-gate-manifest", body), PATH, None).job_id == JOB


@pytest.mark.parametrize("extra", [b"\n", b" ", b"\x00", b"}"])
def test_GATE_M2_a_generation_file_with_one_trailing_byte_is_refused(extra: bytes) -> None:
    data = encode_manifest(JOB, 7, {"gate": 1})
    declared = len(data) - data.index(b"\n") - 1
    assert _damage(data + extra) == (f"body is {declared + 1} bytes, header says {declared} (truncated or extended)")
    assert _damage(data[:-1]) == (f"body is {declared - 1} bytes, header says {declared} (truncated or extended)")


def test_GATE_M2_a_head_with_one_trailing_byte_is_refused_and_the_generations_are_read(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": 1})
    head = tmp_path / HEAD_NAME
    good = read_manifest_set(tmp_path, JOB)
    assert good.head is not None and good.head.generation == 1 and good.problems == ()
    head.write_bytes(head.read_bytes() + b"\n")
    found = read_manifest_set(tmp_path, JOB)
    assert found.head is None and found.newest is not None and found.newest.generation == 1
    declared = len(head.read_bytes()) - head.read_bytes().index(b"\n") - 2
    assert found.problems == (f"{head}: body is {declared + 1} bytes, header says {declared} (truncated or extended); "
                              "ignored (the generations themselves are read)",)


def test_GATE_M2_a_trust_log_line_with_one_trailing_byte_is_refused() -> None:
    line = log_line({"sequence": 1, "generation": 1, "job_id": JOB})
    assert line == (b"scout-trust sha256=" + hashlib.sha256(b'{"generation":1,"job_id":"job-frames","sequence":1}')
                    .hexdigest().encode() + b' {"generation":1,"job_id":"job-frames","sequence":1}\n')
    records, problems, length = _parse_log(line, Path(LOG_NAME), JOB)
    assert (records, problems, length) == ([{"sequence": 1, "generation": 1, "job_id": JOB}], [], len(line))
    not_a_line = f"{LOG_NAME} line 1: not a 'scout-trust sha256=<hex> {{...}}' line; skipped"
    # A byte after the closing brace: not a line; one more brace: a JSON text the digest is not of.
    for extra, problem in ((b" ", not_a_line), (b"x", not_a_line), (b"\r", not_a_line),
                           (b"}", f"{LOG_NAME} line 1: checksum does not match (altered); skipped")):
        records, problems, length = _parse_log(line[:-1] + extra + b"\n", Path(LOG_NAME), JOB)
        assert (records, problems, length) == ([], [problem], len(line) + 1), extra


def test_GATE_M2_every_malformed_header_is_refused_naming_the_frame() -> None:
    body = b'{"format_version": 1}'
    expected = ("first line is not 'scout-gate-manifest sha256=<64 hex> bytes=<n>' (torn or not a scout-gate-manifest "
                "file)")
    for data in (
        b"",
        body,
        _frame("scout-gate-head", body),  # another kind of file
        _frame("scout-gate-manifest", body).replace(b"sha256=", b"sha256:"),
        _frame("scout-gate-manifest", body, digest="A" * 64),  # upper-case hex
        _frame("scout-gate-manifest", body, digest="a" * 63),
        _frame("scout-gate-manifest", body, declared=10**12),  # 13 digits
        _frame("scout-gate-manifest", body).replace(b"\n", b"\r\n", 1),
        b"scout-gate-manifest sha256=" + b"a" * 64 + b" bytes=" + b"1" * 200 + b"\n",  # past the header cap
    ):
        assert _damage(data) == expected, data[:80]


def test_GATE_M2_an_altered_body_is_refused_naming_both_digests() -> None:
    data = bytearray(encode_manifest(JOB, 7, {"gate": 1}))
    data[-3] ^= 0x01
    header, body = bytes(data).split(b"\n", 1)
    declared = header.split(b"sha256=")[1].split(b" ")[0].decode()
    assert _damage(bytes(data)) == (f"sha256 of the body is {hashlib.sha256(body).hexdigest()}, header says "
                                    f"{declared} (altered)")


def _verified(document: object) -> bytes:
    return _frame("scout-gate-manifest", json.dumps(document).encode())


def test_GATE_M2_a_verified_body_that_is_not_a_generation_is_refused_saying_what_it_is() -> None:
    good = {"format_version": 1, "job_id": JOB, "generation": 7, "payload": {}}
    cases = [
        (_frame("scout-gate-manifest", b"\xff\xfe"), "verified body is not JSON scout can read: "),
        (_frame("scout-gate-manifest", b"{"), "verified body is not JSON scout can read: "),
        (_verified([1]), "verified body is list, not a JSON object"),
        (_verified({**good, "format_version": 0}), "format_version is 0, not a positive int"),
        (_verified({**good, "format_version": True}), "format_version is True, not a positive int"),
        (_verified({**good, "format_version": "1"}), "format_version is '1', not a positive int"),
        (_verified({k: v for k, v in good.items() if k != "format_version"}), "format_version is None, not a positive int"),
        (_verified({**good, "job_id": ""}), "job_id is '', not a non-empty string"),
        (_verified({**good, "job_id": 5}), "job_id is 5, not a non-empty string"),
        (_verified({**good, "generation": "7"}), "generation is '7', not an int"),
        (_verified({**good, "generation": True}), "generation is True, not an int"),
        (_verified({**good, "payload": []}), "payload is list, not a JSON object"),
        (_verified({**good, "generation": 8}), "file name says generation 7, content says 8 (renamed?)"),
    ]
    for data, message in cases:
        text = _damage(data)
        assert text.startswith(message) if message.endswith(": ") else text == message, (text, message)
    # A file not named like a generation is not checked against its name.
    assert decode_manifest(_verified({**good, "generation": 8}), Path("copy.json"), JOB).generation == 8
    assert decode_manifest(_verified(good), PATH, JOB).payload == {}


def test_GATE_M4_a_verified_file_of_another_job_or_a_newer_format_is_an_error_naming_both() -> None:
    good = {"format_version": 1, "job_id": "other-job", "generation": 7, "payload": {}}
    with pytest.raises(ManifestJobMismatch) as mismatch:
        decode_manifest(_verified(good), PATH, JOB)
    assert str(mismatch.value) == (f"{PATH}: manifest belongs to job_id 'other-job', not {JOB!r}; point this job at its "
                                   "own manifest directory (or pass the job id that wrote it)")
    with pytest.raises(ManifestFormatTooNew) as newer:
        decode_manifest(_verified({**good, "format_version": 2}), PATH, JOB)
    assert str(newer.value) == (f"{PATH}: manifest format_version 2 is newer than this scout reads (1); upgrade scout "
                                "on every rank before resuming this job")


def test_GATE_M2_what_cannot_be_written_as_a_generation_is_refused_naming_the_value() -> None:
    cases = [
        (("", 1, {}), "job_id must be a non-empty string, got ''"),
        ((None, 1, {}), "job_id must be a non-empty string, got None"),
        ((JOB, 0, {}), f"generation must be an int in 1..{GENERATION_MAX}, got 0"),
        ((JOB, GENERATION_MAX + 1, {}), f"generation must be an int in 1..{GENERATION_MAX}, got {GENERATION_MAX + 1}"),
        ((JOB, True, {}), f"generation must be an int in 1..{GENERATION_MAX}, got True"),
        ((JOB, 1.0, {}), f"generation must be an int in 1..{GENERATION_MAX}, got 1.0"),
        ((JOB, 1, [1]), "manifest payload must be a JSON object (a mapping), got list"),
        ((JOB, 1, {"x": math.nan}), "manifest payload is not plain JSON (generation 1): Out of range float values are "
                                    "not JSON compliant"),
        ((JOB, 2, {"x": {1, 2}}), "manifest payload is not plain JSON (generation 2): Object of type set is not JSON "
                                  "serializable"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError) as error:
            encode_manifest(*args)  # type: ignore[arg-type]
        assert str(error.value).startswith(message), (str(error.value), message)
    assert decode_manifest(encode_manifest(JOB, 1, {}), Path("manifest.000000000001.json"), JOB).generation == 1
    top = Path(f"manifest.{GENERATION_MAX:012d}.json")
    assert decode_manifest(encode_manifest(JOB, GENERATION_MAX, {}), top, JOB).generation == GENERATION_MAX


def test_GATE_M2_trust_log_lines_each_carry_their_own_digest() -> None:
    good = log_line({"sequence": 2, "generation": 3, "job_id": JOB})
    altered = good.replace(b'"sequence":2', b'"sequence":3')
    cases = [
        (altered, f"{LOG_NAME} line 1: checksum does not match (altered); skipped"),
        (b"scout-trust sha256=" + hashlib.sha256(b"{\xff}").hexdigest().encode() + b" {\xff}\n",
         f"{LOG_NAME} line 1: verified line is not JSON scout can read (not ASCII (ordinal not in range(128) at byte 1)); skipped"),
    ]
    for body, problem in ((b'{"sequence":0,"generation":1}', "0 / generation 1"),
                          (b'{"sequence":1,"generation":true}', "1 / generation True"),
                          (b'{"generation":1}', "None / generation 1"),
                          (b'{"sequence":1,"generation":"2"}', "1 / generation '2'")):
        line = b"scout-trust sha256=" + hashlib.sha256(body).hexdigest().encode() + b" " + body + b"\n"
        cases.append((line, f"{LOG_NAME} line 1: sequence {problem} are not ints >= 1; skipped"))
    for line, problem in cases:
        assert _parse_log(line + good, Path(LOG_NAME), JOB) == (
            [{"sequence": 2, "generation": 3, "job_id": JOB}], [problem], len(line + good))
    # A last line without its newline is a write in progress: neither a record nor a problem.
    assert _parse_log(good + good[:-1], Path(LOG_NAME), JOB) == ([json.loads(good.split(b" ", 2)[2])], [], len(good))
    # Lines are numbered from 1, problems in file order.
    records, problems, _ = _parse_log(good + b"junk\n" + altered, Path(LOG_NAME), JOB)
    assert len(records) == 1 and [p.split(":")[0] for p in problems] == [f"{LOG_NAME} line 2", f"{LOG_NAME} line 3"]
    with pytest.raises(ManifestJobMismatch) as error:
        _parse_log(log_line({"sequence": 1, "generation": 1, "job_id": "other"}), Path(LOG_NAME), JOB)
    assert str(error.value).startswith(f"{LOG_NAME}: trust log line 1 belongs to job_id 'other', not {JOB!r}")


def test_GATE_M2_a_trust_log_line_is_plain_ascii_json() -> None:
    line = log_line({"sequence": 1, "generation": 1, "reason": "détail"})
    assert b'"reason":"d\\u00e9tail"' in line and line.isascii()
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        log_line({"sequence": 1, "generation": 1, "x": math.nan})


def test_GATE_33_a_trust_log_record_needs_an_int_sequence_of_at_least_one(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        for record in ([("sequence", 1)], {"sequence": True}, {"sequence": "1"}, {"sequence": 0}, {"sequence": 1.0}, {}):
            with pytest.raises(ValueError) as error:
                writer.commit({"gate": 1}, [record])  # type: ignore[list-item]
            assert str(error.value) == f"a trust-log record needs an int 'sequence' >= 1, got {record!r}"
        # Refused before anything is written: no generation used its number.
        assert writer.commit({"gate": 1}, [{"sequence": 1}]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".writer.lock", "manifest.000000000001.json",
                                                          "manifest.head", "trust.log"]


# ------------------------------------------------------------------------------------------
# Reading a file: a regular file, capped, one clear line on failure (GATE-34)
# ------------------------------------------------------------------------------------------


def _unreadable(path: object, max_bytes: int = MAX_FILE_BYTES) -> str:
    with pytest.raises(ManifestUnreadable) as error:
        read_regular_file(path, max_bytes)  # type: ignore[arg-type]
    return str(error.value)


def test_GATE_34_the_cap_is_an_int_of_at_least_one_and_a_file_of_exactly_the_cap_is_read(tmp_path: Path) -> None:
    for bad in (0, -1, True, 1.5, "10"):
        with pytest.raises(ValueError) as error:
            read_regular_file(tmp_path / "x", bad)  # type: ignore[arg-type]
        assert str(error.value) == f"max_bytes must be an int >= 1, got {bad!r}"
    path = tmp_path / "ten"
    path.write_bytes(b"0123456789")
    assert read_regular_file(path, 10) == b"0123456789"
    assert read_regular_file(path, 11) == b"0123456789"
    assert _unreadable(path, 9) == f"{path}: 10 bytes, over the 9-byte limit of a manifest file; this is not a scout manifest"
    one = tmp_path / "one"
    one.write_bytes(b"x")
    assert read_regular_file(one, 1) == b"x"


def test_GATE_34_a_file_larger_than_one_read_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "large"
    data = bytes(range(256)) * (6 * 1024)  # 1.5 MiB: two reads of at most 1 MiB
    path.write_bytes(data)
    assert read_regular_file(path) == data


def test_GATE_34_what_cannot_be_opened_is_one_line_naming_the_file(tmp_path: Path) -> None:
    assert _unreadable(tmp_path / "absent") == f"{tmp_path / 'absent'}: no such file"
    (tmp_path / "file").write_text("")
    below = tmp_path / "file" / "child"
    assert _unreadable(below) == f"{below}: cannot open: Not a directory"
    assert _unreadable(tmp_path) == (f"{tmp_path}: is a directory, not a regular file; a manifest is a regular file "
                                     "written by scout")


def test_GATE_34_a_file_the_reader_may_not_read_says_what_to_do() -> None:
    # Write-only for everyone, root included (a sysctl trigger); present on Linux.
    path = Path("/proc/sys/vm/compact_memory")
    if not path.exists():
        pytest.skip(f"{path} is not on this system")
    assert _unreadable(path) == (f"{path}: permission denied; give the reading user read access to the file and its "
                                 "directory")


def test_GATE_34_a_fifo_is_refused_at_once_without_a_writer(tmp_path: Path) -> None:
    """Opened non-blocking: a FIFO nobody writes to is refused, never waited on. (Were it
    opened blocking, the read would hang; the writer end opened below then releases it.)"""
    fifo = tmp_path / "manifest.000000000001.json"
    os.mkfifo(fifo)
    outcome: list[str] = []
    reader = threading.Thread(target=lambda: outcome.append(_unreadable(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    hung = reader.is_alive()
    if hung:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked open return
        reader.join(timeout=10)
    assert not hung, "reading a FIFO blocked"
    assert outcome == [f"{fifo}: is a FIFO, not a regular file; a manifest is a regular file written by scout"]


def test_GATE_34_a_file_that_grows_past_the_cap_while_read_is_refused() -> None:
    # /proc files report a size of 0 and are read a page at a time: the size check passes and
    # the cap must be enforced while reading, over the sum of the reads.
    path = Path("/proc/kallsyms")
    if not path.exists():
        pytest.skip(f"{path} is not on this system")
    assert _unreadable(path, 10_000) == f"{path}: grew past the 10000-byte limit while read"


def test_GATE_34_a_failed_read_is_one_line_naming_the_file() -> None:
    path = Path("/proc/self/mem")  # its offset 0 is never mapped: a read fails with EIO
    if not path.exists():
        pytest.skip(f"{path} is not on this system")
    assert _unreadable(path) == f"{path}: read failed: Input/output error"


# ------------------------------------------------------------------------------------------
# The writer: what it leaves on disk, and what it refuses (GATE-M1, GATE-32, GATE-33)
# ------------------------------------------------------------------------------------------


def test_GATE_M1_a_commit_passes_every_write_stage_in_order_and_writes_files_of_mode_644(tmp_path: Path) -> None:
    stages: list[tuple[str, int]] = []
    previous = os.umask(0o022)
    try:
        with ManifestWriter(tmp_path, JOB, hook=lambda stage, generation: stages.append((stage, generation))) as writer:
            writer.commit({"gate": 1}, [{"sequence": 1}])
    finally:
        os.umask(previous)
    assert stages == [(stage, 1) for stage in WRITE_STAGES]
    assert (tmp_path / "manifest.000000000001.json").stat().st_mode & 0o777 == 0o644


class _ShortWrites:
    """``os.write`` as POSIX allows it: fewer bytes than asked (here at most 7 per call)."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = os.write

    def __call__(self, fd: int, data: bytes) -> int:
        self.calls += 1
        return self.real(fd, bytes(data[:7]))


def test_GATE_M1_short_writes_are_continued_until_the_file_is_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    short = _ShortWrites()
    monkeypatch.setattr(manifest_module.os, "write", short)
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": "x" * 40}, [{"sequence": 1}])
    monkeypatch.undo()
    assert short.calls > 10
    loaded = read_manifest_set(tmp_path, JOB)
    assert loaded.newest is not None and loaded.newest.payload == {"gate": "x" * 40}
    assert loaded.problems == () and len(loaded.log) == 1


def test_GATE_33_a_closed_writer_refuses_to_commit_and_closing_twice_is_harmless(tmp_path: Path) -> None:
    writer = ManifestWriter(tmp_path, JOB)
    writer.close()
    writer.close()
    with pytest.raises(ManifestError) as error:
        writer.commit({"gate": 1})
    assert str(error.value) == f"{tmp_path}: commit after close(); open a new ManifestWriter"
    assert not any(p.name.startswith("manifest.") for p in tmp_path.iterdir())
    ManifestWriter(tmp_path, JOB).close()  # the lock was released


def test_GATE_33_a_create_that_fails_raises_its_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def full_disk(path: object, flags: int, *args: object) -> int:
        if Path(str(path)).name.startswith(".manifest.") and flags & os.O_EXCL:
            raise OSError(28, "No space left on device")
        return real(path, flags, *args)  # type: ignore[arg-type]

    with ManifestWriter(tmp_path, JOB) as writer:
        monkeypatch.setattr(manifest_module.os, "open", full_disk)
        with pytest.raises(OSError) as error:
            writer.commit({"gate": 1})
        monkeypatch.undo()
        assert error.value.errno == 28
        assert writer.commit({"gate": 1}) == 1


def _generation_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("manifest.0"))


def test_GATE_32_on_opening_the_writer_sets_aside_only_damaged_newer_generations_naming_them(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB, generations_kept=5) as writer:
        for _ in range(4):
            writer.commit({"gate": 1})
    for generation in (1, 3, 4):  # one damaged below the newest good (2), two above it
        path = tmp_path / f"manifest.{generation:012d}.json"
        path.write_bytes(path.read_bytes()[:-1])
    with pytest.warns(ManifestFallbackWarning) as caught, ManifestWriter(tmp_path, JOB) as writer:
        assert writer.resumed is not None and writer.resumed.generation == 2
    assert _generation_files(tmp_path) == ["manifest.000000000001.json", "manifest.000000000002.json",
                                           "manifest.000000000003.json.damaged", "manifest.000000000004.json.damaged"]
    reason = "body is {} bytes, header says {} (truncated or extended)"
    sizes = {g: len((tmp_path / f"manifest.{g:012d}.json.damaged").read_bytes().split(b"\n", 1)[1]) for g in (3, 4)}
    listed = "; ".join(f"{tmp_path / f'manifest.{g:012d}.json'}: {reason.format(sizes[g], sizes[g] + 1)}" for g in (4, 3))
    assert [str(w.message) for w in caught if isinstance(w.message, ManifestFallbackWarning)] == [
        f"{tmp_path}: damaged manifest generation(s) set aside as *.damaged ({listed}); the last good one is "
        f"{tmp_path / 'manifest.000000000002.json'} (generation 2)"]


def test_GATE_32_a_writer_over_nothing_good_names_every_damaged_file(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": 1})
    path = tmp_path / "manifest.000000000001.json"
    path.write_bytes(b"torn")
    with pytest.raises(ManifestDamaged) as error:
        ManifestWriter(tmp_path, JOB)
    assert str(error.value).startswith(f"{tmp_path}: no manifest generation verifies ({path}: first line is not")


def test_GATE_34_the_writer_reads_with_its_own_cap(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": "x" * 200})
    with pytest.raises(ManifestDamaged, match="over the 100-byte limit"):
        ManifestWriter(tmp_path, JOB, max_bytes=100)


def test_GATE_32_stale_temporary_files_are_removed_even_if_one_vanishes_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": 1})
    (tmp_path / ".manifest.000000000002.999.tmp").write_bytes(b"half a commit")
    (tmp_path / ".manifest.head.999.tmp").write_bytes(b"half a head")
    real = os.listdir

    def listing(path: object) -> list[str]:
        # Another process removed this one between the listing and the removal.
        return [*real(path), ".manifest.000000000003.998.tmp"]  # type: ignore[call-overload]

    monkeypatch.setattr(manifest_module.os, "listdir", listing)
    with ManifestWriter(tmp_path, JOB):
        pass
    monkeypatch.undo()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".manifest.")]


def test_GATE_32_a_torn_last_log_line_is_cut_before_the_next_append(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": 1}, [{"sequence": 1}])
    log = tmp_path / LOG_NAME
    whole = log.read_bytes()
    log.write_bytes(whole + log_line({"sequence": 2, "generation": 2, "job_id": JOB})[:30])  # a crash mid-append
    with ManifestWriter(tmp_path, JOB) as writer:
        assert log.read_bytes() == whole
        writer.commit({"gate": 2}, [{"sequence": 2}])
    found = read_manifest_set(tmp_path, JOB)
    assert found.problems == () and [r["sequence"] for r in found.log] == [1, 2]


# ------------------------------------------------------------------------------------------
# Reading a directory: every second record checked, every odd file named (GATE-30..GATE-34)
# ------------------------------------------------------------------------------------------


def _committed(directory: Path, count: int = 1, records: bool = True) -> None:
    with ManifestWriter(directory, JOB) as writer:
        for index in range(count):
            writer.commit({"gate": index}, [{"sequence": index + 1}] if records else [])


def _head(directory: Path, **document: object) -> None:
    body = {"format_version": 1, "job_id": JOB, "generation": 1, "sha256": "a" * 64, **document}
    (directory / HEAD_NAME).write_bytes(_frame("scout-gate-head", json.dumps(body).encode()))


def test_GATE_M4_a_head_a_log_or_a_generation_of_another_job_is_an_error_naming_it(tmp_path: Path) -> None:
    _committed(tmp_path)
    _head(tmp_path, job_id="other")
    with pytest.raises(ManifestJobMismatch) as error:
        read_manifest_set(tmp_path, JOB)
    assert str(error.value) == (f"{tmp_path / HEAD_NAME}: manifest head belongs to job_id 'other', not {JOB!r}; point "
                                "this job at its own manifest directory (or pass the job id that wrote it)")
    (tmp_path / HEAD_NAME).unlink()
    with (tmp_path / LOG_NAME).open("ab") as log:
        log.write(log_line({"sequence": 9, "generation": 1, "job_id": "other"}))
    with pytest.raises(ManifestJobMismatch, match=rf"^{tmp_path / LOG_NAME}: trust log line 2 belongs to job_id 'other'"):
        read_manifest_set(tmp_path, JOB)
    (tmp_path / LOG_NAME).unlink()
    generation = tmp_path / "manifest.000000000001.json"
    generation.write_bytes(encode_manifest("other", 1, {}))
    with pytest.raises(ManifestJobMismatch, match=rf"^{generation}: manifest belongs to job_id 'other'"):
        read_manifest_set(tmp_path, JOB)
    assert read_manifest_set(tmp_path, None).newest is not None  # any job, for inspection tools


def test_GATE_31_every_malformed_head_is_a_problem_saying_why(tmp_path: Path) -> None:
    _committed(tmp_path)
    path = tmp_path / HEAD_NAME
    cases = [
        ({"generation": "1"}, "generation is '1', not an int in 1..999999999999"),
        ({"generation": True}, "generation is True, not an int in 1..999999999999"),
        ({"generation": 0}, "generation is 0, not an int in 1..999999999999"),
        ({"generation": GENERATION_MAX + 1}, "generation is 1000000000000, not an int in 1..999999999999"),
        ({"sha256": 5}, "sha256 is 5, not 64 hex digits"),
        ({"sha256": "A" * 64}, f"sha256 is {'A' * 64!r}, not 64 hex digits"),
    ]
    for fields, why in cases:
        _head(tmp_path, **fields)
        found = read_manifest_set(tmp_path, JOB)
        assert found.head is None
        assert found.problems == (f"{path}: {why}; ignored (the generations themselves are read)",), fields
    _head(tmp_path, generation=GENERATION_MAX)
    found = read_manifest_set(tmp_path, JOB)
    assert found.head is not None and found.head.generation == GENERATION_MAX and found.lost[0].generation == GENERATION_MAX


def test_GATE_31_the_head_problem_comes_first_and_log_problems_name_the_log(tmp_path: Path) -> None:
    _committed(tmp_path)
    (tmp_path / HEAD_NAME).write_bytes(b"torn")
    with (tmp_path / LOG_NAME).open("ab") as log:
        log.write(b"junk\n")
    problems = read_manifest_set(tmp_path, JOB).problems
    assert [p.split(":")[0] for p in problems] == [str(tmp_path / HEAD_NAME), f"{tmp_path / LOG_NAME} line 2"]


def test_GATE_34_a_second_record_that_is_no_regular_file_is_a_problem_naming_it(tmp_path: Path) -> None:
    _committed(tmp_path)
    head = tmp_path / HEAD_NAME
    head.unlink()
    head.mkdir()
    log = tmp_path / LOG_NAME
    log.unlink()
    os.mkfifo(log)
    found = read_manifest_set(tmp_path, JOB)
    assert found.problems == (
        f"{head}: is a directory, not a regular file; a manifest is a regular file written by scout; ignored (the "
        "generations themselves are read)",
        f"{log}: is a FIFO, not a regular file; a manifest is a regular file written by scout; ignored (every "
        "generation carries the whole trust-transition log)",
    )
    assert found.newest is not None and found.head is None and found.log == ()


@pytest.mark.parametrize("name", [HEAD_NAME, LOG_NAME])
def test_GATE_31_a_directory_holding_only_an_unreadable_second_record_holds_a_manifest(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    found = read_manifest_set(tmp_path, JOB)
    assert found.named_anything and found.newest is None
    with pytest.raises(ManifestDamaged):
        load_manifest(tmp_path, JOB)


def test_GATE_31_a_dangling_generation_link_is_a_damaged_generation(tmp_path: Path) -> None:
    _committed(tmp_path)
    dangling = tmp_path / "manifest.000000000002.json"
    dangling.symlink_to(tmp_path / "nowhere")
    found = read_manifest_set(tmp_path, JOB)
    assert [(s.path, s.why) for s in found.skipped] == [(dangling, "no such file")]
    assert found.lost_reason == f"generation 2: {dangling.name} does not verify (no such file)"


def test_GATE_31_a_generation_set_aside_as_damaged_is_lost_until_a_newer_one(tmp_path: Path) -> None:
    _committed(tmp_path)
    (tmp_path / "manifest.000000000002.json.damaged").write_bytes(b"torn")
    found = read_manifest_set(tmp_path, JOB)
    assert found.lost_reason == ("generation 2: manifest.000000000002.json.damaged was set aside as damaged and no good "
                                 "generation followed it")
    assert found.highest_named == 2


def test_GATE_30_a_generation_pruned_between_listing_and_reading_is_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed(tmp_path)
    real, calls = os.listdir, []

    def listing(path: object) -> list[str]:
        calls.append(path)
        names = real(path)  # type: ignore[call-overload]
        # The second listing (the first of the generations) still shows a newer generation the
        # writer has since pruned away; every later listing is the directory as it is.
        return [*names, "manifest.000000000007.json"] if len(calls) == 2 else names

    monkeypatch.setattr(manifest_module.os, "listdir", listing)
    found = read_manifest_set(tmp_path, JOB)
    monkeypatch.undo()
    assert len(calls) == 4 and found.highest_named == 1 and found.lost == () and found.newest is not None


def test_GATE_30_a_directory_that_is_absent_holds_no_manifest(tmp_path: Path) -> None:
    found = read_manifest_set(tmp_path / "absent", JOB)
    assert found.directory == tmp_path / "absent" and not found.named_anything and found.newest is None


def test_GATE_34_a_directory_that_cannot_be_listed_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ManifestUnreadable) as error:
        read_manifest_set(tmp_path / "file", JOB)
    assert str(error.value) == f"{tmp_path / 'file'}: not a directory; pass the manifest directory"
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    with pytest.raises(ManifestUnreadable) as error:
        read_manifest_set(loop, JOB)
    assert str(error.value) == f"{loop}: cannot list: Too many levels of symbolic links"

    def denied(path: object) -> list[str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(manifest_module.os, "listdir", denied)  # root may list anything
    with pytest.raises(ManifestUnreadable) as error:
        read_manifest_set(tmp_path, JOB)
    assert str(error.value) == (f"{tmp_path}: permission denied listing the manifest directory; give the reading user "
                                "read and execute access to it")


def test_GATE_33_the_writers_arguments_and_a_second_writer_are_refused_naming_the_value(tmp_path: Path) -> None:
    for kept in (1, 2.5, True, "3"):
        with pytest.raises(ValueError) as error:
            ManifestWriter(tmp_path, JOB, generations_kept=kept)  # type: ignore[arg-type]
        assert str(error.value) == f"generations_kept must be an int >= 2, got {kept!r}"
    for job in ("", 5, None):
        with pytest.raises(ValueError) as error:
            ManifestWriter(tmp_path, job)  # type: ignore[arg-type]
        assert str(error.value) == f"job_id must be a non-empty string, got {job!r}"
    with ManifestWriter(tmp_path, JOB, generations_kept=2) as writer:
        for _ in range(4):
            writer.commit({"gate": 1})
        assert _generation_files(tmp_path) == ["manifest.000000000003.json", "manifest.000000000004.json"]
        with pytest.raises(ManifestBusy) as busy:
            ManifestWriter(tmp_path, JOB)
        assert str(busy.value) == (f"{tmp_path}: another manifest writer holds .writer.lock; a job has one writer (the "
                                   "gate leader); open a reader with load_manifest instead")


def test_GATE_33_a_directory_the_writer_may_not_create_in_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def denied(path: object, flags: int, *args: object) -> int:
        if Path(str(path)).name == ".writer.lock":
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(manifest_module.os, "open", denied)  # root may create anything
    with pytest.raises(ManifestUnreadable) as error:
        ManifestWriter(tmp_path, JOB)
    assert str(error.value) == (f"{tmp_path}: permission denied creating the manifest directory or its .writer.lock; "
                                "the writer needs write access to the directory")


def test_GATE_33_second_records_that_cannot_be_written_are_warnings_and_leave_no_temporary_file(tmp_path: Path) -> None:
    _committed(tmp_path)
    head, log = tmp_path / HEAD_NAME, tmp_path / LOG_NAME
    head.unlink()
    head.mkdir()
    log.unlink()
    log.mkdir()
    with pytest.warns(ManifestRepairWarning) as caught, ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": 9}, [{"sequence": 2}])
    assert sorted(str(w.message) for w in caught if isinstance(w.message, ManifestRepairWarning)) == [
        f"{head}: writing the head failed (Is a directory); the generation is committed; the head is rewritten at the "
        "next commit",
        f"{log}: appending 1 trust record(s) failed (Is a directory); the generation is committed and carries them; "
        "the append is retried at the next commit",
    ]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".manifest.")]


def test_GATE_M1_a_new_trust_log_is_made_durable_by_a_directory_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs: list[Path] = []
    real = manifest_module._fsync_directory
    monkeypatch.setattr(manifest_module, "_fsync_directory", lambda d: (fsyncs.append(d), real(d))[1])
    with ManifestWriter(tmp_path, JOB) as writer:
        writer.commit({"gate": 1})  # no record: no log yet
        assert len(fsyncs) == 1
        writer.commit({"gate": 2}, [{"sequence": 1}])  # the generation, then the new log
        assert len(fsyncs) == 3
        writer.commit({"gate": 3}, [{"sequence": 2}])  # the log exists: the generation only
        assert len(fsyncs) == 4


def test_GATE_M1_every_file_the_writer_makes_has_mode_644(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        _committed(tmp_path)
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {".writer.lock": 0o644, "manifest.000000000001.json": 0o644, HEAD_NAME: 0o644, LOG_NAME: 0o644}


def test_GATE_33_an_old_generation_that_is_already_gone_does_not_stop_the_pruning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ManifestWriter(tmp_path, JOB, generations_kept=2) as writer:
        writer.commit({"gate": 1})
        writer.commit({"gate": 2})
        real = os.listdir
        monkeypatch.setattr(manifest_module.os, "listdir",
                            lambda path: [*real(path), "manifest.000000000000.json"])  # removed by hand meanwhile
        assert writer.commit({"gate": 3}) == 3
        monkeypatch.undo()
    assert _generation_files(tmp_path) == ["manifest.000000000002.json", "manifest.000000000003.json"]


def test_GATE_M2_a_generation_is_plain_ascii_json() -> None:
    data = encode_manifest(JOB, 1, {"note": "détail"})
    assert b'"note": "d\\u00e9tail"' in data and data.isascii()


def test_GATE_30_a_prune_seen_twice_is_listed_again_twice_and_a_vanished_only_generation_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed(tmp_path)
    real, calls = os.listdir, []

    def listing(path: object) -> list[str]:
        calls.append(path)
        names = real(path)  # type: ignore[call-overload]
        # The generation listings of the first two attempts (calls 2 and 4) show a generation
        # pruned since; the third attempt sees the directory as it is.
        return [*names, "manifest.000000000007.json"] if len(calls) in (2, 4) else names

    monkeypatch.setattr(manifest_module.os, "listdir", listing)
    found = read_manifest_set(tmp_path, JOB)
    assert len(calls) == 6 and found.highest_named == 1 and found.lost == ()
    # No good generation at all, and the only one listed vanished: listed again, no crash.
    (tmp_path / "manifest.000000000001.json").unlink()
    calls.clear()
    found = read_manifest_set(tmp_path, JOB)
    assert len(calls) == 6 and found.newest is None
    monkeypatch.undo()


def test_GATE_31_every_witness_of_a_lost_generation_is_named_newest_first(tmp_path: Path) -> None:
    _committed(tmp_path)
    good = tmp_path / "manifest.000000000001.json"
    # The head names generation 3 and the log generation 3 and 2: nothing good holds them.
    _head(tmp_path, generation=3)
    with (tmp_path / LOG_NAME).open("ab") as log:
        for sequence, generation in ((5, 2), (6, 3)):
            log.write(log_line({"sequence": sequence, "generation": generation, "job_id": JOB}))
    found = read_manifest_set(tmp_path, JOB)
    assert [(lost.generation, lost.why) for lost in found.lost] == [
        (3, "manifest.head names it, but no good generation file holds it (the newest good one is 1): deleted?; "
            "trust.log records trust changes committed in it, but no good generation file holds it (the newest good "
            "one is 1)"),
    ]
    assert found.highest_named == 3
    _head(tmp_path, generation=5)
    (tmp_path / "manifest.000000000004.json").write_bytes(b"torn")
    found = read_manifest_set(tmp_path, JOB)
    assert [lost.generation for lost in found.lost] == [5, 4, 3] and found.highest_named == 5
    # With no good generation at all, the reasons say so.
    good.unlink()
    (tmp_path / "manifest.000000000004.json").unlink()
    found = read_manifest_set(tmp_path, JOB)
    assert [lost.why for lost in found.lost] == [
        "manifest.head names it, but no good generation file holds it (the newest good one is none): deleted?",
        "trust.log records trust changes committed in it, but no good generation file holds it (the newest good one "
        "is none)",
    ]


def test_GATE_31_a_newest_generation_that_is_not_the_file_the_head_names_is_lost(tmp_path: Path) -> None:
    _committed(tmp_path, 2)
    newest = tmp_path / "manifest.000000000002.json"
    newest.write_bytes(encode_manifest(JOB, 2, {"gate": "rewritten"}))  # verifies, but is not what was committed
    found = read_manifest_set(tmp_path, JOB)
    assert [(lost.generation, lost.why) for lost in found.lost] == [
        (2, "manifest.000000000002.json is not the file the writer committed (manifest.head records another digest): "
            "replaced?")]
    # A head naming an older generation with another digest is no witness against the newest.
    _head(tmp_path, generation=1, sha256="b" * 64)
    assert read_manifest_set(tmp_path, JOB).lost == ()


def test_GATE_33_a_head_that_cannot_even_be_started_is_a_warning_too(tmp_path: Path) -> None:
    with ManifestWriter(tmp_path, JOB) as writer:
        blocked = tmp_path / f".manifest.head.{os.getpid()}.tmp"
        blocked.mkdir()  # the temporary head can be neither created nor removed
        with pytest.warns(ManifestRepairWarning) as caught:
            writer.commit({"gate": 1})
    assert [str(w.message) for w in caught if isinstance(w.message, ManifestRepairWarning)] == [
        f"{tmp_path / HEAD_NAME}: writing the head failed (Is a directory); the generation is committed; the head is "
        "rewritten at the next commit"]
    assert read_manifest_set(tmp_path, JOB).newest is not None


def test_GATE_38_nesting_is_counted_over_both_bracket_kinds_outside_strings_up_to_the_bound() -> None:
    # GATE-38's bound at its edge: NESTING_MAX levels are read, one more is damage, whatever mix
    # of arrays and objects makes them; brackets inside strings are not nesting.
    def nested(levels: int) -> bytes:
        pairs = [(b"[", b"]") if level % 2 else (b'{"k":', b"}") for level in range(levels)]
        return b"".join(o for o, _ in pairs) + b'"[{]}"' + b"".join(c for _, c in reversed(pairs))

    assert NESTING_MAX == 64
    document = _json_document(nested(64))
    for level in range(64):
        document = document["k"] if level % 2 == 0 else document[0]
    assert document == "[{]}"
    with pytest.raises(_Undecodable) as error:
        _json_document(nested(65))
    assert str(error.value) == "nested 65 levels deep, more than 64"
    assert _json_document(b'"' + b"[" * 100 + b'"') == "[" * 100
    assert _json_document(b"7") == 7
    assert _damage(_frame("scout-gate-manifest", b"\xff\xfe")) == (
        "verified body is not JSON scout can read: not ASCII (ordinal not in range(128) at byte 0)")
    assert _damage(_frame("scout-gate-manifest", b"")) == (
        "verified body is not JSON scout can read: Expecting value: line 1 column 1 (char 0)")
