"""The picture of a run: ranks down, steps across -- where each fault struck, which ranks it
named, stragglers while they lasted, unchecked replays, checkpoints coloured by their final
trust, and the attempts a restart began. ``scout report RUN_DIR`` writes it beside the reports.

matplotlib is imported here only (the ``report`` extra); nothing else in scout needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from scout.job.summary import RunView

__all__ = ["render_picture"]

TRUST_COLOURS: Final = {
    "RECOVERY_VERIFIED": "#1a9850", "CANDIDATE": "#fee08b", "CAPTURED": "#999999",
    "QUARANTINED": "#d73027", "SUPERSEDED": "#dddddd",
}
FAULT_MARKERS: Final = {  # kind -> (marker, colour)
    "hang": ("X", "#d73027"), "data_stall": ("X", "#fc8d59"), "checkpoint_stall": ("X", "#91bfdb"),
    "desync": ("D", "#7b3294"), "unresponsive": ("v", "#4d4d4d"), "sdc": ("*", "#c51b7d"),
    "observer_failure": ("x", "#000000"),
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

    for record in view.records:
        kind, step = record["kind"], record["step"]
        if step is None:
            continue
        evidence = record["evidence"]
        if kind == "restart" and record["reason"] == "restored":
            axes.axvline(step, color="#2166ac", linestyle="--", linewidth=1, zorder=2)
            axes.text(step, ranks - 0.6, f" attempt {record['generation']} from here", fontsize=7, color="#2166ac")
            legend["restart (restored)"] = Line2D([], [], color="#2166ac", linestyle="--")
        elif kind == "group_stall":
            members = evidence.get("group_ranks", [])
            if members:
                axes.add_patch(Rectangle((step - 0.4, min(members) - 0.4), 0.8, max(members) - min(members) + 0.8,
                                             color="#fdae61", alpha=0.5, zorder=2))
                legend["group stall"] = Rectangle((0, 0), 1, 1, color="#fdae61", alpha=0.5)
        elif kind == "unchecked":
            axes.plot([step], [-0.8], marker="|", markersize=12, color="#f46d43", zorder=3)
            legend["replay unchecked"] = Line2D([], [], marker="|", color="#f46d43", linestyle="", markersize=12)
        elif kind in FAULT_MARKERS:
            marker, colour = FAULT_MARKERS[kind]
            for rank in record["ranks"]:
                axes.plot([step], [rank], marker=marker, markersize=13, color=colour, zorder=4, linestyle="")
            legend[kind.replace("_", " ")] = Line2D([], [], marker=marker, color=colour, linestyle="", markersize=10)

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
    for record in view.records:
        if record["kind"] != "straggler" or record["step"] is None:
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
        axes.plot([start, max(end, start + 0.5)], [rank + 0.25, rank + 0.25], color="#542788", linewidth=4, zorder=3)
    if spans:
        legend["straggler (confirmed)"] = line([], [], color="#542788", linewidth=4)
