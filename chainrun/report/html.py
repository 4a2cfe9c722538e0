"""The timeline as one self-contained HTML page: inline SVG, inline CSS, no script, no external URL.

Pure Python (no matplotlib), so `chainrun report --html` works wherever chainrun does, e.g.
on a login node without a plotting stack; the page opens offline in any browser.
"""

from __future__ import annotations

import time
from html import escape

from chainrun.durations import format_duration as dur
from chainrun.report.plot import GAP_COLOUR, OUTCOME_COLOURS, OVERLAP_COLOUR, PREDICTED_COLOUR, WAIT_COLOUR
from chainrun.report.timeline import Timeline

WIDTH, LEFT, RIGHT, ROW, TOP = 900, 70, 80, 30, 40


def timeline_svg(tl: Timeline) -> str:
    rows = sorted({b.idx for b in tl.bars} | {w.idx for w in tl.waits} | {s.idx for s in tl.spans}) or [0]
    y_of = {idx: TOP + i * ROW for i, idx in enumerate(rows)}
    height = TOP + len(rows) * ROW + 40
    span = tl.t1 - tl.t0
    plot_w = WIDTH - LEFT - RIGHT
    x = lambda t: LEFT + (t - tl.t0) / span * plot_w  # noqa: E731
    out = [f'<svg width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="timeline of chain {escape(tl.chain_id)}" '
           'font-family="sans-serif" font-size="11">',
           '<defs><pattern id="wait" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="' + WAIT_COLOUR + '"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#999" stroke-width="1.5"/></pattern></defs>']
    # time axis: about 8 ticks
    step = _nice_step(span / 8)
    t = 0.0
    while t <= span + 1e-9:
        xx = x(tl.t0 + t)
        out.append(f'<line class="tick" x1="{xx:.1f}" y1="{TOP - 12}" x2="{xx:.1f}" y2="{height - 30}" stroke="#eee"/>'
                   f'<text x="{xx:.1f}" y="{height - 16}" text-anchor="middle" fill="#666">+{dur(t)}</text>')
        t += step
    for s in tl.spans:
        colour = GAP_COLOUR if s.kind == "gap" else OVERLAP_COLOUR
        sign = "+" if s.kind == "gap" else "-"
        x0, x1 = x(s.start), x(s.end)
        out.append(f'<rect class="{s.kind}" data-seconds="{s.seconds:.0f}" x="{x0:.1f}" y="{TOP - 12}" '
                   f'width="{max(x1 - x0, 1.5):.1f}" height="{len(rows) * ROW + 8}" fill="{colour}" opacity="0.3">'
                   f'<title>{s.kind} before segment {s.idx}: {dur(s.seconds)}</title></rect>'
                   f'<text x="{(x0 + x1) / 2:.1f}" y="{TOP - 16}" text-anchor="middle" fill="{colour}" '
                   f'font-weight="bold">{sign}{dur(s.seconds)}</text>')
    for idx in rows:
        out.append(f'<text x="{LEFT - 8}" y="{y_of[idx] + 4}" text-anchor="end">seg {idx}</text>')
    for w in tl.waits:
        y = y_of[w.idx]
        if w.until > w.since:
            out.append(f'<rect class="wait" x="{x(w.since):.1f}" y="{y - 4}" width="{max(x(w.until) - x(w.since), 1):.1f}" '
                       f'height="8" fill="url(#wait)" stroke="#999" stroke-width="0.5"><title>segment {w.idx} waited '
                       f'{dur(w.until - w.since)} in the queue</title></rect>')
        if w.predicted_wait_s is not None:
            px = x(w.since + w.predicted_wait_s)
            out.append(f'<path class="predicted" d="M{px:.1f},{y - 6} l5,6 l-5,6 l-5,-6 z" fill="{PREDICTED_COLOUR}">'
                       f'<title>segment {w.idx}: predicted wait {dur(w.predicted_wait_s)}, actual '
                       f'{dur(w.actual_wait_s)}</title></path>')
    for b in tl.bars:
        y = y_of[b.idx]
        x0, x1 = x(b.start), x(b.end)
        colour = OUTCOME_COLOURS.get(b.outcome, "#9d9d9d")
        out.append(f'<rect class="segment {escape(b.outcome)}" x="{x0:.1f}" y="{y - 9}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="18" fill="{colour}" stroke="#000" stroke-width="0.6"><title>segment {b.idx} '
                   f'(job {escape(b.job_id or "-")}): {escape(b.outcome)}, ran {dur(b.end - b.start)}</title></rect>'
                   f'<text x="{x1 + 3:.1f}" y="{y + 4}" fill="#444" font-size="10">{escape(b.outcome)}</text>')
    if tl.rates:  # the throughput line: each segment's steps/s, scaled into the band above the rows
        top = max(r.steps_per_s for r in tl.rates)
        for r in tl.rates:
            yy = TOP - 12 - 14 * r.steps_per_s / top
            out.append(f'<line class="throughput" x1="{x(r.start):.1f}" y1="{yy:.1f}" x2="{x(r.end):.1f}" y2="{yy:.1f}" '
                       f'stroke="#1f4e9d" stroke-width="2"><title>segment {r.idx}: {r.steps_per_s:.3g} steps/s'
                       + (f", {r.samples_per_s:.3g} samples/s" if r.samples_per_s else "")
                       + (f" on {escape(','.join(r.nodes))}" if r.nodes else "") + '</title></line>')
    out.append("</svg>")
    return "\n".join(out)


def _nice_step(raw: float) -> float:
    for s in (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800):
        if s >= raw:
            return float(s)
    return 604800.0 * max(1, round(raw / 604800))


_CSS = """
body{font-family:sans-serif;margin:2em;color:#222;max-width:960px}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}
.legend span{display:inline-block;margin-right:1.2em;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
"""


def html_page(tl: Timeline, summary: dict, segments: list[dict]) -> str:
    """The whole page: title, summary numbers, the SVG, a legend and the segment table."""
    rows = [("status", summary["status"].lower() + (f" ({summary['reason']})" if summary["reason"] else "")),
            ("policy", summary["policy"]), ("cluster", summary["cluster"]),
            ("progress", f"{dur(summary['done_s'])} of {dur(summary['total_s'])}"),
            ("segments", f"{summary['segments']} ({summary['segments_ran']} ran, {summary['retries']} retries)"),
            ("interruption", f"{dur(summary['interruption_s'])} in {summary['gaps']} gap(s), longest "
                             f"{dur(summary['longest_gap_s'])}"),
            ("overlap", f"{dur(summary['overlap_s'])} in {summary['overlaps']} hand-over(s)"),
            ("queue wait", f"{dur(summary['wait_total_s'])} in total, longest {dur(summary['wait_max_s'])}")]
    if summary.get("prediction_mae_s") is not None:
        rows.append(("prediction error", f"{dur(summary['prediction_mae_s'])} mean absolute, "
                                          f"{len(summary['predicted_vs_actual'])} segment(s)"))
    seen = sorted({b.outcome for b in tl.bars})
    legend = [(OUTCOME_COLOURS.get(k, "#9d9d9d"), f"segment: {k}") for k in seen]
    legend += [(WAIT_COLOUR, "queue wait"), (GAP_COLOUR, "gap (interruption)"),
              (OVERLAP_COLOUR, "overlap"), (PREDICTED_COLOUR, "predicted start")]
    seg_rows = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
            s["idx"], s["job_id"] or "-", s["outcome"] or s["phase"].lower(), dur(s["time_limit_s"]), dur(s["wait_s"]),
            dur(s["predicted_wait_s"]), "-" if s["gap_s"] is None else dur(s["gap_s"]), s["reason"])) + "</tr>"
        for s in segments)
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>chainrun: {escape(tl.chain_id)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{escape(tl.chain_id)}</h1>
<table>{''.join(f'<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>' for k, v in rows)}</table>
{timeline_svg(tl)}
<p class="legend">{''.join(f'<span><i style="background:{c};opacity:{0.5 if c in (GAP_COLOUR, OVERLAP_COLOUR) else 1}"></i>{escape(n)}</span>' for c, n in legend)}</p>
<table><tr><th>seg</th><th>job</th><th>outcome</th><th>limit</th><th>wait</th><th>predicted</th><th>gap</th><th>note</th></tr>
{seg_rows}</table>
<p style="color:#888;font-size:11px">generated by chainrun on {escape(generated)}</p>
</body></html>
"""
