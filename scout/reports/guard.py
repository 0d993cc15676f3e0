"""scout's exception boundary on one rank (spec/guard.md): the parts of scout, the record of each
part's failures, and the test-only injection of failures. No torch.

Every guarded call site -- a hook, a wrapper, a check, the gate's writer -- catches the
exceptions of scout's own code and calls :func:`failed` with the part it belongs to (GUARD-2,
GUARD-3). The rank's :class:`Boundary` keeps the first failure of each part (with the last frames
of its traceback), counts the later ones, and says which parts still run here (:func:`running`:
a hook checks it before doing scout's work). Which parts are *off* -- on every rank, from one step
-- is decided by the job's agreement (``scout.job.boundary``, GUARD-4), which takes the new
failures from here (:meth:`Boundary.take_new`) and switches parts off (:meth:`Boundary.switch_off`).

One boundary per process, like the instrumentation: hooks installed deep inside torch reach it
without being handed it (:func:`activate` by ``scout.attach``; without it, :func:`failed` only logs
and every part runs).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import attrs

__all__ = [
    "ALIKE_UNTIL_OFF",
    "CONSEQUENCES",
    "ERROR_CHARS_MAX",
    "FRAMES_MAX",
    "INJECT_VARIABLE",
    "NEEDS_CONTROL",
    "POINTS",
    "Boundary",
    "Failure",
    "InjectedFailure",
    "Part",
    "activate",
    "current",
    "deactivate",
    "failed",
    "inject",
    "parse_injections",
    "running",
]

logger = logging.getLogger("scout")

#: A failure's message is cut to this many characters; its traceback to its last frames.
ERROR_CHARS_MAX: Final = 500
FRAMES_MAX: Final = 5
#: GUARD-9: the test-only variable that injects failures (``POINT@STEP:RANK,...``).
INJECT_VARIABLE: Final = "SCOUT_TEST_INJECT"


class Part(str, enum.Enum):
    """GUARD-2: the parts of scout on a rank; the values are the reports' ``evidence.part``."""

    LOOP = "loop"
    REPLAY = "replay"
    EXPERTS = "experts"
    CANARY = "canary"
    AGGREGATE = "aggregate"
    GATE = "gate"
    CHECKPOINT = "checkpoint"
    OPS = "ops"
    DDP_HOOK = "ddp_hook"
    INSTRUMENTATION = "instrumentation"
    COMPLETION = "completion"
    CONTROL = "control"

    @property
    def reason(self) -> str:
        """GUARD-5: the ``internal_error`` report's stable reason code."""
        return f"{self.value}-failed"


#: GUARD-2: what is off once a part is off, in the words of its report.
CONSEQUENCES: Final[Mapping[Part, str]] = {
    Part.LOOP: "no more loop or forward straggler checks",
    Part.REPLAY: "no more dense replay: no SDC check of the model's layers, no checkpoint promoted or saved",
    Part.EXPERTS: "no more expert replay: no SDC check of the experts, no checkpoint promoted or saved",
    Part.CANARY: "no more canary checks: no checkpoint promoted or saved",
    Part.AGGREGATE: "no more checks and no gate: no SDC check, no checkpoint promoted or saved",
    Part.GATE: "no more gate events: no checkpoint promoted or saved; SDC findings are still reported",
    Part.CHECKPOINT: "no more checkpoints saved by scout",
    Part.OPS: "this rank's stats are no longer written for the ops sidecar",
    Part.DDP_HOOK: "DDP's gradient buckets are no longer published (their all-reduces are unseen by the observer)",
    Part.INSTRUMENTATION: "collectives and layers are no longer published; the observer sees step marks only",
    Part.COMPLETION: "completion tracking withdrawn: the observer judges by host progress alone",
    Part.CONTROL: "scout's control group failed: every check, the gate and checkpoints are off on this rank",
}
assert set(CONSEQUENCES) == set(Part), "every part says what its switching off means"

#: GUARD-7: what a rank switches off at once when its control group fails.
NEEDS_CONTROL: Final = frozenset({Part.LOOP, Part.REPLAY, Part.EXPERTS, Part.CANARY, Part.AGGREGATE, Part.GATE,
                                  Part.CHECKPOINT, Part.CONTROL})

#: GUARD-3: parts whose work the observer reads on every rank (the progress record) keep running
#: after a failure on one rank until they are off on every rank, so that every rank's record stays
#: comparable; their later failures are counted. Every other part stops at once where it failed.
ALIKE_UNTIL_OFF: Final = frozenset({Part.INSTRUMENTATION, Part.DDP_HOOK, Part.COMPLETION})

#: GUARD-9: every injection point (``part.place``); a test names one of these.
POINTS: Final = frozenset({
    "loop.forward_hook", "loop.check",
    "replay.capture", "replay.optimizer_hook", "replay.prepare", "replay.report",
    "experts.prepare",
    "canary.check",
    "aggregate.merge",
    "gate.feed", "gate.boundary", "gate.capture",
    "checkpoint.space",
    "ops.after_step",
    "ddp_hook.bucket",
    "instrumentation.publish", "instrumentation.layer_hook",
    "completion.poll",
    "control.exchange",
})
assert all(point.split(".")[0] in {p.value for p in Part} for point in POINTS)


class InjectedFailure(RuntimeError):
    """GUARD-9: the failure a test asked for at an injection point."""


@attrs.frozen
class Failure:
    """GUARD-3: one part's first failure on one rank."""

    part: Part
    rank: int
    step: int  # the step in whose training phase or job.step() it happened
    where: str
    error_type: str
    message: str
    frames: tuple[str, ...]
    count: int = 1

    @classmethod
    def of(cls, part: Part, error: BaseException, *, rank: int, step: int, where: str) -> Failure:
        frames = traceback.extract_tb(error.__traceback__)[-FRAMES_MAX:]
        return cls(part, rank, step, where, type(error).__name__, str(error)[:ERROR_CHARS_MAX],
                   tuple(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in frames))

    def line(self) -> str:
        """One line for stderr and the summary."""
        return f"{self.error_type}: {self.message}"[:200]

    def to_plain(self) -> tuple[str, int, int, str, str, str, tuple[str, ...], int]:
        return (self.part.value, self.rank, self.step, self.where, self.error_type, self.message, self.frames,
                self.count)

    @classmethod
    def from_plain(cls, value: Iterable[object]) -> Failure:
        part, rank, step, where, error_type, message, frames, count = tuple(value)
        return cls(Part(str(part)), int(str(rank)), int(str(step)), str(where), str(error_type), str(message),
                   tuple(str(f) for f in frames) if isinstance(frames, (tuple, list)) else (), int(str(count)))


def parse_injections(text: str) -> dict[str, tuple[int, int]]:
    """GUARD-9: ``POINT@STEP:RANK,...`` as ``{point: (step, rank)}``; a bad entry is a ValueError
    naming it and the points."""
    found: dict[str, tuple[int, int]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        point, _, where = entry.partition("@")
        step_text, _, rank_text = where.partition(":")
        try:
            step, rank = int(step_text), int(rank_text)
        except ValueError:
            step = rank = -1
        if point not in POINTS or step < 1 or rank < 0:
            raise ValueError(f"{INJECT_VARIABLE}: {entry!r} is not POINT@STEP:RANK with STEP >= 1, RANK >= 0 and "
                             f"POINT one of {', '.join(sorted(POINTS))}")
        found[point] = (step, rank)
    return found


class Boundary:
    """One rank's record of scout's failures and of the parts that are off (module docstring)."""

    def __init__(self, rank: int, injections: Mapping[str, tuple[int, int]] | None = None) -> None:
        self.rank = rank
        #: The step being trained or checked now (the job sets it; hooks read it).
        self.step = 0
        self._lock = threading.Lock()
        self._first: dict[Part, Failure] = {}  # every part's first failure here, kept
        self._new: list[Part] = []  # failed since the last take_new()
        #: GUARD-4: part -> the step it is off from, on every rank (or on this one: GUARD-7).
        self.off: dict[Part, int] = {}
        self._stopped: frozenset[Part] = frozenset()  # failed here or off: hooks skip them
        self._injections = {point: (step, rank) for point, (step, rank) in (injections or {}).items()
                            if rank == self.rank}
        #: Called (outside the lock) for each part at its first failure here (the job stops a
        #: part without collectives at once there, e.g. the gate's writer).
        self.on_first_failure: Callable[[Part], None] | None = None

    def running(self, part: Part) -> bool:
        """Whether ``part`` still does its work on this rank: not failed here, not off."""
        return part not in self._stopped

    def is_off(self, part: Part) -> bool:
        return part in self.off

    def failed(self, part: Part, error: BaseException, where: str) -> None:
        """GUARD-3: record ``error`` of ``part`` (its first failure here; later ones are counted)."""
        with self._lock:
            first = self._first.get(part)
            if first is not None:
                self._first[part] = attrs.evolve(first, count=first.count + 1)
                return
            failure = self._first[part] = Failure.of(part, error, rank=self.rank, step=self.step, where=where)
            if part not in self.off:
                self._new.append(part)
            if part not in ALIKE_UNTIL_OFF:
                self._stopped = self._stopped | {part}
        logger.error("scout: %s failed on rank %d at step %d (%s): %s; scout switches it off on every rank and "
                     "training goes on (spec/guard.md GUARD-3)", part.value, self.rank, failure.step, where,
                     failure.line())
        callback = self.on_first_failure
        if callback is not None:
            try:
                callback(part)
            except Exception:  # the boundary's own reaction must not raise either
                logger.debug("scout: stopping %s after its failure failed", part.value, exc_info=True)

    def take_new(self) -> list[Part]:
        """The parts that failed here since the last call (the flags of the next agreement)."""
        with self._lock:
            new, self._new = self._new, []
        return new

    def failures(self, parts: Iterable[Part]) -> list[Failure]:
        """This rank's first failure of each of ``parts`` that failed here, with its count."""
        with self._lock:
            return [self._first[p] for p in parts if p in self._first]

    def switch_off(self, parts: Iterable[Part], step: int) -> list[Part]:
        """GUARD-4: ``parts`` are off from ``step``; returns those that were not off before."""
        with self._lock:
            fresh = [p for p in dict.fromkeys(parts) if p not in self.off]
            for part in fresh:
                self.off[part] = step
            self._stopped = self._stopped | set(fresh)
        return fresh

    def inject(self, point: str) -> None:
        """GUARD-9: raise at ``point`` if a test armed it for this rank and step (once)."""
        armed = self._injections.get(point)
        if armed is None or self.step < armed[0]:
            return
        with self._lock:
            if self._injections.pop(point, None) is None:
                return
        raise InjectedFailure(f"injected at {point} on rank {self.rank}, step {self.step} ({INJECT_VARIABLE})")


_ACTIVE: Boundary | None = None
#: GUARD-9: whether any injection is armed in this process (a call site tests this first).
INJECTING = False


def activate(rank: int, environ: Mapping[str, str] | None = None) -> Boundary:
    """The boundary of this process's job (``scout.attach``); reads the injections (GUARD-9)."""
    global _ACTIVE, INJECTING
    injections = parse_injections((os.environ if environ is None else environ).get(INJECT_VARIABLE, ""))
    _ACTIVE = Boundary(rank, injections)
    INJECTING = bool(_ACTIVE._injections)
    return _ACTIVE


def deactivate(boundary: Boundary) -> None:
    global _ACTIVE, INJECTING
    if _ACTIVE is boundary:
        _ACTIVE, INJECTING = None, False


def current() -> Boundary | None:
    return _ACTIVE


def failed(part: Part, error: BaseException, where: str) -> None:
    """GUARD-3 at a call site: record ``error`` on the active boundary (outside a job: a debug log)."""
    boundary = _ACTIVE
    if boundary is None:
        logger.debug("scout: %s failed (%s)", part.value, where, exc_info=error)
        return
    boundary.failed(part, error, where)


def running(part: Part) -> bool:
    """Whether a hook of ``part`` does scout's work now (always, outside a job)."""
    boundary = _ACTIVE
    return boundary is None or boundary.running(part)


def inject(point: str) -> None:
    """GUARD-9 at a call site: ``if guard.INJECTING: guard.inject("replay.prepare")``."""
    boundary = _ACTIVE
    if boundary is not None:
        boundary.inject(point)
