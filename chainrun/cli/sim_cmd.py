"""``chainrun sim``: replay a trace with injected chains and compare submission policies.

Heavy imports (pandas, lightgbm) happen inside the command, so ``chainrun --help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("sim", help="Replay a job trace with injected chains of fixed work; what each submission policy "
                            "(reactive, dependency, fixed lead, avg, predicted, oracle) costs them.")(sim)


def sim(
    trace: Annotated[list[str], typer.Option("--trace", metavar="TRACE", help="sacct text (header line, whitespace-separated), a sacct -P dump (.xz/.gz too), or a built-in trace: ls6-a100-dev. Repeat it for several clusters at once (order = preference): predicted on each alone and predicted_multi (docs/multi-cluster.md).")],
    nodes: Annotated[Optional[int], typer.Option("--nodes", min=1, help="Nodes in the replayed partition (default: the trace's peak concurrent nodes).")] = None,
    chains_every: Annotated[Optional[str], typer.Option("--chains-every", help="Trace time between injected chains, e.g. 6h (default 12h).")] = None,
    handoff: Annotated[str, typer.Option("--handoff", help="Time a predecessor needs to checkpoint and exit once its successor starts.")] = "5m",
    priority: Annotated[str, typer.Option("--priority", help="fairshare (age + job size + fair share from the trace's users, LS6's weights), multifactor (age + job size) or age.")] = "fairshare",
    workers: Annotated[int, typer.Option("--workers", min=1, max=16, help="Worker processes.")] = 2,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (a versioned envelope) instead of tables.")] = False,
    chains: Annotated[bool, typer.Option("--chains", help="Whole-chain replay (what `sim` always runs; kept for scripts): every segment of chains of fixed work, completion overhead per policy and load level.")] = False,
    work: Annotated[str, typer.Option("--work", help="--chains: compute per chain (training time less restarts).")] = "168h",
    segment: Annotated[str, typer.Option("--segment", help="--chains: segment length (time limit).")] = "48h",
    restart_cost: Annotated[str, typer.Option("--restart-cost", help="--chains: compute lost at every segment start (model load, data loader warm-up).")] = "10m",
    successor_limit: Annotated[str, typer.Option("--successor-limit", help="--chains: size the next segment as the watcher does (shipped), or by the rule before the take-over fix (handover).")] = "shipped",
    inject_from: Annotated[Optional[str], typer.Option("--from", help="--chains: inject chains from this date (YYYY-MM-DD, trace time).")] = None,
    inject_until: Annotated[Optional[str], typer.Option("--until", help="--chains: inject chains before this date.")] = None,
    tune: Annotated[Optional[str], typer.Option("--tune-score-from", help="--chains: choose predicted's tunables (the rule, the cost of a boundary and the guard's share) on chains that end before this date; the window from it is not scored in the same run (see --rolling).")] = None,
    shapes: Annotated[Optional[str], typer.Option("--shapes", help="--chains: elastic shapes, node counts, the first the reference (e.g. 4,2,1): chains of the reference shape under reactive, predicted and predicted_elastic (with --tune-score-from: the shape margin is chosen before that date).")] = None,
    rolling: Annotated[bool, typer.Option("--rolling", help="--chains: rolling-origin evaluation: for every week scored (--from/--until select the weeks and points scored; the week grid and the values in force are those of the run without them), choose predicted's values and the best fixed lead on chains that ended before it, score the week's chains with the values in force (docs/evaluation.md).")] = False,
    efficiency: Annotated[Optional[str], typer.Option("--efficiency", help="--shapes: the other shapes' scaling efficiency relative to linear in nodes (default 1.0); a second value adds a sensitivity row, e.g. 1,0.8.")] = None,
    transfer: Annotated[Optional[str], typer.Option("--transfer", help="several --trace: a checkpoint's copy between clusters (default 15m).")] = None,
    pace: Annotated[Optional[list[str]], typer.Option("--pace", metavar="CLUSTER=PACE", help="several --trace: CLUSTER=PACE, work per second relative to the reference (default 1.0 each), e.g. ls6-a100-dev#2=0.6.")] = None,
    align: Annotated[Optional[str], typer.Option("--align", help="several --trace: end (shift every other trace by whole weeks so the last weeks coincide; the default) or Nw (shift by N weeks).")] = None,
    site_margin: Annotated[Optional[str], typer.Option("--site-margin", help="several --trace: the margin a move must gain (default: chosen on the older half of the window, scored on the newer).")] = None,
    race: Annotated[bool, typer.Option("--race", help="several --trace: also predicted_multi_race (a segment planned while nothing runs goes to every cluster; the first to start is kept).")] = False,
) -> None:
    from chainrun.errors import UsageError

    if len(trace) > 1:
        if rolling or tune or shapes or efficiency:
            raise UsageError("several --trace: not with --rolling, --tune-score-from or --shapes")
        _sites(trace, nodes=nodes, chains_every=chains_every, handoff=handoff, priority=priority, workers=workers,
               json_out=json_out, work=work, segment=segment, restart_cost=restart_cost,
               successor_limit=successor_limit, inject_from=inject_from, inject_until=inject_until,
               transfer=transfer, pace=pace, align=align, site_margin=site_margin, race=race)
        return
    # checked here, not left to default: one trace would silently ignore them (None/False: not given)
    sites_only = [o for o, v in (("--transfer", transfer), ("--pace", pace), ("--align", align),
                                 ("--site-margin", site_margin), ("--race", race)) if v not in (None, False, [])]
    if sites_only:
        raise UsageError(f"{', '.join(sites_only)}: only with two or more --trace (one given)",
                         hint="see docs/multi-cluster.md")
    trace = trace[0]
    # the per-transition replay (its own copies of the rules) was retired: `sim` is the whole-chain replay,
    # which runs the shipped policy classes and reports every boundary's gap too ("transitions")
    _chains(trace, nodes=nodes, chains_every=chains_every, handoff=handoff, priority=priority, workers=workers,
            json_out=json_out, work=work, segment=segment, restart_cost=restart_cost,
            successor_limit=successor_limit, inject_from=inject_from, inject_until=inject_until, tune=tune,
            shapes=shapes, efficiency=efficiency, rolling=rolling)


def _h(v) -> str:
    if v is None:
        return "-"
    return f"{v * 60:.1f}m" if v < 1 else f"{v:.2f}h"


def _pct(v, digits: int = 0) -> str:
    return "-" if v is None else f"{v * 100:.{digits}f}%"


def _date(value: str | None, what: str) -> float | None:
    if value is None:
        return None
    import pandas as pd

    from chainrun.errors import UsageError

    try:
        return float(pd.Timestamp(value).timestamp())  # trace times are read the same way (naive = UTC)
    except ValueError:
        raise UsageError(f"{what}: not a date: {value!r}", hint="use YYYY-MM-DD") from None


def _chains(trace, *, nodes, chains_every, handoff, priority, workers, json_out, work, segment, restart_cost,
            successor_limit, inject_from, inject_until, tune, shapes=None, efficiency=None, rolling=False) -> None:
    from chainrun.errors import UsageError
    from chainrun.sim.chain_replay import chains_fidelity, run_chains
    from chainrun.traces import read_trace as load_trace, trace_notes

    cfg = _chains_config(nodes=nodes, chains_every=chains_every, handoff=handoff, priority=priority, workers=workers,
                         work=work, segment=segment, restart_cost=restart_cost, successor_limit=successor_limit,
                         inject_from=inject_from, inject_until=inject_until)
    shp, effs = _shapes(shapes, efficiency, nodes)
    split = _date(tune, "--tune-score-from")
    if rolling and (tune or shp):
        raise UsageError("--rolling chooses week by week itself: not with --tune-score-from or --shapes")
    if tune and (inject_from or inject_until):  # tune.py and elastic.py set the windows from the split
        raise UsageError("--tune-score-from splits the trace itself: not with --from or --until",
                         hint="score the window from the split in a second run with --from DATE, or use --rolling")
    tr = load_trace(trace)
    _check_windows(tr, cfg, split, scored_from_split=bool(shp))
    if rolling:
        from chainrun.sim.rolling import rolling as run_rolling

        data = run_rolling(tr, cfg)
    elif shp:
        from chainrun.sim.elastic import run_elastic, tune_elastic

        if tune:
            data = tune_elastic(tr, cfg, split, shp, effs)
        else:
            data = run_elastic(tr, cfg, shp, effs)
    elif tune:
        from chainrun.sim.tune import tune as run_tune

        out = run_tune(tr, cfg, split)
        data = {"fidelity": chains_fidelity(tr, cfg), "tune": out}
    else:
        res = run_chains(tr, cfg)
        data = {"fidelity": res.fidelity, **res.as_json()}
    if notes := trace_notes(tr):  # what the reader set aside or read as unknown: said, not dropped in silence
        data.setdefault("meta", {}).setdefault("warnings", []).extend(notes)
    if json_out:
        from chainrun.cli.render import envelope
        from chainrun.sim.jsonsafe import finite as _finite

        typer.echo(envelope("sim", _finite(data)))
        return
    render_chains(data)


def _check_windows(tr, cfg, split: float | None, scored_from_split: bool) -> None:
    """Every window the run replays must hold a chain, else one line before any replay: --from/--until,
    or --tune-score-from's (chosen on chains that end before the split, scored from it with --shapes:
    the windows tune.py and elastic.py use)."""
    from dataclasses import replace

    from chainrun.sim.chain_replay import chain_life_s, check_window, day

    if split is None:
        check_window(tr, cfg)
        return
    life = chain_life_s(cfg.work.work_s)  # tune.py's: a chain that starts by split - life ends before it
    check_window(tr, replace(cfg, inject_from=None, inject_until=split - life),
                 f"to choose on before --tune-score-from {day(split)} (it must start by {day(split - life)})",
                 "a later --tune-score-from")
    if scored_from_split:
        check_window(tr, replace(cfg, inject_from=split, inject_until=None),
                     f"to score from --tune-score-from {day(split)} on", "an earlier --tune-score-from")


def _chains_config(*, nodes, chains_every, handoff, priority, workers, work, segment, restart_cost, successor_limit,
                   inject_from, inject_until):
    """The replay's config from the shared options, checked (one-line errors)."""
    from chainrun.durations import parse_duration
    from chainrun.errors import UsageError
    from chainrun.sim.chain_replay import ChainsConfig, with_work

    if successor_limit not in ("shipped", "takeover", "handover"):
        raise UsageError(f"unknown --successor-limit {successor_limit!r}", hint="use shipped or handover")
    every = float(parse_duration(chains_every or "12h", what="--chains-every"))
    if every <= 0:
        raise UsageError("--chains-every must be positive")
    w = {k: float(parse_duration(v, what=o)) for k, v, o in (("work_s", work, "--work"), ("segment_s", segment, "--segment"),
                                                           ("restart_s", restart_cost, "--restart-cost"),
                                                           ("handoff_s", handoff, "--handoff"))}
    if w["work_s"] <= 0 or w["segment_s"] <= 0:
        raise UsageError("--work and --segment must be positive")
    if w["segment_s"] <= w["restart_s"] + 300 + 60:
        raise UsageError("--segment must be longer than the restart cost plus the signal lead")
    start, end = _date(inject_from, "--from"), _date(inject_until, "--until")
    if start is not None and end is not None and start >= end:  # [from, until) would hold no chain
        raise UsageError(f"--from {inject_from} is not before --until {inject_until}: the window holds no chain")
    return with_work(ChainsConfig(nodes=nodes, chains_every_s=every, priority=priority, workers=workers,
                                  inject_from=start, inject_until=end),
                     successor_limit=successor_limit, **w)


def _sites(traces, *, transfer, pace, align, site_margin, race, json_out, **kw) -> None:
    """Several --trace: the multi-cluster replay (chainrun/sim/two_sites.py)."""
    from chainrun.durations import parse_duration
    from chainrun.errors import UsageError
    from chainrun.sim.two_sites import SitesConfig, parse_align, run_sites

    cfg = _chains_config(**kw)
    transfer, align = transfer if transfer is not None else "15m", align if align is not None else "end"
    t = float(parse_duration(transfer, what="--transfer"))
    if t < 0:
        raise UsageError("--transfer must not be negative")
    m = None if site_margin is None else float(parse_duration(site_margin, what="--site-margin"))
    parse_align(align)  # a bad value fails before the traces are read
    data = run_sites(list(traces), cfg, SitesConfig(transfer_s=t, align=align, margin_s=m, race=race), pace_args=pace or [])
    if json_out:
        from chainrun.cli.render import envelope
        from chainrun.sim.jsonsafe import finite as _finite

        typer.echo(envelope("sim", _finite(data)))
        return
    render_sites(data)


def render_sites(data: dict) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    c, m = data["chains"], data["meta"]
    for s in m["sites"]:
        con.print(f"[bold]{s['name']}[/bold]: {s['nodes']} nodes, shifted {s['shift_weeks']} weeks, pace {s['pace']:g}; "
                  f"fidelity Spearman {_num(data['fidelity'][s['name']].get('spearman'))}")
    sm = c.get("site_margin", {})
    blocks = [("scored chains" if sm.get("chosen") is not None and "split" in sm else "chains", c["policies"])]
    if "whole_window" in c:
        blocks.append(("whole window (the choice chains included)", c["whole_window"]["policies"]))
    if "rolling" in c:
        blocks.append(("rolling (margin chosen each week on the chains ended before it)", c["rolling"]["policies"]))
    for title, pols in blocks:
        t = Table(title=f"{title}: {c['work_h']:g} h work in {c['segment_h']:g} h segments, transfer "
                        f"{c['transfer_min']:g} min; window {m['window']['from'][:10]} .. {m['window']['until'][:10]}")
        for col in ("policy", "n", "overhead", "low", "medium", "heavy", "moves", "GPU-h twice", "stuck"):
            t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
        for name, p in pols.items():
            bl = p["by_load"]
            t.add_row(name, str(p["n"]), _h(p["mean_overhead_h"]),
                      *(f"{_h(bl[lv]['mean_overhead_h'])} ({bl[lv]['n']})" for lv in ("low", "medium", "heavy")),
                      _num(p.get("moves")), _pct(p.get("gpu_h_twice_share"), 2), str(p.get("stuck", 0)))
        con.print(t)
    con.print(f"site margin {sm.get('margin_s', 0) / 3600:g} h ({sm.get('note', '')})")
    if "rolling" in c:  # * marks a week with too little past: the default margin
        con.print("rolling weeks (start: margin, chains): " + ", ".join(
            f"{w['start'][:10]}: {w['margin_s'] / 3600:g} h{'' if w['chosen'] else '*'} ({w['n']})"
            for w in c["rolling"]["weeks"]) + "; * the default margin (too little past)")
    for w in m.get("warnings", []):
        con.print(f"[yellow]warning:[/yellow] {w}")


def _shapes(shapes, efficiency, nodes):
    """--shapes and --efficiency, checked before the trace is read: ((), ()) without --shapes."""
    from chainrun.errors import UsageError

    if shapes is None:
        if efficiency is not None:
            raise UsageError("--efficiency needs --shapes", hint="e.g. --shapes 4,2,1 --efficiency 1,0.8")
        return (), ()
    from chainrun.chain.shapes import parse_shapes
    from chainrun.sim.elastic import parse_efficiencies

    return parse_shapes(shapes, max_nodes=nodes), parse_efficiencies(efficiency or "1")


def render_chains(data: dict) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    f = data["fidelity"]
    con.print(f"[bold]Fidelity[/bold] ({f.get('nodes')} nodes): Spearman {_num(f.get('spearman'))} "
              f"(without the rebuilt dependency holds {_num(f.get('spearman_without_holds'))}), "
              f"median sim/real wait {_num(f.get('median_ratio'))}, within x2 {_pct(f.get('within_2x'))}")
    if "tune" in data:
        _render_choice(con, data["tune"])
        _render_warnings(con, data)
        return
    blocks = [("chains", data)]
    for title, d in blocks:
        c, m = d["chains"], d["meta"]
        t = Table(title=f"{m['injections']} chains of {c['work_h']:g} h work in {c['segment_h']:g} h segments, restart "
                        f"{c['restart_cost_min']:g} min, {m['nodes']} nodes; {m['seconds']:.0f}s")
        for col in ("policy", "n", "overhead", "90% CI", "from start", "queue", "restart", "hand-off", "segments",
                    "GPU-h twice", "low", "medium", "heavy", "stuck", "per transition: int / zero / cut"):
            t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
        for name, p in c["policies"].items():
            bl, tr = p["by_load"], p.get("transitions") or {}
            ci = p.get("ci90_h") or [None, None]
            t.add_row(name, str(p["n"]), _h(p["mean_overhead_h"]), f"{_h(ci[0])}-{_h(ci[1])}",
                      _h(p.get("mean_overhead_from_start_h")), _h(p.get("mean_queue_h")), _h(p.get("mean_restart_h")),
                      _h(p.get("mean_handoff_h")), _num(p.get("mean_segments")), _pct(p.get("gpu_h_twice_share"), 2),
                      *(f"{_h(bl[lv]['mean_overhead_h'])} ({bl[lv]['n']})" for lv in ("low", "medium", "heavy")),
                      str(p.get("stuck", 0)),
                      f"{_h(tr.get('mean_interruption_h'))} / {_pct(tr.get('zero_interruption_share'))} / "
                      f"{_h(tr.get('mean_cut_h'))}")
        con.print(t)
        if c.get("elastic"):
            _render_elastic(con, c)
        if c.get("rolling"):
            _render_rolling(con, c["rolling"])
    con.print("overhead: (work done - chain submitted) - work, mean per chain (from start: from the first segment's "
              "start); low/medium/heavy: by reactive's mean gap per boundary <=2h / <=12h / more; stuck: more than "
              "60 segments (not in the means).")
    _render_warnings(con, data)


def _render_warnings(con, data: dict) -> None:
    for w in data.get("meta", {}).get("warnings", []):
        con.print(f"[yellow]warning:[/yellow] {w}")


def _render_choice(con, tune: dict) -> None:
    """The choice and the candidates on the choice window; the scored window is not run (tune.py)."""
    from rich.table import Table

    p = tune["choose"]["picked"]
    what = (f"rule {p.get('rule') or 'quantile'}, target {p['target'] if p['target'] is not None else 'none'}"
            + (f", boundary cost {p['transition_cost_s'] / 3600:g} h" if p.get("transition_cost_s") else "")
            + (f", guard share {p['lead_share']:g}" if p.get("lead_share") is not None else ""))
    t = Table(title=f"candidates on {tune['choose']['injections']} chains that end before the split")
    for col in ("candidate", "n", "overhead", "low", "medium", "heavy", "gap left", "stuck"):
        t.add_column(col, justify="left" if col == "candidate" else "right", no_wrap=col == "candidate")
    for name, r in {**tune["choose"]["candidates"], **tune["choose"]["references"]}.items():
        bl = r.get("by_load") or {}
        t.add_row(name, str(r["n"]), _h(r["mean_overhead_h"]),
                  *(f"{_h(bl[lv]['mean_overhead_h'])} ({bl[lv]['n']})" if bl.get(lv) else "-"
                    for lv in ("low", "medium", "heavy")),
                  _num(r.get("gap_left")), str(r.get("stuck", 0)))
    con.print(t)
    con.print(f"chosen: {p['name']} ({what}, floor {p['floor_s'] / 3600:g} h). The window from the split on is not "
              "scored in the run that chooses: score it with `chainrun sim --chains --from DATE`, or use --rolling.")


def _render_rolling(con, r: dict) -> None:
    from rich.table import Table

    t = Table(title="rolling origin: chosen on chains that ended before the week, adopted when it beat the values in "
                    "force on the check")
    for col in ("week", "n", "choice/check chains", "chosen", "adopted", "in force", "best fixed"):
        t.add_column(col, justify="left" if col in ("week", "chosen", "in force") else "right")
    for wk in r["weeks"]:
        # a week straddling --from/--until: its n counts only the part inside the window
        a, b = wk.get("scored_from"), wk.get("scored_until")
        span = f" (scored {(a or wk['start'])[:10]} .. {(b or wk['end'])[:10]})" if a or b else ""
        t.add_row(wk["start"][:10] + span, str(wk["n"]), f"{wk.get('choice_chains', 0)}/{wk.get('check_chains', 0)}",
                  _values(wk["chosen"]), "yes" if wk["adopted"] else "no", _values(wk["in_force"]),
                  f"{wk['best_fixed_lead_s'] / 3600:g} h")
    con.print(t)


def _values(v: dict) -> str:
    return (f"{v['rule']}, cost {v['transition_cost_s'] / 3600:g} h, share {v['lead_share']:g}, "
            f"floor {v['floor_s'] / 3600:g} h")


def _render_elastic(con, c: dict) -> None:
    e = c["elastic"]
    con.print(f"elastic: chains of {e['reference_nodes']} nodes ({e['gpus_per_node']} GPUs each), shapes "
              f"{','.join(map(str, e['shapes']))}, shape margin {e['margin_s'] / 60:g} min; work at the reference "
              "shape, other shapes at nodes/reference x efficiency")
    for name, p in c["policies"].items():
        vs = p.get("vs_predicted")
        if not vs:
            continue
        cells = [f"{lv} {_pct(v['reduction'])} ({v['n']})" if v else f"{lv} -" for lv, v in vs.items()]
        con.print(f"  {name} (efficiency {p['efficiency']:g}): less overhead than predicted: {', '.join(cells)}; "
                  f"chains that changed shape {_pct(p.get('chains_elastic_share'))}, slowdown "
                  f"{_h(p.get('mean_slowdown_h'))}")


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"
