"""The manifest's frames and checksums, byte by byte (docs/gate.md GATE-M2, GATE-M4; spec/gate.md
GATE-31, GATE-34; scout/gate/manifest.py).

A generation file and the head are ``MAGIC sha256=<hex> bytes=<n>`` then exactly ``n`` bytes; a
trust-log line is ``scout-trust sha256=<hex> <JSON>`` and a newline. The rule (issue 26): a file
or line with one byte more than its frame declares is refused -- as damaged, with the reason --
never read as if the extra byte were not there. Here also: the exact bytes each frame is made
of, and the exact reason each malformed frame is refused with. Mutation target ``gate-manifest``
(tests/mutation/)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from scout.gate.manifest import (
    GENERATION_MAX,
    HEAD_NAME,
    LOG_NAME,
    ManifestFormatTooNew,
    ManifestJobMismatch,
    ManifestWriter,
    _Damaged,
    _parse_log,
    decode_manifest,
    encode_manifest,
    log_line,
    read_manifest_set,
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
        (_frame("scout-gate-manifest", b"\xff\xfe"), "verified body is not JSON: "),
        (_frame("scout-gate-manifest", b"{"), "verified body is not JSON: "),
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
         f"{LOG_NAME} line 1: verified line is not JSON; skipped"),
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
