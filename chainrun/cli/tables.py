"""Rich tables for chains and segments."""

from __future__ import annotations

import time

from rich.table import Table

from chainrun.chain.summary import ChainView
from chainrun.cli.render import clock
from chainrun.durations import format_duration as dur

_STATUS_STYLE = {"ACTIVE": "cyan", "COMPLETED": "green", "FAILED": "red", "CANCELLED": "yellow"}


def progress_bar(done: float, total: float, width: int = 12) -> str:
    frac = 0.0 if total <= 0 else min(1.0, done / total)
    full = int(round(frac * width))
    return "█" * full + "░" * (width - full) + f" {frac * 100:3.0f}%"


def chain_list(views: list[ChainView]) -> Table:
    t = Table(title="chains", title_justify="left")
    for col in ("chain", "status", "segment", "progress", "ETA", "gaps", "note"):
        t.add_column(col, no_wrap=col != "note", overflow="fold")
    for v in views:
        style = _STATUS_STYLE.get(v.status, "")
        seg = f"{v.current} {v.current_state.lower()}" if v.current is not None else "-"
        t.add_row(
            f"{v.id}\n[dim]{v.policy}[/]", f"[{style}]{v.status.lower()}[/]", seg,
            f"{progress_bar(v.done_s, v.total_s, 8)}\n{dur(v.done_s)} / {dur(v.total_s)}", clock(v.eta),
            f"+{dur(v.interruption_s)}\n[dim]-{dur(v.overlap_s)}[/]", v.reason,
        )
    return t


def chain_detail(v: ChainView) -> Table:
    now = time.time()
    style = _STATUS_STYLE.get(v.status, "")
    title = (f"{v.id}  [{style}]{v.status}[/]  {progress_bar(v.done_s, v.total_s)}  {dur(v.done_s)} / {dur(v.total_s)}"
             f"  policy {v.policy}  ETA {clock(v.eta)}" + (f"\n{v.reason}" if v.reason else ""))
    t = Table(title=title, title_justify="left", caption=f"checkpoints: {v.checkpoint_dir}", caption_justify="left")
    for col in ("seg", "job", "state", "outcome", "limit", "submit", "eligible", "start", "end", "wait",
                "predicted", "gap", "note"):
        t.add_column(col, no_wrap=col != "note")
    for s in v.segment_views:
        gap = "-" if s.gap_s is None else (f"[red]+{dur(s.gap_s)}[/]" if s.gap_s > 60 else
                                           f"[yellow]{dur(s.gap_s)}[/]" if s.gap_s < 0 else dur(s.gap_s))
        t.add_row(
            str(s.idx) + (" (retry)" if s.is_retry else ""), s.job_id or "-", s.slurm_state or s.phase,
            s.outcome or "", dur(s.time_limit_s), clock(s.submit, now=now), clock(s.eligible, now=now),
            clock(s.start, now=now), clock(s.end, now=now), dur(s.wait_s),
            dur(s.predicted_wait_s) + (f" ({s.predicted_model})" if s.predicted_model else "") if s.predicted_wait_s is not None else "-",
            gap, s.reason if s.outcome in ("crash", "cancelled") else "",
        )
    return t
