"""The timeline as a PNG (matplotlib, Agg backend, imported only here and only when asked)."""

from __future__ import annotations

from pathlib import Path

from chainrun.errors import UsageError
from chainrun.report.timeline import Timeline

OUTCOME_COLOURS = {
    "continue": "#4c78a8", "handoff": "#54a0a0", "done": "#59a14f", "crash": "#b2182b",
    "cancelled": "#9d9d9d", "skipped": "#c7c7c7", "running": "#9ecae9", "?": "#9d9d9d",
}
GAP_COLOUR = "#d62728"
OVERLAP_COLOUR = "#f5a623"
WAIT_COLOUR = "#d9d9d9"
PREDICTED_COLOUR = "#6a3d9a"


def _scale(tl: Timeline) -> tuple[float, str]:
    span = tl.t1 - tl.t0
    if span <= 2 * 3600:
        return 60.0, "minutes"
    if span <= 3 * 86400:
        return 3600.0, "hours"
    return 86400.0, "days"


THROUGHPUT_COLOUR = "#1f4e9d"


def render_png(tl: Timeline, path: str | Path, *, dpi: int = 100) -> dict:
    """Draw ``tl`` into ``path``; returns what was drawn (counts, artists, pixel size)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.lines import Line2D
    except ImportError:
        raise UsageError("the PNG timeline needs matplotlib", hint="pip install 'chainrun[plot]', or use --html") from None
    unit, unit_name = _scale(tl)
    x = lambda t: (t - tl.t0) / unit  # noqa: E731
    rows = sorted({b.idx for b in tl.bars} | {w.idx for w in tl.waits} | {s.idx for s in tl.spans}) or [0]
    ypos = {idx: i for i, idx in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.45 * len(rows)), dpi=dpi, layout="constrained")
    drawn: dict[str, list] = {"bars": [], "waits": [], "gaps": [], "overlaps": [], "predicted": [], "labels": []}
    try:
        for w in tl.waits:
            if w.until > w.since:
                drawn["waits"].append(ax.barh(ypos[w.idx], x(w.until) - x(w.since), left=x(w.since), height=0.3,
                                              color=WAIT_COLOUR, edgecolor="#999999", hatch="///", linewidth=0.5))
            if w.predicted_wait_s is not None:
                (m,) = ax.plot([x(w.since + w.predicted_wait_s)], [ypos[w.idx]], marker="D", markersize=6,
                               color=PREDICTED_COLOUR, linestyle="none")
                drawn["predicted"].append(m)
        for b in tl.bars:
            drawn["bars"].append(ax.barh(ypos[b.idx], max(x(b.end) - x(b.start), 1e-6), left=x(b.start), height=0.6,
                                         color=OUTCOME_COLOURS.get(b.outcome, "#9d9d9d"), edgecolor="black",
                                         linewidth=0.6, hatch=".." if b.outcome == "running" else None))
            drawn["labels"].append(ax.text(x(b.end), ypos[b.idx] + 0.38, f" {b.outcome}", fontsize=7, va="center",
                                           ha="left", color="#444444"))
        for s in tl.spans:
            colour = GAP_COLOUR if s.kind == "gap" else OVERLAP_COLOUR
            patch = ax.axvspan(x(s.start), x(s.end), color=colour, alpha=0.3, linewidth=0, zorder=0.5)
            drawn["gaps" if s.kind == "gap" else "overlaps"].append(patch)
            sign = "+" if s.kind == "gap" else "-"
            ax.text((x(s.start) + x(s.end)) / 2, -0.75, f"{sign}{_short(s.seconds)}", fontsize=7, ha="center",
                    color=colour, fontweight="bold")
        if tl.rates:  # the throughput line: each segment's steps/s over its bar, on its own axis
            ax2 = ax.twinx()
            for r in tl.rates:
                (ln,) = ax2.plot([x(r.start), x(r.end)], [r.steps_per_s, r.steps_per_s], color=THROUGHPUT_COLOUR,
                                 linewidth=1.6)
                drawn.setdefault("throughput", []).append(ln)
            ax2.set_ylim(0, max(r.steps_per_s for r in tl.rates) * 1.25)
            ax2.set_ylabel("steps/s", fontsize=8, color=THROUGHPUT_COLOUR)
            ax2.tick_params(axis="y", labelsize=7, colors=THROUGHPUT_COLOUR)
        ax.set_yticks(range(len(rows)), [f"seg {i}" for i in rows])
        ax.set_ylim(len(rows) - 0.4, -1.1)
        ax.set_xlim(0, max(x(tl.t1) * 1.06, 1e-3))
        ax.set_xlabel(f"{unit_name} since the chain was created")
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{tl.chain_id} ({tl.policy}, {tl.status.lower()})", loc="left", fontsize=10)
        handles = [Patch(color=OUTCOME_COLOURS[k], label=k) for k in sorted({b.outcome for b in tl.bars}) if k in OUTCOME_COLOURS]
        handles += [Patch(facecolor=WAIT_COLOUR, edgecolor="#999999", hatch="///", label="queue wait"),
                    Patch(color=GAP_COLOUR, alpha=0.3, label="gap (interruption)"),
                    Patch(color=OVERLAP_COLOUR, alpha=0.3, label="overlap")]
        if drawn.get("throughput"):
            handles.append(Line2D([], [], color=THROUGHPUT_COLOUR, label="steps/s"))
        if drawn["predicted"]:
            handles.append(Line2D([], [], marker="D", color=PREDICTED_COLOUR, linestyle="none", label="predicted start"))
        # a figure legend outside every axis: one anchored to the bars' axes covered the steps/s axis's ticks
        fig.legend(handles=handles, fontsize=7, loc="outside right upper", frameon=False)
        path = Path(path)
        fig.savefig(path, dpi=dpi, format="png")  # a PNG whatever the name: `--png t.txt` was an internal error
        width, height = (int(round(v)) for v in fig.get_size_inches() * dpi)
    finally:
        plt.close(fig)
    return {"path": str(path), "width": width, "height": height,
            **{k: len(v) for k, v in drawn.items()}, "artists": drawn}


def _short(seconds: float) -> str:
    from chainrun.durations import format_duration

    return format_duration(abs(seconds))
