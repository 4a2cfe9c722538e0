"""``chainrun watch --install-schedule | --uninstall-schedule``: parse, call chainrun/schedule.py, render."""

from __future__ import annotations

import typer

from chainrun.errors import UsageError


def schedule_options(*, install: bool, uninstall: bool, every: str | None, via: str | None,
                     json_out: bool, other_options: list[str]) -> None:
    from chainrun import paths, schedule
    from chainrun.cli.render import envelope
    from chainrun.durations import format_duration
    from chainrun.runner.local import LocalRunner
    from chainrun.state.store import Store

    if install and uninstall:
        raise UsageError("--install-schedule and --uninstall-schedule together", hint="give one of them")
    if not (install or uninstall):
        raise UsageError("--every and --via go with --install-schedule",
                         hint="e.g. chainrun watch --install-schedule --every 5m")
    if other_options:
        raise UsageError(f"{', '.join(other_options)} cannot go with --{'un' if uninstall else ''}install-schedule",
                         hint="the tick always runs `chainrun watch --once --plain` for every cluster of this home")
    if uninstall and (every or via):
        raise UsageError("--every and --via go with --install-schedule, not --uninstall-schedule")
    every_s = schedule.parse_every(every) if every else schedule.DEFAULT_EVERY_S
    store = Store(paths.state_db())
    try:
        if install:
            res = schedule.install_ticks(LocalRunner(), store, every_s=every_s, via=via)
        else:
            gone = schedule.uninstall_ticks(LocalRunner(), store)
    finally:
        store.close()
    if install:
        if json_out:
            typer.echo(envelope("watch --install-schedule", {
                "via": res.via, "why": res.why, "host": res.host, "every_s": res.every_s, "changed": res.changed,
                "entry": res.lines, "log": res.log}))
            return
        where = "your scrontab" if res.via == "scrontab" else f"the crontab of {res.host}"
        typer.echo(f"{'installed in' if res.changed else 'already in'} {where}: a tick every "
                   f"{format_duration(res.every_s)} (`chainrun watch --once --plain`)")
        typer.echo(f"why {res.via}: {res.why}")
        typer.echo(f"log: {res.log}")
        for line in res.lines:
            typer.echo(f"  {line}")
        if res.via == "scrontab":
            typer.echo(f"each tick is a small batch job named {schedule.TICK_JOB_NAME} (it queues and is charged); "
                       "`chainrun status` shows the last and next tick")
        return
    if json_out:
        typer.echo(envelope("watch --uninstall-schedule", {"removed": gone.lines, "was": gone.record,
                                                            "note": gone.note}))
        return
    if not gone.lines:
        typer.echo("no chainrun tick entry in your scrontab or this host's crontab")
    for via, lines in gone.lines.items():
        typer.echo(f"removed from your {'scrontab' if via == 'scrontab' else 'crontab'}: {len(lines)} line(s); "
                   "your other entries are unchanged")
    if gone.note:
        typer.echo(f"note: {gone.note}")
