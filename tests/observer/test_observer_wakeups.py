"""DRIVER-6: a watching observer process reads its record seldom (watch_interval_s), yet wakes at
once when its trainer's control pipe closes or a stop signal comes. Real observer processes
(scout.observer.launch.start_observer) beside two progress records this test publishes."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from scout.observer.launch import ObserverHandle, start_observer
from scout.observer.progress import ProgressPublisher, RecordIdentity
from scout.observer.rendezvous import DirectoryRendezvous

pytestmark = pytest.mark.processes

WATCH_S = 5.0  # the default watch interval: a poll could not explain a prompt exit
PROMPT_S = 0.5
INSIDE_S = 1.0  # into a watch interval, when the event comes


@pytest.fixture
def group() -> Iterator[tuple[list[ProgressPublisher], list[ObserverHandle]]]:
    job = f"wakeups-{time.monotonic_ns()}"
    publishers = [ProgressPublisher(RecordIdentity(job, 0, rank)) for rank in (0, 1)]
    handles: list[ObserverHandle | None] = [None, None]
    done = threading.Event()
    with tempfile.TemporaryDirectory() as directory:
        def start(rank: int) -> None:
            handles[rank] = start_observer(publishers[rank], group_ranks=(0, 1), secret=b"s" * 32,
                                           rendezvous=DirectoryRendezvous(directory),
                                           config={"stall_threshold_s": 10.0}, on_failure="report",
                                           watch_interval_s=WATCH_S)
            done.wait(120)  # an observer's parent-death signal fires when the thread that started it ends

        threads = [threading.Thread(target=start, args=(rank,), daemon=True) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while None in handles and time.monotonic() < deadline:
            time.sleep(0.01)
        assert None not in handles, "the observers did not start within 60 s"
        ready = [h for h in handles if h is not None]
        try:
            for handle in ready:
                handle.wait_ready(60)
            for _ in range(3):  # a healthy trainer
                for publisher in publishers:
                    publisher.advance()
            yield publishers, ready
        finally:
            for publisher, handle in zip(publishers, ready, strict=True):
                publisher.close()
                handle.close()
            done.set()
            for thread in threads:
                thread.join(10)


def _exit_after(handle: ObserverHandle, started: float, timeout_s: float = 10.0) -> float:
    handle.process.wait(timeout_s)
    return time.monotonic() - started


def test_DRIVER_6_the_observer_wakes_at_once_when_its_trainers_pipe_closes(group: tuple) -> None:
    _publishers, handles = group
    time.sleep(INSIDE_S)  # well inside a watch interval
    started = time.monotonic()
    assert handles[0].process.stdin is not None
    handles[0].process.stdin.close()  # as the kernel does when the trainer dies
    assert _exit_after(handles[0], started) < PROMPT_S


def test_DRIVER_6_the_observer_wakes_at_once_on_a_stop_signal(group: tuple) -> None:
    _publishers, handles = group
    time.sleep(INSIDE_S)
    started = time.monotonic()
    handles[1].process.send_signal(signal.SIGTERM)
    assert _exit_after(handles[1], started) < PROMPT_S


def test_OBS_8_DRIVER_6_a_clean_close_ends_the_observer_by_its_pipe_not_by_a_signal(group: tuple) -> None:
    """job.close(): the record is closed, then the control pipe; the observer reads ``closed`` and
    stops as a clean exit at once -- close() neither signals it nor waits out its bound (it did,
    1.2 s on every rank of every job, while the pipe was closed only after that wait)."""
    publishers, handles = group
    time.sleep(INSIDE_S)
    signalled: list[object] = []
    process = handles[0].process
    for name in ("send_signal", "terminate", "kill"):
        original = getattr(process, name)
        setattr(process, name, lambda *args, _name=name, _original=original: (signalled.append(_name),
                                                                              _original(*args)))
    started = time.monotonic()
    publishers[0].close()
    handles[0].close()
    assert time.monotonic() - started < PROMPT_S
    assert signalled == [] and process.returncode == 0, (signalled, process.returncode)
