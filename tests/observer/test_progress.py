"""The progress record (spec/observer.md, "Progress record", PROGRESS-1..7): writer and reader
in different processes, seqlock consistency under concurrent writes, ownership, stale segments."""

from __future__ import annotations

import multiprocessing
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from scout.observer import progress
from scout.observer.progress import (
    ObserverAlreadyAttached,
    ProgressPublisher,
    ProgressReader,
    RecordIdentity,
    RecordInUse,
    RecordMismatch,
    RecordNotFound,
    Stage,
    process_alive,
    process_start_ticks,
    record_name,
)
from tests.observer import helpers

pytestmark = pytest.mark.processes

SPAWN = multiprocessing.get_context("spawn")
WAIT_S = 30.0


def unique_identity(rank: int = 0) -> RecordIdentity:
    return RecordIdentity(f"test-{os.getpid()}-{time.monotonic_ns()}", 0, rank)


class Child:
    """A spawned helper with a pipe; always reaped (killed if needed) at the end of the test."""

    def __init__(self, target: Any, *args: Any) -> None:
        self.conn, child_conn = SPAWN.Pipe()
        self.process = SPAWN.Process(target=target, args=(*args, child_conn), daemon=True)
        self.process.start()

    def recv(self) -> Any:
        assert self.conn.poll(WAIT_S), "child did not answer in time"
        return self.conn.recv()

    def finish(self) -> None:
        self.conn.send("exit")
        self.process.join(WAIT_S)

    def kill(self) -> None:
        assert self.process.pid is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(WAIT_S)

    def reap(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(WAIT_S)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.reap()


def start(children: list[Child], target: Any, *args: Any) -> Child:
    child = Child(target, *args)
    children.append(child)
    return child


def test_PROGRESS_1_reader_in_another_process_sees_the_writers_coordinate(children: list[Child]) -> None:
    child = start(children, helpers.hold_publisher, unique_identity())
    name, token, pid = child.recv()
    with ProgressReader(name, token) as reader:
        snapshot = reader.read()
        assert snapshot is not None
        assert snapshot.coordinate == (7, 2)
        assert snapshot.stage is Stage.COLLECTIVE
        assert snapshot.fingerprint == helpers.fingerprint_of(7)
        assert snapshot.collectives_entered == 1
        assert not snapshot.closed
        assert reader.owner_alive()
        # Monotonic timestamps, comparable across processes of one host.
        assert 0 < snapshot.publish_ns <= time.monotonic_ns()
        child.finish()
        # The writer closed cleanly: the last publish says so.
        final = reader.read()
        assert final is not None and final.closed
    assert child.process.exitcode == 0


def _check_consistent(snapshot: progress.Snapshot) -> None:
    step, op = snapshot.coordinate
    f = helpers.fingerprint_of(step)
    if step == 0:  # the record as created, before the first step
        assert (op, snapshot.fingerprint, snapshot.collectives_entered) == (0, 0, 0)
    elif op == 0:
        assert (snapshot.fingerprint, snapshot.collectives_entered, snapshot.stage_sequence) == (0, step - 1, step - 1)
    elif op == 1:
        assert (snapshot.stage, snapshot.fingerprint, snapshot.stage_key) == (Stage.COLLECTIVE, f, f)
        assert (snapshot.collectives_entered, snapshot.stage_sequence) == (step, step - 1)
    elif op == 2:
        assert snapshot.fingerprint == 0 and snapshot.stage is not Stage.COLLECTIVE
        assert snapshot.collectives_entered == step
    elif op == 3:
        assert (snapshot.stage, snapshot.stage_key, snapshot.stage_sequence) == (Stage.DATA_LOADING, step, step)
    else:
        assert op == 4
        assert (snapshot.stage, snapshot.completed_stage, snapshot.completed_stage_key) == (
            Stage.COMPUTE, Stage.DATA_LOADING, step,
        )


def test_PROGRESS_2_no_torn_read_under_concurrent_writes(children: list[Child]) -> None:
    child = start(children, helpers.churn_publisher, unique_identity(), 1.5)
    name, token = child.recv()
    reads = consistent = 0
    seen_ops: set[int] = set()
    with ProgressReader(name, token) as reader:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            reads += 1
            snapshot = reader.read()
            if snapshot is None:
                continue
            consistent += 1
            _check_consistent(snapshot)
            seen_ops.add(snapshot.op)
        steps = child.recv()
        child.finish()
    # The test is only meaningful if the writer really raced the reader.
    assert steps > 1000 and consistent > 1000, (steps, reads, consistent)
    assert seen_ops == {0, 1, 2, 3, 4}


def test_PROGRESS_2_a_copy_that_fails_its_checksum_or_stays_mid_publish_is_refused() -> None:
    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        publisher.begin_step(3)
        good = reader.read()
        assert good is not None and good.step == 3
        buffer = publisher._segment.buf
        # A stopped writer leaves the sequence odd: bounded attempts, then None, quickly.
        (sequence,) = struct.unpack_from("<Q", buffer, progress._SEQ_OFFSET)
        struct.pack_into("<Q", buffer, progress._SEQ_OFFSET, sequence + 1)
        started = time.monotonic()
        assert reader.read(attempts_max=10_000) is None
        assert time.monotonic() - started < 1.0
        assert reader.failed_reads == 1 and reader.last_snapshot == good
        # Even sequence but a payload from "another publish": the checksum rejects it.
        struct.pack_into("<Q", buffer, progress._SEQ_OFFSET, sequence + 2)
        struct.pack_into("<q", buffer, progress._PAYLOAD_OFFSET, 999)
        assert reader.read(attempts_max=10) is None
        publisher.advance()
        fresh = reader.read()
        assert fresh is not None and fresh.coordinate == (3, 1)


_NO_TRACKER = """
import os
from multiprocessing import resource_tracker
from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity
identity = RecordIdentity(f"tracker-{os.getpid()}", 0, 0)
with ProgressPublisher(identity) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
    publisher.begin_step(2)
    snapshot = reader.read()
    assert snapshot is not None and snapshot.step == 2, snapshot
    path = "/dev/shm/" + publisher.name
    assert os.path.exists(path) and os.stat(path).st_mode & 0o777 == 0o600, oct(os.stat(path).st_mode)
print(resource_tracker._resource_tracker._pid, os.path.exists(path))
"""


def test_PROGRESS_1_a_record_and_its_reader_start_no_resource_tracker_and_leave_no_segment() -> None:
    # A fresh interpreter: the tracker is per process, and another test may have started one here.
    # Python < 3.13's SharedMemory starts one for a segment even when its registration is undone at
    # once: one more interpreter per trainer and per observer at every job's start.
    done = subprocess.run([sys.executable, "-c", _NO_TRACKER], capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "False"], done.stdout


def test_PROGRESS_3_a_live_owners_record_is_never_taken_over(children: list[Child]) -> None:
    identity = unique_identity(rank=5)
    child = start(children, helpers.hold_publisher, identity)
    name, token, pid = child.recv()
    with pytest.raises(RecordInUse, match=rf"rank 5 .* live process {pid}: two trainers publish for one rank"):
        ProgressPublisher(identity)
    with ProgressReader(name, token) as reader:
        snapshot = reader.read()
        assert snapshot is not None and snapshot.coordinate == (7, 2)
    child.finish()


def test_PROGRESS_4_a_dead_owners_record_is_reclaimed(children: list[Child]) -> None:
    identity = unique_identity(rank=2)
    child = start(children, helpers.hold_publisher, identity)
    name, old_token, pid = child.recv()
    child.kill()
    assert not process_alive(pid, 0)
    with ProgressPublisher(identity) as publisher:
        assert publisher.name == name and publisher.token != old_token
        publisher.begin_step(1)
        # The dead owner's token no longer opens the record.
        with pytest.raises(RecordMismatch, match="token given to this observer does not match"):
            ProgressReader(name, old_token)
        with ProgressReader(name, publisher.token) as reader:
            snapshot = reader.read()
            assert snapshot is not None and snapshot.step == 1


def test_PROGRESS_4_an_observer_removes_the_record_of_a_killed_trainer(children: list[Child]) -> None:
    child = start(children, helpers.hold_publisher, unique_identity())
    name, token, _ = child.recv()
    reader = ProgressReader(name, token)
    assert reader.owner_alive()
    child.kill()
    assert not reader.owner_alive()
    reader.close(unlink_if_orphaned=True)
    with pytest.raises(RecordNotFound):
        ProgressReader(name, token)


def test_PROGRESS_5_a_second_observer_for_one_rank_is_refused(children: list[Child]) -> None:
    with ProgressPublisher(unique_identity(rank=4)) as publisher:
        child = start(children, helpers.hold_reader, publisher.name, publisher.token)
        observer_pid = child.recv()
        with pytest.raises(ObserverAlreadyAttached, match=rf"rank 4 .* live observer, pid {observer_pid}"):
            ProgressReader(publisher.name, publisher.token)
        # A dead observer's claim is stale: the slot can be taken again.
        child.kill()
        with ProgressReader(publisher.name, publisher.token) as reader:
            assert reader.claimed


def test_PROGRESS_5_an_observer_that_left_frees_its_slot(children: list[Child]) -> None:
    with ProgressPublisher(unique_identity()) as publisher:
        child = start(children, helpers.hold_reader, publisher.name, publisher.token)
        child.recv()
        child.finish()
        with ProgressReader(publisher.name, publisher.token) as reader:
            assert reader.claimed


def test_PROGRESS_6_records_are_named_per_job_generation_and_rank() -> None:
    names = {record_name(job, generation, rank) for job in ("a", "b") for generation in (0, 1) for rank in (0, 1, 10)}
    assert len(names) == 12
    assert all(name.startswith("scout_") and len(name) <= 30 for name in names)
    assert record_name("a", 0, 1) == record_name("a", 0, 1)
    identity = RecordIdentity.from_environment(3, {"TORCHELASTIC_RUN_ID": "run7", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert identity == RecordIdentity("run7", 2, 3)
    with pytest.raises(ValueError, match="rank must be an int in"):
        RecordIdentity("job", 0, -1)
    with pytest.raises(ValueError, match="job_id must be a non-empty string"):
        RecordIdentity("", 0, 0)


def test_PROGRESS_6_missing_and_foreign_records_are_refused() -> None:
    name = record_name(f"absent-{os.getpid()}", 0, 0)
    with pytest.raises(RecordNotFound, match="has not created it yet"):
        ProgressReader(name, b"\x00" * 16)
    with pytest.raises(ValueError, match="token must be 16 bytes"):
        ProgressReader(name, b"short")


def test_PROGRESS_7_a_recycled_pid_does_not_count_as_the_owner() -> None:
    me = os.getpid()
    start_ticks = process_start_ticks(me)
    assert start_ticks is not None and start_ticks > 0
    assert process_alive(me, start_ticks)
    assert not process_alive(me, start_ticks + 1)  # same pid, another process start
    assert not process_alive(0, 0)


def test_PROGRESS_7_a_zombie_is_dead() -> None:
    process = SPAWN.Process(target=time.sleep, args=(0,))
    process.start()
    assert process.pid is not None
    deadline = time.monotonic() + WAIT_S
    # The child exits at once; until we reap it, it is a zombie.
    while process_start_ticks(process.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_start_ticks(process.pid) is None
    process.join(WAIT_S)


def test_PROGRESS_8_two_sections_two_writers_no_torn_read_of_either(children: list[Child]) -> None:
    child = start(children, helpers.churn_both_sections, unique_identity(), 1.5)
    name, token = child.recv()
    completions = 0
    with ProgressReader(name, token) as reader:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            snapshot = reader.read()
            if snapshot is None:
                continue
            step, op = snapshot.coordinate
            expected = {0: (0, max(0, step - 1)), 1: (helpers.fingerprint_of(step), step), 2: (0, step)}[op]
            assert (snapshot.fingerprint, snapshot.collectives_entered) == expected, snapshot
            section = snapshot.completion
            if section is None:
                continue
            completions += 1
            (slot,) = section.slots
            n = slot.completed
            assert (slot.enqueued, slot.pending_fingerprint, slot.completed_fingerprint,
                    slot.pending_state, slot.pending_since_ns) == (
                n + 1, helpers.fingerprint_of(n + 1), helpers.fingerprint_of(n), 2, n * 1000)
        steps, published = child.recv()
        child.finish()
    assert steps > 300 and published > 300 and completions > 300, (steps, published, completions)


def test_PROGRESS_8_one_completion_writer_a_section_never_written_or_withdrawn_reads_absent() -> None:
    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        assert reader.read().completion is None  # type: ignore[union-attr]
        writer = publisher.completion_writer()
        with pytest.raises(progress.ProgressError, match="already has a live writer"):
            publisher.completion_writer()
        writer.publish(9, 4, 3, 0xF, 1, 77, 0xE)
        section = reader.read().completion  # type: ignore[union-attr]
        assert section is not None and [(c.source, c.enqueued, c.completed) for c in section.slots] == [(9, 4, 3)]
        # A writer stopped mid-publish: the reader keeps the last consistent copy, bounded.
        (sequence,) = struct.unpack_from("<Q", publisher._segment.buf, progress._COMPLETION_SEQ_OFFSET)
        struct.pack_into("<Q", publisher._segment.buf, progress._COMPLETION_SEQ_OFFSET, sequence + 1)
        assert reader.read(attempts_max=50).completion == section  # type: ignore[union-attr]
        struct.pack_into("<Q", publisher._segment.buf, progress._COMPLETION_SEQ_OFFSET, sequence)
        writer.withdraw()
        assert reader.read().completion is None  # type: ignore[union-attr]
        writer.release()
        writer.release()
        with pytest.raises(progress.ProgressError, match="was released"):
            writer.publish(9, 1, 1, 0, 0, 0)
        publisher.completion_writer().release()


def test_PROGRESS_9_the_coordinate_is_checked_and_becomes_the_observers_progress() -> None:
    from scout.core.observer import Completion, PendingState

    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        writer = publisher.completion_writer()
        for bad, message in (((0, 1, 1, 0, 0, 0), "0 < source"), ((9, 1, 2, 0, 0, 0), "completed <= enqueued"),
                             ((9, 2, 1, 0, 0, 0), "pending state 0 contradicts"),
                             ((9, 1, 1, 0, 2, 0), "pending state 2 contradicts")):
            with pytest.raises(ValueError, match=message):
                writer.publish(*bad)
        publisher.begin_step(5)
        writer.publish(9, 4, 3, 0xF, int(PendingState.STARTED), 2_500_000_000, 0xE)
        seen = reader.read().progress()  # type: ignore[union-attr]
        assert seen.coordinate == (5, 0)
        assert seen.completion == Completion(9, 4, 3, 0xF, PendingState.STARTED, 0xE)
        assert seen.pending_since_s == (2.5,)
        # A re-estimated enqueue time alone is not progress.
        writer.publish(9, 4, 3, 0xF, int(PendingState.STARTED), 2_600_000_000, 0xE)
        assert reader.read().progress() == seen  # type: ignore[union-attr]
        # Values that break PROGRESS-9 read as no completion evidence (a corrupt section), and so
        # do two coordinates of one group.
        buffer = publisher._segment.buf
        struct.pack_into("<Q", buffer, progress._COMPLETION_SLOTS_OFFSET + 16, 99)  # completed > enqueued
        head = progress._COMPLETION_HEAD.unpack_from(buffer, progress._COMPLETION_HEAD_OFFSET)
        rows = (progress._COMPLETION_SLOT.unpack_from(buffer, progress._COMPLETION_SLOTS_OFFSET),)
        struct.pack_into("<Q", buffer, progress._COMPLETION_CHECKSUM_OFFSET, hash((head, rows)) & progress._CHECKSUM_MASK)
        assert reader.read().progress().completion is None  # type: ignore[union-attr]
        slot = progress.CompletionSlot(9, 4, 3, 0xF, 0xE, int(PendingState.STARTED), 1)
        writer.publish_slots([slot, attrs.evolve(slot, source=10)])
        assert len(reader.read().progress().completions) == 2  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="name a group twice"):
            writer.publish_slots([slot, slot])
        with pytest.raises(ValueError, match="exceed COMPLETION_GROUPS_MAX"):
            writer.publish_slots([attrs.evolve(slot, source=s) for s in range(1, progress.COMPLETION_GROUPS_MAX + 2)])
        writer.release()


def test_PROGRESS_13_the_host_contract_is_raised_never_lowered_and_read_whatever_the_section() -> None:
    from scout.core.observer import HostContract

    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        assert reader.read().contract is HostContract.BLOCKING  # type: ignore[union-attr]
        publisher.raise_contract(HostContract.ENQUEUE)
        publisher.raise_contract(HostContract.BLOCKING)  # never lowered
        snapshot = reader.read()
        assert snapshot is not None and snapshot.contract is HostContract.ENQUEUE
        # Without any completion section (never written, withdrawn, stale) the contract stands.
        assert snapshot.completion is None and snapshot.progress().contract is HostContract.ENQUEUE


def test_PROGRESS_10_a_section_its_watcher_stopped_publishing_reads_absent_and_a_live_one_heartbeats() -> None:
    from scout.observer import completion as comp

    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        writer = publisher.completion_writer()
        writer.publish(9, 4, 3, 0xF, 2, 1, 0xE)
        section = reader.read().completion  # type: ignore[union-attr]
        assert section is not None
        fresh = section.publish_ns + round(progress.COMPLETION_STALE_S * 1e9)
        assert reader.read().progress(fresh).completion is not None  # type: ignore[union-attr]
        stale = reader.read().progress(fresh + 1)  # type: ignore[union-attr]
        assert stale.completion is None and stale.completion_stale
        writer.release()

        class Still:
            key = 9

            def poll(self) -> Any:
                from scout.core.observer import Completion, PendingState

                return Completion(9, 4, 3, 0xF, PendingState.STARTED, 0xE), 1

        watcher = comp.CompletionWatcher(Still(), publisher.completion_writer())
        watcher.poll_once()
        watcher.poll_once()
        assert watcher.publishes == 1  # nothing new, and the heartbeat is not due
        watcher._published_s -= progress.COMPLETION_HEARTBEAT_S
        watcher.poll_once()
        assert watcher.publishes == 2  # the heartbeat: the same coordinate, published again
        watcher.stop()


def test_PROGRESS_10_staleness_is_read_from_the_sections_own_last_publish_alone() -> None:
    """PROGRESS-10's one timestamp: a completion section is absent once *its* last publish is
    more than COMPLETION_STALE_S old -- not the time its coordinate last changed (a heartbeat
    keeps an unchanged coordinate of a live watcher fresh: a rank waiting long in one collective
    must keep its evidence), and not the host payload's publish (a training thread that publishes
    says nothing about a watcher that cannot run). Times set apart on a real record's snapshot."""
    import attrs

    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        publisher.begin_step(4)
        writer = publisher.completion_writer()
        writer.publish(9, 4, 3, 0xF, 2, 1, 0xE)
        read = reader.read()
        assert read is not None and read.completion is not None
        writer.release()
    stale_ns = progress.COMPLETION_STALE_NS
    published = 1_000 * stale_ns

    def snapshot(*, section_publish: int, changed: int, host_publish: int) -> Any:
        assert read is not None and read.completion is not None
        section = attrs.evolve(read.completion, publish_ns=section_publish, changed_ns=changed)
        return attrs.evolve(read, completion=section, publish_ns=host_publish)

    # A heartbeat: the coordinate changed long ago, the watcher published just now; the host
    # thread (blocked in the collective) has not published for as long.
    waiting = snapshot(section_publish=published, changed=published - 50 * stale_ns,
                       host_publish=published - 50 * stale_ns)
    assert waiting.progress(published + stale_ns).completion is not None
    assert waiting.progress(published + stale_ns + 1).completion is None
    # The watcher stopped (the process is stopped, a C call holds the GIL) while the host
    # payload is fresh: absent all the same.
    stopped = snapshot(section_publish=published, changed=published, host_publish=published + 10 * stale_ns)
    assert stopped.progress(published + stale_ns + 1).completion is None
    assert stopped.progress(published + stale_ns).completion is not None
    # Without a reading time nothing is judged stale.
    assert waiting.progress().completion is not None


def test_PROGRESS_10_a_heartbeat_moves_the_publish_time_not_the_time_the_coordinate_changed() -> None:
    """An observer that reads seldom (DRIVER-6) dates a completion change by ``changed_ns``:
    heartbeats republish the same coordinate with a later ``publish_ns`` but keep it."""
    import time

    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        writer = publisher.completion_writer()
        writer.publish(9, 4, 3, 0xF, 2, 1, 0xE)
        first = reader.read().completion  # type: ignore[union-attr]
        assert first is not None and first.changed_ns == first.publish_ns
        time.sleep(0.01)
        writer.publish(9, 4, 3, 0xF, 2, 1, 0xE)  # a heartbeat
        beat = reader.read().completion  # type: ignore[union-attr]
        assert beat is not None and beat.publish_ns > first.publish_ns and beat.changed_ns == first.changed_ns
        time.sleep(0.01)
        writer.publish(9, 4, 4, 0, 0, 0, 0xF)  # the collective completed: a change
        changed = reader.read().completion  # type: ignore[union-attr]
        assert changed is not None and changed.changed_ns == changed.publish_ns > beat.publish_ns
        writer.withdraw()
        writer.publish(9, 4, 4, 0, 0, 0, 0xF)  # after a withdrawal the same coordinate is new again
        again = reader.read().completion  # type: ignore[union-attr]
        assert again is not None and again.changed_ns == again.publish_ns > changed.changed_ns
        writer.release()


def test_PROGRESS_11_exiting_is_read_as_leaving_and_later_publishes_keep_it() -> None:
    with ProgressPublisher(unique_identity()) as publisher, ProgressReader(publisher.name, publisher.token) as reader:
        publisher.begin_step(3)
        running = reader.read()
        assert running is not None and not running.leaving and not running.exiting
        assert publisher.mark_exiting()
        exiting = reader.read()
        assert exiting is not None and exiting.exiting and exiting.leaving and not exiting.closed
        publisher.advance()  # a hook that publishes on the way out does not take it back
        later = reader.read()
        assert later is not None and later.exiting and later.op == exiting.op + 1
        publisher.close()
        closed = reader.read() or reader.last_snapshot
        assert closed is not None and closed.closed and closed.leaving
    assert not publisher.mark_exiting()  # a closed record cannot be marked


def test_PROGRESS_12_a_start_removes_the_records_of_dead_trainers_of_any_job_and_no_live_one(
        children: list[Child]) -> None:
    dead = [start(children, helpers.hold_publisher, unique_identity(rank)) for rank in range(2)]
    names = [child.recv()[0] for child in dead]
    for child in dead:
        child.kill()
    with ProgressPublisher(unique_identity(rank=5)) as live:
        assert progress.remove_dead_records() >= 2
        assert [name for name in names if os.path.exists(os.path.join(progress.SHM_DIR, name))] == []
        assert os.path.exists(os.path.join(progress.SHM_DIR, live.name))


def test_PROGRESS_12_a_record_whose_creator_died_before_sizing_it_is_removed() -> None:
    """A creator killed between creating the segment and sizing it leaves an empty segment of this
    user; the sweep removes it (before _Segment, opening it raised and it stayed until reboot)."""
    name = record_name(unique_identity().job_id, 0, 0)
    fd = progress._posixshmem.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
    os.close(fd)
    path = os.path.join(progress.SHM_DIR, name)
    try:
        assert os.path.getsize(path) == 0
        with pytest.raises(RecordMismatch, match="is 0 bytes"):
            ProgressReader(name, b"\x00" * progress.TOKEN_BYTES)
        assert progress.remove_dead_records() >= 1
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_PROGRESS_12_the_sweep_waits_for_a_creator_whose_TMPDIR_differs(tmp_path: Any) -> None:
    """Two torchrun agents on one host give their trainers different TMPDIRs but one /dev/shm:
    a sweep must take the creator's lock, or it removes a record between its creation and its
    header (tests/job/test_multinode.py's healthy rank whose observer never attached)."""
    other_tmp = tmp_path / "other-node-tmp"
    other_tmp.mkdir()
    name = record_name(unique_identity().job_id, 0, 0)
    sweep = ("import sys; from scout.observer import progress; print('sweeping', flush=True); "
             "print(progress.remove_dead_records(), flush=True)")
    env = {**os.environ, "TMPDIR": str(other_tmp)}
    with progress._claim_lock():
        segment = progress._open_segment(name, create=True)  # created, its header not yet written
        try:
            child = subprocess.Popen([sys.executable, "-c", sweep], env=env, stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None and child.stdout.readline().strip() == "sweeping"
            time.sleep(0.5)  # an unlocked sweep removes it well within this
            assert os.path.exists(os.path.join(progress.SHM_DIR, name)), "swept while its creator held the lock"
        finally:
            segment.close()
    out, _ = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0 and int(out.strip()) >= 1  # released without a header: a dead creator's
    assert not os.path.exists(os.path.join(progress.SHM_DIR, name))
