"""``chainrun model sites a,b``: the site margin of chains spanning these clusters, chosen on their
cached histories (chainrun/sim/site_selftune.py) and put in force for later `submit --cluster a,b`
(chainrun/chain/site_tuned.py); ``--show`` prints what is in force; ``--pin``, ``--unpin`` and
``--rollback`` are `model tune`'s for a cluster list. Rendering only."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

SITES_HELP = ("Choose the site margin of chains spanning these clusters (order = preference, e.g. a,b) on "
              "their cached histories and put it in force for later `submit --cluster a,b`; --show: what is in force; "
              "--pin / --unpin / --rollback: as `model tune`'s.")


def sites_cmd(
    clusters: Annotated[Optional[str], typer.Argument(metavar="CLUSTERS", help="Two clusters or more, in order of preference, e.g. a,b (with --show: every list when left out).")] = None,
    show: Annotated[bool, typer.Option("--show", help="Only show the margin in force and the latest choices; change nothing.")] = False,
    pin: Annotated[bool, typer.Option("--pin", help="Keep the margin in force: later choices (here or by `model refresh`) are recorded, but change nothing.")] = False,
    unpin: Annotated[bool, typer.Option("--unpin", help="Let later choices put their margin in force again.")] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Put the margin in force before the current one back (the shipped one if none), pinned.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")] = False,
) -> None:
    from chainrun.chain import site_tuned
    from chainrun.chain.sites import parse_sites
    from chainrun.cli.render import envelope
    from chainrun.errors import UsageError

    from chainrun.sim import site_selftune

    if show + pin + unpin + rollback > 1:
        raise UsageError("give one of --show, --pin, --unpin, --rollback")
    names = parse_sites(clusters) if clusters else None
    if names:
        site_selftune.check_names(names)  # before a corrupt file is touched: bad input changes nothing
    if pin or unpin or rollback:
        if not names:
            raise UsageError("--pin, --unpin and --rollback need the clusters, e.g. chainrun model sites a,b --pin")
        _pin(names, pin=pin, rollback=rollback, json_out=json_out)
        return
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
    typer.echo(f"in force: {_h(f['margin_s'])} ({_source(f)}{'; pinned' if res.get('pinned') else ''}); later "
               f"`chainrun submit --cluster {','.join(names)}` takes it (--site-margin overrides)")


def _pin(names: list[str], *, pin: bool, rollback: bool, json_out: bool) -> None:
    from chainrun.chain import site_tuned
    from chainrun.cli.render import envelope

    e = site_tuned.rollback(names) if rollback else site_tuned.pin(names, on=pin)
    f = e["in_force"]
    if json_out:
        typer.echo(envelope("model sites", {"clusters": names, "in_force": f, "pinned": e["pinned"],
                                            "source": f.get("source"), "set_aside": e.get("set_aside")}))
        return
    if e.get("set_aside"):
        a = e["set_aside"]
        typer.echo(f"warning: set aside the unreadable site margin file {a['file']} ({a['why']}) as {a['moved_to']}; "
                   "starting from the shipped margin", err=True)
    what = "rolled back to" if rollback else ("pinned" if pin else "unpinned")
    typer.echo(f"site margin for {','.join(names)}: {what} {_h(f['margin_s'])} ({_source(f)})"
               + ("; pinned" if e["pinned"] and not pin else ""))


def show_lines(st: dict) -> list[str]:
    if st.get("unreadable"):
        u = st["unreadable"]
        return [f"unreadable site margin file {st['file']}: {u['why']}; submit uses the shipped margin ({u['hint']})"]
    if not st["lists"]:
        return ["no site margin chosen yet: chains spanning clusters use the shipped 1h (chainrun model sites a,b)"]
    out = []
    for k, e in st["lists"].items():
        f = e["in_force"]
        out.append(f"{k}: {_h(f['margin_s'])} ({_source(f)}{'; pinned' if e.get('pinned') else ''})")
        for h in e["recent"]:
            got = ("chosen " + _h(h["margin_s"]) + ("" if h.get("put_in_force", True) else ", not put in force")) \
                if h["chosen"] else "not chosen"
            out.append(f"  {_day(h['at'])}: {got}: {h['reason']}")
    return out


def _source(f: dict) -> str:
    if f.get("source") == "chosen":
        w = f.get("window") or {}
        return f"chosen {_day(f.get('chosen_at'))} on {w.get('finished')} chains, {str(w.get('from'))[:10]} .. " \
               f"{str(w.get('until'))[:10]}"
    if f.get("source") == "rollback":
        return f"rolled back {_day(f.get('since'))} from {_h(f['rolled_back_from'])}" \
            if isinstance(f.get("rolled_back_from"), (int, float)) else f"rolled back {_day(f.get('since'))}"
    return "shipped"


def _h(s: float) -> str:
    return f"{s / 3600:g}h"


def _day(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()
