"""A segment chainrun cancels is settled later, from what Slurm and the wrapper recorded.

``scancel`` returns before the job has ended: a running trainer gets TERM, may save, and
Slurm ends the job seconds later. What chainrun knew at that moment was squeue's *expected*
end (start + limit) and no training time at all, so a cancelled segment used to keep those
as its figures. Now a cancel only marks the segment (``settle``: when it was asked for) and
forgets the expected end; the watcher's next ticks read the job's final sacct row and the
wrapper's outcome/state file, as for any ended segment, and only then fill in its end, its
state, what it held and what it trained. A chain that ended with such segments still gets
ticked (``needs_tick``) until they are settled; one that Slurm never reports is given up
after ``GIVE_UP_S`` with its figures left unknown, never guessed.
"""

from __future__ import annotations

from chainrun.chain import outcomes
from chainrun.durations import format_duration
from chainrun.slurm.parsers import AcctRow
from chainrun.state.records import ACTIVE, CANCELLED_OUT, ENDED, LIVE_PHASES, SKIPPED, UNSTARTED, Chain, Segment
from chainrun.state.store import Store

GIVE_UP_S = 900  # as the engine's LOST_AFTER_S: a job neither squeue nor sacct shows for this long


def mark_cancelled(chain: Chain, s: Segment, reason: str, now: float) -> None:
    """A segment chainrun cancelled (or is about to): ended for planning, its figures still to come."""
    s.phase, s.outcome, s.reason = ENDED, CANCELLED_OUT, reason
    s.slurm_state = "CANCELLED"  # never shown with the live state it had before scancel
    s.extra["cancel_requested"] = True
    if s.job_id:
        s.extra["settle"] = now
        s.end = None  # squeue's end of a running job is start + limit, not when it will stop
        chain.extra["settling"] = True


def note_cancel_intent(store: Store, chain: Chain, segs: list[Segment], now: float) -> None:
    """Before a `chainrun cancel` runs scancel: the intent is in the store first, so a watcher whose tick
    read the chain before the cancel never takes the job's CANCELLED for a cancel outside chainrun
    (adopt_cancel)."""
    live = [s for s in segs if s.phase in LIVE_PHASES and s.job_id]
    for s in live:
        s.extra["cancel_asked"] = now
    chain.extra["cancel_asked"] = now
    store.save(chain, live)


def adopt_cancel(store: Store, chain: Chain, s: Segment) -> None:
    """A job Slurm shows CANCELLED that this tick's copy does not know chainrun cancelled: read the store
    again, since a `chainrun cancel` in another process may have acted after the tick read it. If so, the
    segment is chainrun's cancel, and the chain keeps the status the cancel gave it (this tick's older
    copy must not write it back to ACTIVE)."""
    if s.extra.get("cancel_requested"):
        return
    fresh = store.chain(chain.id)
    seg = next((x for x in store.segments(chain.id) if x.idx == s.idx), None)
    if not (seg and (seg.extra.get("cancel_requested") or seg.extra.get("cancel_asked"))) \
            and not fresh.extra.get("cancel_asked"):
        return
    s.extra["cancel_requested"] = True
    if fresh.status != ACTIVE:
        chain.status, chain.reason, chain.finished = fresh.status, fresh.reason, fresh.finished
    for k in ("cancel_asked", "cancel_pending", "cancel_reason", "settling"):
        if k in fresh.extra:
            chain.extra[k] = fresh.extra[k]


def unsettled(segs: list[Segment]) -> list[Segment]:
    return [s for s in segs if s.extra.get("settle") is not None and s.job_id]


def needs_tick(chain: Chain) -> bool:
    """Active, or finished with cancelled segments whose accounting is still to be read."""
    return chain.status == ACTIVE or bool(chain.extra.get("settling"))


def settle(chain: Chain, s: Segment, row: AcctRow, info: dict[str, str],
           earlier: list[outcomes.Run] | None = None) -> tuple[float, str]:
    """Fill in a cancelled segment from its final sacct row and the wrapper's file; returns the
    seconds it trained and the event text. A job that ended on its own before the cancel reached
    it (e.g. it found the chain finished) keeps the outcome its own ending says. ``earlier``: the
    runs of a requeued job before its last one (outcomes.earlier_runs): their figures add up."""
    s.slurm_state, s.exit_code = row.state, row.exit_code
    s.submit, s.eligible, s.start, s.end = row.submit or s.submit, row.eligible, row.start, row.end
    s.extra.pop("settle", None)
    window = outcomes.payload_window(info, row)
    if window:
        s.extra["payload_start"], s.extra["payload_end"] = window
    what = f"segment {s.idx} (job {s.job_id})"
    if row.state != "CANCELLED":
        result = outcomes.classify(chain, s, row, info)
        s.outcome, s.reason = result.outcome, result.reason
        trained = 0.0 if result.outcome in (UNSTARTED, SKIPPED) else result.credit_s
        how = f"ended by itself ({row.state}: {result.reason}) before chainrun's cancel reached it"
    else:
        trained = max(0.0, window[1] - window[0]) if window and window[1] is not None else 0.0
        how = "cancelled"
    held = max(0.0, row.end - row.start) if row.start and row.end else 0.0
    text = f"{what} {how}: " + (f"held its allocation {format_duration(held)}, trained {format_duration(trained)}"
                                if row.start else "it never started")
    if earlier:
        summed = outcomes.add_earlier_runs(outcomes.Result(s.outcome, trained, s.reason, text), s, earlier)
        return summed.credit_s, summed.message
    return trained, text


def give_up(s: Segment) -> str:
    s.extra.pop("settle", None)
    s.extra["settle_unknown"] = True
    return (f"segment {s.idx} (job {s.job_id}) was cancelled, but Slurm has no final record of it: "
            "its end and training time stay unknown")


def done_settling(chain: Chain, segs: list[Segment]) -> None:
    if not unsettled(segs):
        chain.extra.pop("settling", None)
