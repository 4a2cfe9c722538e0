"""Planning one chain's next segment: the gate, the size and the slack come from chain/sizing.py
(which the replay calls too), the moment from the chain's policy (chain/policies.py), the shape
from shape_plan.py; then a maintenance cut, the hand-off rule, and sbatch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.chain import handoff_plan, reconcile, shape_plan, site_plan, site_race, sizing, span
from chainrun.chain.maintenance import fit_maintenance
from chainrun.chain.pace import (
    chain_shape_rate, chain_shapes, expected_training, segment_overhead, segment_rate, total_tolerance, trained_so_far,
)
from chainrun.chain.policies import PolicyView, WaitEstimate, get_policy
from chainrun.chain.segments import submit_segment
from chainrun.chain.shapes import ShapeChoice
from chainrun.slurm.client import SlurmRefused
from chainrun.state.records import COMPLETED, LIVE_PHASES, RUNNING, SUBMITTING, Chain, Segment

if TYPE_CHECKING:
    from chainrun.chain.tick_context import TickContext, TickReport

MAX_UNCONFIRMED = 6  # sbatch failed (or never answered) this many times in a row: the chain fails


def plan(t: TickContext, c: Chain, segs: list[Segment], report: TickReport) -> None:
    """The gate, the sizes and the slack come from chain/sizing.py, which the replay calls too."""
    now = t.clock()
    if site_race.live(c):  # --race: a segment pends on every site; the race driver keeps one (chain/site_race.py)
        return
    live = [s for s in segs if s.phase in LIVE_PHASES]
    if any(span.foreign(c, s) for s in live):  # a move to another site is under way: the driver's (chain/mover.py)
        return
    if span.spans(c) and getattr(t, "sites", None) is not None and site_plan.reconsider(t, c, segs, now):
        return  # a pending successor was cancelled to run elsewhere: planned again next tick
    # --total counts training: a live segment is expected to train its limit less the signal lead
    overhead = segment_overhead(c, segs)
    expected = sum(sizing.expected_work(expected_training(c, s, overhead), rate=segment_rate(c, s, segs))
                   for s in live)
    remaining = sizing.work_after(c.total_s, c.credited_s, expected)
    gate = dict(live=len(live), work_after_s=remaining, tolerance_s=total_tolerance(c),
                unconfirmed=any(s.phase == SUBMITTING for s in live),  # wait for adoption first
                stopping=any(s.extra.get("total_stop_at") for s in live))  # told to stop (total_stop.py)
    step = sizing.plan_gate(**gate)
    if step == sizing.FIRST and t.done_marker(c):  # the payload said done: nothing more to run
        step = sizing.plan_gate(**gate, done_marker=True)
    if step == sizing.FINISH:
        t.finish(c, segs, COMPLETED, "total time reached" if not live and remaining < gate["tolerance_s"]
                     else "training finished (the payload's done marker exists)")
        return
    if step == sizing.FIRST:
        # the last prediction made while the predecessor ran stays beside the actual wait
        last = segs[-1].extra.get("last_prediction") if segs else None
        est = WaitEstimate(seconds=last["wait_s"], model=last["model"]) if last else None
        if segs and site_race.races(c):  # --race: a successor planned while nothing is live is raced too
            raced = site_race.begin(t, c, segs, remaining)
            if raced is not False:
                report.submitted += int(bool(raced))
                return
        move_to = _where(t, c, site_plan.last_trained(segs), remaining, None, now) if segs else None
        submit_next(t, c, segs, remaining, dependency="", note="", estimate=est, move_to=move_to)
        report.submitted += 1
        return
    if step != sizing.ASK:
        return
    cur = live[0]
    if cur.extra.get("filler"):  # docs/elastic.md, "Filler": the reference is asked for the moment it runs
        if cur.phase == RUNNING and submit_after_filler(t, c, segs, cur, now):
            report.submitted += 1
        return  # a queued filler: no policy may pre-queue behind it (a dependency would wait for its end)
    policy = get_policy(c.policy)
    handover = (cur.end - c.signal_lead_s) if (cur.phase == RUNNING and cur.end) else None
    predict = (lambda: t.predictor(c, cur, t.queue)) if t.predictor else None
    # the share of the chain's slack this boundary may spend (the `slack` rule): remaining is the work
    # left once cur trains to its hand-over point, a later full segment trains segment_s - overhead
    allowance = sizing.slack_allowance(remaining, segment_s=c.segment_s, overhead_s=overhead,
                                       handoff_s=handoff_plan.measured_handoff_s(c, segs))
    move_to = _where(t, c, cur, remaining, handover, now)
    if move_to is not None:  # the policy times the successor by the wait where it would run
        predict = lambda: move_to.waits[move_to.site]  # noqa: E731
    view = PolicyView(now=now, chain=c, current=cur, handover_at=handover, predict_wait=predict,
                      cut_allowance_s=allowance)
    decision = policy.decide(view)
    if decision.estimate is not None:
        cur.extra["last_prediction"] = {"at": now, "wait_s": decision.estimate.seconds, "model": decision.estimate.model}
        t.store.save(c, [cur])
    if decision.submit and (left := left_if_cut(t, c, segs, cur, now)) is not None:
        submit_next(t, c, segs, left, dependency=decision.dependency, note=decision.reason,
                          estimate=decision.estimate, prob_in_time=decision.prob_in_time, move_to=move_to)
        report.submitted += 1


def _where(t: TickContext, c: Chain, last: Segment, remaining: float, handover: float | None, now: float):
    """A chain spanning clusters: the site choice when it names another site (a move), else None."""
    if not span.spans(c) or getattr(t, "sites", None) is None:
        return None
    got = site_plan.choose(t, c, last, remaining_s=remaining, handover_at=handover, now=now)
    if got is None:
        return None
    choice, waits = got
    _note_choice(t, c, last, choice, now, waits)
    return site_plan.Move(choice, waits, last) if choice.site != c.cluster else None


def _note_choice(t: TickContext, c: Chain, cur: Segment, choice, now: float, waits: dict) -> None:
    """Every site decision is kept for `status` (with where each site's wait came from); a change of
    mind is an event."""
    last = c.extra.get("site_choice") or {}
    c.extra["site_choice"] = {**choice.as_dict(), "at": now, "for": cur.idx + 1,
                              "waits": site_plan.wait_sources(waits),
                              "transfers": site_plan.transfer_sources(c, [e.name for e in choice.estimates])}
    # a site dropped from (or back into) the decision is news too (by name: an error's text may vary)
    dropped = set(last.get("left_out") or ()) != {n for n, _ in choice.left_out}
    if last.get("site") != choice.site or last.get("for") != cur.idx + 1 or dropped:
        t.store.save(c, events=[(cur.idx, "site", f"next segment: {choice.reason}")])
    else:
        t.store.save(c)


def left_if_cut(t: TickContext, c: Chain, segs: list[Segment], cur: Segment, now: float) -> float | None:
    """The size of an early successor of ``cur`` (the one live segment): it carries the work left as
    if ``cur`` stopped now, since if it starts early it cuts ``cur`` (sized for the hand-over point,
    early successors spiral). None when nothing may be submitted (sizing.may_submit): the work is
    reached, or the payload's done marker exists (a segment that finished the chain a moment ago
    still shows as running)."""
    t.note_training_start(c, cur, now, force=True)
    left = sizing.left_if_cut(c.total_s, c.credited_s, trained_so_far(cur, now), rate=segment_rate(c, cur, segs))
    tolerance = total_tolerance(c)
    if not sizing.may_submit(left_if_cut_s=left, tolerance_s=tolerance):
        return None
    return left if sizing.may_submit(left_if_cut_s=left, tolerance_s=tolerance,
                                     done_marker=t.done_marker(c)) else None


def submit_after_filler(t: TickContext, c: Chain, segs: list[Segment], cur: Segment, now: float) -> bool:
    """A filler runs: ask for the reference shape at once, whatever the policy's timing, sized as an
    early successor (the work left as if the filler stopped now). When it starts, the hand-off stops
    the filler (no adaptive wait: handoff_plan writes no rule for a filler's successor); if the
    filler reaches its own end first, the chain simply goes on with it. False if nothing may be
    submitted (``left_if_cut``)."""
    left = left_if_cut(t, c, segs, cur, now)
    if left is None:
        return False
    ref = chain_shapes(c)[0]
    why = (f"{ref} nodes (reference), asked as soon as the filler (segment {cur.idx}, {cur.extra.get('nodes')} "
           "nodes) runs: it takes over when it starts")
    submit_next(t, c, segs, left, dependency="", estimate=None, choice=ShapeChoice(ref, why, ()),
                      note=f"filler segment {cur.idx} is running: the reference shape is asked for now")
    return True


def _given_nodes(t: TickContext, segs: list[Segment]) -> int | None:
    """The node count of the chain's latest job in this tick's squeue (what Slurm gave or will give it),
    None when none is queued: the segment's size as its script or ``--gpus`` made it, not its options."""
    rows = {r.job_id: r for r in t.queue}
    return next((rows[s.job_id].nodes for s in reversed(segs) if s.job_id in rows and rows[s.job_id].nodes), None)


def submit_next(t: TickContext, c: Chain, segs: list[Segment], remaining: float, *, dependency: str, note: str,
                 estimate: WaitEstimate | None, choice: ShapeChoice | None = None,
                 prob_in_time: float | None = None, move_to=None) -> None:
    """``move_to``: a site choice (chain/site_plan.py) naming another site: the successor is submitted
    there, gated, and chain/mover.py moves the chain."""
    if reconcile.unconfirmed_run(segs) >= MAX_UNCONFIRMED:
        raise SlurmRefused(f"sbatch failed or did not answer {MAX_UNCONFIRMED} times in a row for chain {c.id}")
    idx = (max(s.idx for s in segs) + 1) if segs else 0
    if choice is None:
        choice = shape_plan.choose(t, c, segs, remaining, idx)  # None unless the chain has --shapes
    rate = chain_shape_rate(c, segs, choice.nodes) if choice else 1.0
    # the training this segment needs at its shape's rate, plus the signal lead, as Slurm grants it
    limit = sizing.segment_limit(remaining, segment_s=c.segment_s, signal_lead_s=c.signal_lead_s, rate=rate)
    prev_failed = bool(segs) and segs[-1].outcome == "crash"
    seg = Segment(chain_id=c.id, idx=idx, time_limit_s=limit, dependency=dependency, is_retry=prev_failed,
                  predicted_wait_s=estimate.seconds if estimate else None,
                  predicted_model=estimate.model if estimate else "")
    if estimate is not None and estimate.target is not None:  # the quantile predicted_wait_s is (live_score)
        seg.extra["wait_quantile"] = float(estimate.target)
    if span.spans(c):  # every segment of a chain spanning clusters names its site
        seg.cluster = c.cluster
    if move_to is not None:
        site = site_plan.prepare_move(t, c, seg, move_to.pred, move_to.site, move_to.choice, t.clock())
        seg.time_limit_s = sizing.segment_limit(remaining, segment_s=site.segment_s, signal_lead_s=c.signal_lead_s)
        note = f"{note}; {move_to.choice.reason}" if note else move_to.choice.reason
        submit_segment(t.store, t.sites.engine(move_to.site).slurm, c, seg, note=note, site=site)
        segs.append(seg)
        return
    if prob_in_time is not None:  # what the policy acted on, scored by `model status` (predict/service.py)
        seg.extra["prob_in_time"] = round(prob_in_time, 4)
    shape_event = shape_plan.apply_shape(t, c, segs, seg, choice)
    if c.extra.get("time_min_s"):  # --time-min: Slurm may start it sooner with a shorter limit
        seg.extra["time_min_s"] = min(int(c.extra["time_min_s"]), limit)
    fit_maintenance(c, seg, t.reservations(), t.clock(), given_nodes=_given_nodes(t, segs))
    if seg.extra.get("plan_note"):
        note = f"{note}; {seg.extra['plan_note']}" if note else seg.extra["plan_note"]
    handoff_plan.write_rule(t.runner, c, segs, seg)  # before sbatch: a successor may start at once
    submit_segment(t.store, t.slurm, c, seg, note=note)
    segs.append(seg)
    if shape_event:
        t.store.add_event(c.id, idx, "shape", shape_event)
