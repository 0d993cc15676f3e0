"""The one driver of rank programs (scout/core/drive.py), and every table that uses it answers
exactly the ops of the union its program yields: the check an ``isinstance`` chain's
``assert_never`` made at type-checking time, made here at test time."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast, get_args

import attrs
import pytest

from scout.core.drive import drive, drive_sim
from scout.transport.base import DeadlineExceeded, Group


@attrs.frozen
class Ask:
    value: int


@attrs.frozen
class Tell:
    value: int


@attrs.frozen
class LoudTell(Tell):
    pass


@attrs.frozen
class Unknown:
    pass


def _program(ops: list[Any]) -> Generator[Any, Any, list[Any]]:
    answers = []
    for op in ops:
        answers.append((yield op))
    return answers


TABLE = {Ask: lambda op: op.value * 10, Tell: lambda op: None}


def test_drive_answers_each_op_with_its_types_handler_and_returns_the_programs_value() -> None:
    assert drive(_program([Ask(1), Tell(2), Ask(3)]), TABLE, who="test") == [10, None, 30]
    assert drive(_program([]), TABLE, who="test") == []


def test_a_subclass_of_an_op_is_answered_by_its_base_classes_handler() -> None:
    assert drive(_program([LoudTell(1), Ask(2)]), TABLE, who="test") == [None, 20]


def test_an_op_without_a_handler_raises_naming_the_op_the_driver_and_what_it_answers() -> None:
    program = _program([Ask(1), Unknown()])
    with pytest.raises(TypeError) as raised:
        drive(program, TABLE, who="the test driver")
    message = str(raised.value)
    assert "the test driver answers Ask, Tell" in message
    assert "Unknown()" in message
    assert "add a handler" in message


def test_without_throw_a_handlers_error_reaches_the_caller_and_the_program_stays_where_it_was() -> None:
    def fail(op: Ask) -> int:
        raise DeadlineExceeded(f"no answer to {op}", 1.0, [1])

    program = _program([Ask(1), Ask(2)])
    with pytest.raises(DeadlineExceeded, match="no answer to Ask"):
        drive(program, {Ask: fail}, who="test")
    assert program.gi_frame is not None  # suspended at the op that failed, not closed


def test_with_throw_a_handlers_error_is_raised_inside_the_program_at_the_op_that_failed() -> None:
    def careful() -> Generator[Any, Any, tuple[str, int]]:
        try:
            yield Tell(1)
        except DeadlineExceeded as exc:
            caught = exc.operation
        return caught, (yield Ask(4))

    def late(op: Tell) -> None:
        raise DeadlineExceeded(f"late {op.value}", 1.0, [1])

    assert drive(careful(), {Tell: late, Ask: TABLE[Ask]}, who="test", throw=True) == ("late 1", 40)


def test_with_throw_an_error_the_program_does_not_catch_reaches_the_caller() -> None:
    def late(op: Tell) -> None:
        raise DeadlineExceeded("late", 1.0, [1])

    with pytest.raises(DeadlineExceeded, match="late"):
        drive(_program([Tell(1), Ask(2)]), {Tell: late, Ask: TABLE[Ask]}, who="test", throw=True)


def test_with_throw_an_op_without_a_handler_is_raised_inside_the_program_too() -> None:
    def lenient() -> Generator[Any, Any, str]:
        try:
            yield Unknown()
        except TypeError as exc:
            return str(exc)
        return "answered"

    assert "run_blocking answers Ask, Tell" in drive(lenient(), TABLE, who="run_blocking", throw=True)


def _simulate(program: Generator[Any, Any, Any]) -> tuple[list[Any], Any]:
    """A stand-in simulator: answers each op its rank yields with the op's value plus 100."""
    seen: list[Any] = []
    answer = None
    while True:
        try:
            op = program.send(answer)
        except StopIteration as done:
            return seen, done.value
        seen.append(op)
        answer = op.value + 100


def test_drive_sim_runs_each_handlers_simulator_ops_in_place_and_answers_with_its_return() -> None:
    def ask(op: Ask) -> Generator[Any, Any, int]:
        first = yield Tell(op.value)
        second = yield Tell(first)
        return cast(int, second)

    def tell(op: Tell) -> Generator[Any, Any, None]:
        yield Tell(-op.value)

    seen, result = _simulate(drive_sim(_program([Ask(1), Tell(5)]), {Ask: ask, Tell: tell}, who="test"))
    assert seen == [Tell(1), Tell(101), Tell(-5)]
    assert result == [201, None]


def test_drive_sim_an_op_without_a_handler_raises_naming_the_simulated_driver() -> None:
    with pytest.raises(TypeError, match="the simulated test answers Ask"):
        _simulate(drive_sim(_program([Unknown()]), {Ask: lambda op: iter(())}, who="the simulated test"))


# Each call site's table covers the union of ops its program yields, and nothing else. A table
# is built with a placeholder for what its handlers close over: the keys are what is checked.

def test_the_observer_processs_table_answers_every_DriverOp() -> None:
    from scout.observer import process
    from scout.observer.driver import DriverOp

    assert set(process._answers(cast(Any, None), cast(Any, None))) == set(get_args(DriverOp))


def test_the_simulated_observers_table_answers_every_DriverOp() -> None:
    from scout.observer.driver import DriverOp
    from scout.scenarios import observer

    assert set(observer._answers((0, 1))) == set(get_args(DriverOp))


def test_the_replay_runners_table_answers_every_RoundOp() -> None:
    from scout.core.replay_round import RoundOp
    from scout.replay import runner

    assert set(runner._round_answers(cast(Any, None))) == set(get_args(RoundOp))


def test_the_simulated_replay_checks_table_answers_every_RoundOp() -> None:
    from scout.core.replay_round import RoundOp
    from scout.scenarios import replay_job

    assert set(replay_job._round_answers(cast(Any, None))) == set(get_args(RoundOp))


def test_run_blockings_table_answers_every_transport_Op() -> None:
    from scout.transport.program import Op, transport_answers

    assert set(transport_answers(cast(Any, None))) == set(get_args(Op))


class _Recorder:
    """Stands in for a ControlGroup's collectives: what each was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def all_gather(self, value: Any) -> list[Any]:
        self.calls.append(("all_gather", value))
        return [value, value]

    def broadcast(self, value: Any, source: int = 0) -> Any:
        self.calls.append(("broadcast", value, source))
        return value

    def barrier(self) -> None:
        self.calls.append(("barrier",))


def test_the_control_groups_table_answers_every_ControlOp_job_wide_and_refuses_a_sub_group() -> None:
    from scout.job.control import ControlOp, control_answers
    from scout.transport.program import AllGather, Barrier, Broadcast

    recorder = _Recorder()
    answers = control_answers(cast(Any, recorder))
    assert set(answers) == set(get_args(ControlOp))

    def program() -> Generator[Any, Any, tuple[Any, Any]]:
        gathered = yield AllGather("mine", timeout_s=1.0)
        decided = yield Broadcast("plan", root=1, timeout_s=1.0)
        yield Barrier(timeout_s=1.0)
        return gathered, decided

    assert drive(program(), answers, who="test") == (["mine", "mine"], "plan")
    assert recorder.calls == [("all_gather", "mine"), ("broadcast", "plan", 1), ("barrier",)]
    sub_group = Group((0, 1), "pair")
    for op in (AllGather(1, 1.0, sub_group), Broadcast(1, 0, 1.0, sub_group), Barrier(1.0, sub_group)):
        with pytest.raises(TypeError, match="job-wide AllGather, Broadcast and Barrier ops"):
            answers[type(op)](op)
    assert len(recorder.calls) == 3  # a refused op reached no collective
