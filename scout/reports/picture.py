"""The picture of a run: one panel per attempt (ranks down, steps across) and a wall-time strip
below them. ``scout report RUN_DIR`` writes it beside the reports.

What each panel shows, for the attempt (from one start record to the next) it is titled with: how the
attempt began (a fresh start, or the checkpoint it restored and why) and how it ended (finished,
stopped by a fault policy, restarts spent, or no closing record: killed or interrupted); each
fault where it struck and whom it named, with a count when the same finding repeats; confirmed
stragglers as bars from confirmation to recovery labelled with their kind and ratio; replays that
could not be checked; and each checkpoint the attempt captured, coloured by its final trust and
labelled with its whole trust history. Below the panels, when ``run_dir/timing.jsonl`` holds loop
checks (spec/replay.md LOOP-6), a strip of each rank's loop performance ratio over the steps with
the test's slow ratio marked (for many ranks, only those ever above it and each check's median:
:func:`scout.reports.loop_timing.loop_series`). Attempts get their own panels because a restart resumes
at an earlier step: on one step axis a quarantined checkpoint and the verified one that replaced
it at the same step would overprint. The wall-time strip puts every report at its time, and draws
each hang from when its rank fell idle to when it was reported, so a 40 s hang has a length.

matplotlib is imported here only (the ``report`` extra); nothing else in scout needs it.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from scout.core.compat import assert_never
from scout.core.guards import whole_number
from scout.core.straggler.tracking import StragglerKind
from scout.reports.kinds import (
    ATTEMPT_STARTS,
    SAVE_FAILED,
    FinishedReason,
    MarkStyle,
    ReportKind,
    RestartReason,
)
from scout.reports.loop_timing import LoopSeries, loop_series
from scout.reports.summary import RunView, attempt_numbers, start_phrase

__all__ = ["Attempt", "attempts_of", "render_picture"]

TRUST_COLOURS: Final = {
    "RECOVERY_VERIFIED": "#1a9850", "CANDIDATE": "#fee08b", "CAPTURED": "#999999",
    "QUARANTINED": "#d73027", "SUPERSEDED": "#bbbbbb", "LOST": "#762a83",
}
TRUST_SHORT: Final = {"captured": "cap", "candidate": "cand", "recovery-verified": "verified",
                      "quarantined": "QUAR", "superseded": "sup", "lost": "LOST"}
STRAGGLER_COLOUR: Final = ReportKind.STRAGGLER.mark.colour
RESTORE_COLOUR: Final = ReportKind.RESTART.mark.colour
#: The kinds drawn as a marker on the ranks they name (their mark, from ReportKind).
RANK_KINDS: Final = frozenset(kind.value for kind in ReportKind if kind.mark.style is MarkStyle.RANKS)
#: Stalls: their bar in the wall-time strip runs from when the rank fell idle to the report.
STALL_KINDS: Final = frozenset({ReportKind.HANG.value, ReportKind.DATA_STALL.value, ReportKind.CHECKPOINT_STALL.value})
#: Room above a panel for its checkpoints' vertical labels (points; one inch is 72).
LABEL_PAD_PT: Final = 84
END_COLOUR: Final = "#b2182b"


@attrs.frozen
class Attempt:
    """One attempt (from one start record to the next, :func:`attempt_numbers`) as the reports tell it."""

    generation: int
    records: tuple[dict[str, Any], ...]
    first_step: int
    last_step: int
    began: str  # "fresh start", "restored t0/s40 (sdc failure, verified checkpoint)"
    ended: str  # "finished at step 100", "stopped by on_sdc=restart at step 57", ...
    ended_badly: bool


def _steps(records: Sequence[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if r.get("step") is not None]


def attempts_of(view: RunView) -> list[Attempt]:
    """The run's attempts in order, each with how it began and ended."""
    by_generation: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record, number in zip(view.records, attempt_numbers(view.records), strict=True):
        by_generation[number].append(record)
    if not by_generation:
        by_generation[0] = []
    attempts = []
    for generation in sorted(by_generation):
        records = by_generation[generation]
        steps = _steps(records)
        began, first = "no start record", min(steps, default=0)
        ended, badly = f"no closing record after step {max(steps, default=0)}: killed or interrupted", True
        for record in records:
            kind, reason, evidence = record["kind"], record["reason"], record.get("evidence") or {}
            if kind == ReportKind.RESTART and reason in ATTEMPT_STARTS:
                lost = evidence.get("lost")
                began = start_phrase(reason, record["step"], evidence.get("choice"), evidence.get("failure"),
                                     [str(item) for item in lost] if isinstance(lost, list) else None)
                first = record["step"] or 0
            elif kind == ReportKind.RESTART and reason == RestartReason.EXHAUSTED:
                ended, badly = f"job stopped at step {record['step']}: restarts spent", True
            elif kind == ReportKind.RESTART:
                policy = evidence.get("policy") or f"on_{reason}=restart"
                ended, badly = f"stopped by {policy} at step {record['step']}", True
            elif kind == ReportKind.FINISHED:
                ended, badly = f"finished at step {record['step']}", reason != FinishedReason.CLOSED
                if reason != FinishedReason.CLOSED:
                    ended = f"left at step {record['step']} ({reason})"
        attempts.append(Attempt(generation, tuple(records), first, max([first, *steps]), began, ended, badly))
    return attempts


def _checkpoint_history(view: RunView) -> dict[str, tuple[int | None, list[str]]]:
    """Per checkpoint id (``t0/s40``): the attempt of its first report and its trust history."""
    history: dict[str, tuple[int | None, list[str]]] = {}
    for record, number in zip(view.records, attempt_numbers(view.records), strict=True):
        if record["kind"] != ReportKind.CHECKPOINT.value:
            continue
        checkpoint = (record.get("evidence") or {}).get("checkpoint")
        if not isinstance(checkpoint, str):
            continue
        generation, changes = history.get(checkpoint, (number, []))
        changes.append(TRUST_SHORT.get(record["reason"], record["reason"]))
        history[checkpoint] = (generation, changes)
    return history


def _time_s(record: dict[str, Any]) -> float | None:
    try:
        return datetime.datetime.fromisoformat(str(record["time"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return None


def _idle_s(record: dict[str, Any]) -> float | None:
    """How long the named rank had been idle when an observer reported it."""
    evidence = record.get("evidence") or {}
    peers = evidence.get("peers")
    peers = peers if isinstance(peers, list) else []  # evidence is each kind's own: OPS-12
    idle = [peer.get("idle_s") for peer in peers if isinstance(peer, dict) and peer.get("rank") in record["ranks"]]
    values = [float(value) for value in idle if isinstance(value, (int, float))]
    if values:
        return max(values)
    value = evidence.get("idle_s")
    return float(value) if isinstance(value, (int, float)) else None


def _checkpoint_label(name: str, trust: str, changes: list[str]) -> str:
    return f"{name} " + ">".join(changes or [TRUST_SHORT.get(trust.lower().replace("_", "-"), trust.lower())])


def _label_pad_pt(checkpoints: list[tuple[str, int, str, list[str]]]) -> float:
    """Room above a panel for its checkpoints' upright labels: the longest one (about 4.3 pt per
    character at their font size), at least LABEL_PAD_PT; a panel without checkpoints needs none."""
    if not checkpoints:
        return 6.0
    longest = max(len(_checkpoint_label(name, trust, changes)) for name, _step, trust, changes in checkpoints)
    return max(LABEL_PAD_PT, 12.0 + 4.3 * longest)


def render_picture(view: RunView, path: str | Path) -> Path:
    """Draw ``view`` into ``path`` (PNG or SVG, by its suffix)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    target = Path(path)
    attempts = attempts_of(view)
    ranks = max(view.world_size, 1)
    last = max(view.last_step, 1)
    history = _checkpoint_history(view)
    drawn = [_checkpoints_of(view, attempt, history, len(attempts) == 1) for attempt in attempts]
    heights = [1.3 + 0.42 * ranks + _label_pad_pt(checkpoints) / 72 for checkpoints in drawn]
    # LOOP-6, LOOP-7: a strip per kind of loop check that wrote lines.
    strips = [(kind.value, *loop_series(view.timing, kind.value)) for kind in (StragglerKind.LOOP, StragglerKind.FORWARD)]
    strips = [strip for strip in strips if strip[1]]
    heights.extend(2.4 for _ in strips)
    heights.append(1.2 + 0.25 * len(attempts))
    # Constrained layout spaces each panel by its own decorations (the checkpoint labels above an
    # attempt's panel), so the strips below keep a normal gap instead of the labels' pad.
    figure, axes_list = plt.subplots(len(heights), 1, figsize=(max(9.0, min(20.0, last / 8)), sum(heights)),
                                     gridspec_kw={"height_ratios": heights}, squeeze=False, layout="constrained")
    legend: dict[str, Any] = {}
    for attempt, checkpoints, axes in zip(attempts, drawn, axes_list[:len(attempts), 0], strict=True):
        _attempt_panel(axes, attempt, checkpoints, ranks, last, legend)
    for axes, (kind, series, slow_ratio) in zip(axes_list[len(attempts):-1, 0], strips, strict=True):
        _loop_strip(axes, kind, series, slow_ratio, last)
    _wall_time_strip(axes_list[-1, 0], view, attempts, legend)
    figure.suptitle(f"scout: {view.run_dir.name} -- {len(view.faults)} fault report(s) in {len(attempts)} "
                    f"attempt(s)", fontsize=10)
    if legend:
        axes_list[0, 0].legend(list(legend.values()), list(legend), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                               fontsize=8)
    target.parent.mkdir(parents=True, exist_ok=True)
    # bbox_inches="tight": labels above the panels and the legend beside them are never clipped.
    figure.savefig(target, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return target


def _checkpoints_of(view: RunView, attempt: Attempt, history: dict[str, tuple[int | None, list[str]]],
                    only: bool) -> list[tuple[str, int, str, list[str]]]:
    """The checkpoints drawn in ``attempt``'s panel: (name, step, final trust, trust history). A
    checkpoint belongs to the attempt that first reported it; without a report, to the attempt
    numbered like its gate timeline; with one attempt, to it."""
    drawn = []
    for timeline, step, trust, _reason in view.checkpoints:
        name = f"t{timeline}/s{step}"
        generation, changes = history.get(name, (None, []))
        if only or (timeline if generation is None else generation) == attempt.generation:
            drawn.append((name, step, trust, changes))
    return drawn


def _attempt_panel(axes: Any, attempt: Attempt, checkpoints: list[tuple[str, int, str, list[str]]], ranks: int,
                   last: int, legend: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    # Room on the right for the labels of what happened at the last step.
    axes.set_xlim(0, last * 1.2 + 2)
    axes.set_ylim(ranks - 0.5, -1.6)
    axes.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    axes.set_xlabel("training step")
    axes.grid(axis="x", alpha=0.2)
    # The checkpoints' labels stand above the panel: the title goes above them.
    axes.set_title(f"attempt {attempt.generation}: {attempt.began} -> {attempt.ended}", fontsize=9, loc="left",
                   color=END_COLOUR if attempt.ended_badly else "black", pad=_label_pad_pt(checkpoints))
    # The steps this attempt did not run are shaded, so a restart's gap is visible.
    if attempt.first_step > 0:
        axes.axvspan(0, attempt.first_step, color="#f0f0f0", zorder=0)

    for name, step, trust, changes in checkpoints:
        colour = TRUST_COLOURS.get(trust, "#999999")
        axes.axvline(step, color=colour, linewidth=3, alpha=0.8, zorder=1)
        axes.text(step, -1.65, _checkpoint_label(name, trust, changes), rotation=90, fontsize=6.5, ha="center", va="bottom", clip_on=False)
        legend[f"checkpoint {trust.lower().replace('_', '-')}"] = Line2D([], [], color=colour, linewidth=3)

    markers: Counter[tuple[str, int, int]] = Counter()
    idle_of: dict[tuple[str, int, int], float] = {}
    kinds = {kind.value: kind for kind in ReportKind}
    for record in attempt.records:
        kind, step, evidence = kinds.get(record["kind"]), record["step"], record.get("evidence") or {}
        if kind is None or step is None:
            continue  # a kind of a newer schema revision, or a report without a step
        mark = kind.mark
        if mark.style is MarkStyle.ATTEMPT:
            if record["reason"] == RestartReason.RESTORED:
                axes.plot([step], [-0.75], marker=">", markersize=9, color=RESTORE_COLOUR, zorder=5, linestyle="")
                axes.text(step, -0.75, f"  resumed here (step {step})", fontsize=7, color=RESTORE_COLOUR,
                          va="center")
                legend["resumed from a checkpoint"] = Line2D([], [], marker=">", color=RESTORE_COLOUR, linestyle="")
            elif record["reason"] != RestartReason.STARTED:
                axes.plot([step], [-0.75], marker="s", markersize=8, color=END_COLOUR, zorder=5, linestyle="")
                policy = evidence.get("policy") or f"on_{record['reason']}=restart"
                text = ("job stopped: restarts spent" if record["reason"] == RestartReason.EXHAUSTED
                        else f"stopped by {policy}")
                axes.text(step, -0.75, f"  {text}", fontsize=7, color=END_COLOUR, va="center", fontweight="bold")
                legend["job stopped"] = Line2D([], [], marker="s", color=END_COLOUR, linestyle="")
        elif mark.style is MarkStyle.GROUP:
            members = evidence.get("group_ranks")
            members = [m for m in members if whole_number(m)] \
                if isinstance(members, list) else []
            if members:
                axes.add_patch(Rectangle((step - 0.4, min(members) - 0.4), 0.8, max(members) - min(members) + 0.8,
                                         color=mark.colour, alpha=0.5, zorder=2))
                legend[kind.value.replace("_", " ")] = Rectangle((0, 0), 1, 1, color=mark.colour, alpha=0.5)
        elif mark.style is MarkStyle.STEP:
            axes.plot([step], [-0.35], marker=mark.symbol, markersize=10, color=mark.colour, zorder=3)
            legend[f"replay {kind.value}"] = Line2D([], [], marker=mark.symbol, color=mark.colour, linestyle="",
                                                    markersize=10)
        elif mark.style is MarkStyle.RANKS:
            for rank in record["ranks"]:
                markers[(kind.value, rank, step)] += 1
                if kind.value in STALL_KINDS and (idle := _idle_s(record)) is not None:
                    idle_of[(kind.value, rank, step)] = max(idle, idle_of.get((kind.value, rank, step), 0.0))
        elif mark.style is MarkStyle.CHECKPOINT and record["reason"] == SAVE_FAILED:
            # A save that failed has no manifest entry (GATE-40): a cross above the ranks at its step.
            axes.plot([step], [-0.35], marker="X", markersize=10, color=END_COLOUR, zorder=4, linestyle="")
            axes.text(step, -0.35, "  save failed", fontsize=7, color=END_COLOUR, va="center")
            legend["checkpoint save failed"] = Line2D([], [], marker="X", color=END_COLOUR, linestyle="",
                                                      markersize=10)
        elif mark.style in (MarkStyle.SPAN, MarkStyle.CHECKPOINT, MarkStyle.NONE):
            pass  # stragglers' spans below; checkpoints from the manifest above
        else:
            assert_never(mark.style)
    for (kind_value, rank, step), count in markers.items():
        mark = ReportKind(kind_value).mark
        marker, colour = mark.symbol, mark.colour
        axes.plot([step], [rank], marker=marker, markersize=13, color=colour, zorder=4, linestyle="")
        notes = [f"x{count}"] if count > 1 else []
        if (kind_value, rank, step) in idle_of:
            notes.append(f"idle {idle_of[(kind_value, rank, step)]:.0f} s")
        if notes:
            axes.text(step, rank, "   " + ", ".join(notes), fontsize=7, va="center", color=colour, zorder=5)
        legend[kind_value.replace("_", " ")] = Line2D([], [], marker=marker, color=colour, linestyle="", markersize=10)
    if attempt.ended_badly and not any(r["kind"] == ReportKind.RESTART and r["reason"] not in ATTEMPT_STARTS
                                       for r in attempt.records):
        left = [r["reason"] for r in attempt.records if r["kind"] == ReportKind.FINISHED]
        axes.plot([attempt.last_step], [-0.75], marker="s", markersize=8, color=END_COLOUR, zorder=5, linestyle="")
        axes.text(attempt.last_step, -0.75, f"  left: {left[-1]}" if left else "  no closing record", fontsize=7,
                  color=END_COLOUR, va="center", fontweight="bold" if left else "normal")
    _stragglers(axes, attempt, legend, Line2D)


def _stragglers(axes: Any, attempt: Attempt, legend: dict[str, Any], line: Any) -> None:
    """A bar per confirmed straggler, from its confirmation to its recovery (or the attempt's
    end), labelled with its kind and its ratio to the group's centre."""
    open_since: dict[tuple[int, str], tuple[int, float | None]] = {}
    spans: list[tuple[int, str, int, int, float | None]] = []
    for record in attempt.records:
        if record["kind"] != ReportKind.STRAGGLER.value or record["step"] is None:
            continue
        recovered = record["reason"].startswith("recovered")
        flavour = record["reason"].removeprefix("recovered-").removesuffix("-slow")
        ratio = (record.get("evidence") or {}).get("performance_ratio")
        for rank in record["ranks"]:
            key = (rank, flavour)
            if recovered and key in open_since:
                start, confirmed_ratio = open_since.pop(key)
                spans.append((rank, flavour, start, record["step"], confirmed_ratio))
            elif not recovered:
                open_since.setdefault(key, (record["step"], ratio if isinstance(ratio, (int, float)) else None))
    spans += [(rank, flavour, start, attempt.last_step, ratio) for (rank, flavour), (start, ratio) in open_since.items()]
    for rank, flavour, start, end, ratio in spans:
        axes.plot([start, max(end, start + 0.5)], [rank + 0.27, rank + 0.27], color=STRAGGLER_COLOUR, linewidth=4,
                  zorder=3)
        label = f"{flavour}-slow" + (f" x{ratio:.2f}" if ratio is not None else "")
        axes.text(start, rank + 0.27, f" {label}", fontsize=7, color=STRAGGLER_COLOUR, va="bottom")
    if spans:
        legend["straggler (confirmed)"] = line([], [], color=STRAGGLER_COLOUR, linewidth=4)


def _loop_strip(axes: Any, kind: str, series: Sequence[LoopSeries], slow_ratio: float | None, last: int) -> None:
    """LOOP-6: each rank's loop (or forward, LOOP-7) performance ratio at each check (one run per
    attempt), the slow ratio as a dashed line; a rank above it at many checks is the one the
    test watches."""
    axes.set_xlim(0, last * 1.2 + 2)
    axes.set_xlabel("training step")
    axes.set_ylabel(f"{kind} ratio", fontsize=8)
    axes.grid(alpha=0.2)
    what = "loop time" if kind == StragglerKind.LOOP else "live forward time"
    axes.set_title(f"{kind} checks: each rank's {what} / the group's centre (timing.jsonl)", fontsize=9, loc="left")
    if slow_ratio is not None:
        axes.axhline(slow_ratio, color=STRAGGLER_COLOUR, linestyle="--", linewidth=1)
        axes.text(last * 1.2 + 1, slow_ratio, f"slow ratio {slow_ratio:.2f}", fontsize=7, color=STRAGGLER_COLOUR,
                  ha="right", va="bottom")
    colours: dict[int, Any] = {}
    for line in series:
        for index, run in enumerate(line.runs):
            steps, ratios = [s for s, _ in run], [r for _, r in run]
            style = {"color": "#333333", "linestyle": ":", "linewidth": 1.5} if line.rank is None else (
                {"color": colours[line.rank]} if line.rank in colours else {})
            drawn = axes.plot(steps, ratios, marker=".", markersize=4, label=line.label if index == 0 else None,
                              **style)
            if line.rank is not None:
                colours[line.rank] = drawn[0].get_color()
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, ncol=1 + len(series) // 9)


def _wall_time_strip(axes: Any, view: RunView, attempts: Sequence[Attempt], legend: dict[str, Any]) -> None:
    """Every report at its wall time, one row per attempt; hangs as bars from when their rank
    fell idle to when they were reported."""
    from matplotlib.lines import Line2D

    times = [t for r in view.records if (t := _time_s(r)) is not None]
    axes.set_yticks(range(len(attempts)), [f"attempt {a.generation}" for a in attempts])
    axes.set_ylim(len(attempts) - 0.5, -0.5)
    axes.set_xlabel("wall time (s)")
    axes.grid(axis="x", alpha=0.2)
    if not times:
        axes.text(0.5, 0.5, "no timed reports", transform=axes.transAxes, ha="center", fontsize=8)
        return
    # The origin is the earliest moment shown: the first report, or a stall that began before it.
    origin = min([*times, *(t - idle for r in view.records if (t := _time_s(r)) is not None
                            and r["kind"] in STALL_KINDS and (idle := _idle_s(r)))])
    for row, attempt in enumerate(attempts):
        stamped = [(t - origin, r) for r in attempt.records if (t := _time_s(r)) is not None]
        if not stamped:
            continue
        axes.plot([min(t for t, _ in stamped), max(t for t, _ in stamped)], [row, row], color="#cccccc", linewidth=1,
                  zorder=1)
        for at, record in stamped:
            kind = record["kind"]
            if kind in RANK_KINDS:
                marker, colour = ReportKind(kind).mark.symbol, ReportKind(kind).mark.colour
                idle = _idle_s(record) if kind in STALL_KINDS else None
                if idle:
                    axes.plot([at - idle, at], [row, row], color=colour, linewidth=5, alpha=0.5, zorder=2)
                    axes.text(at - idle, row - 0.25, f"{kind} {record['ranks']} idle {idle:.0f} s", fontsize=7,
                              color=colour)
                    legend["stall (wall time)"] = Line2D([], [], color="#d73027", linewidth=5, alpha=0.5)
                axes.plot([at], [row], marker=marker, markersize=8, color=colour, linestyle="", zorder=3)
            elif kind == ReportKind.STRAGGLER.value:
                axes.plot([at], [row], marker="|", markersize=10, color=STRAGGLER_COLOUR, linestyle="", zorder=3)
            elif kind == ReportKind.RESTART and record["reason"] not in ATTEMPT_STARTS:
                axes.plot([at], [row], marker="s", markersize=7, color=END_COLOUR, linestyle="", zorder=3)
            elif kind in (ReportKind.RESTART, ReportKind.FINISHED):
                axes.plot([at], [row], marker="o", markersize=4, color="#333333", linestyle="", zorder=3)
