"""--total reached while a segment trains: stop it the way Slurm would at its limit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chainrun.chain import settle
from chainrun.chain.pace import work_done
from chainrun.durations import format_duration
from chainrun.slurm.client import SlurmRefused
from chainrun.state.records import PENDING, RUNNING, Chain, Segment

if TYPE_CHECKING:
    from chainrun.chain.tick_context import TickContext

log = logging.getLogger(__name__)


def stop_at_total(t: TickContext, c: Chain, segs: list[Segment], now: float) -> None:
    """--total reached while a segment trains: send it the chain's signal now, as Slurm would before
    its limit, so it checkpoints and exits; the chain then completes. A successor is sized for the work
    left when it was asked for, and the segment before it may train until its hand-over point, so the
    last segment's limit is often longer than the work left (by up to the lead the policy chose: hours
    for `predicted`). Without this, a trainer that runs until signalled would train past --total to
    that limit. Once per segment. A segment not training (queued, or started and waiting for the
    hand-off) is no longer needed and is cancelled: signalled, a waiting successor would only end
    unstarted and be replaced. The replay (chainrun/sim/chains.py) ends a chain when its work is done:
    this is what makes that true here, to within one watcher tick."""
    running = [s for s in segs if s.phase == RUNNING and s.job_id]
    if not running or c.total_s - work_done(c, segs, now) > 0:
        return
    for s in running:  # the exact payload start before acting on it (a hand-off wait is not training)
        t.note_training_start(c, s, now, force=True)
    if c.total_s - work_done(c, segs, now) > 0:
        return
    events = []
    training = [s for s in running if not s.extra.get("handoff_waiting")]
    for s in training:
        if s.extra.get("total_stop_at"):
            continue
        try:
            t.slurm.signal(s.job_id, c.signal)
        except SlurmRefused as e:  # it ended meanwhile: the next tick reads its end
            log.info("scancel --signal %s: %s", s.job_id, e)
            continue
        s.extra["total_stop_at"] = now
        events.append((s.idx, "total", f"--total {format_duration(c.total_s)} reached: segment {s.idx} "
                                       f"(job {s.job_id}) was sent {c.signal} to checkpoint and stop"))
    unneeded = [s for s in segs if s.job_id and (s.phase == PENDING or (s.phase == RUNNING and s not in training))]
    if unneeded:
        failed = t.slurm.cancel([s.job_id for s in unneeded])
        for s in unneeded:
            if s.job_id in failed:  # still live: this runs again next tick, and so does its scancel
                events.append((s.idx, "warning", f"segment {s.idx} (job {s.job_id}) is not needed (--total "
                                                 f"reached) but scancel failed: {failed[s.job_id]}"))
                continue
            settle.mark_cancelled(c, s, "cancelled by chainrun: not needed, --total reached", now)
            events.append((s.idx, "total", f"segment {s.idx} (job {s.job_id}) cancelled: --total reached"))
    if events:
        t.store.save(c, running + [s for s in unneeded if s not in running], events)
