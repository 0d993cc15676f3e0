"""The page server's and the ops readers' rules that the mutation run over scout/ops found
unpinned (issue 41), in-process: a cursor past the newest report (OPS-15), reads that stop one
byte past their bound (OPS-5, OPS-10), a reports file truncated while the page scans it, a client
gone before its answer, a connection past the bound whose client is gone (OPS-6, OPS-15), a
verified checkpoint's certificate as the page shows it, and the round histogram's buckets."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.ops import paths, web
from scout.ops.slurm import EXCLUDE_FILE_BYTES_MAX, SlurmError, read_exclude_file
from scout.ops.state import ROUND_BUCKETS_S, RoundHistogram
from tests.ops.test_ops_processes import _gate_with_a_verified_checkpoint as _gate
from tests.ops.test_ops_rules import _ask, _line

WAIT_S = 5.0  # every wait of this file is bounded by it


# -- a cursor past the newest report (OPS-15) ----------------------------------------------------


def test_OPS_15_a_cursor_past_the_newest_report_is_answered_from_the_oldest_held(tmp_path: Path) -> None:
    path = tmp_path / reports.REPORTS_FILE
    path.write_bytes(b"".join(_line(step) for step in range(6)))
    page = web.RunPage(tmp_path, records_kept=4)

    def cover(since: int) -> tuple[list[int], int, int, int, int]:
        state = page.state(since)
        return [r["step"] for r in state["reports"]], state["since"], state["next"], state["total"], state["kept_from"]

    assert cover(6) == ([], 6, 6, 6, 2), "the cursor a client holds once it has read everything"
    # A cursor this page never gave (a scout serve that ran before, on this run or another): the
    # answer starts at the oldest report held, below the cursor sent, and next is never past total.
    assert cover(7) == ([2, 3, 4, 5], 2, 6, 6, 2)
    assert cover(1_000) == ([2, 3, 4, 5], 2, 6, 6, 2)
    with path.open("ab") as file:
        file.write(_line(6))
    assert cover(6) == ([6], 6, 7, 7, 3) and cover(7) == ([], 7, 7, 7, 3)
    assert cover(8) == ([3, 4, 5, 6], 3, 7, 7, 3)
    server = web.make_server(tmp_path, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        status, _, body = _ask(server.server_address[1], "GET", "/api/state?since=500")
        state = json.loads(body)
        assert status == 200 and (state["since"], state["next"], state["total"]) == (0, 7, 7)
        assert [r["step"] for r in state["reports"]] == list(range(7))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


# -- bounded reads (OPS-5, OPS-10) ---------------------------------------------------------------


def _read_from_a_pipe_held_open(tmp_path: Path, data: bytes, read: Callable[[Path], Any]) -> Any:
    """``read`` of a FIFO whose writer wrote ``data`` and holds it open until the reader returned
    (at most WAIT_S): a read that asks for more than ``data`` would wait for the writer to close.
    Returns what ``read`` returned or raised."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    returned = threading.Event()
    writer_saw: list[bool] = []

    def write() -> None:
        with open(fifo, "wb") as file:
            file.write(data)
            file.flush()
            writer_saw.append(returned.wait(WAIT_S))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        outcome: Any = read(fifo)
    except Exception as error:  # noqa: BLE001 (the caller compares what was raised)
        outcome = error
    returned.set()
    writer.join(WAIT_S + 1)
    assert writer_saw == [True], "the reader asked for more than its bound and waited for the writer to close"
    return outcome


def test_OPS_5_an_ops_file_is_read_one_byte_past_its_bound_and_no_further(tmp_path: Path) -> None:
    data = b"{" + b" " * paths.STATE_BYTES_MAX  # one byte over the bound
    assert _read_from_a_pipe_held_open(tmp_path, data, paths.read_state) is None


def test_OPS_10_an_exclude_file_is_read_one_byte_past_its_bound_and_no_further(tmp_path: Path) -> None:
    error = _read_from_a_pipe_held_open(tmp_path, b"h\n" * (EXCLUDE_FILE_BYTES_MAX // 2) + b"x", read_exclude_file)
    assert isinstance(error, SlurmError) and str(error) == (
        f"{tmp_path / 'fifo'} is over {EXCLUDE_FILE_BYTES_MAX} bytes: not an exclude-hosts file scout wrote "
        "(one host name per line); check it")


# -- the page's reading of a file that changes under it (OPS-6, OPS-15) ---------------------------


class _TruncatedOnCount:
    """The reports file, truncated (for real) when the page seeks back to its start to count the
    lines before the newest ones: another process rewrote it between the scan and the count."""

    def __init__(self, file: Any, path: Path) -> None:
        self.file, self.path, self.truncated = file, path, False

    def __enter__(self) -> _TruncatedOnCount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def fileno(self) -> int:
        return int(self.file.fileno())

    def read(self, size: int = -1) -> bytes:
        return bytes(self.file.read(size))

    def seek(self, offset: int) -> int:
        if offset == 0 and not self.truncated:
            os.truncate(self.path, 0)
            self.truncated = True
        return int(self.file.seek(offset))


def test_OPS_15_a_reports_file_truncated_while_the_page_counts_its_lines_is_read_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / reports.REPORTS_FILE
    path.write_bytes(b"".join(_line(step) for step in range(6)))
    opened: list[_TruncatedOnCount] = []

    def opening(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = open(file, mode, *args, **kwargs)  # noqa: SIM115 (closed by the wrapper)
        if Path(file) != path:
            return handle
        opened.append(_TruncatedOnCount(handle, path))
        return opened[-1]

    monkeypatch.setattr(web, "SCAN_CHUNK_BYTES", 64)  # the scan of the two newest lines never seeks to 0
    monkeypatch.setattr(web, "open", opening, raising=False)
    page = web.RunPage(tmp_path, records_kept=2)
    state = page.state(0)
    assert [w.truncated for w in opened] == [True]
    assert (state["reports"], state["since"], state["next"], state["total"]) == ([], 0, 0, 0)
    with path.open("ab") as file:
        file.write(_line(10) + _line(11))
    state = page.state(0)
    assert [r["step"] for r in state["reports"]] == [10, 11] and (state["next"], state["total"]) == (2, 2)


# -- the server (OPS-6, OPS-15) --------------------------------------------------------------------


def test_OPS_6_port_65535_is_a_port_the_server_binds(tmp_path: Path) -> None:
    try:
        server = web.make_server(tmp_path, "127.0.0.1", 65535)
    except OSError as error:  # taken by something else on this machine: still not refused as a value
        assert error.errno == errno.EADDRINUSE, error
    else:
        try:
            assert server.server_address[1] == 65535
        finally:
            server.server_close()


class _Peer:
    """The connection's writer: the headers go out, then the client is gone (``error``)."""

    def __init__(self, error: type[OSError]) -> None:
        self.error, self.written = error, b""

    def write(self, data: bytes) -> int:
        if self.written:
            raise self.error("the page was closed")
        self.written += data
        return len(data)

    def flush(self) -> None:
        return


@pytest.mark.parametrize("error", [BrokenPipeError, ConnectionResetError])
def test_OPS_6_a_client_gone_before_its_answers_body_is_no_error(error: type[OSError]) -> None:
    handler = web._Handler.__new__(web._Handler)  # noqa: SLF001 (no socket: the connection is _Peer)
    handler.request_version, handler.requestline, handler.command = "HTTP/1.1", "GET / HTTP/1.1", "GET"
    handler.client_address = ("127.0.0.1", 1)
    peer = _Peer(error)
    handler.wfile = peer  # type: ignore[assignment]
    handler._send(HTTPStatus.OK, b"body", "text/plain; charset=utf-8", False)  # noqa: SLF001
    assert peer.written.startswith(b"HTTP/1.0 200 OK\r\n") and b"Content-Length: 4\r\n" in peer.written


def test_OPS_15_a_connection_past_the_bound_is_answered_503_and_closed_even_when_its_client_is_gone(
        tmp_path: Path) -> None:
    server = web.make_server(tmp_path, "127.0.0.1", 0)
    taken = 0
    try:
        while server.connections.acquire(blocking=False):
            taken += 1
        assert taken == web.CONNECTIONS_MAX
        ours, theirs = socket.socketpair()
        with theirs:
            theirs.settimeout(WAIT_S)
            server.process_request(ours, ("127.0.0.1", 1))
            assert ours.fileno() == -1, "closed by the accepting thread"
            answer = b""
            while chunk := theirs.recv(4096):
                answer += chunk
        assert answer == b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n"
        ours, theirs = socket.socketpair()
        theirs.close()  # the client gave up before it was accepted: the 503 cannot be sent
        server.process_request(ours, ("127.0.0.1", 1))
        assert ours.fileno() == -1
    finally:
        for _ in range(taken):
            server.connections.release()
        server.server_close()


def test_OPS_6_an_answer_that_fails_is_reported_with_the_client_it_failed_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = web.make_server(tmp_path, "127.0.0.1", 0)
    failed: list[Any] = []

    def state(since: int) -> dict[str, Any]:
        raise RuntimeError("a reader bug")

    monkeypatch.setattr(server.page, "state", state)
    monkeypatch.setattr(server, "handle_error", lambda request, address: failed.append(address))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=WAIT_S) as client:
            client.sendall(b"GET /api/state HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            assert client.recv(4096) == b"", "no answer, the connection closed"
            assert failed == [client.getsockname()]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


def test_OPS_6_a_verified_checkpoint_shows_its_certificate_for_the_runs_job(tmp_path: Path) -> None:
    from scout.gate.codec import certificate_to_json
    from scout.gate.recorder import inspect_gate_problems

    _gate(tmp_path)
    reading, problem = inspect_gate_problems(tmp_path / "gate")
    assert reading is not None and problem is None
    entry = reading.state.context.checkpoints[0]
    assert entry.certificate is not None
    checkpoints = web.RunPage(tmp_path).state(0)["checkpoints"]
    assert checkpoints[0]["certificate"] == certificate_to_json(entry.certificate, "run")
    assert checkpoints[0]["certificate"]["job_id"] == "run"


# -- the round histogram (OPS-5) -----------------------------------------------------------------


def test_OPS_5_a_round_histogram_whose_counts_miss_a_bucket_is_never_exported_short() -> None:
    histogram = RoundHistogram()
    histogram.observe(0.003)
    assert len(histogram.cumulative()) == len(ROUND_BUCKETS_S) + 1
    with pytest.raises(ValueError, match="zip"):
        RoundHistogram(counts=[1, 2], total=3).cumulative()
