"""The picture of a run: ranks down, steps across -- where each fault struck, which ranks it
named, stragglers while they lasted, unchecked replays, checkpoints coloured by their final
trust, and the attempts a restart began. ``scout report RUN_DIR`` writes it beside the reports.

matplotlib is imported here only (the ``report`` extra); nothing else in scout needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from scout.core.compat import assert_never
from scout.job.summary import RunView
from scout.reports.kinds import MarkStyle, ReportKind

__all__ = ["render_picture"]

TRUST_COLOURS: Final = {
    "RECOVERY_VERIFIED": "#1a9850", "CANDIDATE": "#fee08b", "CAPTURED": "#999999",
    "QUARANTINED": "#d73027", "SUPERSEDED": "#dddddd",
}


def render_picture(view: RunView, path: str | Path) -> Path:
    """Draw ``view`` into ``path`` (PNG or SVG, by its suffix)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    target = Path(path)
    ranks = max(view.world_size, 1)
    last = max(view.last_step, 1)
    figure, axes = plt.subplots(figsize=(max(8.0, min(20.0, last / 8)), 1.6 + 0.45 * ranks))
    axes.set_xlim(0, last + 1)
    axes.set_ylim(ranks - 0.5, -1.5)
    axes.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    axes.set_xlabel("training step")
    axes.grid(axis="x", alpha=0.2)
    legend: dict[str, Any] = {}

    for timeline, step, trust, _reason in view.checkpoints:
        colour = TRUST_COLOURS.get(trust, "#999999")
        axes.axvline(step, color=colour, linewidth=3, alpha=0.8, zorder=1)
        axes.text(step, -1.1, f"t{timeline}/s{step}", rotation=90, fontsize=7, ha="center", va="bottom")
        legend[f"checkpoint {trust.lower().replace('_', '-')}"] = Line2D([], [], color=colour, linewidth=3)

    kinds = {kind.value: kind for kind in ReportKind}
    for record in view.records:
        kind, step = kinds.get(record["kind"]), record["step"]
        if kind is None or step is None:
            continue
        mark = kind.mark
        name = kind.value.replace("_", " ")
        if mark.style is MarkStyle.ATTEMPT:
            if record["reason"] == "restored":
                axes.axvline(step, color=mark.colour, linestyle="--", linewidth=1, zorder=2)
                axes.text(step, ranks - 0.6, f" attempt {record['generation']} from here", fontsize=7,
                          color=mark.colour)
                legend["restart (restored)"] = Line2D([], [], color=mark.colour, linestyle="--")
        elif mark.style is MarkStyle.GROUP:
            members = record["evidence"].get("group_ranks", [])
            if members:
                axes.add_patch(Rectangle((step - 0.4, min(members) - 0.4), 0.8, max(members) - min(members) + 0.8,
                                         color=mark.colour, alpha=0.5, zorder=2))
                legend[name] = Rectangle((0, 0), 1, 1, color=mark.colour, alpha=0.5)
        elif mark.style is MarkStyle.STEP:
            axes.plot([step], [-0.8], marker=mark.symbol, markersize=12, color=mark.colour, zorder=3)
            legend[f"replay {name}"] = Line2D([], [], marker=mark.symbol, color=mark.colour, linestyle="",
                                              markersize=12)
        elif mark.style is MarkStyle.RANKS:
            for rank in record["ranks"]:
                axes.plot([step], [rank], marker=mark.symbol, markersize=13, color=mark.colour, zorder=4,
                          linestyle="")
            legend[name] = Line2D([], [], marker=mark.symbol, color=mark.colour, linestyle="", markersize=10)
        elif mark.style in (MarkStyle.SPAN, MarkStyle.CHECKPOINT, MarkStyle.NONE):
            pass  # spans below, checkpoints from the manifest above
        else:
            assert_never(mark.style)

    _stragglers(axes, view, last, legend, Line2D)
    axes.set_title(f"scout: {view.run_dir.name} -- {len(view.faults)} fault report(s)", fontsize=10)
    if legend:
        axes.legend(list(legend.values()), list(legend), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target


def _stragglers(axes: Any, view: RunView, last: int, legend: dict[str, Any], line: Any) -> None:
    """A bar per confirmed straggler, from its confirmation to its recovery (or the end)."""
    open_since: dict[tuple[int, str], int] = {}
    spans: list[tuple[int, int, int]] = []
    colour = ReportKind.STRAGGLER.mark.colour
    for record in view.records:
        if record["kind"] != ReportKind.STRAGGLER or record["step"] is None:
            continue
        recovered = record["reason"].startswith("recovered")
        flavour = record["reason"].removeprefix("recovered-").removesuffix("-slow")
        for rank in record["ranks"]:
            key = (rank, flavour)
            if recovered and key in open_since:
                spans.append((rank, open_since.pop(key), record["step"]))
            elif not recovered:
                open_since.setdefault(key, record["step"])
    spans += [(rank, start, last) for (rank, _), start in open_since.items()]
    for rank, start, end in spans:
        axes.plot([start, max(end, start + 0.5)], [rank + 0.25, rank + 0.25], color=colour, linewidth=4, zorder=3)
    if spans:
        legend["straggler (confirmed)"] = line([], [], color=colour, linewidth=4)
