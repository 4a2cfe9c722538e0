"""``chainrun model sites a,b``: the site margin of chains spanning these clusters, chosen on their
cached histories (chainrun/sim/site_selftune.py) and put in force for later `submit --cluster a,b`
(chainrun/chain/site_tuned.py); ``--show`` prints what is in force. Rendering only."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

SITES_HELP = ("Choose the site margin of chains spanning these clusters (order = preference, e.g. a,b) on "
              "their cached histories and put it in force for later `submit --cluster a,b`; --show: what is in force.")


def sites_cmd(
    clusters: Annotated[Optional[str], typer.Argument(metavar="CLUSTERS", help="Two clusters or more, in order of preference, e.g. a,b (with --show: every list when left out).")] = None,
    show: Annotated[bool, typer.Option("--show", help="Only show the margin in force and the latest choices; change nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")] = False,
) -> None:
    from chainrun.chain import site_tuned
    from chainrun.chain.sites import parse_sites
    from chainrun.cli.render import envelope
    from chainrun.errors import UsageError

    from chainrun.sim import site_selftune

    names = parse_sites(clusters) if clusters else None
    if names:
        site_selftune.check_names(names)  # before a corrupt file is touched: bad input changes nothing
    if show:
        st = site_tuned.status(names)
        if json_out:
            typer.echo(envelope("model sites", st))
            return
        for line in show_lines(st):
            typer.echo(line)
        return
    if not names:
        raise UsageError("give the clusters, e.g. chainrun model sites a,b", hint="or --show for every list")
    aside = site_tuned.set_aside()
    if aside and not json_out:
        typer.echo(f"warning: set aside the unreadable site margin file {aside['file']} ({aside['why']}) as "
                   f"{aside['moved_to']}", err=True)
    res = site_selftune.choose_now(names, workers=1 if json_out or not _tty() else 2)
    if json_out:
        typer.echo(envelope("model sites", {**res, "set_aside": aside}))
        return
    typer.echo(f"site margin for {','.join(names)}: {res['summary']}")
    f = res["in_force"]
    typer.echo(f"in force: {_h(f['margin_s'])} ({_source(f)}); later `chainrun submit --cluster {','.join(names)}` "
               "takes it (--site-margin overrides)")


def show_lines(st: dict) -> list[str]:
    if st.get("unreadable"):
        u = st["unreadable"]
        return [f"unreadable site margin file {st['file']}: {u['why']}; submit uses the shipped margin ({u['hint']})"]
    if not st["lists"]:
        return ["no site margin chosen yet: chains spanning clusters use the shipped 1h (chainrun model sites a,b)"]
    out = []
    for k, e in st["lists"].items():
        f = e["in_force"]
        out.append(f"{k}: {_h(f['margin_s'])} ({_source(f)})")
        for h in e["recent"]:
            out.append(f"  {_day(h['at'])}: {'chosen ' + _h(h['margin_s']) if h['chosen'] else 'not chosen'}: "
                       f"{h['reason']}")
    return out


def _source(f: dict) -> str:
    if f.get("source") == "chosen":
        w = f.get("window") or {}
        return f"chosen {_day(f.get('chosen_at'))} on {w.get('finished')} chains, {str(w.get('from'))[:10]} .. " \
               f"{str(w.get('until'))[:10]}"
    return "shipped"


def _h(s: float) -> str:
    return f"{s / 3600:g}h"


def _day(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()
