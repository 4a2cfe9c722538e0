"""Chains and segments for people: tables that fit the terminal, or plain lines.

Two forms, one content:

- on a terminal, a rich table sized to the console. When the table is too wide it degrades
  in a fixed, stated order (``CHAIN_LIST_STEPS``, ``CHAIN_DETAIL_STEPS``): notes move below
  the table, then columns are shortened or dropped. An id column is never shrunk: when even
  the narrowest table does not fit, the plain lines are printed instead;
- off a terminal (a pipe, cron mail, CI logs, ``less``) or with ``--plain``: stable lines, one
  record per line, ``key=value`` fields, the id first. A record longer than the width goes on
  over indented continuation lines, broken only between fields (never inside an id).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from chainrun.chain.summary import ChainView
from chainrun.cli.render import clock
from chainrun.durations import format_duration as dur

_STATUS_STYLE = {"ACTIVE": "cyan", "COMPLETED": "green", "FAILED": "red", "CANCELLED": "yellow"}
NOTE_MIN_WIDTH = 24  # a note column narrower than this moves below the table instead
INDENT = "    "  # continuation lines of a plain record


# --------------------------------------------------------------------------- chain figures
# read with getattr: trained_s / allocated_s / payload_overlaps came to ChainView later, and a
# view built without them (an older summary) still renders

def trained_s(v: ChainView) -> float:
    """Payload training time: the progress toward --total."""
    got = getattr(v, "trained_s", None)
    return float(v.done_s if got is None else got)


def allocated_s(v: ChainView, now: float | None = None) -> float:
    """Time the segments held their allocations (start to end, or to now while running)."""
    got = getattr(v, "allocated_s", None)
    if got is not None:
        return float(got)
    now = time.time() if now is None else now
    return sum(max(0.0, (s.end if s.end is not None else now) - s.start) for s in v.segment_views
               if s.start is not None)


def payload_overlap_errors(v: ChainView) -> list[str]:
    """One loud line per time two copies of the payload trained at once (never allowed)."""
    return overlap_error_lines(getattr(v, "payload_overlaps", None) or [])


def overlap_error_lines(overlaps: list) -> list[str]:
    out = []
    for o in overlaps:
        jobs = list(o.get("jobs", []) if isinstance(o, dict) else getattr(o, "jobs", []))
        secs = float(o.get("seconds", 0) if isinstance(o, dict) else getattr(o, "seconds", 0))
        who = " and ".join(str(j) for j in jobs) or "?"
        out.append(f"ERROR: two copies trained at once: jobs {who} for {secs:.0f} s")
    return out


def pace_of(v: ChainView) -> dict:
    """The progress contract's figures (chain/progress.py pace_view); {} for an older view."""
    return getattr(v, "pace", None) or {}


def eta_of(v: ChainView) -> float | None:
    """The ETA shown: from the measured pace (training toward --total) once there is one, else the plan's."""
    return pace_of(v).get("training_eta") or v.eta


def _rate(x: float | None) -> str:
    return "-" if x is None else (f"{x:.3g}" if x < 1000 else f"{x:,.0f}")


def _steps(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}".replace(",", "_")


def pace_tokens(v: ChainView) -> list[str]:
    """``key=value`` fields of the pace for plain lines; none when the trainer does not report."""
    p = pace_of(v)
    if p.get("step") is None:
        return []
    toks = [f"step={_steps(p['step'])}" + (f"/{_steps(p['total_steps'])}" if p.get("total_steps") else ""),
            f"steps/s={_rate(p.get('steps_per_s'))}"]
    if p.get("samples_per_s") is not None:
        toks.append(f"samples/s={_rate(p['samples_per_s'])}")
    if p.get("steps_eta"):
        toks.append(f"steps_eta={_ts(p['steps_eta'], time.time())}")
    return toks


def placement_lines(v: ChainView) -> list[str]:
    """Nodes chainrun excluded (with the numbers) and every change it made to the request."""
    p = pace_of(v)
    out = []
    for e in p.get("excluded") or []:
        nums = ""
        if e.get("ratio") and e.get("step_s") is not None:
            nums = f" ({e['ratio']:.2f}x: {e['step_s']:.3g} s a step vs {e['others_s']:.3g} s on the others)"
        out.append(f"excluded node {e['node']}{nums}: {e.get('why') or 'slow'}; "
                   f"`chainrun unexclude {v.id} {e['node']}` to pardon it")
    for ch in p.get("changes") or []:
        when = f"after segment {ch['after_segment']}" if ch.get("after_segment") is not None else "by you"
        out.append(f"request change {when}: {ch['what']}")
    if p.get("adapt") is False:
        out.append("adaptation off (--no-adapt): slow nodes are reported, never excluded")
    return out


def site_lines(v: ChainView, now: float) -> list[str]:
    """A chain spanning clusters: its clusters in order of preference and the one it is on, then the
    latest site decision with its numbers (the rule's words) and how many the event log kept.
    [] for a chain on one cluster."""
    sites = getattr(v, "sites", ()) or ()
    if not sites:
        return []
    out = [f"clusters (in order of preference): {', '.join(sites)}; on {v.cluster}"
           + (f"; moves only to gain more than {dur(v.site_margin['margin_s'])} (margin "
              f"{v.site_margin['source']})"
              if getattr(v, "site_margin", None) else "")]
    ch = getattr(v, "site_choice", None)
    if ch and ch.get("reason"):
        out.append(f"placement of segment {ch.get('for', '?')} ({clock(ch.get('at'), now=now)}): {ch['reason']}")
        moves = ch.get("transfers") or {}  # the checkpoint's copy to each other cluster, as that decision weighed it
        if moves:
            out.append("checkpoint transfer weighed: " + "; ".join(
                f"to {n} {dur(float(m.get('transfer_s') or 0))} ({m.get('from')})" for n, m in moves.items()))
    n = len(getattr(v, "site_decisions", ()) or ())
    if n > 1:
        out.append(f"{n} site decisions kept (newest last: `chainrun status {v.id} --json`, site_decisions)")
    return out


def pace_line(v: ChainView, now: float) -> str:
    p = pace_of(v)
    if p.get("step") is None:
        return ""
    parts = [f"step {_steps(p['step'])}" + (f" of {_steps(p['total_steps'])}" if p.get("total_steps") else "")]
    parts.append(f"{_rate(p.get('steps_per_s'))} steps/s")
    if p.get("samples_per_s") is not None:
        parts.append(f"{_rate(p['samples_per_s'])} samples/s")
    etas = []
    if p.get("training_eta"):
        etas.append(f"--total reached {clock(p['training_eta'], now=now)}")
    if p.get("steps_eta"):
        etas.append(f"last step {clock(p['steps_eta'], now=now)}")
    return "pace: " + ", ".join(parts) + (f"; at this pace {' and '.join(etas)}" if etas else "")


def progress_bar(done: float, total: float, width: int = 12) -> str:
    frac = 0.0 if total <= 0 else min(1.0, done / total)
    full = int(round(frac * width))
    return "█" * full + "░" * (width - full) + f" {frac * 100:3.0f}%"


def _pct(done: float, total: float) -> str:
    return f"{0.0 if total <= 0 else min(1.0, done / total) * 100:.0f}%"


# --------------------------------------------------------------------------- fitting
@dataclass
class Column:
    key: str
    header: str
    cells: list[str]  # rich markup, may hold line breaks
    short: list[str] | None = None  # the abbreviated form, used after a "short" step
    wrap: bool = False  # may wrap (the note); every other column keeps its full width
    justify: str = "left"

    def width(self) -> int:
        return max([_cell_len(self.header)] + [_cell_len(c) for c in self.cells])

    def min_width(self) -> int:
        return min(self.width(), NOTE_MIN_WIDTH) if self.wrap else self.width()


def _cell_len(markup: str) -> int:
    return max((line.cell_len for line in Text.from_markup(markup).split("\n")), default=0)


def _table_width(cols: list[Column]) -> int:
    # default box, padding (0, 1): a border left of every column and one at the end
    return sum(c.min_width() for c in cols) + 3 * len(cols) + 1


def fit_columns(cols: list[Column], steps: list[tuple[str, str]], width: int) -> tuple[list[Column], bool, bool]:
    """Apply ``steps`` in order until the table fits ``width``.

    A step is (column key, action): "short" switches to the column's abbreviated cells,
    "drop" removes it, "below" removes it and reports that its content goes under the table.
    Returns (columns, moved_below, fits).
    """
    cols = list(cols)
    below = False
    for key, action in steps:
        if _table_width(cols) <= width:
            break
        i = next((i for i, c in enumerate(cols) if c.key == key), None)
        if i is None:
            continue
        if action == "short" and cols[i].short is not None:
            cols[i] = replace(cols[i], cells=cols[i].short, short=None)
        elif action in ("drop", "below"):
            below = below or action == "below"
            del cols[i]
    return cols, below, _table_width(cols) <= width


def _table(cols: list[Column], title: str | None = None) -> Table:
    t = Table(title=title, title_justify="left")
    for c in cols:
        if c.wrap:
            t.add_column(c.header, overflow="fold", min_width=c.min_width(), justify=c.justify)  # type: ignore[arg-type]
        else:
            t.add_column(c.header, no_wrap=True, min_width=c.width(), justify=c.justify)  # type: ignore[arg-type]
    for row in zip(*(c.cells for c in cols)):
        t.add_row(*row)
    return t


# --------------------------------------------------------------------------- plain lines
def _fold(token: str, room: int) -> list[str]:
    """A token longer than a whole line (a path, user@host): cut after the last '/', else ',',
    '@', ':' or '.' that leaves a third of the line used, else at the room. Ids and host names
    are far shorter than any line, so they stay whole."""
    pieces = []
    while len(token) > room:
        cut = room
        for ch in "/,@:.":
            at = token.rfind(ch, 0, room) + 1
            if at > room // 3:
                cut = at
                break
        pieces.append(token[:cut])
        token = token[cut:]
    return pieces + ([token] if token else [])


def flow(tokens: list[str], width: int, *, first: str = "", indent: str = INDENT, sep: str = "  ") -> list[str]:
    """Tokens on lines of at most ``width``: broken only between tokens, continuation lines
    indented; a token longer than a line is folded (see ``_fold``)."""
    width = max(width, len(indent) + 20)
    lines: list[str] = []
    cur = first
    fresh = True  # nothing but the prefix on the current line yet
    for tok in (t for t in tokens if t):
        if not fresh and len(cur) + len(sep) + len(tok) <= width:
            cur += sep + tok
            continue
        if not fresh:
            lines.append(cur)
            cur = indent
        if len(cur) + len(tok) > width:  # too long even here: fold it over lines of its own
            if cur.strip():
                lines.append(cur.rstrip())
                cur = indent
            *full, tok = _fold(tok, width - len(indent))
            lines += [indent + piece for piece in full]
        cur += tok
        fresh = False
    if cur.strip() or not lines:
        lines.append(cur)
    return lines


def record(tokens: list[str], width: int, indent: str = INDENT) -> list[str]:
    """One record as lines: fields joined by two spaces, broken only between fields."""
    return flow(tokens, width, indent=indent)


def wrap_text(text: str, width: int, *, first: str = "", indent: str = INDENT) -> list[str]:
    """Free text (a note, an event message) wrapped at spaces; an id (a word shorter than a line) stays whole."""
    out: list[str] = []
    for i, para in enumerate(text.splitlines() or [""]):
        out += flow(para.split(" "), width, first=first if i == 0 else indent, indent=indent, sep=" ")
    return out


def _ts(ts: float | None, now: float) -> str:
    return clock(ts, now=now).replace(" ", "T")  # one token in a plain line


def _chain_record(v: ChainView, *, detail: bool = False) -> list[str]:
    seg = f"{v.current}:{v.current_state.lower()}" if v.current is not None else "-"
    tr = trained_s(v)
    sites = getattr(v, "sites", ()) or ()  # a chain spanning clusters: all of them, in order of preference
    toks = [v.id, v.status.lower(), f"cluster={v.cluster}", *([f"clusters={','.join(sites)}"] if sites else []),
            f"policy={v.policy}", f"segment={seg}",
            f"trained={dur(tr)}/{dur(v.total_s)}", f"progress={_pct(tr, v.total_s)}"]
    if detail:
        toks.append(f"allocated={dur(allocated_s(v))}")
    toks += pace_tokens(v)
    toks += [f"eta={_ts(eta_of(v), time.time())}", f"interruption={dur(v.interruption_s)}", f"overlap={dur(v.overlap_s)}"]
    if detail:
        toks.append(f"checkpoints={v.checkpoint_dir}")
    return toks


def untended_line(v: ChainView, now: float) -> str:
    """Since when the chain's cluster was not ticked and what happens next (chain/untended.py);
    "" while ticks come in time."""
    o = getattr(v, "untended", None)
    if not o or not o["stale"]:
        return ""
    if o["failing"]:
        head = f"ticks of {v.cluster} fail since {clock(o['failing_since'], now=now)}: {o['failing']}"
    elif o["last_tick"] is not None:
        head = f"not ticked since {clock(o['last_tick'], now=now)} ({dur(now - o['last_tick'])} ago)"
    else:
        head = f"no tick has reached {v.cluster} yet (run `chainrun watch`)"
    parts = []
    if o["queued"]:
        parts.append(f"the queued segment{'s' if len(o['queued']) > 1 else ''} "
                     f"{', '.join(map(str, o['queued']))} will start")
    if o["unconfirmed"]:
        parts.append(f"segment {', '.join(map(str, o['unconfirmed']))} is not confirmed by Slurm yet")
    if o["needs_tick"] is None and o["stops_at"]:
        parts.append("no segment after these is needed: training ends by itself (the next tick records it)")
    if o["needs_tick"] is not None:
        when = "now" if o["tick_before"] is None or o["tick_before"] <= now else \
            f"before {clock(o['tick_before'], now=now)}"
        stop = f" (without one, training may stop as early as {clock(o['stops_at'], now=now)})" if o["stops_at"] else ""
        parts.append(f"segment {o['needs_tick']} needs a tick {when}{stop}")
    if not parts:
        return head
    after = "; ".join(parts)
    return f"{head}. {after[0].upper()}{after[1:]}"


def _chain_notes(v: ChainView, width: int) -> list[str]:
    out: list[str] = []
    if line := untended_line(v, time.time()):
        out += wrap_text(line, width, first=INDENT + "untended: ")
    for err in payload_overlap_errors(v):
        out += wrap_text(err, width, first=INDENT)
    for line in placement_lines(v):
        out += wrap_text(line, width, first=INDENT)
    if getattr(v, "race_note", ""):  # --race: what raced, which won, what was cancelled
        out += wrap_text(v.race_note, width, first=INDENT + "race: ")
    note = v.reason or getattr(v, "current_note", "")
    if note and note != getattr(v, "race_note", ""):
        out += wrap_text(note, width, first=INDENT + "note: ")
    return out


def chain_lines(views: list[ChainView], width: int) -> list[str]:
    """``status`` off a terminal: one record per chain, its note and any error beneath."""
    out: list[str] = []
    for v in views:
        out += record(_chain_record(v), width) + _chain_notes(v, width)
    return out


def _segment_fields(s, now: float) -> dict[str, str]:
    pred = "-"
    if s.predicted_wait_s is not None:
        pred = dur(s.predicted_wait_s) + (f"({s.predicted_model})" if s.predicted_model else "")
    return {"seg": str(s.idx) + ("(retry)" if s.is_retry else ""), "job": s.job_id or "-",
            "state": s.slurm_state or s.phase, "outcome": s.outcome or "-", "limit": dur(s.time_limit_s),
            "submit": _ts(s.submit, now), "eligible": _ts(s.eligible, now), "start": _ts(s.start, now),
            "end": _ts(s.end, now), "wait": dur(s.wait_s), "predicted": pred,
            "steps": _steps(getattr(s, "steps", None)), "steps/s": _rate(getattr(s, "steps_per_s", None)),
            "nodes": ",".join(getattr(s, "nodes", ()) or ()) or "-",
            "switches": "-" if getattr(s, "switches", None) is None else str(s.switches),
            "shape": "-" if getattr(s, "shape_nodes", None) is None else f"{s.shape_nodes}N",
            "cluster": getattr(s, "cluster", None) or "-",
            "gap": "-" if s.gap_s is None else (f"+{dur(s.gap_s)}" if s.gap_s > 0 else dur(s.gap_s))}


def detail_lines(v: ChainView, width: int) -> list[str]:
    """``status CHAIN`` off a terminal: the chain's record, then one record per segment."""
    now = time.time()
    out = record(_chain_record(v, detail=True), width)
    for line in site_lines(v, now):
        out += wrap_text(line, width, first=INDENT)
    out += _chain_notes(v, width)
    spans = bool(getattr(v, "sites", ()))
    for i, s in enumerate(v.segment_views):
        f = _segment_fields(s, now)
        out += record([f"seg={f['seg']}", f"job={f['job']}"] + ([f"cluster={f['cluster']}"] if spans else [])
                      + [f"{k}={f[k]}" for k in
                      ("state", "outcome", "limit", "submit", "eligible", "start", "end", "wait", "predicted", "gap",
                       "steps", "steps/s", "nodes", "switches")]
                      + ([f"shape={f['shape']}"] if getattr(s, "shape_nodes", None) is not None else []),
                      width)
        if _note(s):
            out += wrap_text(_note(s), width, first=INDENT + "note: ")
        if s.request and (i == 0 or s.request != v.segment_views[i - 1].request):
            out += wrap_text(s.request, width, first=INDENT + "request: ")
    return out


def _note(s) -> str:
    """A segment's note (views from before notes existed: the reason of a bad ending)."""
    return getattr(s, "note", "") or (s.reason if s.outcome in ("crash", "cancelled") else "")


def print_lines(console: Console, lines: list[str]) -> None:
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- tables
# the order in which the chain overview gives way when the terminal is narrow
CHAIN_LIST_STEPS = [("progress", "short"), ("note", "below"), ("gaps", "drop"), ("eta", "drop"),
                    ("segment", "short"), ("chain", "short"), ("cluster", "drop")]


def _chain_list_columns(views: list[ChainView]) -> list[Column]:
    ids, clusters, statuses, segs, segs_short, prog, prog_short, etas, gaps, notes = ([] for _ in range(10))
    ids_short = []
    for v in views:
        style = _STATUS_STYLE.get(v.status, "")
        tr = trained_s(v)
        ids.append(f"{escape(v.id)}\n[dim]{v.policy}[/]")
        ids_short.append(escape(v.id))
        sites = getattr(v, "sites", ()) or ()
        clusters.append(escape(v.cluster) + (f"\n[dim]of {escape(','.join(sites))}[/]" if sites else ""))
        statuses.append(f"[{style}]{v.status.lower()}[/]")
        segs.append(f"{v.current} {v.current_state.lower()}" if v.current is not None else "-")
        segs_short.append(str(v.current) if v.current is not None else "-")
        prog.append(f"{progress_bar(tr, v.total_s, 8)}\n{dur(tr)} / {dur(v.total_s)}")
        prog_short.append(f"{_pct(tr, v.total_s)}\n{dur(tr)}/{dur(v.total_s)}")
        etas.append(clock(eta_of(v)))
        gaps.append(f"+{dur(v.interruption_s)}\n[dim]-{dur(v.overlap_s)}[/]")
        errs = payload_overlap_errors(v)
        note = v.reason or getattr(v, "current_note", "")
        notes.append("\n".join([f"[bold red]{escape(e)}[/]" for e in errs] + ([escape(note)] if note else [])))
    return [
        Column("chain", "chain", ids, short=ids_short), Column("cluster", "cluster", clusters),
        Column("status", "status", statuses), Column("segment", "segment", segs, short=segs_short),
        Column("progress", "trained", prog, short=prog_short), Column("eta", "ETA", etas),
        Column("gaps", "gaps", gaps), Column("note", "note", notes, wrap=True),
    ]


@dataclass
class ChainList:
    """The chain overview, sized when rendered (so the live view refits on every frame)."""

    views: list[ChainView]
    title: str | None = "chains"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        cols, below, fits = fit_columns(_chain_list_columns(self.views), CHAIN_LIST_STEPS, width)
        if not fits:
            yield Text("\n".join(chain_lines(self.views, width)))
            return
        yield _table(cols, self.title)
        for v in self.views:
            if line := untended_line(v, time.time()):
                yield Text(f"{v.id}: {line}", style="yellow")
        if below:
            for v in self.views:
                for err in payload_overlap_errors(v):
                    yield Text(f"{v.id}: {err}", style="bold red")
                if v.reason or getattr(v, "current_note", ""):
                    yield Text(f"{v.id}: {v.reason or v.current_note}")


def chain_list(views: list[ChainView]) -> ChainList:
    return ChainList(views)


CHAIN_DETAIL_STEPS = [("note", "below"), ("nodes", "drop"), ("steps/s", "drop"), ("steps", "drop"), ("predicted", "short"), ("eligible", "drop"), ("submit", "drop"),
                      ("predicted", "drop"), ("limit", "drop"), ("wait", "drop"), ("seg", "short"), ("end", "drop"),
                      ("outcome", "drop"), ("cluster", "drop"), ("start", "drop")]


@dataclass
class ChainDetail:
    """One chain: its figures above, one row per segment, sized when rendered."""

    view: ChainView

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        v, now, width = self.view, time.time(), options.max_width
        rows = [(s, _segment_fields(s, now)) for s in v.segment_views]

        def col(key: str, **kw) -> Column:
            times = key in ("submit", "eligible", "start", "end")  # a table cell may keep the clock's space
            return Column(key, key, [f[key].replace("T", " ") if times else f[key] for _, f in rows], **kw)

        gap_cells = [f"[red]{f['gap']}[/]" if s.gap_s is not None and s.gap_s > 60 else
                     f"[yellow]{f['gap']}[/]" if s.gap_s is not None and s.gap_s < 0 else f["gap"] for s, f in rows]
        notes = [escape(_note(s)) for s, _ in rows]
        spans = bool(getattr(v, "sites", ()))  # a chain spanning clusters: where each segment was submitted
        cols = [
            col("seg", short=[f["seg"].replace("(retry)", "r") for _, f in rows]), col("job"),
            *([col("cluster")] if spans else []), col("state"),
            col("outcome"), col("limit"), col("submit"), col("eligible"), col("start"), col("end"), col("wait"),
            col("predicted", short=[dur(s.predicted_wait_s) for s, _ in rows]), Column("gap", "gap", gap_cells),
        ]
        if any(f["shape"] != "-" for _, f in rows):  # elastic chains: the node count each segment asked for
            cols.append(col("shape", justify="right"))
        if any(f["steps"] != "-" for _, f in rows):
            cols += [col("steps", justify="right"), col("steps/s", justify="right"), col("nodes")]
        if any(notes):
            cols.append(Column("note", "note", notes, wrap=True))
        cols, below, fits = fit_columns(cols, CHAIN_DETAIL_STEPS, width)
        if not fits:
            yield Text("\n".join(detail_lines(v, width)))
            return
        style = _STATUS_STYLE.get(v.status, "")
        tr = trained_s(v)
        yield Text.from_markup(f"[bold]{escape(v.id)}[/]  [{style}]{v.status.lower()}[/]  cluster {escape(v.cluster)}  "
                               f"policy {v.policy}  ETA {clock(eta_of(v), now=now)}")
        yield Text(f"{progress_bar(tr, v.total_s)}  trained {dur(tr)} of {dur(v.total_s)}; allocations held "
                   f"{dur(allocated_s(v, now))}; interruption {dur(v.interruption_s)}, overlap {dur(v.overlap_s)}")
        for err in payload_overlap_errors(v):
            yield Text(err, style="bold red")
        if pace_line(v, now):
            yield Text(pace_line(v, now))
        for line in site_lines(v, now):
            yield Text(line)
        for line in placement_lines(v):
            yield Text(line, style="yellow" if line.startswith("excluded") else "")
        if getattr(v, "race_note", ""):  # --race: what raced, which won, what was cancelled
            yield Text(f"race: {v.race_note}")
        if v.reason:
            yield Text(v.reason)
        if line := untended_line(v, now):
            yield Text(line, style="yellow")
        if rows:
            yield _table(cols)
        if below:
            for s, f in rows:
                if _note(s):
                    yield Text(f"segment {f['seg']} (job {f['job']}): {_note(s)}")
        requests = [s.request for s in v.segment_views if s.request]
        if requests:
            yield Text(f"request of the last segment: {requests[-1]}", style="dim")
        yield Text(f"checkpoints: {v.checkpoint_dir}", style="dim")


def chain_detail(v: ChainView) -> ChainDetail:
    return ChainDetail(v)


def tick_lines(ts, width: int, now: float | None = None) -> list[str]:
    """Where scheduled ticks come from, the last and next one, and a warning when late (chainrun/schedule.py)."""
    from chainrun.durations import format_duration

    now = time.time() if now is None else now
    if not ts.source:
        return wrap_text(f"ticks: {ts.why}; last {_ts(ts.last, now)}", width)
    last = f"{_ts(ts.last, now)} ({format_duration(now - ts.last)} ago)" if ts.last else "none yet"
    out = wrap_text(f"ticks: {ts.source} every {format_duration(ts.every_s)}; last {last}, "
                    f"next ~{_ts(ts.next, now)}", width)
    if ts.late:
        out += wrap_text(f"warning: {ts.late}", width)
    return out
