"""The watcher: one lock per state store, then ticks at an interval.

The lock is an ``flock`` on a file beside the store, so a watcher killed with SIGKILL
releases it with its process: a stale lock cannot exist, and cron's ``watch --once``
never races an interactive ``watch``.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from chainrun.chain.engine import Engine, TickReport
from chainrun.errors import StateError


class WatcherBusy(StateError):
    """Another watcher holds this store."""


@contextmanager
def watcher_lock(home: Path) -> Iterator[None]:
    path = home / "watch.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise WatcherBusy(f"another chainrun watcher (pid {holder}) is driving these chains") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def run_watch(
    engine: Engine, *, interval: float, once: bool, on_tick: Callable[[TickReport], bool | None] | None = None,
    stop_when_idle: bool = False, max_ticks: int | None = None,
) -> TickReport:
    """Tick until told to stop; ``on_tick`` returning False stops too. Returns the last report."""
    ticks = 0
    while True:
        report = engine.tick()
        ticks += 1
        if on_tick is not None and on_tick(report) is False:
            return report
        if once or (max_ticks is not None and ticks >= max_ticks):
            return report
        if stop_when_idle and not engine.store.chains(active_only=True):
            return report
        time.sleep(interval)
