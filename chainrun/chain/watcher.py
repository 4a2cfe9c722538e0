"""The watcher: the acting lease of the home (chainrun/state/lease.py), then ticks at an interval.

One watcher of a home acts: it holds the acting lease, renews it every tick and while it
sleeps, and every transaction it writes re-reads the lease's epoch in the store. Every other
watcher (another terminal, another login node, cron's `watch --once`) sees who acts: a
long-running one becomes a read-only view that takes over once the holder's lease expires;
`--once` skips its tick. A holder that was stopped or suspended past its expiry finds out
before it writes or submits anything (LeaseLost) and becomes a view.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from chainrun.chain.engine import Engine, TickReport
from chainrun.chain.settle import needs_tick
from chainrun.errors import SlurmError, StateError
from chainrun.slurm.client import Backoff
from chainrun.state.lease import ActingLease, LeaseHeld, LeaseLost, Record

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 300.0  # after failed ticks the wait doubles from the interval up to this
# Slurm calls that change something: a watcher calls them only while it acts, checked just before and after
MUTATING = frozenset({"submit", "cancel", "signal", "update_pending"})


@dataclass(frozen=True)
class Role:
    """What this watcher is now: the one that acts, or a read-only view of ``holder``'s work."""

    acting: bool
    holder: Record | None = None  # who acts: this process's own record when ``acting``
    why: str = ""  # how the role changed, e.g. "lost the lease: ..."


class FencedSlurm:
    """The acting watcher's Slurm client: every call that changes something first checks that this
    process still acts. After an sbatch it checks again; a job submitted by a process that lost the
    role meanwhile (suspended during sbatch itself) is cancelled at once and the tick aborts."""

    mutating = MUTATING

    def __init__(self, inner, lease: ActingLease) -> None:
        self._inner, self._lease = inner, lease

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name not in self.mutating or not callable(attr):
            return attr

        def fenced(*args, **kwargs):
            self._lease.assert_acting()
            result = attr(*args, **kwargs)
            if name == "submit":
                try:
                    self._lease.assert_acting()
                except LeaseLost as e:
                    job_id = result[0] if isinstance(result, tuple) else result
                    try:
                        self._inner.cancel([job_id])
                        what = f"cancelled job {job_id}, submitted as the role was lost"
                    except SlurmError as ce:
                        what = f"could not cancel job {job_id}, submitted as the role was lost ({ce})"
                    raise LeaseLost(f"{e}; {what}") from None
            return result

        return fenced


class FencedRunner(FencedSlurm):
    """The acting watcher's runner: files it writes on the cluster (the hand-off rule of the next
    segment, written just before its sbatch) are written only while it acts."""

    mutating = frozenset({"write_file"})


def fenced_open(open_context: Callable, lease: ActingLease) -> Callable:
    """``open_context`` for MultiEngine whose contexts' Slurm clients and runners are fenced by ``lease``."""

    def opener(name, **kwargs):
        ctx = open_context(name, **kwargs)
        ctx.slurm = FencedSlurm(ctx.slurm, lease)
        ctx.runner = FencedRunner(ctx.runner, lease)
        return ctx

    return opener


def _tick_or_view(engine: Engine, *, acting: bool, once: bool) -> TickReport:
    """One tick while acting: a tick that fails is a failed report (with ``once`` it raises; a state
    store problem always does). Read-only: the number of active chains, nothing ticked."""
    if not acting:
        return TickReport(chains=len(engine.store.chains(active_only=True)))
    try:
        return engine.tick()
    except StateError:
        raise
    except Exception as e:
        if once:
            raise
        log.info("watcher tick failed", exc_info=True)  # the traceback: log file always, screen with -v
        return TickReport(failed=True, warnings=[f"tick failed ({type(e).__name__}: {e}); trying again"])


def _next_delay(report: TickReport, backoff: Backoff, interval: float) -> float:
    """The wait before the next tick: the interval, or the backoff after failed ticks (said in the report)."""
    if not report.failed:
        backoff.reset()
        return interval
    delay = backoff.failed()
    if delay > interval:
        report.warnings.append(f"{backoff.failures} failed tick(s) in a row; next try in {delay:.0f}s")
    return delay


def run_watch(
    engine: Engine, *, interval: float, once: bool, on_tick: Callable[[TickReport], bool | None] | None = None,
    stop_when_idle: bool = False, max_ticks: int | None = None, sleep: Callable[[float], None] = time.sleep,
    lease: ActingLease | None = None, on_role: Callable[[Role], None] | None = None,
) -> TickReport:
    """Tick until told to stop; ``on_tick`` returning False stops too. Returns the last report.

    A tick that fails (Slurm down or unreadable, or even a bug in one tick) never ends the
    loop: it is logged, reported as a warning, and the next tick waits longer (capped
    exponential backoff from ``interval`` up to MAX_BACKOFF_S), so a controller that is down
    for minutes is waited out. Only a state store problem (corrupt, newer) stops the watcher;
    with ``once`` every error propagates, so cron sees the exit code.

    With a ``lease`` only the process holding it ticks; while another holds it this loop is a
    read-only view (``on_tick`` gets an empty report, ``on_role`` says who acts) that takes over
    once the lease expires. With ``once`` a lease held elsewhere raises LeaseHeld.
    """
    ticks = 0
    backoff = Backoff(interval, max(interval, MAX_BACKOFF_S))
    role: Role | None = None

    def become(new: Role) -> None:
        nonlocal role
        changed = role is None or new.acting != role.acting or (
            not new.acting and (new.holder and new.holder.label) != (role.holder and role.holder.label))
        role = new
        if changed and on_role is not None:
            on_role(new)

    def lost(e: LeaseLost) -> None:
        log.warning("lost the acting lease: %s", e)
        become(Role(False, lease.holder() if lease else None, f"lost the lease: {e}"))

    def nap(delay: float) -> None:
        """Sleep; the acting watcher renews its lease on the way (a backoff may outlast the lease)."""
        if lease is None or not lease.acting:
            sleep(delay)
            return
        end = time.time() + delay
        while (left := end - time.time()) > 0:
            sleep(min(left, lease.timing.renew_s))
            try:
                lease.renew_if_due()
            except LeaseLost as e:
                lost(e)
                return

    try:
        while True:
            acting = True
            if lease is not None:
                other = lease.try_acquire()
                if other is not None:
                    if once:
                        raise LeaseHeld(other)
                    become(Role(False, other))
                    acting = False
                else:
                    become(Role(True, lease.file.mine))
            try:
                report = _tick_or_view(engine, acting=acting, once=once)
                ticks += 1
                delay = _next_delay(report, backoff, interval)
                if on_tick is not None and on_tick(report) is False:
                    return report
            except LeaseLost as e:  # stopped or suspended past the lease: nothing was written, nothing submitted
                if once:
                    raise
                lost(e)
                report, delay = TickReport(warnings=[f"this watcher lost the acting lease ({e})"]), 0.0
            if once or (max_ticks is not None and ticks >= max_ticks):
                return report
            # idle: no chain active, and no cancelled segment's accounting left to read (chain/settle.py)
            if stop_when_idle and not report.failed and not any(needs_tick(c) for c in engine.store.chains()):
                return report
            nap(delay)
    finally:
        if lease is not None:
            lease.release()
