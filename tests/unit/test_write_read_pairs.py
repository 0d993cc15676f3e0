"""The write/read pairs asserted where scout writes durable bytes (issue 40, TIGER_STYLE: what
was written is what is read back). Each test breaks the writer's half of a pair, as a mutant
would, and sees the assertion stop the write instead of a reader finding damage after a restart."""

from __future__ import annotations

import hashlib

import pytest

from scout.gate import manifest


def test_GATE_M1_a_generation_whose_framing_the_reader_refuses_is_never_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = manifest.encode_manifest("job", 3, {"a": [1, 2]})
    assert manifest.decode_manifest(data, manifest.generation_path(manifest.Path(), 3), "job").payload == {"a": [1, 2]}

    def framed_short(magic: str, body: bytes) -> bytes:  # a header that counts one byte too few
        return f"{magic} sha256={hashlib.sha256(body).hexdigest()} bytes={len(body) - 1}\n".encode() + body

    monkeypatch.setattr(manifest, "_framed", framed_short)
    with pytest.raises(AssertionError):
        manifest.encode_manifest("job", 3, {"a": [1, 2]})


def test_GATE_M1_a_trust_log_line_the_reader_would_skip_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    line = manifest.log_line({"sequence": 1, "generation": 1, "job_id": "job"})
    records, problems, _ = manifest._parse_log(line, manifest.Path("trust.log"), "job")
    assert records == [{"sequence": 1, "generation": 1, "job_id": "job"}] and problems == []
    monkeypatch.setattr(manifest, "LOG_MAGIC", "scout-trust-v2")  # the writer's magic drifts from the reader's
    with pytest.raises(AssertionError):
        manifest.log_line({"sequence": 1, "generation": 1, "job_id": "job"})
