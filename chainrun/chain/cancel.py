"""Cancelling a chain's live segments: by the user (`chainrun cancel`), when the chain finishes, and
again every tick for jobs a scancel could not stop."""

from __future__ import annotations

import time

from chainrun.chain import settle
from chainrun.errors import SlurmError
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import LIVE_PHASES, Chain, Segment
from chainrun.state.store import Store


def cancel_live(slurm: SlurmClient, c: Chain, segs: list[Segment], reason: str) -> list[tuple[int, str, str]]:
    """scancel a chain's live segments; a segment is recorded cancelled only once Slurm took the scancel
    (SlurmClient.cancel retries). One it did not stays live with the error, and the chain is marked
    ``cancel_pending`` for the watcher to ask again (cancel.retry_cancels). Returns warning events."""
    live = [s for s in segs if s.phase in LIVE_PHASES]
    failed = slurm.cancel([s.job_id for s in live if s.job_id]) if live else {}
    events = []
    for s in live:
        if s.job_id in failed:
            if s.extra.get("cancel_failed") != failed[s.job_id]:
                events.append((s.idx, "warning", f"segment {s.idx} (job {s.job_id}) could not be cancelled: "
                                                 f"{failed[s.job_id]}; trying again every watcher tick"))
            s.extra["cancel_failed"] = failed[s.job_id]
            continue
        s.extra.pop("cancel_failed", None)
        settle.mark_cancelled(c, s, reason, time.time())
    if failed:
        c.extra["cancel_pending"], c.extra["cancel_reason"] = True, reason
    else:
        c.extra.pop("cancel_pending", None)
        c.extra.pop("cancel_reason", None)
    return events


def cancel_chain(store: Store, slurm: SlurmClient, c: Chain, *, reason: str = "cancelled by the user") -> list[str]:
    """Cancel a chain's queued and running segments; returns the job ids cancelled. Jobs Slurm would not
    cancel stay live (the watcher asks again) and raise SlurmError once the rest is recorded."""
    from chainrun.state.records import CANCELLED

    segs = store.segments(c.id)
    ids = [s.job_id for s in segs if s.phase in LIVE_PHASES and s.job_id]
    settle.note_cancel_intent(store, c, segs, time.time())  # in the store before any scancel (settle.adopt_cancel)
    events = cancel_live(slurm, c, segs, reason)
    stuck = [s for s in segs if s.phase in LIVE_PHASES and s.extra.get("cancel_failed")]
    done = [j for j in ids if j not in {s.job_id for s in stuck}]
    c.status, c.reason, c.finished = CANCELLED, reason, time.time()
    store.save(c, segs, [(None, "cancelled", f"chain {c.id} cancelled ({len(done)} job(s) cancelled)"), *events])
    if stuck:
        raise SlurmError(f"chain {c.id} cancelled, but Slurm did not cancel job(s) "
                         f"{', '.join(s.job_id for s in stuck)}: {stuck[0].extra['cancel_failed']}",
                         hint="the watcher asks again every tick; or run `scancel` on them yourself")
    return done


def retry_cancels(store: Store, slurm: SlurmClient, chains: list[Chain]) -> None:
    """Jobs of finished chains that a scancel could not stop (cancel_live): asked again every tick
    until Slurm takes it, so a finished chain never leaves a job queued or training."""
    for c in chains:
        segs = store.segments(c.id)
        events = cancel_live(slurm, c, segs, c.extra.get("cancel_reason") or "cancelled by chainrun")
        store.save(c, segs, events)
