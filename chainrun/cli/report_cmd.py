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
    out = console()
    if not results:
        out.print("no chains yet: start one with `chainrun submit SCRIPT --total 72h`")
        return
    if chain:
        out.print(_detail(results[0][2]))
        for kind, info in files.items():
            extra = f" ({info['width']}x{info['height']} px)" if kind == "png" else ""
            out.print(f"{kind}: {info['path']}{extra}")
    else:
        out.print(_table([s for _, _, s in results]))


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


def _detail(s: dict):
    from rich.table import Table

    from chainrun.durations import format_duration as dur

    t = Table(title=f"{s['chain']}  {s['status'].lower()}  policy {s['policy']}" +
              (f"\n{s['reason']}" if s["reason"] else ""), title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("progress", f"{dur(s['done_s'])} of {dur(s['total_s'])}")
    t.add_row("segments", f"{s['segments']} ({s['segments_ran']} ran)")
    t.add_row("retries", f"{s['retries']} ({s['crashes']} crash(es))")
    t.add_row("interruption", f"[red]{dur(s['interruption_s'])}[/] in {s['gaps']} gap(s), longest {dur(s['longest_gap_s'])}")
    t.add_row("overlap", f"[yellow]{dur(s['overlap_s'])}[/] in {s['overlaps']} hand-over(s)")
    t.add_row("queue wait", f"{dur(s['wait_total_s'])} in total, longest {dur(s['wait_max_s'])}")
    if s["prediction_mae_s"] is not None:
        t.add_row("predicted wait", f"mean absolute error {dur(s['prediction_mae_s'])} over "
                                    f"{len(s['predicted_vs_actual'])} segment(s)")
    t.add_row("allocated", f"{dur(s['allocated_s'])} over {dur(s['wall_s'])} wall clock")
    return t


def _table(rows: list[dict]):
    from rich.table import Table

    from chainrun.durations import format_duration as dur

    t = Table(title="chain reports", title_justify="left")
    for col in ("chain", "status", "segs", "retries", "gaps", "overlap", "longest gap"):
        t.add_column(col, no_wrap=col == "chain", min_width=max((len(r["chain"]) for r in rows), default=5)
                     if col == "chain" else None)
    for s in rows:
        t.add_row(s["chain"], s["status"].lower(), f"{s['segments']}", f"{s['retries']}",
                  f"{dur(s['interruption_s'])} ({s['gaps']})", f"{dur(s['overlap_s'])} ({s['overlaps']})",
                  dur(s["longest_gap_s"]))
    return t
