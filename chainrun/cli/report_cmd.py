"""`chainrun report`: a chain's timeline as PNG/HTML and its summary numbers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from chainrun.cli.render import console, envelope
from chainrun.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("report", help="Summarise a chain (interruption, overlap, segments, retries) and draw its "
                               "timeline as a PNG or a self-contained HTML page.")(report)


def report(
    chain: Annotated[Optional[str], typer.Argument(metavar="CHAIN", help="A chain id (or a unique prefix, or its name); "
                                                         "without it: one summary row per chain.")] = None,
    png: Annotated[Optional[Path], typer.Option("--png", metavar="FILE", help="Write the timeline picture to this PNG file "
                                                                "(needs matplotlib).")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", metavar="FILE", help="Write a self-contained HTML page "
                                                                  "(inline SVG, no external links).")] = None,
    plain: Annotated[bool, typer.Option("--plain", help="Plain lines instead of a table; the default when the "
                                                        "output is not a terminal.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (a versioned envelope) instead of a table.")] = False,
) -> None:
    from chainrun import paths
    from chainrun.chain.summary import view_chain
    from chainrun.report.timeline import build_timeline, summarize
    from chainrun.state.store import Store

    if (png or html) and not chain:
        raise UsageError("--png and --html draw one chain", hint="name it: chainrun report CHAIN --png timeline.png")
    for target in (png, html):
        if target is not None:
            _check_target(target)
    store = Store(paths.state_db())
    try:
        chains = [store.chain(chain)] if chain else store.chains()
        views = [view_chain(ch, store.segments(ch.id)) for ch in chains]
    finally:
        store.close()
    results = []
    for v in views:
        tl = build_timeline(v)
        results.append((v, tl, summarize(v, tl)))
    files: dict = {}
    if chain:
        v, tl, summ = results[0]
        if png is not None:
            from chainrun.report.plot import render_png

            meta = _atomic(png, lambda tmp: render_png(tl, tmp))
            meta["path"] = str(png)
            files["png"] = {k: val for k, val in meta.items() if k != "artists"}
        if html is not None:
            from chainrun.report.html import html_page

            page = html_page(tl, summ, v.to_dict()["segments_detail"])
            _atomic(html, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
            files["html"] = {"path": str(html), "bytes": len(page.encode())}
    if json_out:
        if chain:
            v, tl, summ = results[0]
            typer.echo(envelope("report", {**summ, "timeline": tl.to_dict(), "files": files}))
        else:
            typer.echo(envelope("report", [s for _, _, s in results]))
        return
    from chainrun.cli import tables

    out = console()
    if not results:
        typer.echo("no chains yet: start one with `chainrun submit SCRIPT --total 72h`")
        return
    lines = plain or not out.is_terminal  # pipes, cron mail, CI logs: stable lines
    if chain:
        s = results[0][2]
        if lines:
            tables.print_lines(out, tables.record([s["chain"], s["status"].lower(), f"cluster={s['cluster']}",
                                                   f"policy={s['policy']}"], out.width))
            for what, value in _detail_rows(s):
                tables.print_lines(out, tables.wrap_text(f"{what}: {value}", out.width, first=tables.INDENT))
        else:
            out.print(_detail(s))
        for kind, info in files.items():
            extra = f" ({info['width']}x{info['height']} px)" if kind == "png" else ""
            tables.print_lines(out, tables.wrap_text(f"{kind}: {info['path']}{extra}", out.width))
    elif lines:
        rows = [s for _, _, s in results]
        tables.print_lines(out, [ln for s in rows for ln in tables.record(_row_tokens(s), out.width)])
    else:
        out.print(_Table([s for _, _, s in results]))


def _check_target(path: Path) -> None:
    parent = path.expanduser().resolve().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {parent} does not exist")
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder")


def _atomic(path: Path, write):
    """Write through a temporary file beside ``path``, then rename: no half-written picture."""
    path = path.expanduser()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        result = write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return result if isinstance(result, dict) else {}


def _detail_rows(s: dict) -> list[tuple[str, str]]:
    """What a chain's report says, as (what, value) pairs: the same for the table and the lines."""
    from chainrun.cli.tables import overlap_error_lines
    from chainrun.durations import format_duration as dur

    rows = [("ERROR", e) for e in overlap_error_lines(s.get("payload_overlaps") or [])]
    if s["reason"]:
        rows.append(("note", s["reason"]))
    rows += [
        ("trained", f"{dur(s['trained_s'])} of {dur(s['total_s'])}"),
        ("segments", f"{s['segments']} ({s['segments_ran']} ran)"),
        ("retries", f"{s['retries']} ({s['crashes']} crash(es))"),
        ("interruption", f"{dur(s['interruption_s'])} in {s['gaps']} gap(s), longest {dur(s['longest_gap_s'])}"),
        ("overlap", f"{dur(s['overlap_s'])} in {s['overlaps']} hand-over(s)"),
        ("queue wait", f"{dur(s['wait_total_s'])} in total, longest {dur(s['wait_max_s'])}"),
    ]
    if s["prediction_mae_s"] is not None:
        rows.append(("predicted wait", f"mean absolute error {dur(s['prediction_mae_s'])} over "
                                       f"{len(s['predicted_vs_actual'])} segment(s)"))
    rows.append(("allocated", f"{dur(s['allocated_s'])} over {dur(s['wall_s'])} wall clock"))
    pace = s.get("pace") or {}
    if pace.get("step") is not None:
        rows.append(("pace", f"step {pace['step']:,.0f}" + (f" of {pace['total_steps']:,.0f}" if pace.get("total_steps") else "")
                     + f", {pace.get('steps_per_s') or 0:.3g} steps/s"
                     + (f", {pace['samples_per_s']:.3g} samples/s" if pace.get("samples_per_s") else "")))
    for r in s.get("throughput") or []:
        rows.append((f"segment {r['segment']}", f"{r['steps_per_s']:.3g} steps/s"
                     + (f", {r['steps']:,.0f} steps" if r.get("steps") is not None else "")
                     + (f" on {','.join(r['nodes'])}" if r.get("nodes") else "")))
    for sh in s.get("shapes") or []:  # elastic chains: which shape each segment took, and why
        rows.append((f"segment {sh['segment']} shape", sh["reason"] or f"{sh['nodes']} nodes"))
    for e in pace.get("excluded") or []:
        rows.append(("excluded", f"{e['node']}: {e.get('why', '')}"))
    for ch in pace.get("changes") or []:
        rows.append(("request change", (f"after segment {ch['after_segment']}: " if ch.get("after_segment") is not None
                                        else "") + ch["what"]))
    return rows


def _detail(s: dict):
    from rich.markup import escape
    from rich.table import Table

    style = {"interruption": "red", "overlap": "yellow", "ERROR": "bold red"}
    t = Table(title=f"{escape(s['chain'])}  {s['status'].lower()}  cluster {escape(s['cluster'])}  policy {s['policy']}",
              title_justify="left", show_header=False)
    t.add_column("what", style="bold", no_wrap=True)
    t.add_column("value", overflow="fold")
    for what, value in _detail_rows(s):
        t.add_row(what, f"[{style[what]}]{escape(value)}[/]" if what in style else escape(value))
    return t


def _row_tokens(s: dict) -> list[str]:
    from chainrun.durations import format_duration as dur

    return [s["chain"], s["status"].lower(), f"cluster={s['cluster']}", f"segments={s['segments']}",
            f"retries={s['retries']}", f"interruption={dur(s['interruption_s'])}", f"gaps={s['gaps']}",
            f"overlap={dur(s['overlap_s'])}", f"overlaps={s['overlaps']}", f"longest_gap={dur(s['longest_gap_s'])}"]


# the order in which the report overview gives way when the terminal is narrow
REPORT_LIST_STEPS = [("longest", "drop"), ("retries", "drop"), ("segs", "drop"), ("overlap", "drop"),
                     ("cluster", "drop")]


class _Table:
    """The report overview, sized when rendered; plain lines if even the narrowest table does not fit."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __rich_console__(self, console, options):
        from rich.markup import escape
        from rich.text import Text

        from chainrun.cli.tables import Column, _table, fit_columns, record
        from chainrun.durations import format_duration as dur

        rs = self.rows
        cols = [
            Column("chain", "chain", [escape(s["chain"]) for s in rs]),
            Column("cluster", "cluster", [escape(s["cluster"]) for s in rs]),
            Column("status", "status", [s["status"].lower() for s in rs]),
            Column("segs", "segs", [str(s["segments"]) for s in rs], justify="right"),
            Column("retries", "retries", [str(s["retries"]) for s in rs], justify="right"),
            Column("gaps", "gaps", [f"{dur(s['interruption_s'])} ({s['gaps']})" for s in rs]),
            Column("overlap", "overlap", [f"{dur(s['overlap_s'])} ({s['overlaps']})" for s in rs]),
            Column("longest", "longest gap", [dur(s["longest_gap_s"]) for s in rs]),
        ]
        cols, _, fits = fit_columns(cols, REPORT_LIST_STEPS, options.max_width)
        if not fits:
            yield Text("\n".join(ln for s in rs for ln in record(_row_tokens(s), options.max_width)))
            return
        yield _table(cols, "chain reports")
