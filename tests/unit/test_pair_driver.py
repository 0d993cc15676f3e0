"""bench/attach_overhead.py's pair driver freezes one job's whole process tree at every turn
(SIGSTOP); a driver ended by ``kill`` must still thaw and end both jobs, or their processes stay
stopped for good (an evaluation stopped with ``pkill`` left its trainers' resource trackers
behind, stopped, for hours)."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def _attach_overhead() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        module: ModuleType = importlib.import_module("attach_overhead")
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_terminate_raises_system_exit_inside_and_restores_the_handler() -> None:
    module = _attach_overhead()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as raised, module.terminate_raises():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode; never reached
    assert raised.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_terminate_raises_leaves_other_threads_alone() -> None:
    module = _attach_overhead()
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def inside() -> None:
        with module.terminate_raises():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=inside)
    thread.start()
    thread.join(10)
    assert seen == [before]


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, state) of every process whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in command and state != "Z":
            found.append((int(entry.name), state))
    return found


DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import attach_overhead as a
a.pair_run(a.Arm("first", scout=False), a.Arm("second", scout=False), first=0, size="tiny", steps=100000,
           batch=2, nproc=1, device="cpu", work=Path({work!r}))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.timeout(180)
def test_a_pair_driver_ended_by_sigterm_leaves_no_process_behind(tmp_path: Path) -> None:
    work = tmp_path / "pair"
    work.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(bench=str(BENCH), work=str(work))], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Wait (bounded) until the jobs take turns: one of them is frozen.
        deadline = time.monotonic() + 120
        while not any(state == "T" for _, state in _processes_mentioning(str(work))):
            assert driver.poll() is None, driver.stderr.read().decode()[-2000:] if driver.stderr else ""
            assert time.monotonic() < deadline, "the pair never took turns"
            time.sleep(0.2)
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=60)
        deadline = time.monotonic() + 30
        while _processes_mentioning(str(work)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _processes_mentioning(str(work))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
        for pid, _ in _processes_mentioning(str(work)):  # whatever the driver left, this test ends
            for signum in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
    assert left == [], f"processes of the pair outlived its driver: {left}"
    assert driver.returncode == 128 + signal.SIGTERM


def test_allocator_setup_is_the_runs_choice_and_names_a_bad_one(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _attach_overhead()
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "7")  # the shell's setting must not leak into a stock run
    heap = module._environment(module.DEFAULTS, "heap")
    stock = module._environment(module.OFF, "stock")
    assert heap["MALLOC_MMAP_MAX_"] == "0" and int(heap["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 30
    assert not {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"} & set(stock)
    with pytest.raises(ValueError, match="'jemalloc'"):
        module._environment(module.DEFAULTS, "jemalloc")


#: A child that maps 64 MiB, touches and frees it three times, then counts the page faults of a
#: fourth time: glibc's stock malloc maps a block that large afresh each time (about 16,000 faults
#: of 4 KiB), a kept heap gives back memory the process already has.
_FAULTS_OF_A_BLOCK = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
def once():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(ctypes.c_void_p(block))
for _ in range(3):
    once()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
once()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_heap_allocator_setup_stops_the_per_step_page_faults() -> None:
    module = _attach_overhead()
    faults = {}
    for allocator in ("stock", "heap"):
        done = subprocess.run([sys.executable, "-c", _FAULTS_OF_A_BLOCK], env=module._environment(module.OFF, allocator),
                              capture_output=True, text=True, timeout=60, check=True)
        faults[allocator] = int(done.stdout.split()[-1])
    assert faults["stock"] > 10_000 and faults["heap"] < 1_000, faults
