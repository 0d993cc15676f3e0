"""One driver for rank programs: a generator yields op values, a table of handlers answers them.

Every program in scout -- the observer's driver, the replay round, the job's restore, step and
save programs, the transport's conformance programs -- is a generator that yields an op and
receives its answer. Each place that runs one used to write the same loop (send the answer,
catch ``StopIteration``, dispatch on the op's type); they now pass a table instead:

* :func:`drive` runs a program to its end with *blocking* handlers, ``{OpType: op -> answer}``;
  with ``throw=True`` an exception a handler raises is thrown *into* the program at the op that
  failed (``generator.throw``), so the program can catch it where it yielded the op;
* :func:`drive_sim` is the simulator's: each handler returns a generator of simulator ops
  (``answer = yield from handler(op)``), so the program runs inside a simulated rank.

A table is the list of ops a place answers, which is what a reader looks for; a test per call
site compares the table's keys with the union of ops it is documented to answer (``DriverOp``,
``RoundOp``, ``program.Op``, ...), standing in for the ``assert_never`` an ``isinstance`` chain
ends with. An op without a handler is a bug in the program or the table: :class:`TypeError`
naming the op, the driver and the ops it answers. Pure: no torch, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

__all__ = ["Handler", "SimHandler", "drive", "drive_sim", "handler_for"]

T = TypeVar("T")

#: A blocking handler: the answer to one op.
Handler = Callable[[Any], Any]
#: A simulator handler: a generator of simulator ops whose return value is the answer.
SimHandler = Callable[[Any], Generator[Any, Any, Any]]

H = TypeVar("H")


def handler_for(handlers: Mapping[type, H], op: object, who: str) -> H:
    """The handler of ``op``'s type (or of the nearest base class in the table)."""
    for kind in type(op).__mro__:
        handler = handlers.get(kind)
        if handler is not None:
            return handler
    answers = ", ".join(sorted(kind.__name__ for kind in handlers)) or "no ops"
    raise TypeError(f"{who} answers {answers}; a program it runs yielded {op!r}, which has no handler: "
                    "yield only those ops there, or add a handler for its type to the table")


def drive(program: Generator[Any, Any, T], handlers: Mapping[type, Handler], *, who: str,
          throw: bool = False) -> T:
    """Run ``program`` to its end, answering each op it yields with its type's handler; its
    return value. ``who`` names the driver in errors. With ``throw``, an :class:`Exception` from
    a handler (or a missing handler) is raised inside the program at the op that failed and the
    program decides; without, it propagates to the caller and the program stays suspended."""
    answer: Any = None
    failure: Exception | None = None
    while True:
        try:
            op = program.send(answer) if failure is None else program.throw(failure)
        except StopIteration as done:
            result: T = done.value
            return result
        failure = None
        if not throw:
            answer = handler_for(handlers, op, who)(op)
            continue
        try:
            answer = handler_for(handlers, op, who)(op)
        except Exception as exc:  # delivered into the program, as the simulator does
            failure, answer = exc, None


def drive_sim(program: Generator[Any, Any, T], handlers: Mapping[type, SimHandler], *,
              who: str) -> Generator[Any, Any, T]:
    """:func:`drive` for a program run inside a simulated rank: each handler's generator is run
    in place (its simulator ops go to the simulator) and its return value is the answer."""
    answer: Any = None
    while True:
        try:
            op = program.send(answer)
        except StopIteration as done:
            result: T = done.value
            return result
        answer = yield from handler_for(handlers, op, who)(op)
