"""A segment whose job has ended: its outcome classified (chain/outcomes.py), its work credited at
its shape's rate, what it says about its nodes acted on (placement, spread), and the chain
finished, retried or failed by the rules below."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chainrun.chain import outcomes, placement, settle, spread
from chainrun.chain.pace import segment_rate, total_tolerance
from chainrun.errors import SlurmError
from chainrun.slurm.parsers import AcctRow
from chainrun.state.records import (
    CANCELLED_OUT, CHECKPOINT_CRASH, COMPLETED, CONTINUE, CRASH, DONE, ENDED, HANDOFF, NO_RUN_FOLDER, RUNNING,
    SKIPPED, UNSTARTED, Chain, Segment,
)

if TYPE_CHECKING:
    from chainrun.chain.tick_context import TickContext

log = logging.getLogger(__name__)

MAX_CHECKPOINT_CRASHES = 2  # the payload crashed while saving this many times in a row: a broken checkpoint, stop
MAX_UNSTARTED = 6  # this many segments in a row ended waiting for the chain: its last owner cannot be established
MAX_NO_RUN_FOLDER = 2  # this many segments could not see the run folder on their node: it is not on a shared filesystem


def ended(t: TickContext, c: Chain, segs: list[Segment], s: Segment, row: AcctRow) -> None:
    if row.state == "CANCELLED":  # a `chainrun cancel` since this tick read the store is chainrun's cancel
        settle.adopt_cancel(t.store, c, s)
    info = outcomes.read_outcome_file(t.runner, c, s, run_start=(row.start or row.submit) if s.extra.get("requeues") else None)
    result = outcomes.classify(c, s, row, info, checkpoint_time=lambda: outcomes.newest_checkpoint(t.runner, c),
                               cancel_record=lambda gen: outcomes.read_cancel_record(t.runner, c, gen))
    result = outcomes.add_earlier_runs(result, s, outcomes.earlier_runs(t.runner, c, s))  # a requeued job's runs
    s.phase, s.slurm_state, s.outcome, s.reason = ENDED, row.state, result.outcome, result.reason
    s.submit, s.eligible, s.start, s.end = row.submit, row.eligible, row.start, row.end
    s.exit_code, s.credit_s = row.exit_code, result.credit_s
    s.extra.update({k: v for k, v in info.items() if k in ("handoff_wait", "signaled", "signal_at", "gen")})
    window = outcomes.payload_window(info, row)
    if window:
        s.extra["payload_start"], s.extra["payload_end"] = window
    events = [(s.idx, result.outcome, result.message)]
    if result.outcome in (CONTINUE, HANDOFF):
        c.consecutive_failures = 0  # UNSTARTED and SKIPPED neither spend a retry nor reset the count
    if result.outcome in (CRASH, CHECKPOINT_CRASH) and (tail := outcomes.read_tail(t.runner, c, s)):
        s.extra["log_tail"] = tail[-2000:]
        events.append((s.idx, "warning", f"last lines of job {s.job_id}:\n{tail}"))
    events += check_overlaps(t, c, segs, s)
    if result.outcome == NO_RUN_FOLDER:
        events += exclude_blind_node(t, c, segs, s, row)
    elif result.outcome not in (UNSTARTED, SKIPPED):  # the pace it trained at, then what it says about its nodes
        t.read_progress(c, s)
    # --total is work at the reference shape: this segment's training times its shape's rate
    s.extra["rate"] = segment_rate(c, s, segs, final=True)
    s.extra["work_s"] = result.credit_s * s.extra["rate"]
    c.credited_s += s.extra["work_s"]
    if result.outcome == CONTINUE and c.total_s - c.credited_s < total_tolerance(c):
        # it stopped (Slurm's signal, its limit) with --total reached before a tick told it to: no next segment
        events[0] = (s.idx, CONTINUE, result.message.replace("; next segment continues", "; --total reached"))
    if result.outcome not in (UNSTARTED, SKIPPED):
        events += placement.after_segment(c, segs, s)
        events += placement.interference(c, s, lambda: exclusive_cost(t, c, s))
        events += spread.after_segment(c, segs, s)
        if any(kind == "adapt" for _, kind, _ in events):
            events += t.update_queued(c, segs)
    t.store.save(c, [s], events)
    if result.outcome == DONE:
        t.finish(c, segs, COMPLETED, f"training finished in segment {s.idx}")
    elif result.outcome == CRASH:
        count_failure(t, c, segs, s)
    elif result.outcome == CHECKPOINT_CRASH and _streak(segs, CHECKPOINT_CRASH) >= MAX_CHECKPOINT_CRASHES:
        t.fail(c, segs, f"the payload crashed while checkpointing {MAX_CHECKPOINT_CRASHES} times in a row "
                            f"(last: segment {s.idx}, job {s.job_id}); fix the checkpoint code and resubmit")
    elif result.outcome == UNSTARTED and _streak(segs, UNSTARTED) >= MAX_UNSTARTED:
        t.fail(c, segs, f"{MAX_UNSTARTED} segments in a row could not take the chain over from its last owner; "
                            f"see {c.run_dir}/control")
    elif result.outcome == CANCELLED_OUT and result.external:
        t.fail(c, segs, result.reason)
    elif result.outcome == NO_RUN_FOLDER and sum(o.outcome == NO_RUN_FOLDER for o in segs) >= MAX_NO_RUN_FOLDER:
        blind = sorted({o.extra.get("blind_node") or "?" for o in segs if o.outcome == NO_RUN_FOLDER})
        t.fail(c, segs, f"{MAX_NO_RUN_FOLDER} segments could not see the run folder {c.run_dir} "
                            f"(node(s) {', '.join(blind)}): put it on a shared filesystem that every compute "
                            "node mounts and submit again (`chainrun cluster test --probe` checks one)")


def exclude_blind_node(t: TickContext, c: Chain, segs: list[Segment], s: Segment,
                       row: AcctRow) -> list[tuple[int, str, str]]:
    """A node that does not see the run folder gets no further segment of the chain: excluded like a
    straggler (placement.py; `chainrun unexclude` pardons it), a queued successor updated in place.
    Not subject to --no-adapt: a segment there cannot train at all."""
    node = outcomes.ran_on(row)
    if not node:
        return []
    s.extra["blind_node"] = node
    why = f"the run folder {c.run_dir} is not visible there"
    if not placement.exclude(c, node, why, s.idx, s.end):
        return []
    events = [(s.idx, "adapt", f"excluding node {node} from the next segments: {why} "
                               f"(`chainrun unexclude {c.id} {node}` to pardon it)")]
    return events + t.update_queued(c, segs)


def check_overlaps(t: TickContext, c: Chain, segs: list[Segment], s: Segment) -> list[tuple[int, str, str]]:
    """The promise checked, not assumed: did two payloads of this chain ever train at once?"""
    windows: dict[str, tuple[float, float | None]] = {}
    for o in segs:
        if o.job_id and o.extra.get("payload_start") is not None and (o is s or o.phase == ENDED):
            windows[o.job_id] = (float(o.extra["payload_start"]), o.extra.get("payload_end"))
        elif o is not s and o.phase == RUNNING and o.job_id:  # still training: its start is in its state file
            again = o.start if o.extra.get("requeues") else None  # only this run's record
            w = outcomes.payload_window(outcomes.read_outcome_file(t.runner, c, o, run_start=again), None)
            if w:
                windows[o.job_id] = (w[0], None)
    found = [(a, b, secs) for a, b, secs in outcomes.payload_overlaps(windows, t.clock()) if s.job_id in (a, b)]
    events = []
    for a, b, secs in found:
        pair = sorted((a, b))
        known = s.extra.setdefault("payload_overlaps", [])
        if any(sorted(k["jobs"]) == pair for k in known):
            continue
        known.append({"jobs": pair, "seconds": secs})
        msg = (f"ERROR: two copies of chain {c.id} trained at the same time: jobs {pair[0]} and {pair[1]} "
               f"for {secs:.0f}s (both wrote to {c.checkpoint_dir}); please report this")
        log.error(msg)
        events.append((s.idx, "error", msg))
    return events


def exclusive_cost(t: TickContext, c: Chain, s: Segment) -> float | None:
    """How much longer the next segment would wait with --exclusive: two `sbatch --test-only` (no job
    is created), made only when a segment's pace suffered from a neighbour."""
    from chainrun.chain.request import segment_args
    from chainrun.chain.segments import wrapper_path

    probe = Segment(chain_id=c.id, idx=s.idx + 1, time_limit_s=c.segment_s,
                    extra={"nodes": s.extra["nodes"]} if s.extra.get("nodes") else {})  # elastic: its shape
    args = segment_args(c, probe)
    try:
        plain = t.slurm.test_only(wrapper_path(c), args, script_args=[str(probe.idx)])
        excl = t.slurm.test_only(wrapper_path(c), args + ["--exclusive"], script_args=[str(probe.idx)])
    except SlurmError as e:
        log.info("sbatch --test-only for chain %s: %s", c.id, e)
        return None
    return None if plain is None or excl is None else max(0.0, excl - plain)


def count_failure(t: TickContext, c: Chain, segs: list[Segment], s: Segment) -> None:
    c.consecutive_failures += 1
    if c.consecutive_failures > c.retries:
        t.fail(c, segs, f"segment {s.idx} failed ({s.reason}); no retries left")
    else:
        left = c.retries - c.consecutive_failures
        t.store.save(c, [], [(s.idx, "retry", f"segment {s.idx} failed ({s.reason}); retrying ({left} retries left after this)")])


def _streak(segs: list[Segment], outcome: str) -> int:
    """How many of the chain's last ended segments had this outcome, in a row."""
    n = 0
    for s in sorted((s for s in segs if s.phase == ENDED and s.outcome != CANCELLED_OUT), key=lambda s: s.idx,
                    reverse=True):
        if s.outcome != outcome:
            break
        n += 1
    return n
