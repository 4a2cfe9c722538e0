"""A live segment read from the tick's one ``squeue``: its phase, a requeue by Slurm, and why a
pending segment waits (a hopeless reason fails the chain; Slurm's catch-all is explained from the
nodes and reservations)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chainrun.durations import format_duration
from chainrun.errors import SlurmError
from chainrun.slurm import reasons
from chainrun.slurm.parsers import QueueRow
from chainrun.state.records import PENDING, RUNNING, Chain, Segment

if TYPE_CHECKING:
    from chainrun.chain.tick_context import TickContext

log = logging.getLogger(__name__)

QUEUE_PHASE = {
    "PENDING": PENDING, "CONFIGURING": RUNNING, "RUNNING": RUNNING, "COMPLETING": RUNNING,
    "SUSPENDED": RUNNING, "STOPPED": RUNNING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING, "RESIZING": RUNNING,
}


def apply(t: TickContext, c: Chain, segs: list[Segment], s: Segment, q: QueueRow) -> None:
    phase = QUEUE_PHASE.get(q.state, s.phase)
    if phase == PENDING and s.phase == RUNNING:
        requeued(t, c, s, q)
    changed = phase != s.phase or q.state != s.slurm_state
    s.slurm_state, s.submit = q.state, q.submit or s.submit
    if phase == RUNNING:
        s.start, s.end = q.start or s.start, q.end or s.end
        s.extra.pop("pending_reason", None)
        s.extra.pop("expected_start", None)
    if changed and phase == RUNNING and s.phase != RUNNING:
        t.store.add_event(c.id, s.idx, "started", f"segment {s.idx} (job {s.job_id}) started")
    s.phase = phase
    if phase == PENDING:
        pending(t, c, segs, s, q)


def requeued(t: TickContext, c: Chain, s: Segment, q: QueueRow) -> None:
    """A running segment is back in the queue under the same job id: Slurm requeued it (a node
    failure, preemption with PreemptMode=REQUEUE, `scontrol requeue`). It stays the same segment,
    neither a new submission nor a foreign job; what its last run recorded is dropped, so its
    training start, hand-off wait and --total stop are read afresh when it runs again (the
    wrapper's rerun claims the chain through the normal protocol, SLURM_RESTART_COUNT >= 1)."""
    s.extra["requeues"] = int(s.extra.get("requeues") or 0) + 1
    for k in ("payload_start", "handoff_waiting", "state_read_at", "total_stop_at", "granted_s"):
        s.extra.pop(k, None)
    trained = f", after {format_duration(t.clock() - s.start)} running" if s.start else ""
    t.store.add_event(c.id, s.idx, "requeued",
                         f"segment {s.idx} (job {s.job_id}) was requeued by Slurm{trained} ({q.state}, "
                         f"{q.reason or 'no reason given'}); it runs again under the same job id")
    s.start = s.end = None


def pending(t: TickContext, c: Chain, segs: list[Segment], s: Segment, q: QueueRow) -> None:
    """Why it waits, and Slurm's own start estimate: both from the tick's one squeue."""
    why = reasons.explain(q.reason)
    s.extra["pending_reason"] = q.reason
    s.extra["expected_start"] = q.start  # squeue --start's answer; None until the backfill plans it
    what = f"segment {s.idx} (job {s.job_id})"
    if why.hopeless:
        t.fail(c, segs, f"{what} can never start: {why.words} ({why.code})" + (f"; {why.hint}" if why.hint else ""))
    elif why.code in (*reasons.UNAVAILABLE, "JobHeldUser", "JobHeldAdmin") and s.extra.get("warned_reason") != why.code:
        s.extra["warned_reason"] = why.code
        if why.code in reasons.UNAVAILABLE:  # Slurm's catch-all: say which nodes, or which reservation
            why = explain_unavailable(t, c, s, q.reason)
            s.extra["pending_explained"] = {"reason": q.reason, "words": why.words}
        t.store.add_event(c.id, s.idx, "warning", f"{what} is pending: {why.words}"
                             + (f" ({why.hint})" if why.hint else ""))


def explain_unavailable(t: TickContext, c: Chain, s: Segment, reason: str) -> reasons.Reason:
    """What the nodes and reservations say (two scontrol calls, once per segment and reason)."""
    from chainrun.chain.contract import option_value
    from chainrun.slurm.reservations import expand_nodes

    found = t.reservations()
    try:
        states = t.slurm.node_states(c.partition)
    except SlurmError as e:  # without them, Slurm's own words
        log.info("scontrol show node: %s", e)
        return reasons.explain(reason)
    pinned = set(expand_nodes(option_value(c.sbatch_args, "--nodelist", "-w") or ""))
    return reasons.explain_unavailable(reason, node_states=states, reservations=found,
                                       now=t.clock(), limit_s=s.time_limit_s, pinned=pinned,
                                       partition=c.partition)
