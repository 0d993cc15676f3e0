"""The replay runner: one driver of the replay round (``scout.core.replay_round``) over torch
collectives, parameterised by a recipe executor (spec/replay.md REPLAY-9).

The round decides; the runner executes its ops and owns everything every recipe class shares:

* the schedule contract at construction (READY-1), ``resume_at`` (validated) and the per-step
  arming and release of captures;
* the readiness and evidence all-gathers on the replay peer group, the source's broadcast that
  every peer enters whatever its local state (READY-3), and the communication slot (COMM-1);
* timing (STRAG-1: warm-up runs, then the median of the timed repetitions, on the clock of
  :class:`ReplayTimer` -- the one place that knows the clock);
* error handling: a local failure is a status (REPLAY-4, REPLAY-7), a deadline or transport
  failure disables the runner (READY-4), any other error in a check disables it and never
  reaches the training loop -- in a job it is a failure of the runner's part instead
  (spec/guard.md GUARD-3): the rounds go on, with this peer not ready where its own preparation
  failed, until the job switches the part off on every rank at one step (GUARD-4);
* the device and communication straggler tests (STRAG-2..STRAG-4, COMM-2), when asked.

What differs by recipe class is the :class:`RecipeExecutor`: what is captured, how a due recipe
is described (READY-1), which local evidence is signed before the broadcast (REPLAY-3), which
tensors the source broadcasts, and the replay itself. ``scout.replay.replay`` has the dense
executors (hidden layers, embedding and head, optimizer slices), ``scout.replay.moe`` the
expert executor.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, Final, Protocol, TypeVar

import attrs
import torch
from torch.utils.hooks import RemovableHandle

from scout.core.drive import Handler, drive
from scout.core.guards import whole_number
from scout.core.recipes import (
    Catalog,
    Coverage,
    DueRecipe,
    EvidenceKind,
    RecipeResult,
    ReplayStatus,
    Schedule,
    coverage,
)
from scout.core.replay_round import (
    Execute,
    Executed,
    GatherEvidence,
    GatherReadiness,
    Prepared,
    RoundOutcome,
    communication_slot,
    lanes,
    merge_outcomes,
    replay_round,
)
from scout.core.straggler import Confirmed, Recovered, SequentialConfig
from scout.core.straggler.tracking import (
    ReplayStragglers,
    ReplayTiming,
    StragglerEvent,
    StragglerKind,
)
from scout.core.verdict import Status, TimingConfig, Verdict, classify_exact
from scout.replay.collectives import OwnWallClock, PeerGroup
from scout.replay.determinism import NondeterministicReplay
from scout.replay.signature import structured_signature
from scout.reports import guard
from scout.reports.guard import Part
from scout.transport.base import DeadlineExceeded, TransportError
from scout.transport.nccl.timing import Mark, Timer, WallTimer, timer_for, wait_elapsed_s

__all__ = ["RecipeExecutor", "ReplayRun", "ReplayRunner", "ReplayTimer", "RunnerSettings", "StepReport"]

logger = logging.getLogger("scout.replay")
_Result = TypeVar("_Result")
TIMING_CLOCKS: Final = ("auto", "cpu", "wall", "own")


@attrs.frozen
class StepReport:
    """What one call of ``step()`` did."""

    step: int
    results: tuple[RecipeResult, ...]
    timing: dict[str, Verdict]  # recipe id -> timing verdict over replay compute ms
    compute_ms: dict[str, float]  # this peer's replay compute time per recipe
    collective_ms: float  # this peer's time inside replay collectives this step (entry + wait)
    capture_bytes: int  # bytes held by captures when the check began
    errors: tuple[str, ...] = ()
    # STRAG-4: the device (replay compute) sequential test's reports of this step, as the
    # machine's effects, and the peer positions confirmed now.
    stragglers: tuple[Confirmed | Recovered, ...] = ()
    confirmed_stragglers: frozenset[int] = frozenset()
    # COMM-1..COMM-3: every peer's own communication time (ms, by position) in the collectives
    # before the evidence exchange, its timing verdict, and the communication test's reports.
    communication_ms: tuple[float, ...] = ()
    communication: Verdict | None = None
    communication_stragglers: tuple[Confirmed | Recovered, ...] = ()
    confirmed_communication_stragglers: frozenset[int] = frozenset()
    # STRAG-1: every peer's compute time per recipe (ms, by position, from the evidence rows;
    # MISSING where its replay did not complete) and this peer's timed repetitions (ms).
    peer_compute_ms: dict[str, tuple[Any, ...]] = attrs.Factory(dict)
    repetitions_ms: dict[str, tuple[float, ...]] = attrs.Factory(dict)
    # STRAG-2: each peer's log time ratio to the centre this check, by kind ("device",
    # "communication"); None where the check said nothing about it.
    evidence: dict[str, tuple[float | None, ...]] = attrs.Factory(dict)
    # STRAG-21: confirmations and recoveries of this step with what their reports need, and
    # every peer's performance ratio (median over its trail) by kind.
    straggler_events: tuple[StragglerEvent, ...] = ()
    performance_ratios: dict[str, tuple[float | None, ...]] = attrs.Factory(dict)


@attrs.frozen
class RunnerSettings:
    """What the runner needs of a replay configuration (``ReplayConfig`` has every field)."""

    source_position: int
    timing: TimingConfig
    communication_timing: TimingConfig
    timing_warmup_runs: int
    timing_repetitions: int
    timing_clock: str
    timing_resolve_timeout_s: float
    straggler: SequentialConfig
    device_floor_ms: float
    straggler_trail_checks: int
    history_limit: int


@attrs.frozen
class ReplayRun:
    """One recipe's replay, ready to run: ``run`` is called once per warm-up and timed
    repetition (it must be repeatable and leave live state alone, REPLAY-5); ``evidence``
    signs the first run's result."""

    device: torch.device
    run: Callable[[], Any]
    evidence: Callable[[Any], dict[EvidenceKind, int]]


class RecipeExecutor(Protocol):
    """The part of replay that differs by recipe class."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def schedule_tag(self) -> str:
        """Names the executor in the schedule contract's digest (READY-1)."""
        ...

    def arm(self, step: int, due: Sequence[DueRecipe]) -> None:
        """Capture the inputs of ``due`` at ``step`` (hooks fire during the step's forward). The
        runner arms nothing again while nothing is armed, and releases nothing after a step that
        had nothing armed (REPLAY-10): arming nothing must leave nothing to capture or hold."""

    def held_bytes(self) -> int:
        """CAP-5: bytes the captures hold now."""
        ...

    def prepare(self, due: DueRecipe) -> tuple[ReplayStatus, tuple[object, ...]]:
        """READY-1: this peer's status for ``due`` and the description of what it would replay."""
        ...

    def local_evidence(self, due: DueRecipe) -> Sequence[Callable[[], dict[EvidenceKind, int]]]:
        """REPLAY-3, OPT-2: signers of local evidence, called before the broadcast, each guarded."""
        ...

    def payload(self, due: DueRecipe) -> Sequence[torch.Tensor]:
        """REPLAY-1: the tensors the source broadcasts (overwritten in place on the others)."""
        ...

    def replay(self, due: DueRecipe) -> ReplayRun:
        """The replay of ``due`` on the source's inputs (after the broadcast)."""
        ...

    def release(self) -> None:
        """Drop this step's captures."""

    def close(self) -> None:
        """Remove every hook; the model and optimizer are as they were."""


#: STRAG-1's CPU clock: the replaying thread's CPU time, with the wall timer's arithmetic.
THREAD_CPU_TIMER: Final = WallTimer(clock_ns=time.thread_time_ns)


#: The ``own`` timer, shared: its run-queue reader keeps one descriptor per reading thread.
OWN_WALL_TIMER: Final = WallTimer(clock_ns=OwnWallClock())


class ReplayTimer:
    """STRAG-1: how a replay's compute time is measured -- ``warmup_runs`` untimed runs, then
    ``repetitions`` timed ones, each the span between two marks of a device timer
    (``scout.transport.nccl.timing``: on CUDA events on the current stream, never a device-wide
    drain, TIMING-2); the repetitions are queued back to back and resolved after the last one,
    bounded by ``resolve_timeout_s`` (TIMING-6: a device that does not get there fails the
    replay, it does not hang it). The check's time is the median of the timed runs. The timer is
    chosen here and nowhere else (``mode``: ``auto`` -- on a CPU the wall clock less the
    replaying thread's run-queue delay, events on an accelerator -- ``own``, ``cpu`` or
    ``wall``). Compute hooks run inside the timed span and are told the span so far on the same
    timer (FAULT-3)."""

    def __init__(self, mode: str, warmup_runs: int, repetitions: int, resolve_timeout_s: float = 60.0) -> None:
        if mode not in TIMING_CLOCKS:
            raise ValueError(f"timing_clock must be one of {', '.join(TIMING_CLOCKS)}, got {mode!r}")
        if warmup_runs < 0 or repetitions < 1:
            raise ValueError(f"timing needs warmup_runs >= 0 and repetitions >= 1, got {warmup_runs}, {repetitions}")
        if not (math.isfinite(resolve_timeout_s) and resolve_timeout_s > 0):
            raise ValueError(f"timing_resolve_timeout_s must be a finite number > 0, got {resolve_timeout_s!r}")
        self.mode = mode
        self.warmup_runs = warmup_runs
        self.repetitions = repetitions
        self.resolve_timeout_s = resolve_timeout_s
        self._hooks: OrderedDict[int, Callable[[float], None]] = OrderedDict()

    def add_hook(self, hook: Callable[[float], None]) -> RemovableHandle:
        """Call ``hook(elapsed_s)`` at the end of every timed repetition, inside its timed
        span, with the time measured so far (opt-in, for faults: FAULT-3's ``slow_compute``)."""
        handle = RemovableHandle(self._hooks)
        self._hooks[handle.id] = hook
        return handle

    def timer(self, device: torch.device) -> Timer:
        """STRAG-1: on a CPU the ``own`` clock -- the wall clock less the replaying thread's
        run-queue delay: a straggler is the wall time a rank costs, waits included (a rank that
        sleeps or answers late), and time the host gave its core to another process is
        contention, not the rank; on a CUDA device events on the current stream (TIMING-2).
        ``own``: as ``auto``; ``wall``: events on CUDA, the plain wall clock elsewhere; ``cpu``:
        the thread's CPU time (which a waiting rank does not advance)."""
        if self.mode == "cpu":
            return THREAD_CPU_TIMER
        if self.mode in ("auto", "own") and device.type == "cpu":
            return OWN_WALL_TIMER
        return timer_for(device) if device.type == "cuda" else WallTimer()

    def measured(self, timer: Timer, start: Mark) -> Mark:
        """The end mark of a timed run, compute hooks included (on CUDA a hook waits for the
        span's own marks -- only when one is installed, FAULT-3)."""
        if self._hooks:
            elapsed = self.elapsed_s(timer, start, timer.record())
            for hook in tuple(self._hooks.values()):
                hook(elapsed)
        return timer.record()

    def elapsed_s(self, timer: Timer, start: Mark, end: Mark) -> float:
        """TIMING-6: the span's duration once its marks completed, bounded by the resolve
        timeout."""
        elapsed = wait_elapsed_s(timer, start, end, timeout_s=self.resolve_timeout_s)
        if elapsed is None:
            raise RuntimeError(f"replay timing: the device did not finish the timed replay within "
                               f"timing_resolve_timeout_s={self.resolve_timeout_s} s")
        return elapsed

    def timed(self, device: torch.device, run: Callable[[], _Result]) -> tuple[_Result, float, tuple[float, ...]]:
        """The first run's result (the evidence), the median of the timed runs and every timed
        run, in seconds. The first run is a warm-up (caches, allocator, lazy initialisation)
        whose time says more about the host than about the device; the median ignores one run
        in three that a descheduled thread or a page fault lengthened."""
        timer = self.timer(device)
        first: _Result | None = None
        spans: list[tuple[Mark, Mark]] = []
        for index in range(self.warmup_runs + self.repetitions):
            start = timer.record()
            result = run()
            if index >= self.warmup_runs:
                spans.append((start, self.measured(timer, start)))
            if index == 0:
                first = result
        assert first is not None  # repetitions >= 1
        # The repetitions are queued back to back; only now wait, for their own marks alone.
        times = [self.elapsed_s(timer, start, end) for start, end in spans]
        return first, statistics.median(times), tuple(times)


@attrs.define
class _Local:
    status: ReplayStatus = ReplayStatus.OK
    evidence: dict[EvidenceKind, int] = attrs.Factory(dict)
    compute_s: float = 0.0
    repetitions_s: tuple[float, ...] = ()


def validated_step(step: object, what: str) -> int:
    if not whole_number(step) or step < 0:
        raise ValueError(f"{what} needs a step >= 0, got {step!r}")
    return step


class ReplayRunner:
    """Replay of one executor's recipes among one peer group; call :meth:`step` once per
    training step, after ``optimizer.step()``. Construction is collective over ``peers`` (the
    schedule contract, READY-1)."""

    def __init__(self, executor: RecipeExecutor, peers: PeerGroup, schedule: Schedule, settings: RunnerSettings, *,
                 track_stragglers: bool = True, label: str = "replay", part: Part = Part.REPLAY) -> None:
        if settings.source_position >= peers.size:
            raise ValueError(f"source_position {settings.source_position} is outside the peer group of {peers.size}")
        self.executor = executor
        self.peers = peers
        self.schedule = schedule
        self.settings = settings
        self.label = label
        self.part = part  # spec/guard.md GUARD-2: the part its failures are charged to in a job
        # GUARD-3: the source's broadcast tensors, taken when the recipe is prepared (a peer that
        # cannot take them is not ready, so no peer ever enters the broadcast without them).
        self._payloads: dict[Any, Sequence[torch.Tensor]] = {}
        self.timer = ReplayTimer(settings.timing_clock, settings.timing_warmup_runs, settings.timing_repetitions,
                                 settings.timing_resolve_timeout_s)
        self.results: deque[RecipeResult] = deque(maxlen=settings.history_limit)
        self.step_count = 0
        self.disabled_reason: str | None = None
        self._closed = False
        # REPLAY-10: the step that is armed with nothing (and holds nothing), if the next one is.
        self._idle_step: int | None = None
        self.schedule_digest = structured_signature((executor.schedule_tag, 1, schedule.describe()))
        # STRAG-4, COMM-2: one sequential test per kind of evidence over this group.
        self.stragglers = ReplayStragglers(
            peers.ranks, settings.straggler, settings.straggler_trail_checks,
            device_floor_ms=settings.device_floor_ms, communication_timing=settings.communication_timing,
        ) if track_stragglers else None
        self._check_schedule_contract()
        self._arm(1)

    # -- public ---------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        return self.executor.catalog

    @property
    def closed(self) -> bool:
        return self._closed

    def coverage(self, since_step: int = 0) -> Coverage:
        return coverage(self.catalog, list(self.results), since_step)

    def close(self) -> None:
        self._closed = True
        self.executor.close()

    def resume_at(self, step: int) -> None:
        """The job restarted from a checkpoint taken after step ``step``: the next :meth:`step`
        is step ``step + 1`` (the schedule is a function of the step, so every peer resumes it
        alike)."""
        self.step_count = validated_step(step, "resume_at")
        self._arm(step + 1)

    def set_schedule(self, schedule: Schedule) -> None:
        """BUDGET-5: replay on ``schedule`` from the next step on (every peer switches at the same
        step, so the digest each round carries stays the same on every peer); the next step's
        captures are armed anew."""
        if schedule.catalog != self.schedule.catalog:
            raise ValueError(f"a new schedule must keep the catalog: {schedule.catalog} is not {self.schedule.catalog}")
        self.schedule = schedule
        self.schedule_digest = structured_signature((self.executor.schedule_tag, 1, schedule.describe()))
        self.executor.release()
        self._arm(self.step_count + 1)

    def step(self) -> StepReport:
        """Finish step ``step_count + 1``: run its due checks, arm the next step."""
        if self._closed:
            raise RuntimeError(f"this {self.label} runner was closed; attach a new one to keep checking")
        step = self.step_count = self.step_count + 1
        if self._idle_step == step:  # REPLAY-10: nothing due, nothing armed, nothing held
            self._arm(step + 1)
            return StepReport(step, (), {}, {}, 0.0, 0)
        try:
            return self._check(step)
        except Exception as exc:  # diagnostics never crash the trainer
            reason = f"internal error at step {step}: {exc!r}"
            if guard.current() is not None:  # GUARD-3: the job switches the part off on every rank
                guard.failed(self.part, exc, "job.step")
            else:
                logger.exception("scout: %s check at step %d failed", self.label, step)
                self.disabled_reason = reason
            results = self._inconclusive_all(self.schedule.due(step), reason)
            return StepReport(step, results, {}, {}, 0.0, 0, (repr(exc),))
        finally:
            self._payloads.clear()
            self.executor.release()
            self._arm(step + 1)

    def keep_step(self) -> None:
        """spec/budget.md BUDGET-14: finish step ``step_count + 1`` where nothing is due, as
        ``step()`` does (REPLAY-10), without building its empty report."""
        step = self.step_count + 1
        if self._closed or self._idle_step != step:  # not an idle step: step() says why, or checks it
            self.step()
            return
        self.step_count = step
        self._arm(step + 1)

    # -- the protocol -----------------------------------------------------------------------

    def _check_schedule_contract(self) -> None:
        if self.peers.size == 1:
            return
        try:
            rows = self.peers.all_gather_int64([self.schedule_digest])
        except Exception as exc:
            self.disabled_reason = f"schedule contract exchange failed: {exc}"
            logger.warning("scout: %s disabled: %s", self.label, self.disabled_reason)
            return
        verdict = classify_exact([row[0] for row in rows])
        if verdict.status is not Status.AGREE:
            self.disabled_reason = (
                f"peers disagree on the replay schedule ({verdict.status.value}, outliers "
                f"{list(verdict.outliers)}): every peer must use the same intervals, catalog and slicing"
            )
            logger.warning("scout: %s disabled: %s", self.label, self.disabled_reason)

    def _arm(self, step: int) -> None:
        due = self.schedule.due(step)
        if not due and self._idle_step == step - 1:
            self._idle_step = step  # REPLAY-10: nothing was armed, nothing is: the executor keeps it
            return
        self.executor.arm(step, due)
        self._idle_step = None if due else step

    def _inconclusive_all(self, due: Sequence[DueRecipe], reason: str) -> tuple[RecipeResult, ...]:
        results = tuple(RecipeResult(d.recipe, d.step, Status.INCONCLUSIVE, reason=reason) for d in due)
        self.results.extend(results)
        return results

    def _check(self, step: int) -> StepReport:
        due = self.schedule.due(step)
        capture_bytes = self.executor.held_bytes()
        if not due:
            return StepReport(step, (), {}, {}, 0.0, capture_bytes)
        if self.disabled_reason is not None:
            results = self._inconclusive_all(due, f"replay-disabled: {self.disabled_reason}")
            return StepReport(step, results, {}, {}, 0.0, capture_bytes)
        timer = getattr(self.peers, "timer", None)
        collective_ms = 0.0
        outcomes: list[RoundOutcome] = []
        rounds = lanes(due)  # REC-3: one round per lane, lane 0 first (REPLAY-9)
        for index, lane in enumerate(rounds):
            if timer is not None:
                timer.take()  # COMM-1: each round's communication slot holds its own collectives
            prepared = [self._prepare(d) for d in lane]
            try:
                outcomes.append(self._drive(replay_round(step, prepared, schedule_digest=self.schedule_digest,
                                                         group_size=self.peers.size, timing=self.settings.timing)))
            except TransportError as exc:  # a deadline, or a group the binding marked unusable (READY-4)
                kind = "deadline" if isinstance(exc, DeadlineExceeded) else "transport failure"
                self.disabled_reason = f"{kind} at step {step}: {exc}"
                logger.warning("scout: %s disabled: %s", self.label, self.disabled_reason)
                done = tuple(r for outcome in outcomes for r in outcome.results)
                self.results.extend(done)
                left = [d for later in rounds[index:] for d in later]
                return StepReport(step, done + self._inconclusive_all(left, f"{kind}: {exc}"), {}, {}, 0.0,
                                  capture_bytes, (str(exc),))
            if timer is not None:
                collective_ms += timer.take().total_s * 1e3
        outcome = merge_outcomes(outcomes)
        self.results.extend(outcome.results)
        return self._report(step, outcome, collective_ms, capture_bytes)

    def _report(self, step: int, outcome: RoundOutcome, collective_ms: float, capture_bytes: int) -> StepReport:
        if guard.INJECTING:
            guard.inject(f"{self.part.value}.report")
        timing = ReplayTiming({}, None, ())
        ratios: dict[str, tuple[float | None, ...]] = {}
        if self.stragglers is not None:
            timing = self.stragglers.observe(step, outcome.peer_compute_ms, outcome.timing, outcome.communication_ms)
            ratios = self.stragglers.performance_ratios()
        events = timing.events
        return StepReport(
            step, outcome.results, outcome.timing, outcome.compute_ms, collective_ms, capture_bytes,
            stragglers=tuple(e.effect for e in events if e.kind is StragglerKind.DEVICE),
            confirmed_stragglers=self.stragglers.device.confirmed if self.stragglers else frozenset(),
            communication_ms=outcome.communication_ms,
            communication=timing.communication,
            communication_stragglers=tuple(e.effect for e in events if e.kind is StragglerKind.COMMUNICATION),
            confirmed_communication_stragglers=(self.stragglers.communication.confirmed if self.stragglers
                                                else frozenset()),
            peer_compute_ms=outcome.peer_compute_ms,
            repetitions_ms=outcome.repetitions_ms,
            evidence=timing.evidence,
            straggler_events=events,
            performance_ratios=ratios,
        )

    def _prepare(self, due: DueRecipe) -> Prepared:
        """READY-1 for ``due``, and the broadcast's tensors when it is ready. A failure here comes
        before the round's first collective: this peer is not ready (READY-3 decides alike on
        every peer) and it is its part's failure (GUARD-3), never a skipped collective."""
        try:
            if guard.INJECTING:
                guard.inject(f"{self.part.value}.prepare")
            status, description = self.executor.prepare(due)
            if status is ReplayStatus.OK:
                self._payloads[due.recipe] = list(self.executor.payload(due))
        except Exception as exc:
            guard.failed(self.part, exc, "job.step")
            if guard.current() is None:
                logger.warning("scout: %s could not prepare %s: %r", self.label, due.recipe, exc)
            status, description = ReplayStatus.NOT_READY, ("not-ready", str(due.recipe), due.step, "internal error")
        digest = structured_signature(("scout-replay-readiness", 1, due.step, description))
        return Prepared(due, status, digest)

    def _drive(self, round_: Generator[Any, Any, RoundOutcome]) -> RoundOutcome:
        return drive(round_, _round_answers(self), who=f"{self.label}'s replay runner")

    def _gather_evidence(self, op: GatherEvidence) -> list[list[int]]:
        timer = getattr(self.peers, "timer", None)  # COMM-1: the check's earlier collectives
        calls = timer.peek().calls if timer is not None else ()
        return self.peers.all_gather_int64([*op.row, *communication_slot(calls)])

    def _execute(self, due: DueRecipe) -> Executed:
        """Sign local evidence, take part in the source's broadcast, replay (timed). The
        broadcast always happens: a local failure must not make this peer skip a collective
        its peers enter (READY-3)."""
        local = _Local()
        for signer in self.executor.local_evidence(due):
            self._guarded(due, local, signer)
        if self.peers.size > 1:
            payload = self._payloads.pop(due.recipe, None)
            self.peers.broadcast_(self.executor.payload(due) if payload is None else payload,
                                  self.settings.source_position)

        def replay() -> dict[EvidenceKind, int]:
            run = self.executor.replay(due)
            first, local.compute_s, local.repetitions_s = self.timer.timed(run.device, run.run)
            return run.evidence(first)

        self._guarded(due, local, replay)
        return Executed(local.status, local.compute_s, local.repetitions_s, dict(local.evidence))

    def _guarded(self, due: DueRecipe, local: _Local, work: Callable[[], dict[EvidenceKind, int]]) -> None:
        if local.status is not ReplayStatus.OK:
            return
        try:
            local.evidence.update(work())
        except NondeterministicReplay as exc:  # REPLAY-4
            logger.warning("scout: %s replay refused a nondeterministic kernel: %s", due.recipe, exc)
            local.status = ReplayStatus.NONDETERMINISTIC
        except Exception as exc:  # REPLAY-7
            logger.warning("scout: %s replay failed: %r", due.recipe, exc)
            local.status = ReplayStatus.REPLAY_FAILED


def _round_answers(runner: ReplayRunner) -> dict[type, Handler]:
    """The round's ops (``RoundOp``) answered on the runner's peer group (torch collectives) and
    its executor."""
    return {
        GatherReadiness: lambda op: runner.peers.all_gather_int64(list(op.row)),
        Execute: lambda op: runner._execute(op.due),
        GatherEvidence: lambda op: runner._gather_evidence(op),
    }
