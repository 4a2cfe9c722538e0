"""The live view of `chainrun watch` on a terminal: the chain table, events scrolling beneath."""

from __future__ import annotations

import time
from collections import deque

from rich.console import Group
from rich.live import Live
from rich.text import Text

from chainrun.chain.engine import Engine
from chainrun.chain.summary import view_chain
from chainrun.cli import tables
from chainrun.cli.render import clock


def live_watch(engine: Engine, *, interval: float, until_done: bool, notify: list[str] | None = None) -> None:
    from chainrun.notify import watch_notifier

    store = engine.store
    notifier = watch_notifier(store, notify)  # reads events after each tick; never raises
    events: deque[str] = deque(maxlen=12)
    recent = store.events(limit=1)
    last = recent[-1][0] if recent else 0

    def frame():
        views = [view_chain(c, store.segments(c.id)) for c in store.chains()]
        ev = Text("\n".join(events) or "(no events yet)", style="dim")
        return Group(tables.chain_list(views), Text(f"last tick {clock(time.time())}, every {interval:.0f}s; Ctrl-C to stop"), ev)

    with Live(frame(), auto_refresh=False, transient=False) as live:
        while True:
            report = engine.tick()
            for eid, e in store.events(after_id=last):
                last = eid
                events.append(f"{clock(e.ts)} {e.chain_id} {e.kind}: {e.message}")
            for w in report.warnings:
                events.append(f"{clock(time.time())} warning: {w}")
            for msg, target, ok in notifier.after_tick():
                events.append(f"{clock(time.time())} {msg.chain_id} notified {target}: {msg.kind}" + ("" if ok else " (failed)"))
            live.update(frame(), refresh=True)
            if until_done and not store.chains(active_only=True):
                return
            time.sleep(interval)
