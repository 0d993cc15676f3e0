"""``scout serve RUN_DIR``: a live page of a run (spec/ops.md OPS-6).

One page, all of it inline (HTML, CSS, JavaScript drawing SVG: no external asset, so it works on
an air-gapped cluster; the Content-Security-Policy header forbids loading anything from
elsewhere), and one read-only JSON endpoint it polls once a second:

- ``GET /``: the page (``scout/ops/page.html``);
- ``GET /api/state?since=N``: the reports from the N-th on (at most ``RECORDS_PER_ANSWER``), every
  checkpoint with its trust and, once verified, its coverage certificate, the nodes' progress
  (``run_dir/ops/node-*.json``, written by the sidecars while the job runs), the hosts to exclude.

The server only reads: it answers GET and HEAD and nothing else (405), binds loopback unless
told otherwise, handles at most ``CONCURRENT_MAX`` requests at once (503 beyond), and reads the
reports incrementally, keeping the newest ``RECORDS_KEPT`` in memory. It works while the job runs
and after it ended: everything it shows comes from files.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
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

__all__ = ["CONCURRENT_MAX", "RECORDS_KEPT", "RunPage", "make_server"]

RECORDS_KEPT: Final = 20_000
RECORDS_PER_ANSWER: Final = 2_000
CONCURRENT_MAX: Final = 16
NODE_FILES_MAX: Final = 4096
#: The page may load nothing from anywhere else (OPS-6); its own script and styles are inline.
CONTENT_SECURITY_POLICY: Final = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                  "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'")


def page_html() -> bytes:
    return importlib.resources.files("scout.ops").joinpath("page.html").read_bytes()


class RunPage:
    """The run directory as the page sees it, read incrementally; thread-safe."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"{self.run_dir} is not a run directory (scout.attach's run_dir)")
        self.lock = threading.Lock()
        self.tail = ReportTail(self.run_dir / reports.REPORTS_FILE, from_end=False)
        self.records: list[dict[str, Any]] = []
        self.first_index = 0  # the global index of records[0] (older ones were let go)
        self._gate_key: tuple[int, int] | None = None
        self._checkpoints: list[dict[str, Any]] = []
        self._gate_problem: str | None = None

    def state(self, since: int) -> dict[str, Any]:
        with self.lock:
            while True:
                fresh = self.tail.read()
                if not fresh:
                    break
                self.records.extend(fresh)
            if len(self.records) > RECORDS_KEPT:
                dropped = len(self.records) - RECORDS_KEPT
                del self.records[:dropped]
                self.first_index += dropped
            start = max(since, self.first_index) - self.first_index
            chosen = self.records[start:start + RECORDS_PER_ANSWER]
            end = self.first_index + start + len(chosen)
            total = self.first_index + len(self.records)
            checkpoints, problem = self._read_gate()
        return {"run_dir": str(self.run_dir), "name": self.run_dir.resolve().name, "time": time.time(),
                "since": self.first_index + start, "next": end, "total": total, "reports": chosen,
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


def _exclude_hosts(run_dir: Path) -> list[str]:
    path = run_dir / "exclude_hosts.txt"
    try:
        return path.read_text(encoding="utf-8").split()[:10_000]
    except OSError:
        return []


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

    def __init__(self, address: tuple[str, int], page: RunPage) -> None:
        self.page = page
        self.html = page_html()
        self.slots = threading.BoundedSemaphore(CONCURRENT_MAX)
        super().__init__(address, _Handler)


def make_server(run_dir: str | Path, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A server of ``run_dir``'s page on ``host:port`` (0: a free port); call ``serve_forever``."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    return _Server((host, port), RunPage(run_dir))
