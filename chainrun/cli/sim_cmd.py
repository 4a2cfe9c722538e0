"""``chainrun sim``: replay a trace with injected chains and compare submission policies.

Heavy imports (pandas, lightgbm) happen inside the command, so ``chainrun --help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("sim", help="Replay a job trace with injected chains; measure interruption and overlap per "
                            "submission policy (reactive, dependency, fixed lead, avg, predicted, oracle).")(sim)


def sim(
    trace: Annotated[str, typer.Option("--trace", help="sacct text (header line, whitespace-separated) or a sacct -P dump.")],
    nodes: Annotated[Optional[int], typer.Option("--nodes", min=1, help="Nodes in the replayed partition (default: the trace's peak concurrent nodes).")] = None,
    chains_every: Annotated[str, typer.Option("--chains-every", help="Trace time between injected chains, e.g. 4h.")] = "4h",
    handoff: Annotated[str, typer.Option("--handoff", help="Time a predecessor needs to checkpoint and exit once its successor starts.")] = "5m",
    priority: Annotated[str, typer.Option("--priority", help="age, or multifactor (age + job size weights of LS6).")] = "age",
    workers: Annotated[int, typer.Option("--workers", min=1, max=16, help="Worker processes.")] = 2,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (a versioned envelope) instead of tables.")] = False,
) -> None:
    from dataclasses import replace

    from chainrun.durations import parse_duration
    from chainrun.sim import SimConfig, run_sim
    from chainrun.traces import read_trace

    every = parse_duration(chains_every, what="--chains-every")
    if every <= 0:
        from chainrun.errors import UsageError

        raise UsageError("--chains-every must be positive")
    cfg = SimConfig(nodes=nodes, chains_every_s=float(every), priority=priority, workers=workers)
    cfg.spec = replace(cfg.spec, handoff_s=float(parse_duration(handoff, what="--handoff")))
    res = run_sim(read_trace(trace), cfg)
    if json_out:  # the versioned envelope, like every --json; the object itself is under "data"
        from chainrun.cli.render import envelope

        typer.echo(envelope("sim", res.as_json()))
        return
    render(res)


def _h(v) -> str:
    if v is None:
        return "-"
    return f"{v * 60:.1f}m" if v < 1 else f"{v:.2f}h"


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def render(res) -> None:
    from rich.console import Console
    from rich.table import Table

    import sys

    con = Console(highlight=False, width=None if sys.stdout.isatty() else 180)  # a pipe gets the whole table
    f, m = res.fidelity, res.meta
    con.print(
        f"[bold]Fidelity[/bold] (trace replayed alone on {m['nodes']} nodes, {m['fidelity_jobs']} jobs compared): "
        f"Spearman {f.spearman:.2f}, median sim/real wait {f.median_ratio:.2f}, within x2 {f.within_2x * 100:.0f}%"
    )
    t = Table(title=f"{m['injections']} injected chains (every {m['chains_every_h']:g} h, {'/'.join(map(str, m['chain_nodes']))} "
                    f"nodes, 48 h segments); predictor: {', '.join(m['predictor']) or '-'}; {m['seconds']:.0f}s")
    for c in ("policy", "n", "interruption", "overlap", "zero-int", "GPU-h twice", "cut", "low", "medium", "heavy"):
        t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=c == "policy")
    for name, p in res.policies.items():
        bl = p["by_load"]
        t.add_row(name, str(p["transitions"]), _h(p["mean_interruption_h"]), _h(p["mean_overlap_h"]),
                  _pct(p["zero_interruption_share"]), f"{p['gpu_hours_twice']:.0f}", _h(p["mean_cut_h"]),
                  *(f"{_h(bl[lv]['mean_interruption_h'])} ({bl[lv]['transitions']})" for lv in ("low", "medium", "heavy")))
    if m["injections"] == 0:
        con.print("[yellow]no chain injected: the trace is too short for the 7-day warm-up plus a 48 h segment "
                  "and 3 days of background[/yellow]")
    else:
        con.print(t)
    con.print("interruption/overlap: mean per transition; zero-int: gap <= 60 s; cut: predecessor time handed to a "
              "later segment; low/medium/heavy: mean interruption (transitions) by reactive gap <=2h / <=12h / more.")
