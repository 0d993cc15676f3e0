"""Child-process programs for the progress-record tests (module level, so ``spawn`` can import
them). Each program talks to the test over a multiprocessing pipe and never waits unbounded."""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection

from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity, Stage
from tests import processes

# Every wait in a child is bounded by this, so a broken test cannot leave processes behind.
CHILD_LIFETIME_MAX_S = 60.0


def fingerprint_of(step: int) -> int:
    return (step * 0x9E3779B97F4A7C15 + 1) & (2**64 - 1) or 1


def hold_publisher(identity: RecordIdentity, conn: Connection) -> None:
    """Create a record, report its name and token, publish a few coordinates, then wait to be
    told to exit (or be killed)."""
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    publisher = ProgressPublisher(identity)
    publisher.begin_step(7)
    publisher.advance()
    publisher.enter_collective(fingerprint_of(7))
    conn.send((publisher.name, publisher.token, os.getpid()))
    if conn.poll(CHILD_LIFETIME_MAX_S):
        conn.recv()
    publisher.close()


def churn_publisher(identity: RecordIdentity, duration_s: float, conn: Connection) -> None:
    """Publish as fast as possible for ``duration_s``, keeping fields in a fixed relation to
    the step so that a reader can tell a torn copy from a consistent one."""
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    publisher = ProgressPublisher(identity)
    conn.send((publisher.name, publisher.token))
    deadline = time.monotonic() + min(duration_s, CHILD_LIFETIME_MAX_S)
    step = 0
    while time.monotonic() < deadline:
        step += 1
        publisher.begin_step(step)
        publisher.enter_collective(fingerprint_of(step))
        publisher.exit_collective()
        publisher.begin_stage(Stage.DATA_LOADING, key=step)
        publisher.end_stage()
    conn.send(step)
    if conn.poll(CHILD_LIFETIME_MAX_S):
        conn.recv()
    publisher.close()


def churn_both_sections(identity: RecordIdentity, duration_s: float, conn: Connection) -> None:
    """PROGRESS-8: the training thread churns the payload while a second thread (the watcher's
    stand-in) churns the completion section, each keeping its fields in a fixed relation."""
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    publisher = ProgressPublisher(identity)
    writer = publisher.completion_writer()
    conn.send((publisher.name, publisher.token))
    deadline = time.monotonic() + min(duration_s, CHILD_LIFETIME_MAX_S)
    counts = [0, 0]

    def completions() -> None:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            writer.publish(7, n + 1, n, fingerprint_of(n + 1), 2, n * 1000, fingerprint_of(n))
        counts[1] = n

    import threading

    thread = threading.Thread(target=completions)
    thread.start()
    while time.monotonic() < deadline:
        counts[0] += 1
        publisher.begin_step(counts[0])
        publisher.enter_collective(fingerprint_of(counts[0]))
        publisher.exit_collective()
    thread.join(CHILD_LIFETIME_MAX_S)
    conn.send(tuple(counts))
    if conn.poll(CHILD_LIFETIME_MAX_S):
        conn.recv()
    writer.release()
    publisher.close()


def hold_reader(name: str, token: bytes, conn: Connection) -> None:
    """Attach as the record's observer and stay attached until told to go (or killed)."""
    processes.die_with_parent()  # killed with its parent, whatever state it is in
    reader = ProgressReader(name, token)
    conn.send(os.getpid())
    if conn.poll(CHILD_LIFETIME_MAX_S):
        conn.recv()
    reader.close()
