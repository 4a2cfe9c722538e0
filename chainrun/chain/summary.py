"""What `status` and `watch` show about a chain: plain data, rendered by the CLI."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from chainrun.chain import progress
from chainrun.state.records import ACTIVE, LIVE_PHASES, PENDING, RUNNING, Chain, Segment


@dataclass(frozen=True)
class SegmentView:
    idx: int
    job_id: str | None
    phase: str
    slurm_state: str
    outcome: str | None
    reason: str
    time_limit_s: int
    submit: float | None
    eligible: float | None
    start: float | None
    end: float | None
    wait_s: float | None
    predicted_wait_s: float | None
    predicted_model: str
    gap_s: float | None  # start minus the predecessor's end: >0 interruption, <0 overlap
    overlap_s: float
    credit_s: float  # training time this segment delivered (payload start to exit)
    is_retry: bool
    # from the progress contract (chain/progress.py): None when the trainer does not report
    step: float | None = None  # the trainer's step when this segment last reported
    steps: float | None = None  # steps this segment trained
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    nodes: tuple = ()  # nodes its ranks reported from
    node_verdicts: tuple = ()  # the straggler rule's comparison of its nodes (chain/placement.py)
    switches: int | None = None  # leaf switches its nodes spanned (chain/spread.py); None = not reported
    pending_reason: str = ""  # squeue's code while pending (e.g. Priority, ReqNodeNotAvail, ...)
    expected_start: float | None = None  # Slurm's own estimate (squeue --start), while pending
    request: str = ""  # the sbatch options this segment asked for (user's, site's, chainrun's)
    note: str = ""  # one line for people: why it waits, what was planned, or how it ended
    # elastic segments (--shapes, docs/elastic.md): None/"" for a one-shape chain
    shape_nodes: int | None = None  # the node count this segment asked for
    shape_reason: str = ""  # why that shape was chosen (the rule's words)
    shape_options: tuple = ()  # every candidate: predicted wait, rate, finish of the remaining work
    rate: float | None = None  # reference-seconds of work per second of its training
    work_s: float | None = None  # its training times its rate: what it counts toward --total
    granted_s: float | None = None  # the limit Slurm granted when --time-min made it shorter than asked
    settling: bool = False  # cancelled by chainrun, its end and training not yet read from Slurm (chain/settle.py)
    cluster: str | None = None  # a chain spanning clusters: the site it was submitted on
    move: dict | None = None  # ...and, when it moved the chain there, the move (chain/mover.py): phase, copy, decision


@dataclass(frozen=True)
class ChainView:
    id: str
    name: str
    cluster: str
    policy: str
    status: str
    reason: str
    total_s: int
    done_s: float
    segment_s: int
    segments: int
    current: int | None
    current_state: str
    eta: float | None
    interruption_s: float
    overlap_s: float
    trained_s: float  # the payload's run time so far: what --total counts
    allocated_s: float  # time the chain's jobs held their allocations (waits for a hand-off included)
    payload_overlaps: list[dict]  # two payloads of this chain that trained at once: must stay empty
    pace: dict  # steps, steps/s, samples/s, training ETAs from the pace, excluded nodes, request changes
    retries_used: int
    checkpoint_dir: str
    run_dir: str
    created: float
    finished: float | None
    segment_views: list[SegmentView]
    current_note: str = ""  # the live segment's note: why it waits, what was planned for it
    shapes: tuple = ()  # --shapes: node counts, the reference (the shape --total is counted in) first
    time_min_s: int | None = None  # --time-min
    # without ticks (chain/untended.py): since when its cluster was not ticked and what happens next;
    # None when not asked for (view_chain without ``ticks``) or for a finished chain
    untended: dict | None = None
    # a chain spanning clusters (issue 26): its sites in order of preference and the last site decision
    sites: tuple = ()
    site_choice: dict | None = None
    site_margin: dict | None = None  # its margin (site_plan.margin_s) and where it came from
    # every site decision the events kept (newest last, the last DECISIONS): {"at", "segment", "decision"}
    site_decisions: tuple = ()
    race: dict | None = None  # --race: the last race's racers, the winner, what was cancelled (chain/site_race.py)
    race_note: str = ""

    def to_dict(self, *, with_segments: bool = True) -> dict:
        d = asdict(self)
        if not with_segments:
            d.pop("segment_views")
        else:
            d["segments_detail"] = d.pop("segment_views")
        return d


DECISIONS = 10  # site decisions `status` carries (the event log keeps them all)


def site_decisions(store, chain: Chain, limit: int = DECISIONS) -> list[dict]:
    """A chain spanning clusters: its newest site decisions from the event log (kind ``site``: where
    segment 0 started, each change of mind, each pending successor moved), oldest first, with the
    numbers each was made on (the rule's own words). [] for a chain on one cluster (no query)."""
    if not chain.extra.get("sites"):
        return []
    return [{"at": e.ts, "segment": e.idx, "decision": e.message}
            for _, e in store.events(chain.id, kind="site", limit=limit)]


def view_chain(chain: Chain, segs: list[Segment], now: float | None = None, *, ticks: dict | None = None,
               decisions: list[dict] | None = None) -> ChainView:
    """``ticks``: the clusters' tick records (untended.read_all), for the outlook without ticks;
    ``decisions``: a spanning chain's site decisions (site_decisions)."""
    now = time.time() if now is None else now
    live = [s for s in segs if s.phase in LIVE_PHASES]
    cur = live[0] if live else (segs[-1] if segs else None)
    from chainrun.chain.pace import pace_view, work_done

    running = next((s for s in live if s.phase == RUNNING), None)
    # work so far in reference-shape seconds (each segment's training from its payload start, times its rate)
    done = work_done(chain, segs, min(now, running.end or now) if running else now)
    allocated = sum(max(0.0, (s.end or 0) - s.start) for s in segs if s.start and s.phase not in LIVE_PHASES and s.end)
    allocated += sum(max(0.0, now - s.start) for s in live if s.phase == RUNNING and s.start)
    allocated += sum(float(s.extra.get("held_before_s") or 0) for s in segs)  # a requeued job's earlier runs
    eta = None
    if chain.status == ACTIVE:
        per_segment = max(60.0, chain.segment_s - chain.signal_lead_s)  # training one full segment delivers
        after = max(0.0, chain.total_s - done - sum(max(0.0, s.time_limit_s - chain.signal_lead_s) for s in live
                                                     if s.phase != RUNNING))
        base = (running.end - chain.signal_lead_s) if running and running.end else now
        eta = max(now, base) + after + (after // per_segment) * chain.signal_lead_s
    views = [_segment_view(s, now) for s in segs]
    return ChainView(
        id=chain.id, name=chain.name, cluster=chain.cluster, policy=chain.policy, status=chain.status,
        reason=chain.reason, total_s=chain.total_s, done_s=min(float(chain.total_s), done), segment_s=chain.segment_s,
        segments=len(segs), current=cur.idx if cur else None,
        current_state=(cur.slurm_state or cur.phase) if cur else "", eta=eta,
        interruption_s=sum(max(0.0, v.gap_s) for v in views if v.gap_s is not None),
        overlap_s=sum(v.overlap_s for v in views),
        trained_s=done, allocated_s=allocated,
        payload_overlaps=[o for s in segs for o in s.extra.get("payload_overlaps", [])],
        pace=pace_view(chain, segs, now, done),
        retries_used=sum(1 for s in segs if s.is_retry), checkpoint_dir=chain.checkpoint_dir, run_dir=chain.run_dir,
        created=chain.created, finished=chain.finished, segment_views=views,
        current_note=next((v.note for v in views if v.phase in LIVE_PHASES and v.note), "")
        or (_race_note(chain) if (chain.extra.get("race") or {}).get("phase") == "racing" else ""),
        shapes=tuple(chain.extra.get("shapes") or ()), time_min_s=chain.extra.get("time_min_s"),
        untended=_untended(chain, segs, ticks, now),
        sites=tuple(chain.extra.get("sites") or ()), site_choice=chain.extra.get("site_choice"),
        site_margin=_site_margin(chain), site_decisions=tuple(decisions or ()), race=chain.extra.get("race"),
        race_note=_race_note(chain),
    )


def _race_note(chain: Chain) -> str:
    if not chain.extra.get("race"):
        return ""
    from chainrun.chain.site_race import summary

    return summary(chain.extra["race"])


def _site_margin(chain: Chain) -> dict | None:
    if not chain.extra.get("sites"):
        return None
    from chainrun.chain.site_plan import margin_s

    src = chain.extra.get("site_margin_source") or ("--site-margin" if "site_margin_s" in chain.extra else "shipped")
    return {"margin_s": margin_s(chain), "source": src}


def _untended(chain: Chain, segs: list[Segment], ticks: dict | None, now: float) -> dict | None:
    if ticks is None:
        return None
    from chainrun.chain.untended import outlook

    o = outlook(chain, segs, ticks.get(chain.cluster), now)
    return o.to_dict() if o else None


def _segment_view(s: Segment, now: float) -> SegmentView:
    gap = s.extra.get("gap_s")
    return SegmentView(
        idx=s.idx, job_id=s.job_id, phase=s.phase, slurm_state=s.slurm_state, outcome=s.outcome, reason=s.reason,
        time_limit_s=s.time_limit_s, submit=s.submit, eligible=s.eligible, start=s.start, end=s.end, wait_s=s.wait_s,
        predicted_wait_s=s.predicted_wait_s, predicted_model=s.predicted_model,
        gap_s=float(gap) if gap is not None else None, overlap_s=s.overlap_s, credit_s=s.credit_s, is_retry=s.is_retry,
        **progress.segment_fields(s),
        pending_reason=s.extra.get("pending_reason", "") if s.phase == PENDING else "",
        expected_start=s.extra.get("expected_start") if s.phase == PENDING else None,
        request=s.extra.get("request", ""), note=segment_note(s, now),
        shape_nodes=s.extra.get("nodes"), shape_reason=(s.extra.get("shape") or {}).get("reason", ""),
        shape_options=tuple((s.extra.get("shape") or {}).get("options") or ()), rate=s.extra.get("rate"),
        work_s=s.extra.get("work_s"), granted_s=s.extra.get("granted_s"),
        settling=s.extra.get("settle") is not None, cluster=s.cluster, move=s.extra.get("move"),
    )


_EXPLAINED = ("crash", "cancelled", "unstarted", "checkpoint-crash")
_MOVE_PHASE = {"ahead": "copying ahead while the predecessor trains", "fenced": "waiting for the predecessor to stop",
               "go": "go-ahead written", "done": "done", "abandoned": "abandoned (the successor ended first)"}


def move_note(mv: dict) -> str:
    """A move in one line: where from and to, its phase, the copy (bytes, rate), the checkpoint it resumes from."""
    out = f"move {mv.get('from')}->{mv.get('to')}: {_MOVE_PHASE.get(mv.get('phase'), mv.get('phase'))}"
    copy = mv.get("copy") or {}
    if copy.get("bytes_total") and mv.get("phase") in ("ahead", "fenced"):
        rate = copy.get("throughput_Bps")
        out += (f"; copy {copy.get('state')} {copy.get('bytes_done') or 0}/{copy['bytes_total']} bytes"
                + (f" at {rate / 1e6:.1f} MB/s" if rate else ""))
    if mv.get("copy_error") and mv.get("phase") in ("ahead", "fenced"):
        out += f"; last copy failed: {mv['copy_error']}"
    r = mv.get("resume") or {}
    if r and not mv.get("go") and mv.get("phase") == "fenced":  # the choice of checkpoint, with its pace
        out += (f"; resuming from step {r.get('resume_step')} (redo from step {r.get('ahead_step')}: "
                f"{r.get('redo_s')} s at pace {r.get('pace')} ({r.get('pace_from')}); "
                f"transfer of step {r.get('final_step')}: {r.get('transfer_s')} s)")
    if mv.get("go"):
        out += f"; resumed from step {mv['go'].get('step')}"
    return out


def segment_note(s: Segment, now: float) -> str:
    """Why a segment waits (Slurm's reason in words, its wait so far beside the prediction, Slurm's
    start estimate), what was planned for it (e.g. a maintenance window), or how it ended badly."""
    from chainrun.durations import format_duration as dur
    from chainrun.slurm.reasons import explain

    parts = []
    if s.phase == PENDING:
        why = explain(s.extra.get("pending_reason", ""))
        told = s.extra.get("pending_explained") or {}
        words = told.get("words") if told.get("reason") == s.extra.get("pending_reason") else why.words
        if words:  # Slurm's reason, or what the nodes and reservations said about it (queue_row.pending)
            parts.append(f"pending: {words}")
        since = s.eligible or s.submit
        if since:
            waited = f"waited {dur(max(0.0, now - since))}"
            if s.predicted_wait_s is not None:
                waited += f" (predicted {dur(s.predicted_wait_s)})"
            parts.append(waited)
        start = s.extra.get("expected_start")
        if start and start > now:
            parts.append("Slurm expects it to start " + time.strftime("%a %H:%M", time.localtime(start)))
    if s.extra.get("move"):  # the move that brought the chain to this segment's site (chain/mover.py)
        parts.append(move_note(s.extra["move"]))
    if s.extra.get("plan_note"):
        parts.append(s.extra["plan_note"])
    if (s.extra.get("shape") or {}).get("reason"):  # elastic segments: which shape, and why
        parts.append("shape " + s.extra["shape"]["reason"])
    if s.extra.get("granted_s"):
        parts.append(f"Slurm granted {dur(float(s.extra['granted_s']))} of {dur(s.time_limit_s)} (--time-min)")
    if s.outcome in _EXPLAINED and s.reason:
        parts.append(s.reason)
    if s.extra.get("settle") is not None:  # chain/settle.py: nothing is shown that Slurm has not said
        parts.append("its end and training are read from Slurm by the next `chainrun watch` tick")
    elif s.extra.get("settle_unknown"):
        parts.append("Slurm kept no final record of it: its end and training are unknown")
    return "; ".join(parts)
