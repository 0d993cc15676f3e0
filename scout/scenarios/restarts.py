"""Simulated restarts with storage faults: the product's restore and save programs
(``scout.job.restore``, ``scout.job.save``) in the simulated job (:mod:`.replay_job`), at any
size, beside its check pipeline. A cycle is 2 steps and a checkpoint is saved at every cycle end,
so by step 8 the checkpoints of steps 2, 4 and 6 are verified; the launcher allows one restart.

* ``restart-lost-checkpoint``: an SDC on one rank at step ``SDC_STEP`` stops every rank
  (``on_sdc = "restart"``); before the restart, the files of the checkpoint the recovery decision
  chooses (the newest verified) are gone on some ranks. The restart marks it lost (GATE-42,
  naming its path and exactly those ranks), falls back to the next verified one (RECOVERY-7) and
  trains from there to the end.
* ``restart-nothing-left``: the same, but every checkpoint the decision chooses is gone: each is
  lost in turn, newest first, and the restart starts from initialization.
* ``save-failed-stop``: one rank's write of the checkpoint of step ``SAVE_STEP`` fails
  (``on_checkpoint_error = "stop"``): one ``save-failed`` report names that rank, every rank stops
  at that step, the gate never records the checkpoint, and the restart restores the newest
  verified one (an uncertain failure, RECOVERY-3).
* ``save-failed-continue``: the same write fails under ``"continue"``: training goes on in the
  one attempt, and the next checkpoint is saved and verified.
* ``save-no-space``: rank 0's free-space check finds too little before the save of step
  ``SAVE_STEP`` (``"stop"``): nothing is written on any rank, the report names no rank, every rank
  stops and the restart restores the newest verified checkpoint.
* ``saves-healthy``: no fault: every checkpoint is saved, recorded and verified in turn, and
  nothing is reported (the part's healthy runs).
* ``manifest-failed``: rank 0's commit of the capture of step ``SAVE_STEP`` fails
  (``"continue"``): the report names rank 0 and the manifest, the gate's writer stops, and no
  rank saves a checkpoint after it (spec/guard.md GUARD-6); training goes on to the end.

What each check expects is derived from the run's own reports and the faults injected, not from
the recovery code: the verified checkpoints are those reported ``recovery-verified``, newest first.
Every run is a pure function of the scenario, ranks and seed (``scout simulate NAME --ranks N
--seed S``); ``--rounds`` is not used (the steps are fixed).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from scout.core.failure import FailureClass
from scout.gate.dcp import checkpoint_path
from scout.gate.model import CheckpointId, Trust
from scout.reports.kinds import CheckpointReason, FinishedReason, ReportKind, RestartReason
from scout.scenarios.registry import Check, ScenarioOutcome, ScenarioParams, scenario
from scout.scenarios.replay_job import AttemptEnd, Faults, JobRun, run_replay_job
from scout.scenarios.sim_storage import (
    CHECKPOINT_ROOT,
    MANIFEST_PATH,
    FilesGone,
    ManifestFails,
    NoSpace,
    StorageFault,
    WriteFails,
)

__all__ = ["faulty_rank", "lacking_ranks"]

STEPS: Final = 12  # every attempt trains to this step
SDC_STEP: Final = 9  # after the checkpoints of steps 2, 4 and 6 are verified (cycles of 2 steps)
SAVE_STEP: Final = 6  # a save after two verified checkpoints (steps 2 and 4)
#: How many ranks lose the chosen checkpoint's files, at most (drawn from the seed).
LACKING_MAX: Final = 4
COLUMNS: Final = ("attempt", "restored", "lost", "last step", "ended", "saved", "failed saves", "named")


def faulty_rank(params: ScenarioParams, name: str) -> int:
    """The rank a scenario injects its fault into, drawn from the seed by a generator of its own."""
    return random.Random(f"{name}:{params.seed}").randrange(params.ranks)


def lacking_ranks(params: ScenarioParams, name: str) -> tuple[int, ...]:
    """The ranks whose files of the chosen checkpoint are gone: 1 to ``LACKING_MAX`` of them."""
    draw = random.Random(f"{name}:lacking:{params.seed}")
    return tuple(sorted(draw.sample(range(params.ranks), draw.randint(1, min(LACKING_MAX, params.ranks)))))


class _Kept(logging.Handler):
    def __init__(self, kept: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.kept = kept

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append(record.getMessage())


@contextlib.contextmanager
def _warnings_kept(kept: list[str]) -> Iterator[None]:
    """Rank 0's warnings (``scout`` logger) during a run, kept for the checks instead of printed."""
    handler = _Kept(kept)
    scout_logger = logging.getLogger("scout")
    propagate = scout_logger.propagate
    scout_logger.addHandler(handler)
    scout_logger.propagate = False
    try:
        yield
    finally:
        scout_logger.removeHandler(handler)
        scout_logger.propagate = propagate


def _job(params: ScenarioParams, name: str, faults: Faults, storage: Sequence[StorageFault], *,
         on_checkpoint_error: str = "stop") -> tuple[JobRun, list[str]]:
    kept: list[str] = []
    with _warnings_kept(kept):
        run = run_replay_job(ranks=params.ranks, group_size=params.group_size, seed=params.seed, steps=STEPS,
                             faults=faults, scenario=name, storage_faults=storage, max_restarts=1,
                             on_checkpoint_error=on_checkpoint_error)
    return run, kept


def _of(records: Sequence[dict[str, Any]], kind: ReportKind, reason: str | None = None,
        generation: int | None = None) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind and (reason is None or r["reason"] == reason)
            and (generation is None or r["generation"] == generation)]


def _verified(run: JobRun, generation: int) -> list[str]:
    """The checkpoints reported verified in an attempt, newest first."""
    return [r["evidence"]["checkpoint"] for r in reversed(_of(run.records, ReportKind.CHECKPOINT,
                                                               CheckpointReason.RECOVERY_VERIFIED, generation))]


def _checkpoint(name: str) -> CheckpointId:
    """The checkpoint a report names (``t0/s8``)."""
    timeline, step = name[1:].split("/s")
    return CheckpointId(int(timeline), int(step))


def _name_step(name: str) -> int:
    return _checkpoint(name).step


def _rows(run: JobRun) -> list[tuple[Any, ...]]:
    """One row per attempt, as rank 0 lived it (every rank's is checked alike below)."""
    rows = []
    for number, attempt in enumerate(run.attempts[0] if run.attempts else ()):
        if attempt.restored is None:  # on_missing_checkpoint = "stop" refused it
            rows.append((number, "-", "-", 0, attempt.ended.value, "-", "-", ()))
            continue
        decision = attempt.restored.decision
        named = sorted({rank for r in run.records if r["generation"] == number
                        and (r["kind"] == ReportKind.SDC or r["reason"] == CheckpointReason.SAVE_FAILED)
                        for rank in r["ranks"]})
        failed = [r["evidence"]["checkpoint"] for r in _of(run.records, ReportKind.CHECKPOINT,
                                                          CheckpointReason.SAVE_FAILED, number)]
        rows.append((number, str(decision.checkpoint) if decision.checkpoint else "initialization",
                     " ".join(attempt.restored.lost) or "-", attempt.outcome.step if attempt.outcome else decision.step,
                     attempt.ended.value, " ".join(str(s.checkpoint) for s in attempt.saves if s.recorded) or "-",
                     " ".join(failed) or "-", tuple(named)))
    return rows


def _alike(run: JobRun, ends: Sequence[AttemptEnd]) -> Check:
    """Every rank ran the same attempts, started each where rank 0 did, and ended each alike."""
    first = run.attempts[0] if run.attempts else ()
    different = [rank for rank, attempts in enumerate(run.attempts)
                 if [(a.restored, a.ended, a.outcome.step if a.outcome else None) for a in attempts]
                 != [(a.restored, a.ended, a.outcome.step if a.outcome else None) for a in first]]
    seen = [a.ended for a in first]
    return Check(f"every rank's attempts started and ended alike: {[end.value for end in ends]}",
                 len(run.attempts) == run.simulation.ranks and not different and seen == list(ends),
                 f"ranks that differ from rank 0: {different[:8]}; rank 0's ends: {[end.value for end in seen]}")


def _restart(run: JobRun, generation: int) -> dict[str, Any] | None:
    starts = [r for r in _of(run.records, ReportKind.RESTART, generation=generation)
              if r["reason"] in (RestartReason.STARTED, RestartReason.RESTORED)]
    return starts[0] if len(starts) == 1 else None


def _trust(run: JobRun, name: str) -> Trust | None:
    """The trust the final manifest holds for checkpoint ``name`` (None: it never recorded it)."""
    if not run.storage.generations:
        return None
    entry = next((e for e in run.storage.generations[-1].context.checkpoints if str(e.id) == name), None)
    return None if entry is None else entry.trust


def _lost_restart(params: ScenarioParams, name: str, count: int) -> ScenarioOutcome:
    victim = faulty_rank(params, name)
    lacking = lacking_ranks(params, name)
    bit = random.Random(f"{name}:bit:{params.seed}").randrange(32)
    gone = FilesGone(1, count, lacking)
    run, warnings = _job(params, name, Faults(sdc_rank=victim, sdc_step=SDC_STEP, sdc_bit=bit, attempt=0), [gone])
    verified = _verified(run, 0)
    expected_lost = verified[:count]
    fallback = verified[count] if count < len(verified) else None
    sdc = _of(run.records, ReportKind.SDC)
    lost = _of(run.records, ReportKind.CHECKPOINT, CheckpointReason.LOST)
    restart = _restart(run, 1)
    start = _name_step(fallback) if fallback else 0
    where = [str(checkpoint_path(CHECKPOINT_ROOT, _checkpoint(n))) for n in expected_lost]
    checks = [
        _alike(run, (AttemptEnd.STOPPED, AttemptEnd.FINISHED)),
        Check(f"attempt 0: the SDC reports name exactly rank {victim}, first at step {SDC_STEP}, and every rank stops "
              "there", bool(sdc) and all(r["ranks"] == [victim] for r in sdc) and sdc[0]["step"] == SDC_STEP
              and run.attempts[0][0].outcome is not None and run.attempts[0][0].outcome.step == SDC_STEP,
              f"sdc reports (ranks, step): {[(r['ranks'], r['step']) for r in sdc][:4]}"),
        Check(f"{len(verified)} checkpoints were verified before the fault: one to lose"
              + (" and one to fall back to" if count == 1 else ""),
              len(verified) >= (2 if count == 1 else 1), f"verified, newest first: {verified}"),
        Check(f"the restart marks exactly {expected_lost} lost, newest first, each naming its path and rank(s) "
              f"{list(lacking)} (GATE-42)",
              [r["evidence"]["checkpoint"] for r in lost] == expected_lost
              and all(path in r["evidence"]["detail"] and f"on rank(s) {list(lacking)}" in r["evidence"]["detail"]
                      for r, path in zip(lost, where, strict=False))
              and all(r["evidence"]["before"] == Trust.RECOVERY_VERIFIED.value for r in lost),
              f"lost reports: {[(r['evidence']['checkpoint'], r['evidence']['detail'][:80]) for r in lost]}"),
        Check(f"the restart starts from {fallback or 'initialization'} (step {start}), with evidence.lost "
              f"{expected_lost} (RECOVERY-7)",
              restart is not None and restart["step"] == start and restart["evidence"].get("lost") == expected_lost
              and restart["reason"] == (RestartReason.RESTORED if fallback else RestartReason.STARTED)
              and all(len(a) == 2 and a[1].restored is not None
                      and str(a[1].restored.decision.checkpoint or "") == (fallback or "") for a in run.attempts),
              f"restart report: {None if restart is None else (restart['reason'], restart['step'], restart['evidence'].get('lost'))}"),
        Check("every lost checkpoint stays LOST in the manifest, and rank 0 warned once naming them and the start",
              all(_trust(run, n) is Trust.LOST for n in expected_lost) and len(warnings) == 1
              and all(n in warnings[0] for n in expected_lost)
              and (f"checkpoint {fallback}" if fallback else "initialization") in warnings[0],
              f"trust: {[(n, _trust(run, n)) for n in expected_lost]}; warnings: {[w[:160] for w in warnings]}"),
        Check(f"attempt 1 trains from step {start} to step {STEPS} and finishes",
              bool(_of(run.records, ReportKind.FINISHED, FinishedReason.CLOSED, 1))
              and all(a[-1].outcome is not None and a[-1].outcome.step == STEPS for a in run.attempts),
              f"last steps: {sorted({a[-1].outcome.step if a[-1].outcome else None for a in run.attempts}, key=str)}"),
    ]
    faults = [f"rank {victim}: bit {bit} of its replay output flipped at step {SDC_STEP} (attempt 0 only)",
              gone.describe()]
    return ScenarioOutcome(COLUMNS, _rows(run), checks, faults, run.simulation)


@scenario("restart-lost-checkpoint", summary=f"an SDC stops the job at step {SDC_STEP}; the newest verified "
          "checkpoint's files are gone on 1-4 ranks: the restart marks it lost (GATE-42), falls back to the next "
          "verified one (RECOVERY-7) and trains to the end", min_ranks=3)
def restart_lost_checkpoint(params: ScenarioParams) -> ScenarioOutcome:
    return _lost_restart(params, "restart-lost-checkpoint", 1)


@scenario("restart-nothing-left", summary=f"an SDC stops the job at step {SDC_STEP}; every checkpoint the restart "
          "chooses has no files on 1-4 ranks: each is marked lost, newest first, and the restart starts from "
          "initialization", min_ranks=3)
def restart_nothing_left(params: ScenarioParams) -> ScenarioOutcome:
    return _lost_restart(params, "restart-nothing-left", 1_000)


def _save_outcome(params: ScenarioParams, name: str, storage: StorageFault, *, policy: str,
                  failed_ranks: list[int], error: str, path: str, restarts: bool,
                  more: Callable[[JobRun], list[Check]]) -> ScenarioOutcome:
    run, warnings = _job(params, name, Faults(), [storage], on_checkpoint_error=policy)
    failed = _of(run.records, ReportKind.CHECKPOINT, CheckpointReason.SAVE_FAILED)
    checkpoint = f"t0/s{SAVE_STEP}"
    ends = (AttemptEnd.SAVE_FAILED, AttemptEnd.FINISHED) if restarts else (AttemptEnd.FINISHED,)
    checks = [
        _alike(run, ends),
        Check(f"one save-failed report: step {SAVE_STEP}, ranks {failed_ranks}, path {path}, policy "
              f"on_checkpoint_error={policy} (GATE-40)",
              len(failed) == 1 and failed[0]["step"] == SAVE_STEP and failed[0]["ranks"] == failed_ranks
              and failed[0]["evidence"]["path"] == path and error in failed[0]["evidence"]["error"]
              and failed[0]["evidence"]["policy"] == f"on_checkpoint_error={policy}",
              f"save-failed reports: {[(r['step'], r['ranks'], r['evidence']) for r in failed]}"),
        Check(f"the gate never records {checkpoint}: it is never a candidate", _trust(run, checkpoint) is None,
              f"{checkpoint} in the manifest: {_trust(run, checkpoint)}"),
        Check("rank 0 logged the failure once", sum("could not be saved" in w for w in warnings) == 1,
              f"warnings: {[w[:160] for w in warnings]}"),
    ]
    if restarts:
        verified = [n for n in _verified(run, 0) if _name_step(n) < SAVE_STEP]
        restart = _restart(run, 1)
        checks.append(Check(
            f"the restart restores the newest verified checkpoint, {verified[0] if verified else None} (an uncertain "
            "failure, RECOVERY-3), and trains to the end",
            bool(verified) and restart is not None and restart["reason"] == RestartReason.RESTORED
            and restart["step"] == _name_step(verified[0])
            and restart["evidence"]["failure"] == FailureClass.UNCERTAIN.value
            and all(a[-1].outcome is not None and a[-1].outcome.step == STEPS for a in run.attempts),
            f"verified before step {SAVE_STEP}: {verified}; restart: "
            f"{None if restart is None else (restart['reason'], restart['step'], restart['evidence'].get('failure'))}"))
    checks += more(run)
    faults = [storage.describe(), f"on_checkpoint_error = {policy}"]
    return ScenarioOutcome(COLUMNS, _rows(run), checks, faults, run.simulation)


def _every_rank_wrote(run: JobRun, writes: int) -> Check:
    assert run.files is not None
    return Check(f"every rank wrote {writes} checkpoint(s)", set(run.files.writes) == {writes},
                 f"writes by rank: {sorted(set(run.files.writes))}")


@scenario("save-failed-stop", summary=f"one rank's write of the checkpoint of step {SAVE_STEP} fails "
          "(on_checkpoint_error = stop): reported naming it, every rank stops, the restart restores the newest "
          "verified checkpoint", min_ranks=2)
def save_failed_stop(params: ScenarioParams) -> ScenarioOutcome:
    name = "save-failed-stop"
    rank = faulty_rank(params, name)
    path = f"{CHECKPOINT_ROOT}/t0-s{SAVE_STEP:012d}"
    return _save_outcome(params, name, WriteFails(rank, SAVE_STEP), policy="stop", failed_ranks=[rank],
                         error="No space left on device", path=path, restarts=True, more=lambda run: [])


@scenario("save-failed-continue", summary=f"one rank's write of the checkpoint of step {SAVE_STEP} fails "
          "(on_checkpoint_error = continue): reported naming it, training goes on, the next checkpoint is verified",
          min_ranks=2)
def save_failed_continue(params: ScenarioParams) -> ScenarioOutcome:
    name = "save-failed-continue"
    rank = faulty_rank(params, name)
    path = f"{CHECKPOINT_ROOT}/t0-s{SAVE_STEP:012d}"
    following = f"t0/s{SAVE_STEP + 2}"

    def more(run: JobRun) -> list[Check]:
        return [Check(f"the next checkpoint, {following}, is saved and verified",
                      _trust(run, following) is Trust.RECOVERY_VERIFIED, f"{following}: {_trust(run, following)}")]

    return _save_outcome(params, name, WriteFails(rank, SAVE_STEP), policy="continue", failed_ranks=[rank],
                         error="No space left on device", path=path, restarts=False, more=more)


@scenario("save-no-space", summary=f"too little free space before the save of step {SAVE_STEP} "
          "(on_checkpoint_error = stop): nothing is written, every rank stops, the restart restores the newest "
          "verified checkpoint", min_ranks=2)
def save_no_space(params: ScenarioParams) -> ScenarioOutcome:
    path = f"{CHECKPOINT_ROOT}/t0-s{SAVE_STEP:012d}"
    # Attempt 0 writes steps 2 and 4, not 6; attempt 1 restores step 4 and writes 6, 8, 10, 12.
    return _save_outcome(params, "save-no-space", NoSpace(SAVE_STEP), policy="stop", failed_ranks=[],
                         error="not enough free space", path=path, restarts=True,
                         more=lambda run: [_every_rank_wrote(run, 2 + 4)])


@scenario("manifest-failed", summary=f"rank 0's commit of the capture of step {SAVE_STEP} to the manifest fails "
          "(on_checkpoint_error = continue): reported naming rank 0, the gate's writer stops and no checkpoint is "
          "saved after it (GUARD-6)", min_ranks=2)
def manifest_failed(params: ScenarioParams) -> ScenarioOutcome:
    def more(run: JobRun) -> list[Check]:
        later = [str(s.checkpoint) for s in run.attempts[0][0].saves if s.checkpoint.step > SAVE_STEP
                 and s.skipped is None] if run.attempts and run.attempts[0] else ["?"]
        return [_every_rank_wrote(run, SAVE_STEP // 2),
                Check("no checkpoint after it is saved: rank 0 refuses every later save (GUARD-6)", not later,
                      f"saved after step {SAVE_STEP}: {later}")]

    return _save_outcome(params, "manifest-failed", ManifestFails(SAVE_STEP), policy="continue", failed_ranks=[0],
                         error="No space left on device", path=MANIFEST_PATH, restarts=False, more=more)


@scenario("saves-healthy", summary="no storage fault: every checkpoint is saved on every rank, recorded and "
          "verified in turn; nothing is reported lost or failed, and the one attempt runs to its end", min_ranks=2)
def saves_healthy(params: ScenarioParams) -> ScenarioOutcome:
    run, warnings = _job(params, "saves-healthy", Faults(), [])
    saved = [str(s.checkpoint) for s in run.attempts[0][0].saves if s.recorded] if run.attempts else []
    due = [f"t0/s{step}" for step in range(2, STEPS + 1, 2)]
    bad = [(r["kind"], r["reason"], r["step"]) for r in run.records
           if r["reason"] in (CheckpointReason.SAVE_FAILED, CheckpointReason.LOST, CheckpointReason.QUARANTINED)
           or r["kind"] in (ReportKind.SDC, ReportKind.UNCHECKED)]
    checks = [
        _alike(run, (AttemptEnd.FINISHED,)),
        Check(f"every due checkpoint is saved and recorded: {due}", saved == due, f"saved: {saved}"),
        Check("all but the last are verified by the end", [n for n in due if _trust(run, n) is Trust.RECOVERY_VERIFIED]
              == due[:-1], f"trust: {[(n, _trust(run, n)) for n in due]}"),
        _every_rank_wrote(run, len(due)),
        Check("nothing is reported failed, lost, quarantined or unchecked, and nothing is logged", not bad
              and not warnings, f"reports: {bad[:6]}; warnings: {[w[:120] for w in warnings]}"),
    ]
    return ScenarioOutcome(COLUMNS, _rows(run), checks, ["none"], run.simulation)


def faulty_ranks(name: str, params: ScenarioParams) -> tuple[int, ...]:
    """The rank(s) a scenario of this module names when it localizes its fault: the SDC's rank,
    the rank whose write failed, rank 0 for the manifest, none for a free-space refusal."""
    if name in ("restart-lost-checkpoint", "restart-nothing-left", "save-failed-stop", "save-failed-continue"):
        return (faulty_rank(params, name),)
    return (0,) if name == "manifest-failed" else ()

