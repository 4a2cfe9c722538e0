"""The watcher: one lock per state store, then ticks at an interval.

The lock is an ``flock`` on a file beside the store, so a watcher killed with SIGKILL
releases it with its process: a stale lock cannot exist, and cron's ``watch --once``
never races an interactive ``watch``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from chainrun.chain.engine import Engine, TickReport
from chainrun.chain.settle import needs_tick
from chainrun.errors import StateError
from chainrun.slurm.client import Backoff

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 300.0  # after failed ticks the wait doubles from the interval up to this


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
    stop_when_idle: bool = False, max_ticks: int | None = None, sleep: Callable[[float], None] = time.sleep,
) -> TickReport:
    """Tick until told to stop; ``on_tick`` returning False stops too. Returns the last report.

    A tick that fails (Slurm down or unreadable, or even a bug in one tick) never ends the
    loop: it is logged, reported as a warning, and the next tick waits longer (capped
    exponential backoff from ``interval`` up to MAX_BACKOFF_S), so a controller that is down
    for minutes is waited out. Only a state store problem (corrupt, newer) stops the watcher;
    with ``once`` every error propagates, so cron sees the exit code.
    """
    ticks = 0
    backoff = Backoff(interval, max(interval, MAX_BACKOFF_S))
    while True:
        try:
            report = engine.tick()
        except StateError:
            raise
        except Exception as e:
            if once:
                raise
            log.info("watcher tick failed", exc_info=True)  # the traceback: log file always, screen with -v
            report = TickReport(failed=True, warnings=[f"tick failed ({type(e).__name__}: {e}); trying again"])
        ticks += 1
        if report.failed:
            delay = backoff.failed()
            if delay > interval:
                report.warnings.append(f"{backoff.failures} failed tick(s) in a row; next try in {delay:.0f}s")
        else:
            backoff.reset()
            delay = interval
        if on_tick is not None and on_tick(report) is False:
            return report
        if once or (max_ticks is not None and ticks >= max_ticks):
            return report
        # idle: no chain active, and no cancelled segment's accounting left to read (chain/settle.py)
        if stop_when_idle and not report.failed and not any(needs_tick(c) for c in engine.store.chains()):
            return report
        sleep(delay)
