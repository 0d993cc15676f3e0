"""What a run directory says, for people and machines: ``scout report RUN_DIR``.

It reads ``run_dir/reports.jsonl`` (every finding, ``scout.report/1``), ``run_dir/timing.jsonl``
(every loop check's ratios, spec/replay.md LOOP-6) and the gate's manifest (``run_dir/gate``:
the final trust of every checkpoint) and gives a summary -- faults by kind, with ranks, hosts,
steps and reasons; the loop checks' ratios per rank; restarts and what they restored; how each
attempt ended (spec/ops.md OPS-13: an attempt that raised, or that left no ``finished`` report --
a crash, a kill, a full run_dir -- is shown as such); checkpoint trust -- as text
(:func:`summary_text`) or JSON (:func:`summary_json`). :mod:`scout.reports.picture` draws it. Lines
that are not reports (torn, or of the wrong types) are skipped and counted (OPS-12). No torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout import reports
from scout.core.guards import whole_number
from scout.gate.codec import CodecError
from scout.gate.manifest import ManifestError
from scout.gate.model import Trust
from scout.gate.recorder import inspect_gate_problems
from scout.reports.kinds import ATTEMPT_STARTS, ReportKind, RestartReason
from scout.reports.loop_timing import loop_timing_json, loop_timing_lines
from scout.reports.timing import TIMING_FILE, read_timing

__all__ = ["RunView", "load_run", "summary_json", "summary_text"]

SUMMARY_SCHEMA: Final = "scout.run-summary/1"
FAULT_KINDS: Final = tuple(kind.value for kind in ReportKind if kind.is_fault)


@attrs.frozen
class RunView:
    run_dir: Path
    records: tuple[dict[str, Any], ...]
    checkpoints: tuple[tuple[int, int, str, str], ...]  # (timeline, step, trust, reason)
    manifest_problem: str | None
    world_size: int
    last_step: int
    timing: tuple[dict[str, Any], ...] = ()  # LOOP-6: run_dir/timing.jsonl's records
    timing_skipped: int = 0  # its lines that could not be read (a torn last line)
    skipped: int = 0  # OPS-12: lines of reports.jsonl that are not reports (torn, or of the wrong types)

    @property
    def faults(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] in FAULT_KINDS]

    @property
    def unclean(self) -> list[dict[str, Any]]:
        """OPS-13: the attempts that did not end by closing scout or by a policy's stop."""
        return [attempt for attempt in attempt_ends(self.records) if attempt["ended"] not in CLEAN_ENDS]


def _natural(value: object) -> int | None:
    return value if whole_number(value) and value >= 0 else None


def _texts(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def load_run(run_dir: str | Path) -> RunView:
    """Read a run directory; a missing or damaged manifest is reported, not fatal."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a run directory (scout.attach's run_dir)")
    found = reports.read_reports(path / reports.REPORTS_FILE)
    records = found.records
    checkpoints: list[tuple[int, int, str, str]] = []
    problem: str | None = None
    gate = path / "gate"
    if gate.is_dir():
        try:
            # Read as every gate reader reads it: every surviving record folded, failing
            # closed when the newest generation is lost (GATE-30, GATE-31).
            reading, problem = inspect_gate_problems(gate)
            if reading is not None:
                checkpoints = [(e.id.timeline, e.id.step, e.trust.value, e.reason)
                               for e in reading.state.context.checkpoints]
        except (ManifestError, CodecError, OSError) as error:
            problem = str(error)
    world = 0
    for record in records:
        # Evidence is each kind's own: a value of another type is not a rank (OPS-12).
        evidence = record["evidence"]
        peers = evidence.get("peers") if isinstance(evidence.get("peers"), list) else []
        world = max([world, _natural(evidence.get("world_size")) or 0, *(r + 1 for r in record["ranks"]),
                     *((_natural(p.get("rank")) or 0) + 1 for p in peers if isinstance(p, dict))])
    timing = read_timing(path / TIMING_FILE)
    for record in timing.records:
        world = max([world, *(int(r) + 1 for r in record["ranks"])])
    last_step = max([0, *(r["step"] or 0 for r in records), *(c[1] for c in checkpoints),
                     *(r["step"] for r in timing.records)])
    return RunView(path, records, tuple(checkpoints), problem, world, last_step, timing.records, timing.skipped,
                   found.skipped)


def attempt_numbers(records: Sequence[dict[str, Any]]) -> list[int]:
    """Each record's attempt: an attempt begins at each ``restart`` record that starts one
    (``started``, ``restored``), so a relaunch of the same job -- whose launcher counts its
    restarts from 0 again -- is an attempt of its own, and matches the gate's timeline."""
    numbers, starts = [], 0
    for record in records:
        if record["kind"] == ReportKind.RESTART.value and record["reason"] in ATTEMPT_STARTS:
            starts += 1
        numbers.append(max(0, starts - 1))
    return numbers


#: How an attempt may end and still be clean (OPS-13): scout closed, or a policy stopped it.
CLEAN_ENDS: Final = ("closed", "stopped")


def attempt_ends(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OPS-13: how each attempt (:func:`attempt_numbers`) ended: ``closed`` (``finished``
    ``closed``), ``stopped`` (a policy's ``restart`` report), ``exception`` or ``interrupted``
    (``finished`` with that reason and its error), or ``none``: no end report at all -- it
    crashed, was killed, could not write its run_dir (full), or still runs."""
    ends: list[dict[str, Any]] = []
    for record in records:
        kind, reason = record["kind"], record["reason"]
        if kind == ReportKind.RESTART.value and reason in ATTEMPT_STARTS:
            ends.append({"attempt": len(ends), "generation": record["generation"], "ended": "none", "step": None,
                         "error": None})
        elif ends and ends[-1]["ended"] == "none" and kind == ReportKind.FINISHED.value:
            error = record["evidence"].get("error")
            ends[-1].update(ended=reason, step=record["step"],
                            error=None if error is None else str(error))
        elif ends and ends[-1]["ended"] == "none" and kind == ReportKind.RESTART.value:
            ends[-1].update(ended="stopped", step=record["step"], error=reason)
    return ends


def end_phrase(end: dict[str, Any]) -> str:
    """OPS-13: an attempt that did not end cleanly, in one line of ``scout report``."""
    where = f" at step {end['step']}" if end["step"] is not None else ""
    if end["ended"] == "none":
        return (f"attempt {end['attempt']} did not end cleanly: no finished report (it crashed, was killed, could "
                "not write its run_dir -- full? -- or still runs; see the job's log)")
    return f"attempt {end['attempt']} ended by {end['ended']}{where}: {_clip(str(end['error'] or '?'), 300)}"


def start_phrase(reason: str, step: int, choice: str | None, failure: str | None, lost: list[str] | None = None) -> str:
    """How an attempt began (its ``restart`` record: ``started`` or ``restored``), in the report
    and its picture: a fresh start, or the step, choice and failure of the restore; and the chosen
    checkpoints found without files on the way (spec/recovery.md RECOVERY-7)."""
    if reason == RestartReason.STARTED:
        return "fresh start" + (f" ({', '.join(lost)} lost: no files)" if lost else "")
    article = "an" if str(failure)[:1] in "aeiou" else "a"
    gone = f"; {', '.join(lost)} lost: no files" if lost else ""
    return f"restored step {step} ({choice} checkpoint for {article} {failure} failure{gone})"


def summary_json(view: RunView) -> dict[str, Any]:
    counts = Counter(r["kind"] for r in view.faults)
    numbers = dict(zip(map(id, view.records), attempt_numbers(view.records), strict=True))
    restarts = [{"generation": r["generation"], "attempt": numbers[id(r)], "step": r["step"], "reason": r["reason"],
                 "failure": r["evidence"].get("failure"), "choice": r["evidence"].get("choice"),
                 "lost": _texts(r["evidence"].get("lost"))}
                for r in view.records if r["kind"] == ReportKind.RESTART]
    verified = [f"t{t}/s{s}" for t, s, trust, _ in view.checkpoints if trust == Trust.RECOVERY_VERIFIED.value]
    return {
        "schema": SUMMARY_SCHEMA,
        "run_dir": str(view.run_dir),
        "world_size": view.world_size,
        "last_step": view.last_step,
        "faults_by_kind": dict(sorted(counts.items())),
        "unchecked_replays": sum(r["kind"] == ReportKind.UNCHECKED for r in view.records),
        "faults": [{k: r[k] for k in ("kind", "ranks", "hosts", "step", "reason", "generation", "time", "source")}
                   for r in view.faults],
        "restarts": restarts,
        "checkpoints": [{"checkpoint": f"t{t}/s{s}", "trust": trust, "reason": reason}
                        for t, s, trust, reason in view.checkpoints],
        "restore_candidate": verified[-1] if verified else None,
        "manifest_problem": view.manifest_problem,
        "attempts": attempt_ends(view.records),
        "unclean_attempts": [end["attempt"] for end in view.unclean],
        "skipped_lines": view.skipped,
        "exclude_hosts": _exclude_hosts(view.run_dir),
        "loop_timing": loop_timing_json(view.timing, view.timing_skipped,
                                        [r for r in view.records if r["kind"] == ReportKind.STRAGGLER],
                                        off=_loop_check_off(view.records)),
        "parts_off": parts_off(view.records, numbers),
        # spec/budget.md BUDGET-7, BUDGET-8: each cadence the run replayed at, and what it bought;
        # BUDGET-11, BUDGET-13: the loop check's and the agreement's intervals with it (None in runs
        # of earlier versions).
        "cadences": [{"generation": r["generation"], "step": r["step"], "reason": r["reason"],
                      **{k: r["evidence"].get(k) for k in ("interval_steps", "lanes", "cycle_steps", "share",
                                                           "overhead_budget", "status", "loop_check_steps",
                                                           "agreement_interval_steps")}}
                     for r in view.records if r["kind"] == ReportKind.CADENCE],
    }


def _loop_check_off(records: Sequence[dict[str, Any]]) -> str | None:
    """LAYOUT-3: why the last attempt's layout had the loop check off (its restart report), or None."""
    starts = [r for r in records if r["kind"] == ReportKind.RESTART and isinstance(r.get("evidence"), dict)]
    off = starts[-1]["evidence"].get("loop_check_off") if starts else None
    return off if isinstance(off, str) else None


def parts_off(records: Sequence[dict[str, Any]], attempts: dict[int, int]) -> list[dict[str, Any]]:
    """spec/guard.md GUARD-8: every part of scout switched off after an error of its own, by
    attempt (a restarted attempt starts with every part on), from its ``internal_error`` reports:
    the step it is off from, where it failed first and with what."""
    found: dict[tuple[int, str], dict[str, Any]] = {}
    for record in records:
        if record["kind"] != ReportKind.INTERNAL_ERROR:
            continue
        evidence = record["evidence"]
        key = (attempts[id(record)], str(evidence.get("part", "?")))
        if key in found:
            found[key]["ranks"] = sorted({*found[key]["ranks"], *record["ranks"]})
            continue
        found[key] = {"attempt": key[0], "part": key[1], "off_step": evidence.get("off_step"), "step": record["step"],
                      "ranks": list(record["ranks"]),
                      "error": f"{evidence.get('error_type', '?')}: {evidence.get('message', '')}",
                      "consequence": evidence.get("consequence", "")}
    return list(found.values())


def _exclude_hosts(run_dir: Path) -> list[str]:
    path = run_dir / "exclude_hosts.txt"
    if not path.is_file():
        return []
    with path.open("rb") as file:
        return file.read(1 << 20).decode("utf-8", "replace").split()


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def summary_text(view: RunView) -> str:
    data = summary_json(view)
    lines = [f"scout report: {view.run_dir}  ({view.world_size} ranks, up to step {view.last_step})", ""]
    if view.faults:
        lines.append(f"{'kind':<16} {'ranks':<10} {'hosts':<18} {'step':>6}  {'gen':>3}  reason")
        for r in view.faults:
            lines.append(f"{r['kind']:<16} {str(r['ranks']):<10} {','.join(r['hosts']) or '-':<18} "
                         f"{r['step'] if r['step'] is not None else '-':>6}  {r['generation']:>3}  {r['reason']}")
    elif view.unclean or view.skipped:
        lines.append("no fault reported, but the run did not end cleanly (below)")
    else:
        lines.append("no fault reported")
    unchecked = [r for r in view.records if r["kind"] == ReportKind.UNCHECKED]
    if unchecked:
        last = unchecked[-1]["evidence"]
        lines.append(f"{len(unchecked)} replay(s) could not be checked (not corruption; no promotion in their cycle); "
                     f"last: {_clip(str(last.get('detail', '')), 160)}")
    if data["parts_off"]:  # GUARD-8: what scout stopped doing, and why
        lines += ["", "scout parts off after errors of their own (training went on; spec/guard.md):"]
        for part in data["parts_off"]:
            lines.append(f"  {part['part']:<16} from step {part['off_step']} (attempt {part['attempt']}): failed on "
                         f"rank(s) {part['ranks']} at step {part['step']}: {_clip(part['error'], 100)}")
    if data["loop_timing"] is not None:
        lines += ["", *loop_timing_lines(data["loop_timing"])]
    for cadence in data["cadences"]:
        share = "" if cadence["share"] is None else (f", scout's work {100 * cadence['share']:.2f} % of a step "
                                                     f"(budget {100 * cadence['overhead_budget']:g} %)")
        intervals = "" if cadence["loop_check_steps"] is None else f", a loop check every {cadence['loop_check_steps']} steps"
        if cadence["agreement_interval_steps"] is not None:
            intervals += f", an agreement on scout's own failures every {cadence['agreement_interval_steps']} steps"
        lines.append(f"replay cadence from step {cadence['step']} ({cadence['reason']}): {cadence['lanes']} layer(s) "
                     f"every {cadence['interval_steps']} steps, a cycle (SDC bound) of {cadence['cycle_steps']} steps"
                     f"{share}{intervals}{'' if cadence['status'] == 'within' else ' -- ' + str(cadence['status'])}")
    lines.append("")
    for restart in data["restarts"]:  # numbered as the picture numbers attempts (attempt_numbers)
        what = (start_phrase(restart["reason"], restart["step"], restart["choice"], restart["failure"], restart["lost"])
                if restart["reason"] in ATTEMPT_STARTS else f"stopped by policy ({restart['reason']})")
        lines.append(f"attempt {restart['attempt']}: {what}")
    lines += [end_phrase(end) for end in view.unclean]  # OPS-13
    if view.skipped:  # OPS-12
        lines.append(f"{view.skipped} line(s) of {reports.REPORTS_FILE} skipped: torn (a crash or a full disk) or not "
                     f"{reports.SCHEMA} records")
    if data["checkpoints"]:
        lines.append("")
        lines.append("checkpoints: " + ", ".join(f"{c['checkpoint']} {c['trust']}" for c in data["checkpoints"]))
    lines.append(f"restore would use: {data['restore_candidate'] or 'no recovery-verified checkpoint'}")
    if data["exclude_hosts"]:
        lines.append(f"hosts to exclude: {', '.join(data['exclude_hosts'])}")
    if view.manifest_problem:
        lines.append(f"manifest: {view.manifest_problem}")
    return "\n".join(lines) + "\n"
