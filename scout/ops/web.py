"""``scout serve RUN_DIR``: a live page of a run (spec/ops.md OPS-6).

One page, all of it inline (HTML, CSS, JavaScript drawing SVG: no external asset, so it works on
an air-gapped cluster; the Content-Security-Policy header forbids loading anything from
elsewhere), and one read-only JSON endpoint it polls once a second:

- ``GET /``: the page (``scout/ops/page.html``);
- ``GET /api/state?since=N``: the reports from the N-th on (at most ``RECORDS_PER_ANSWER``; an N
  past the newest is answered from the oldest held, OPS-15), every checkpoint with its trust and,
  once verified, its coverage certificate, the nodes' progress (``run_dir/ops/node-*.json``,
  written by the sidecars while the job runs), the hosts to exclude.

The server only reads: it answers GET and HEAD and nothing else (405), binds loopback unless
told otherwise, and answers only requests whose ``Host`` names it (OPS-14: a page elsewhere whose
name is rebound to this address cannot read the run). It is bounded (OPS-15): at most
``CONNECTIONS_MAX`` connections at once (503 beyond), each read with a timeout, a listen backlog
of ``LISTEN_BACKLOG``, at most ``CONCURRENT_MAX`` answers computed at once. It reads the reports
from the end of the file -- the newest ``RECORDS_KEPT`` at most, however long the file is -- and
then incrementally; each answer says how many older lines it did not load, so its counts say
what they cover. It works while the job runs and after it ended: everything it shows comes from
files.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
import socket
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from scout import reports
from scout.ops import paths
from scout.ops.tail import ReportTail

__all__ = ["CONCURRENT_MAX", "CONNECTIONS_MAX", "LISTEN_BACKLOG", "READ_TIMEOUT_S", "RECORDS_KEPT", "RunPage",
           "allowed_host_names", "make_server"]

#: OPS-15: the newest reports held in memory (older lines are counted, not parsed).
RECORDS_KEPT: Final = 20_000
RECORDS_PER_ANSWER: Final = 2_000
CONCURRENT_MAX: Final = 16
#: OPS-15: open connections at most (one thread each); more are answered 503 and closed.
CONNECTIONS_MAX: Final = 64
#: OPS-15: connections the kernel queues before they are accepted.
LISTEN_BACKLOG: Final = 128
#: OPS-15: a connection that sends nothing (or half a request) for this long is closed.
READ_TIMEOUT_S: Final = 10.0
#: Bytes scanned at a time when looking for the newest lines from the end of the reports file.
SCAN_CHUNK_BYTES: Final = 1 << 20
NODE_FILES_MAX: Final = 4096
#: OPS-14: the names a loopback server answers to (a browser's Host for 127.0.0.1, ::1, localhost).
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1", "ip6-localhost")
#: The page may load nothing from anywhere else (OPS-6); its own script and styles are inline.
CONTENT_SECURITY_POLICY: Final = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                  "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'")


def page_html() -> bytes:
    return importlib.resources.files("scout.ops").joinpath("page.html").read_bytes()


class RunPage:
    """The run directory as the page sees it, read incrementally; thread-safe."""

    def __init__(self, run_dir: str | Path, *, records_kept: int = RECORDS_KEPT) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"{self.run_dir} is not a run directory (scout.attach's run_dir)")
        if records_kept < 1:
            raise ValueError(f"records_kept must be >= 1, got {records_kept}")
        self.records_kept = records_kept
        self.lock = threading.Lock()
        self.tail: ReportTail | None = None  # opened at the first answer, at the newest lines (OPS-15)
        self.records: list[dict[str, Any]] = []
        self.first_index = 0  # the global index of records[0] (older ones were let go or never loaded)
        self.lines_not_loaded = 0  # lines before the newest records_kept at the first read (OPS-15)
        self._gate_key: tuple[int, int] | None = None
        self._checkpoints: list[dict[str, Any]] = []
        self._gate_problem: str | None = None

    def _open_tail(self) -> ReportTail:
        """OPS-15: start at the newest ``records_kept`` lines of the file, found from its end; the
        lines before them are counted (a scan for newlines), never parsed."""
        path = self.run_dir / reports.REPORTS_FILE
        start, before = _newest_lines(path, self.records_kept)
        self.first_index = self.lines_not_loaded = before
        return ReportTail(path, from_end=False, offset=start)

    def state(self, since: int) -> dict[str, Any]:
        with self.lock:
            if self.tail is None:
                self.tail = self._open_tail()
            while True:
                fresh = self.tail.read()
                if not fresh:
                    break
                self.records.extend(fresh)
                if len(self.records) > self.records_kept:
                    dropped = len(self.records) - self.records_kept
                    del self.records[:dropped]
                    self.first_index += dropped
            total = self.first_index + len(self.records)
            # OPS-15: ``next`` is never past ``total``. A cursor past it was not given by this
            # page (its total never shrinks): it comes from a scout serve that ran before, on this
            # run or another, so it is answered from the oldest report held, and the answer's
            # ``since``, below the cursor sent, tells the client its numbering is gone.
            start = (max(since, self.first_index) if since <= total else self.first_index) - self.first_index
            chosen = self.records[start:start + RECORDS_PER_ANSWER]
            end = self.first_index + start + len(chosen)
            kept_from, skipped = self.first_index, self.tail.skipped
            checkpoints, problem = self._read_gate()
        # OPS-15: what the counts cover -- reports kept_from..total-1; the ones before were not
        # loaded (the newest records_kept are); skipped lines were not reports (OPS-12).
        return {"run_dir": str(self.run_dir), "name": self.run_dir.resolve().name, "time": time.time(),
                "since": self.first_index + start, "next": end, "total": total, "reports": chosen,
                "kept_from": kept_from, "records_kept": self.records_kept, "skipped_lines": skipped,
                "checkpoints": checkpoints, "manifest_problem": problem, "nodes": self._nodes(),
                "exclude_hosts": _exclude_hosts(self.run_dir)}

    def _read_gate(self) -> tuple[list[dict[str, Any]], str | None]:
        gate = self.run_dir / "gate"
        try:
            entries = list(os.scandir(gate))
        except OSError:
            return [], None
        key = _entries_key(entries)
        if key == self._gate_key:
            return self._checkpoints, self._gate_problem
        from scout.gate.codec import CodecError, certificate_to_json
        from scout.gate.manifest import ManifestError
        from scout.gate.recorder import inspect_gate_problems

        checkpoints: list[dict[str, Any]] = []
        problem = None
        try:
            reading, problem = inspect_gate_problems(gate)
            if reading is not None:
                job_id = reading.state.context.config.job_id
                for entry in reading.state.context.checkpoints:
                    checkpoints.append({
                        "checkpoint": f"t{entry.id.timeline}/s{entry.id.step}", "timeline": entry.id.timeline,
                        "step": entry.id.step, "trust": entry.trust.value, "reason": entry.reason,
                        "certificate": None if entry.certificate is None
                        else certificate_to_json(entry.certificate, job_id)})
        except (ManifestError, CodecError, OSError) as error:
            problem = str(error)
        self._gate_key, self._checkpoints, self._gate_problem = key, checkpoints, problem
        return checkpoints, problem

    def _nodes(self) -> list[dict[str, Any]]:
        folder = self.run_dir / paths.OPS_DIR
        try:
            names = sorted(p for p in folder.glob("node-*.json"))[:NODE_FILES_MAX]
        except OSError:
            return []
        return [value for value in (paths.read_state(name) for name in names) if value is not None]


def _entries_key(entries: list[os.DirEntry[str]]) -> tuple[int, int]:
    """How many entries there are and the newest modification among them: what says the gate
    changed. The job writes the gate while the page reads it, so an entry listed and gone before
    its stat (a manifest's temporary file, renamed into place) is skipped (OPS-6)."""
    present, newest_ns = 0, 0
    for entry in entries:
        try:
            modified_ns = entry.stat().st_mtime_ns
        except FileNotFoundError:
            continue
        present, newest_ns = present + 1, max(newest_ns, modified_ns)
    return present, newest_ns


def _newest_lines(path: Path, count: int) -> tuple[int, int]:
    """OPS-15: the byte offset where the newest ``count`` lines of ``path`` begin, and how many
    lines come before it. Read in chunks from the end; memory is bounded by one chunk, and the
    lines before are counted (a search for newlines), never parsed."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return 0, 0
            file.seek(size - 1)
            skip_final = file.read(1) == b"\n"  # it ends the newest line, not the one before it
            position, newlines, start = size, 0, 0
            while position > 0 and not start:
                chunk_start = max(0, position - SCAN_CHUNK_BYTES)
                file.seek(chunk_start)
                chunk = file.read(position - chunk_start)
                end = len(chunk) - (1 if skip_final else 0)
                skip_final = False
                while (found := chunk.rfind(b"\n", 0, end)) >= 0:
                    newlines += 1
                    if newlines == count:
                        start = chunk_start + found + 1
                        break
                    end = found
                position = chunk_start
            before, read = 0, 0
            file.seek(0)
            while read < start:
                chunk = file.read(min(SCAN_CHUNK_BYTES, start - read))
                if not chunk:
                    break
                before += chunk.count(b"\n")
                read += len(chunk)
            return start, before
    except OSError:
        return 0, 0


def _exclude_hosts(run_dir: Path) -> list[str]:
    path = run_dir / "exclude_hosts.txt"
    try:
        with open(path, "rb") as file:
            text = file.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return []
    return text.split()[:10_000]


def allowed_host_names(host: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """OPS-14: the names a ``Host`` header may give for a server bound to ``host``: the loopback
    names on loopback; the bound address; on a wildcard or another address also this machine's
    names; and ``extra`` (``scout serve --allow-host``). Lower case, without a port."""
    names = {name.lower() for name in extra}
    bound = host.strip("[]").lower()
    names.add(bound)
    if bound in LOOPBACK_NAMES or bound.startswith("127."):
        names.update(LOOPBACK_NAMES)
    else:
        names.update(name.lower() for name in (socket.gethostname(), socket.getfqdn()) if name)
        if bound in ("", "0.0.0.0", "::"):
            names.update(LOOPBACK_NAMES)
            with contextlib.suppress(OSError):
                names.update(str(info[4][0]).lower() for info in socket.getaddrinfo(socket.gethostname(), None))
    names.discard("")
    return frozenset(names)


def _host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port: ``[::1]:8765`` is ``::1``."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "scout-serve"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)

    def _refuse(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815 (read-only: OPS-6)

    def _answer(self, *, head: bool) -> None:
        host = self.headers.get("Host")
        if host is None or _host_name(host) not in self.server.host_names:
            # OPS-14: a name this server was not started for: a DNS-rebinding page, or a proxy.
            # The answer names nothing the server knows (a rebinding page can read it).
            self._send(HTTPStatus.MISDIRECTED_REQUEST,
                       b"scout serve does not answer for this Host; if the name is meant, start it with "
                       b"--allow-host NAME\n", "text/plain; charset=utf-8", head)
            return
        if not self.server.slots.acquire(blocking=False):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"busy\n", "text/plain; charset=utf-8", head)
            return
        try:
            url = urllib.parse.urlsplit(self.path)
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, self.server.html, "text/html; charset=utf-8", head)
            elif url.path == "/api/state":
                query = urllib.parse.parse_qs(url.query)
                try:
                    since = max(0, int(query.get("since", ["0"])[0]))
                except ValueError:
                    self._send(HTTPStatus.BAD_REQUEST, b"since must be an int\n", "text/plain; charset=utf-8", head)
                    return
                body = json.dumps(self.server.page.state(since), sort_keys=True).encode("utf-8")
                self._send(HTTPStatus.OK, body, "application/json", head)
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8", head)
        finally:
            self.server.slots.release()

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, head: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if not head:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        return  # quiet: one line per poll would drown the terminal


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG  # OPS-15: the listen backlog

    def __init__(self, address: tuple[str, int], page: RunPage, *, read_timeout_s: float,
                 allow_hosts: tuple[str, ...]) -> None:
        self.page = page
        self.html = page_html()
        self.slots = threading.BoundedSemaphore(CONCURRENT_MAX)
        self.connections = threading.BoundedSemaphore(CONNECTIONS_MAX)
        self.read_timeout_s = read_timeout_s
        self.host_names = allowed_host_names(address[0], allow_hosts)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """OPS-15: a thread per connection up to ``CONNECTIONS_MAX``; past that the connection
        is answered 503 at once, from the accepting thread, without reading it."""
        if not self.connections.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n")
            self.shutdown_request(request)
            return
        request.settimeout(self.read_timeout_s)  # OPS-15: a silent or half-sent request ends
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()


def make_server(run_dir: str | Path, host: str = "127.0.0.1", port: int = 0, *,
                read_timeout_s: float = READ_TIMEOUT_S, allow_hosts: tuple[str, ...] = ()) -> ThreadingHTTPServer:
    """A server of ``run_dir``'s page on ``host:port`` (0: a free port); call ``serve_forever``.
    ``allow_hosts``: more names the ``Host`` header may give (OPS-14)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    if not 0 < read_timeout_s <= 3600:
        raise ValueError(f"read_timeout_s must be in (0, 3600] seconds, got {read_timeout_s!r}")
    bad = [name for name in allow_hosts if not name or any(c in name for c in "/ \t\r\n")]
    if bad:
        raise ValueError(f"--allow-host takes a host name or address without a port or a path, got {bad!r}")
    return _Server((host, port), RunPage(run_dir), read_timeout_s=read_timeout_s, allow_hosts=tuple(allow_hosts))
