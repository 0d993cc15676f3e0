"""One replay round: the protocol every recipe executor runs (spec/replay.md READY-*, EVID-*,
COMM-1, STRAG-1, REPLAY-9). Pure: no torch, no clock, no I/O.

Theory of operation. At a step where recipes are due, every peer of a replay group runs
:func:`replay_round` with the recipes it prepared (a capture, or why there is none) and answers
the :data:`RoundOp` values it yields:

1. ``GatherReadiness(row)`` -- every peer's readiness row, by position: the schedule digest
   and, for every recipe class, ``(due, status, description digest)`` (READY-2, READY-3). The
   decision (:func:`decide_readiness_rows`) is a function of the gathered rows only, so every
   peer takes the same branch;
2. ``Execute(due)`` -- for each recipe that proceeds, on every peer: sign the local inputs,
   take part in the source's broadcast, replay (timed, STRAG-1), and answer
   :class:`Executed` (a local failure is a status, never a skipped collective: REPLAY-7);
3. ``GatherEvidence(row)`` -- every peer's evidence row with its communication slot appended
   by the driver (COMM-1); :func:`decide_evidence_rows` gives each recipe's result
   (``combine_evidence``, EVID-2..EVID-5), its timing verdict and every peer's compute time.

A driver maps the ops onto a world: ``scout.replay.runner`` onto torch collectives and a
recipe executor (hidden layer, embedding and head, optimizer slice, expert), the simulator onto
simulated collectives and simulated executors. The row format lives here, once.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, Final

import attrs

from scout.core import invariants
from scout.core.recipes import (
    CLASS_ORDER,
    DueRecipe,
    EvidenceKind,
    RecipeClass,
    RecipeResult,
    ReplayStatus,
    combine_evidence,
    decide_readiness,
)
from scout.core.verdict import (
    MISSING,
    Status,
    TimingConfig,
    Verdict,
    classify_exact,
    classify_timing,
)

__all__ = [
    "COMMUNICATION_CALLS",
    "COMMUNICATION_SLOT",
    "EVIDENCE_OF",
    "EVIDENCE_ROW_LENGTH",
    "READINESS_ROW_LENGTH",
    "Execute",
    "Executed",
    "GatherEvidence",
    "GatherReadiness",
    "Prepared",
    "RoundOp",
    "RoundOutcome",
    "communication_slot",
    "decide_evidence_rows",
    "decide_readiness_rows",
    "evidence_position",
    "evidence_row",
    "lanes",
    "merge_outcomes",
    "own_communication_ms",
    "readiness_row",
    "replay_round",
]

#: EVID-3: the evidence groups each recipe class signs (REPLAY-3, REPLAY-6, OPT-2, MOE-1), and
#: the live path's self-check of the module classes (SELF-1: a code, not a signature).
_MODULE: Final = (EvidenceKind.PARAMETERS, EvidenceKind.INPUT, EvidenceKind.RNG, EvidenceKind.OUTPUT,
                  EvidenceKind.INPUT_GRADIENT, EvidenceKind.PARAMETER_GRADIENT, EvidenceKind.LIVE)
EVIDENCE_OF: Final[Mapping[RecipeClass, tuple[EvidenceKind, ...]]] = {
    RecipeClass.EMBEDDING: _MODULE,
    RecipeClass.HIDDEN: _MODULE,
    RecipeClass.OUTPUT: _MODULE,
    RecipeClass.OPTIMIZER: (EvidenceKind.PARAMETERS, EvidenceKind.INPUT, EvidenceKind.UPDATED,
                            EvidenceKind.LIVE_UPDATED),
    RecipeClass.EXPERT: (EvidenceKind.PARAMETERS, EvidenceKind.INPUT, EvidenceKind.OUTPUT,
                         EvidenceKind.INPUT_GRADIENT, EvidenceKind.PARAMETER_GRADIENT),
}
_EVIDENCE_ORDER: Final = tuple(EvidenceKind)
# READY-3, EVID-1: fixed-size rows, one slot per recipe class, whatever is due locally.
_READINESS_SLOT: Final = 3  # due flag, status, description digest
_EVIDENCE_SLOT: Final = 2 + len(_EVIDENCE_ORDER)  # status, compute microseconds, evidence...
#: COMM-1: entry and wait microseconds of each of the check's collectives before the evidence
#: exchange (one readiness exchange and at most one broadcast per recipe class); -1 pads.
COMMUNICATION_CALLS: Final = 1 + len(CLASS_ORDER)
COMMUNICATION_SLOT: Final = 2 * COMMUNICATION_CALLS
READINESS_ROW_LENGTH: Final = 1 + _READINESS_SLOT * len(CLASS_ORDER)
_EVIDENCE_PART: Final = _EVIDENCE_SLOT * len(CLASS_ORDER)
EVIDENCE_ROW_LENGTH: Final = _EVIDENCE_PART + COMMUNICATION_SLOT


@attrs.frozen
class Prepared:
    """One due recipe on this peer before the round: ready (OK) or why not, and the digest of
    its description (READY-1)."""

    due: DueRecipe
    status: ReplayStatus
    digest: int


@attrs.frozen
class Executed:
    """What one peer's execution of a proceeding recipe gave: its status (OK unless a local
    step failed, REPLAY-7), the check's compute time (STRAG-1: the median of the timed
    repetitions), every timed repetition, and its evidence signatures."""

    status: ReplayStatus
    compute_s: float = 0.0
    repetitions_s: tuple[float, ...] = ()
    evidence: Mapping[EvidenceKind, int] = attrs.Factory(dict)


@attrs.frozen
class GatherReadiness:
    """All-gather ``row`` over the replay group; answer: every peer's row, by position."""

    row: tuple[int, ...]


@attrs.frozen
class Execute:
    """Sign, take part in the source's broadcast, replay ``due``; answer: :class:`Executed`."""

    due: DueRecipe


@attrs.frozen
class GatherEvidence:
    """All-gather ``row`` with this peer's communication slot appended (:func:`communication_slot`);
    answer: every peer's full row, by position."""

    row: tuple[int, ...]


RoundOp = GatherReadiness | Execute | GatherEvidence


@attrs.frozen
class RoundOutcome:
    """What one round decided (recipe ids as strings where they key a mapping)."""

    results: tuple[RecipeResult, ...]  # one per due recipe, in class order
    timing: dict[str, Verdict]  # timing verdict over the peers' compute times, per replayed recipe
    compute_ms: dict[str, float]  # this peer's compute time per replayed recipe
    communication_ms: tuple[float, ...]  # COMM-2: every peer's own communication time (or empty)
    peer_compute_ms: dict[str, tuple[Any, ...]]  # every peer's compute time per recipe, MISSING if it failed
    repetitions_ms: dict[str, tuple[float, ...]]  # this peer's timed repetitions per recipe


def lanes(due: Sequence[DueRecipe]) -> tuple[tuple[DueRecipe, ...], ...]:
    """REC-3, REPLAY-9: the rounds of one check. Lane ``j`` holds every class's ``j``-th due
    recipe (in ``due``'s order), so no round carries two recipes of one class; a check with at
    most one recipe per class is one lane."""
    by_lane: list[list[DueRecipe]] = []
    seen: dict[RecipeClass, int] = {}
    for recipe in due:
        lane = seen.get(recipe.recipe.recipe_class, 0)
        seen[recipe.recipe.recipe_class] = lane + 1
        if lane == len(by_lane):
            by_lane.append([])
        by_lane[lane].append(recipe)
    return tuple(tuple(lane) for lane in by_lane)


def merge_outcomes(outcomes: Sequence[RoundOutcome]) -> RoundOutcome:
    """The outcome of a check run as several lanes (:func:`lanes`), lane 0 first: every lane's
    results in lane order and its per-recipe figures; the communication times are lane 0's (the
    check's first collectives, as COMM-1 reads them for a check of one lane)."""
    if not outcomes:
        raise ValueError("a check has at least one round to merge")
    if len(outcomes) == 1:
        return outcomes[0]
    merged = RoundOutcome((), {}, {}, outcomes[0].communication_ms, {}, {})
    for outcome in outcomes:
        merged = attrs.evolve(
            merged, results=merged.results + outcome.results, timing={**merged.timing, **outcome.timing},
            compute_ms={**merged.compute_ms, **outcome.compute_ms},
            peer_compute_ms={**merged.peer_compute_ms, **outcome.peer_compute_ms},
            repetitions_ms={**merged.repetitions_ms, **outcome.repetitions_ms})
    return merged


def _slot(recipe_class: RecipeClass) -> int:
    return CLASS_ORDER.index(recipe_class)


def evidence_position(recipe_class: RecipeClass, kind: EvidenceKind) -> int:
    """Where ``kind``'s signature of ``recipe_class`` sits in an evidence row (EVID-1)."""
    return _EVIDENCE_SLOT * _slot(recipe_class) + 2 + _EVIDENCE_ORDER.index(kind)


def readiness_row(schedule_digest: int, prepared: Sequence[Prepared]) -> tuple[int, ...]:
    """READY-2, READY-3: the schedule digest, then ``(due, status, digest)`` per class."""
    by_class = {p.due.recipe.recipe_class: p for p in prepared}
    if len(by_class) != len(prepared):
        raise ValueError(f"two due recipes of one class in one round: {[str(p.due.recipe) for p in prepared]}")
    row = [schedule_digest]
    for recipe_class in CLASS_ORDER:
        local = by_class.get(recipe_class)
        row += (0, 0, 0) if local is None else (1, int(local.status), local.digest)
    return tuple(row)


def decide_readiness_rows(
    step: int, prepared: Sequence[Prepared], rows: Sequence[Sequence[int]]
) -> tuple[list[DueRecipe], dict[RecipeClass, RecipeResult]]:
    """READY-2, READY-5: the recipes that proceed, and an Inconclusive result for every other
    (never an attribution). A function of the gathered rows only."""
    for row in rows:
        if len(row) != READINESS_ROW_LENGTH:
            raise ValueError(f"a readiness row has {len(row)} values, not {READINESS_ROW_LENGTH}")
    single = len(rows) == 1
    schedules_agree = single or classify_exact([row[0] for row in rows]).status is Status.AGREE
    proceeding: list[DueRecipe] = []
    inconclusive: dict[RecipeClass, RecipeResult] = {}
    for local in prepared:
        slot = 1 + _READINESS_SLOT * _slot(local.due.recipe.recipe_class)
        digests = [row[slot + 2] if row[slot] == 1 else MISSING for row in rows]
        statuses = [row[slot + 1] if row[slot] == 1 else MISSING for row in rows]
        decision = decide_readiness(digests, statuses)
        if not schedules_agree:
            reason = "readiness: schedule digests differ"
        elif not decision.proceed:
            reason = decision.reason or "readiness"
        else:
            proceeding.append(local.due)
            continue
        if single:
            reason = "singleton"
        inconclusive[local.due.recipe.recipe_class] = RecipeResult(local.due.recipe, step, Status.INCONCLUSIVE,
                                                                   reason=reason)
    return proceeding, inconclusive


def evidence_row(executed: Mapping[RecipeClass, Executed]) -> tuple[int, ...]:
    """EVID-1 without the communication slot: status, compute µs and evidence per class."""
    row = [0] * _EVIDENCE_PART
    for recipe_class, done in executed.items():
        slot = _EVIDENCE_SLOT * _slot(recipe_class)
        row[slot] = int(done.status)
        row[slot + 1] = round(done.compute_s * 1e6)
        for kind, value in done.evidence.items():
            row[slot + 2 + _EVIDENCE_ORDER.index(kind)] = value
    return tuple(row)


def communication_slot(calls_s: Sequence[tuple[float, float]]) -> tuple[int, ...]:
    """COMM-1: the ``(entry_s, wait_s)`` of this check's first collectives in µs, -1 padded."""
    slot = [-1] * COMMUNICATION_SLOT
    for index, (entry_s, wait_s) in enumerate(calls_s[:COMMUNICATION_CALLS]):
        slot[2 * index : 2 * index + 2] = [round(entry_s * 1e6), round(wait_s * 1e6)]
    return tuple(slot)


def decide_evidence_rows(
    step: int, proceeding: Sequence[DueRecipe], rows: Sequence[Sequence[int]], timing: TimingConfig
) -> tuple[dict[RecipeClass, RecipeResult], dict[str, Verdict], dict[str, tuple[Any, ...]], tuple[float, ...]]:
    """EVID-2..EVID-5, STRAG-1, COMM-2: each proceeding recipe's result and timing verdict,
    every peer's compute time per recipe (MISSING where its replay did not complete, STRAG-3),
    and every peer's own communication time."""
    for row in rows:
        if len(row) != EVIDENCE_ROW_LENGTH:
            raise ValueError(f"an evidence row has {len(row)} values, not {EVIDENCE_ROW_LENGTH}")
    results: dict[RecipeClass, RecipeResult] = {}
    verdicts: dict[str, Verdict] = {}
    peer_compute_ms: dict[str, tuple[Any, ...]] = {}
    for due in proceeding:
        recipe_class = due.recipe.recipe_class
        slot = _EVIDENCE_SLOT * _slot(recipe_class)
        statuses = [row[slot] for row in rows]
        evidence = {kind: [row[slot + 2 + _EVIDENCE_ORDER.index(kind)] for row in rows]
                    for kind in EVIDENCE_OF[recipe_class]}
        results[recipe_class] = combine_evidence(due.recipe, step, statuses, evidence)
        times_ms = tuple(row[slot + 1] / 1e3 if row[slot] == int(ReplayStatus.OK) else MISSING for row in rows)
        peer_compute_ms[str(due.recipe)] = times_ms
        verdicts[str(due.recipe)] = classify_timing(times_ms, timing)
    communication_ms = own_communication_ms([row[_EVIDENCE_PART:] for row in rows]) if len(rows) > 1 else ()
    return results, verdicts, peer_compute_ms, communication_ms


def own_communication_ms(calls_us: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """COMM-2: each peer's own communication time in ms for one check.

    ``calls_us[p]`` is peer ``p``'s ``entry_us, wait_us`` of each collective of the check, in
    call order, flattened (``-1`` pads absent calls). The peers of one collective return at
    about the same moment, so a peer's wait beyond the shortest wait in the group is time
    spent waiting for a later peer, not communicating: per call, own = entry + min(wait). A
    peer whose side of the path is slow has a long entry and the shortest wait; the peers
    waiting for it have a long wait, not a long entry. A peer's value for the check is its
    smallest own time over the calls every peer made: a slow side of the path slows every
    call, a descheduled thread one of them.
    """
    if not calls_us:
        return ()
    pairs = [list(zip(row[0::2], row[1::2], strict=True)) for row in calls_us]
    common = min(next((i for i, (entry, _) in enumerate(row) if entry < 0), len(row)) for row in pairs)
    if common == 0:
        return ()
    own = []
    for row in pairs:
        per_call = []
        for index in range(common):
            shared_us = min(peer[index][1] for peer in pairs)
            per_call.append((row[index][0] + shared_us) / 1e3)
        own.append(min(per_call))
    return tuple(own)


def replay_round(
    step: int, prepared: Sequence[Prepared], *, schedule_digest: int, group_size: int, timing: TimingConfig
) -> Generator[RoundOp, Any, RoundOutcome]:
    """The round of one check step (module docstring). ``group_size`` 1 gathers nothing: a
    singleton group decides from its own rows (every recipe Inconclusive ``singleton``)."""
    if group_size < 1:
        raise ValueError(f"a replay group has at least one peer, got group_size={group_size}")
    mine = readiness_row(schedule_digest, prepared)
    rows = [mine] if group_size == 1 else (yield GatherReadiness(mine))
    proceeding, results = decide_readiness_rows(step, prepared, rows)
    executed: dict[RecipeClass, Executed] = {}
    for due in proceeding:
        done = yield Execute(due)
        if not isinstance(done, Executed):
            raise TypeError(f"Execute({due.recipe}) was answered with {done!r}, not an Executed")
        executed[due.recipe.recipe_class] = done
    verdicts: dict[str, Verdict] = {}
    peer_compute_ms: dict[str, tuple[Any, ...]] = {}
    communication_ms: tuple[float, ...] = ()
    if proceeding:
        row = evidence_row(executed)
        evidence_rows = [row + communication_slot(())] if group_size == 1 else (yield GatherEvidence(row))
        decided, verdicts, peer_compute_ms, communication_ms = decide_evidence_rows(step, proceeding, evidence_rows,
                                                                                    timing)
        results.update(decided)
    ordered = tuple(results[c] for c in CLASS_ORDER if c in results)
    if invariants.ENABLED and (len(ordered) != len(prepared) or any(
            r.step != step or (r.outliers and r.outliers[-1] >= group_size) for r in ordered)):
        raise invariants.violated("REPLAY-9/results", f"step {step}, {len(prepared)} due, group of {group_size}: "
                                  f"{[(str(r.recipe), r.step, list(r.outliers)) for r in ordered]}")
    return RoundOutcome(
        ordered,
        verdicts,
        {str(due.recipe): executed[due.recipe.recipe_class].compute_s * 1e3 for due in proceeding},
        communication_ms,
        peer_compute_ms,
        {str(due.recipe): tuple(t * 1e3 for t in executed[due.recipe.recipe_class].repetitions_s)
         for due in proceeding},
    )
