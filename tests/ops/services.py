"""Real services the ops tests start on loopback, each bounded and ended by the test: a
Prometheus server (Debian's ``prometheus``), a headless chromium driven by selenium through the
system's chromedriver (never a downloaded driver), the page server. Where a service cannot be
had, :func:`missing` says why in one line, for ``pytest.skip``."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
READY_TIMEOUT_S = 30.0
#: Chromium as root in a container, on a closed network (no sandbox, no background traffic).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,1100")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def missing_prometheus() -> str | None:
    if shutil.which("prometheus") is None:
        return "no prometheus server (Debian package 'prometheus'; .ci/run installs it)"
    return None


def missing_browser() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (requirements-dev.txt)"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"no {path} (Debian package '{package}'; .ci/run installs it)"
    return None


def _stop(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)


@contextlib.contextmanager
def prometheus(work: Path, targets: list[str], scrape_interval_s: float) -> Iterator[str]:
    """A Prometheus server on loopback scraping ``targets`` (host:port); yields its base URL."""
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": f"{scrape_interval_s:g}s", "scrape_timeout": f"{scrape_interval_s:g}s",
                   "evaluation_interval": f"{scrape_interval_s:g}s"},
        "scrape_configs": [{"job_name": "scout", "static_configs": [{"targets": targets}]}],
    }))
    log = (work / "prometheus.log").open("w")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
         f"--storage.tsdb.path={work / 'tsdb'}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not become ready: {(work / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield base
    finally:
        _stop(process)
        log.close()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector Prometheus's HTTP API returns for ``promql``."""
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """Headless chromium under selenium, through the system's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="scout-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.contextmanager
def page_server(run_dir: Path) -> Iterator[str]:
    """``scout serve RUN_DIR --port 0`` as a process; yields the page's URL."""
    import re
    import sys

    process = subprocess.Popen([sys.executable, "-m", "scout.cli", "serve", str(run_dir), "--port", "0"],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        found = re.search(r"http://\S+/", process.stdout.readline())
        if found is None:
            raise RuntimeError(f"scout serve did not print its address (exit code {process.poll()})")
        yield found.group(0)
    finally:
        _stop(process)
        if process.stdout is not None:
            process.stdout.close()


@contextlib.contextmanager
def serve(run_dir: Path, *arguments: str) -> Iterator[tuple[str, int]]:
    """``scout serve RUN_DIR --port 0 ARGUMENTS...`` as a process; yields the page's URL and its pid."""
    import re
    import sys

    process = subprocess.Popen([sys.executable, "-m", "scout.cli", "serve", str(run_dir), "--port", "0", *arguments],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        found = re.search(r"http://\S+/", process.stdout.readline())
        if found is None:
            raise RuntimeError(f"scout serve did not print its address (exit code {process.poll()})")
        yield found.group(0), process.pid
    finally:
        _stop(process)
        if process.stdout is not None:
            process.stdout.close()


#: A process that publishes progress like a trainer (the sidecar's rank): its record's name,
#: token, pid and start ticks on its first line; it runs a minute at most.
TRAINER = """
import json, os, sys, time
from scout.observer.progress import ProgressPublisher, RecordIdentity, process_start_ticks
publisher = ProgressPublisher(RecordIdentity("ops-test-" + sys.argv[1], 0, 5))
publisher.begin_step(12)
print(json.dumps({"name": publisher.name, "token": publisher.token.hex(), "pid": os.getpid(),
                  "start_ticks": process_start_ticks(os.getpid()) or 0}), flush=True)
for _ in range(1200):
    publisher.advance()
    time.sleep(0.05)
"""


@contextlib.contextmanager
def fake_trainer(tag: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """A process with a progress record, as a trainer has; killed at the end."""
    import signal
    import sys

    process = subprocess.Popen([sys.executable, "-c", TRAINER, tag], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout is not None
        yield process, json.loads(process.stdout.readline())
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@contextlib.contextmanager
def sidecar(spec: dict[str, Any], log: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``python -m scout.ops.sidecar`` given ``spec``, its stderr to ``log``; yields the process
    and its first line (ready or error). Killed at the end if it still runs."""
    import sys

    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "scout.ops.sidecar"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(spec) + "\n")
        process.stdin.flush()
        yield process, json.loads(process.stdout.readline())
    finally:
        _stop(process)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
