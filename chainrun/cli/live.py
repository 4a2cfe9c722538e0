"""The live view of `chainrun watch` on a terminal: the chain table, events scrolling beneath.

Only the rendering lives here: the loop is :func:`chainrun.chain.watcher.run_watch`, the same
one `watch --plain` uses, so a failing tick is caught, shown and retried with backoff here too.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from chainrun.chain.engine import Engine
from chainrun.chain.summary import view_chain
from chainrun.cli import tables
from chainrun.cli.render import clock, role_line


def live_watch(engine: Engine, *, interval: float, until_done: bool, notify: list[str] | None = None,
               console: Console | None = None, sleep: Callable[[float], None] = time.sleep,
               max_ticks: int | None = None, lease=None) -> None:
    """With a ``lease`` held by another watch this is a read-only view: the line under the table
    says which host:pid acts and until when; it takes over when that lease expires."""
    from chainrun.chain.watcher import run_watch
    from chainrun.notify import watch_notifier

    store = engine.store
    # made when this watch starts to act, before its first tick (it writes its high-water mark): a view never notifies
    notifier = watch_notifier(store, notify) if lease is None else None
    events: deque[str] = deque(maxlen=12)
    recent = store.events(limit=1)
    last = recent[-1][0] if recent else 0
    state = {"line": f"starting; a tick every {interval:.0f}s; Ctrl-C to stop", "role": None}

    def frame():
        views = [view_chain(c, store.segments(c.id)) for c in store.chains()]
        ev = Text("\n".join(events) or "(no events yet)", style="dim")
        role = state["role"]
        lines = [Text(state["line"])] + ([Text(role_line(role), style="bold" if role.acting else "yellow")]
                                         if role is not None else [])
        return Group(tables.chain_list(views), *lines, ev)

    def on_role(role) -> None:
        nonlocal notifier
        state["role"] = role
        if role.acting and notifier is None:
            notifier = watch_notifier(store, notify)  # reads events after each tick; never raises
        if role.why:
            events.append(f"{clock(time.time())} {role.why}")

    def on_tick(report) -> None:
        nonlocal last
        now = time.time()
        for eid, e in store.events(after_id=last):
            last = eid
            events.append(f"{clock(e.ts)} {e.chain_id} {e.kind}: {e.message}")
        for w in report.warnings:
            events.append(f"{clock(now)} warning: {w}")
        acting = state["role"] is None or state["role"].acting
        for msg, target, ok in (notifier.after_tick() if acting else []):  # only the acting watch notifies
            events.append(f"{clock(now)} {msg.chain_id} notified {target}: {msg.kind}" + ("" if ok else " (failed)"))
        what = "failed (see the warning below)" if report.failed else f"every {interval:.0f}s"
        state["line"] = (f"last {'tick' if acting else 'look'} {clock(now)}, {what}; Ctrl-C to stop")
        live.update(frame(), refresh=True)

    with Live(frame(), console=console, auto_refresh=False, transient=False) as live:
        try:
            run_watch(engine, interval=interval, once=False, on_tick=on_tick, stop_when_idle=until_done, sleep=sleep,
                      max_ticks=max_ticks, lease=lease, on_role=on_role)
        finally:  # sends still going out get a last chance; what is left is logged (notify.py)
            for msg, target, ok in (notifier.close() if notifier is not None else []):
                events.append(f"{clock(time.time())} {msg.chain_id} notified {target}: {msg.kind}"
                              + ("" if ok else " (failed)"))
            live.update(frame(), refresh=True)
