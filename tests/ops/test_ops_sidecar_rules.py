"""The sidecar's own rules, driven in this process (issue 41's mutation run over scout/ops): its
watchdog (OPS-2), its loop's errors and signals, the metrics address it names, how often it looks
at the gate and the ranks' ops files (OPS-5), and how it reads a progress record (OPS-1). Each
test compares what an operator sees whole: the exit code, the log line, the ready line, the
node file, the series."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from scout.ops import paths, sidecar

DEAD = {"rank": 0, "record_name": "ops-sidecar-rules-none", "record_token": "00", "pid": 0, "start_ticks": 0}


def _spec(run_dir: Path, **extra: Any) -> dict[str, Any]:
    return {"run_dir": str(run_dir), "host": "h", "ranks": [DEAD], "job_id": "j", "generation": 0, **extra}


def _run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spec: dict[str, Any],
              handlers: dict[int, Any]) -> tuple[int, list[Any], str]:
    """``sidecar.main()`` in this process: the spec on a pipe as its stdin, the signal handlers it
    installs kept in ``handlers`` (not installed)."""
    read_end, write_end = os.pipe()
    os.write(write_end, json.dumps(spec).encode() + b"\n")
    os.close(write_end)

    class Stdin:
        def fileno(self) -> int:
            return read_end

    monkeypatch.setattr(sidecar.sys, "stdin", Stdin())
    monkeypatch.setattr(sidecar.signal, "signal", lambda signum, handler: handlers.__setitem__(signum, handler))
    try:
        code = sidecar.main()
    finally:
        os.close(read_end)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


# -- the watchdog and the loop (OPS-2) ------------------------------------------------------------


def test_OPS_2_the_watchdog_ends_a_sidecar_whose_last_steps_hang_at_its_deadline_with_exit_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Its trainer is gone at once; its finish() then hangs (as on a blocked read): the watchdog,
    # polling every 0.1 s, ends the process on_report_timeout_s + EXIT_DEADLINE_S after the trainers
    # were gone -- not before -- with exit code 3 and says why. os._exit is recorded, not done.
    monkeypatch.setattr(sidecar, "EXIT_DEADLINE_S", 0.3)
    ended, released = threading.Event(), threading.Event()
    exits: list[tuple[Any, float, str, bool]] = []
    waits: list[float | None] = []
    entered: list[float] = []
    real_wait, real_finish = threading.Event.wait, sidecar.Sidecar.finish

    def exit_(code: Any) -> None:
        current = threading.current_thread()
        exits.append((code, time.monotonic(), current.name, current.daemon))
        ended.set()
        real_wait(released, 10.0)  # the process would have ended here: the thread waits for the test

    def wait(self: threading.Event, timeout: float | None = None) -> bool:
        if threading.current_thread().name == "scout-ops-watchdog":
            waits.append(timeout)
        return real_wait(self, timeout)

    def finish(self: sidecar.Sidecar, hooks_deadline_s: float) -> None:
        entered.append(time.monotonic())
        ended.wait(10.0)  # blocked until the watchdog fires (bounded)
        real_finish(self, hooks_deadline_s)

    monkeypatch.setattr(sidecar.os, "_exit", exit_)
    monkeypatch.setattr(threading.Event, "wait", wait)
    monkeypatch.setattr(sidecar.Sidecar, "finish", finish)
    try:
        code, said, err = _run_main(monkeypatch, capsys, _spec(tmp_path, on_report_timeout_s=0.2), {})
    finally:
        released.set()  # main has returned (its loop is finished): the watchdog's next look ends it
    assert (code, said) == (0, [{"ready": True, "metrics_address": None, "metrics_error": None}])
    assert len(exits) == 1, "the watchdog ended it once"
    exit_code, fired_s, thread_name, daemon = exits[0]
    assert (exit_code, thread_name, daemon) == (sidecar.EXIT_FAILED, "scout-ops-watchdog", True)
    assert fired_s - entered[0] >= 0.45, "not before on_report_timeout_s + EXIT_DEADLINE_S (0.5 s)"
    assert waits and set(waits) == {0.1}, "it looks every 0.1 s"
    assert err == ("scout: ops sidecar on h: its loop did not stop within 0.5 s after its trainers were gone; "
                   "ending it (OPS-2)\n")


def test_OPS_2_an_error_in_the_loop_is_logged_and_the_loop_goes_on_until_sigint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from scout.observer.progress import ProgressPublisher, RecordIdentity, process_start_ticks

    publisher = ProgressPublisher(RecordIdentity(f"ops-sidecar-rules-{os.getpid()}", 0, 0))
    handlers: dict[int, Any] = {}
    watchdogs: list[list[tuple[str, bool]]] = []
    ticks = [0]

    def tick(self: sidecar.Sidecar) -> None:
        ticks[0] += 1
        watchdogs.append([(t.name, t.daemon) for t in threading.enumerate() if t.name == "scout-ops-watchdog"])
        if ticks[0] == 1:
            raise ValueError("bad read")
        if ticks[0] == 2:
            handlers[signal.SIGINT](signal.SIGINT, None)  # as Ctrl-C would
        elif ticks[0] >= 50:
            handlers[signal.SIGTERM](signal.SIGTERM, None)  # bounded: SIGINT did not stop it

    monkeypatch.setattr(sidecar.Sidecar, "tick", tick)
    try:
        publisher.begin_step(1)
        entry = {"rank": 0, "record_name": publisher.name, "record_token": publisher.token.hex(),
                 "pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()) or 0}
        code, said, err = _run_main(monkeypatch, capsys, _spec(tmp_path, ranks=[entry], poll_interval_s=0.01),
                                    handlers)
    finally:
        publisher.close()
    assert code == 0 and said[0]["ready"]
    assert ticks[0] == 2, "the loop went on after the error and SIGINT ended it"
    assert err == "scout: ops sidecar on h: error in its loop (continuing): ValueError('bad read')\n"
    assert watchdogs[0] == [("scout-ops-watchdog", True)], "one watchdog, a daemon thread, runs beside the loop"


def test_OPS_2_a_metrics_server_that_fails_to_stop_does_not_keep_finish_from_its_hooks(tmp_path: Path) -> None:
    class Stuck:
        def shutdown(self) -> None:
            raise OSError("cannot stop")

    car = sidecar.Sidecar(_spec(tmp_path, on_report="true", on_report_timeout_s=1))
    car._server = Stuck()  # noqa: SLF001
    assert car.hooks is not None and car.hooks.submit({"kind": "hang"})
    car.finish(time.monotonic())  # no time left for the hook: it is dropped, and counted
    assert car._server is None  # noqa: SLF001
    assert car.hooks.counts["dropped"] == 1 and not car.hooks.queue


# -- the spec on stdin (OPS-2) -----------------------------------------------------------------------


def test_OPS_2_no_wait_for_the_spec_is_longer_than_what_is_left_of_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import select as selects

    timeouts: list[float] = []

    def select(rlist: Iterable[int], wlist: Iterable[int], xlist: Iterable[int], timeout: float) -> Any:
        timeouts.append(timeout)
        return selects.select(rlist, wlist, xlist, timeout)

    read_end, write_end = os.pipe()

    class Stdin:
        def fileno(self) -> int:
            return read_end

    monkeypatch.setattr(sidecar.sys, "stdin", Stdin())
    monkeypatch.setattr(sidecar, "select", types.SimpleNamespace(select=select))
    try:
        os.write(write_end, b'{"a": ')  # a part of the line, then nothing: the trainer is stuck
        assert sidecar._read_spec(0.2) is None
    finally:
        os.close(read_end)
        os.close(write_end)
    assert len(timeouts) == 2 and all(0.0 <= t <= 0.2 for t in timeouts), timeouts


# -- the metrics address (OPS-5, OPS-9) --------------------------------------------------------------


def test_OPS_5_the_ready_line_and_the_node_file_name_the_address_it_serves_on_ipv6_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    code, said, err = _run_main(monkeypatch, capsys, _spec(tmp_path, metrics_port=0, metrics_addr="::1"), {})
    assert code == 0, err
    address = said[0]["metrics_address"]
    assert said == [{"ready": True, "metrics_address": ["::1", address[1]], "metrics_error": None}], err
    assert isinstance(address[1], int) and address[1] > 0
    assert paths.read_state(paths.node_status_path(tmp_path, "h", 0))["metrics_address"] == address
    with pytest.raises(OSError), socket.create_connection(("::1", address[1]), timeout=5):
        pass  # its server stopped when it ended


# -- the gate (OPS-5) ----------------------------------------------------------------------------


def _gate(run_dir: Path, boundaries: Iterable[int]) -> None:
    """A gate with a checkpoint captured after each clean cycle ending at ``boundaries``."""
    from scout.core.recipes import RecipeId, RecipeResult
    from scout.core.verdict import Status
    from scout.gate.model import CheckpointCaptured, CycleBoundary, GateConfig
    from scout.gate.recorder import GateWriter
    from scout.gate.results import recipe_verdicts

    config = GateConfig("run", ("hidden.0",), ("dp",))
    agree = RecipeResult(RecipeId.parse("hidden.0"), 0, Status.AGREE)
    with GateWriter.open(run_dir / "gate", config) as writer:
        writer.apply(CycleBoundary(0))
        for boundary in boundaries:
            writer.apply(recipe_verdicts(config, "hidden.0", writer.state.context.cycle, boundary, {"dp": agree}))
            writer.apply(CycleBoundary(boundary))
            writer.apply(CheckpointCaptured(boundary))


def _touch_all(directory: Path, ahead_s: float) -> None:
    """Every file of ``directory`` modified ``ahead_s`` from now (a change its reader cannot miss)."""
    stamp = time.time_ns() + int(ahead_s * 1e9)
    for name in os.listdir(directory):
        os.utime(directory / name, ns=(stamp, stamp))


def test_OPS_5_the_sidecar_looks_at_the_gate_at_its_interval_and_logs_a_damaged_one_once_per_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scout.gate.recorder import inspect_gate

    car = sidecar.Sidecar(_spec(tmp_path))
    gate = tmp_path / "gate"
    gate.mkdir()
    car._read_gate(0.0)  # noqa: SLF001 (an empty gate directory: nothing yet, no error)
    assert not car.state.checkpoints_known
    shutil.rmtree(gate)
    _gate(tmp_path, [8])
    car._read_gate(10.0)  # noqa: SLF001
    assert car.state.checkpoints == ((0, 8, "CANDIDATE"),)
    shutil.rmtree(gate)
    _gate(tmp_path, [8, 16])
    _touch_all(gate, 10.0)
    car._read_gate(10.0 + sidecar.GATE_INTERVAL_S - 0.1)  # noqa: SLF001 (changed, but not looked at yet)
    assert car.state.checkpoints == ((0, 8, "CANDIDATE"),)
    car._read_gate(10.0 + sidecar.GATE_INTERVAL_S)  # noqa: SLF001
    assert car.state.checkpoints == ((0, 8, "RECOVERY_VERIFIED"), (0, 16, "CANDIDATE"))
    for name in os.listdir(gate):
        (gate / name).write_bytes(b"\x00damaged")
    _touch_all(gate, 20.0)
    with warnings.catch_warnings(), pytest.raises(Exception) as raised:
        warnings.simplefilter("ignore")
        inspect_gate(gate, None)
    capsys.readouterr()
    car._read_gate(20.0)  # noqa: SLF001
    assert capsys.readouterr().err == f"scout: ops sidecar on h: could not read the gate manifest {gate}: " \
                                      f"{raised.value}\n"
    assert car.state.checkpoints == ((0, 8, "RECOVERY_VERIFIED"), (0, 16, "CANDIDATE")), "the last good reading"
    car._read_gate(30.0)  # noqa: SLF001 (unchanged since: not read, not logged again)
    assert capsys.readouterr().err == ""


# -- the ranks' ops files (OPS-5) -----------------------------------------------------------------


def test_OPS_5_a_ranks_ops_files_are_read_when_they_change_and_only_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real_read_state: Callable[..., Any] = paths.read_state

    def read_state(path: Any) -> Any:
        reads.append(Path(path).name)
        return real_read_state(path)

    monkeypatch.setattr(paths, "read_state", read_state)
    car = sidecar.Sidecar(_spec(tmp_path, ranks=[{**DEAD, "rank": 4}]))
    source = car.ranks[0]
    stats, rounds = source.stats_path, source.rounds_path
    car.refresh()
    assert reads == [], "no file yet: nothing is read"
    paths.write_state(stats, {"step": 3, "wall_s": 2.0})
    paths.write_state(rounds, {"rounds": 2, "recent": [0.1, 0.2]})
    car.refresh()
    assert reads == [stats.name, rounds.name]
    assert car.state.stats[4].wall_s == 2.0 and car.state.rounds.total == 2
    reads.clear()
    car.refresh()
    car.refresh()
    assert reads == [], "unchanged: not read again"
    paths.write_state(stats, {"step": 4, "wall_s": 3.0})
    _touch_all(stats.parent, 5.0)
    car.refresh()
    assert sorted(reads) == sorted([stats.name, rounds.name]) and car.state.stats[4].wall_s == 3.0
    assert car.state.rounds.total == 2, "a rounds file rewritten with no new round adds none"
    reads.clear()
    stats.unlink()
    rounds.unlink()
    car.refresh()
    assert reads == [] and car.state.stats[4].wall_s == 3.0, "a removed file is not read; its last value stays"


# -- the progress record (OPS-1) ---------------------------------------------------------------------


def test_OPS_1_the_sidecar_reads_a_record_without_claiming_its_observer_slot(tmp_path: Path) -> None:
    from scout.observer.progress import (
        ProgressPublisher,
        ProgressReader,
        RecordIdentity,
        process_start_ticks,
    )

    publisher = ProgressPublisher(RecordIdentity(f"ops-sidecar-slot-{os.getpid()}", 0, 2))
    try:
        publisher.begin_step(6)
        entry = {"rank": 2, "record_name": publisher.name, "record_token": publisher.token.hex(),
                 "pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()) or 0}
        car = sidecar.Sidecar(_spec(tmp_path, ranks=[entry]))
        progress = car.ranks[0].progress(time.monotonic_ns())
        assert progress is not None and progress.step == 6
        assert car.ranks[0].reader is not None and not car.ranks[0].reader.claimed
        with ProgressReader(publisher.name, publisher.token, claim=False) as look:
            assert (look.header.observer_pid, look.header.observer_start) == (0, 0), \
                "the record shows no observer: the rank's own observer can still attach from another process"
        car.finish(time.monotonic())
    finally:
        publisher.close()


# -- a report's time (OPS-5: scout_last_report_timestamp_seconds) -------------------------------------


def test_OPS_5_a_reports_utc_time_is_read_in_each_iso_form_with_a_z() -> None:
    # Python 3.10's fromisoformat reads no "Z" (3.11 reads most forms, not a date alone): the "Z"
    # is read as +00:00 before parsing, so every form below is read on every Python scout supports.
    assert sidecar._unix_time("2026-01-02T03:04:05.123Z") == 1767323045.123
    assert sidecar._unix_time("2026-01-02T03:04Z") == 1767323040.0
    assert sidecar._unix_time("2026-01-02Z") == 1767312000.0
