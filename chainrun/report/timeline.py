"""A chain's timeline as plain data: segment bars, queue waits, gaps and overlaps.

Built on :func:`chainrun.chain.summary.view_chain`; the PNG (matplotlib) and the HTML page
(inline SVG) only draw what this module computes, so both show the same thing and tests
can check the content without reading pixels.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from chainrun.chain.summary import ChainView

# interruptions shorter than this are drawn but not counted as "long" in the summary
LONG_GAP_S = 60.0


@dataclass(frozen=True)
class Bar:
    """One segment's allocation: from its start to its end (or now, while it runs)."""

    idx: int
    job_id: str | None
    start: float
    end: float
    outcome: str  # continue, handoff, done, crash, cancelled, skipped, or "running"
    is_retry: bool


@dataclass(frozen=True)
class Wait:
    """Queue wait of one segment: eligible (or submitted) until it started (or now)."""

    idx: int
    since: float
    until: float
    started: bool
    predicted_wait_s: float | None  # the watcher's prediction, measured from `since`
    actual_wait_s: float | None


@dataclass(frozen=True)
class Rate:
    """A segment's throughput (the progress contract): drawn as a line over its bar."""

    idx: int
    start: float
    end: float
    steps_per_s: float
    samples_per_s: float | None
    steps: float | None
    nodes: tuple = ()


@dataclass(frozen=True)
class Span:
    """Between a segment's predecessor's end and its own start: gap (red) or overlap (amber)."""

    idx: int  # the later segment
    kind: str  # "gap" or "overlap"
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    chain_id: str
    name: str
    status: str
    policy: str
    t0: float
    t1: float
    bars: list[Bar] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    rates: list[Rate] = field(default_factory=list)  # throughput per segment, when the trainer reports it

    @property
    def gaps(self) -> list[Span]:
        return [s for s in self.spans if s.kind == "gap"]

    @property
    def overlaps(self) -> list[Span]:
        return [s for s in self.spans if s.kind == "overlap"]

    def to_dict(self) -> dict:
        return {"chain": self.chain_id, "t0": self.t0, "t1": self.t1,
                "bars": [asdict(b) for b in self.bars], "waits": [asdict(w) for w in self.waits],
                "spans": [asdict(s) | {"seconds": s.seconds} for s in self.spans],
                "rates": [asdict(r) for r in self.rates]}


def build_timeline(view: ChainView, now: float | None = None) -> Timeline:
    now = time.time() if now is None else now
    tl = Timeline(chain_id=view.id, name=view.name, status=view.status, policy=view.policy, t0=view.created, t1=now)
    by_idx = {s.idx: s for s in view.segment_views}
    ran = [s for s in view.segment_views if s.start is not None]
    for s in view.segment_views:
        since = s.eligible or s.submit
        if since is not None and (s.start is None or s.start > since):
            until = s.start if s.start is not None else (s.end if s.outcome else now)
            if until is not None and until > since:
                tl.waits.append(Wait(s.idx, since, until, s.start is not None, s.predicted_wait_s, s.wait_s))
        elif since is not None and s.predicted_wait_s is not None:
            tl.waits.append(Wait(s.idx, since, since, True, s.predicted_wait_s, s.wait_s))
        if s.start is None:
            continue
        running = s.outcome is None and s.phase == "RUNNING"
        if not running and s.end is None:  # cancelled, its end not read from Slurm yet: no bar is invented
            continue
        end = min(now, s.end) if (running and s.end) else (now if running or s.end is None else s.end)
        tl.bars.append(Bar(s.idx, s.job_id, s.start, max(end, s.start), "running" if running else (s.outcome or "?"),
                           s.is_retry))
        if getattr(s, "steps_per_s", None):
            tl.rates.append(Rate(s.idx, s.start, max(end, s.start), float(s.steps_per_s), s.samples_per_s, s.steps,
                                 tuple(s.nodes)))
    # the engine records gap_s on a segment against its predecessor that ran; recompute the
    # span from it so the picture and `chainrun status` agree
    for prev, nxt in zip(ran, ran[1:]):
        g = by_idx[nxt.idx].gap_s
        if g is None:
            if prev.end is None or prev.outcome is None:
                continue
            g = nxt.start - prev.end  # type: ignore[operator]
        if g > 0:
            tl.spans.append(Span(nxt.idx, "gap", nxt.start - g, nxt.start))  # type: ignore[operator]
        elif g < 0:
            tl.spans.append(Span(nxt.idx, "overlap", nxt.start, nxt.start - g))  # type: ignore[operator]
    # an interruption still going on: the last segment ended, its successor has not started
    if view.status == "ACTIVE" and ran and ran[-1].outcome is not None and ran[-1].end is not None:
        if not any(b.outcome == "running" for b in tl.bars) and now > ran[-1].end:
            later = [s for s in view.segment_views if s.idx > ran[-1].idx]
            tl.spans.append(Span(later[0].idx if later else ran[-1].idx + 1, "gap", ran[-1].end, now))
    points = [tl.t0] + [b.start for b in tl.bars] + [w.since for w in tl.waits]
    ends = [b.end for b in tl.bars] + [w.until for w in tl.waits] + [s.end for s in tl.spans]
    if view.finished:
        ends.append(view.finished)
    tl.t0 = min(points)
    tl.t1 = max(ends) if ends else max(tl.t0 + 1, now)
    if tl.t1 <= tl.t0:
        tl.t1 = tl.t0 + 1
    return tl


def summarize(view: ChainView, tl: Timeline | None = None) -> dict:
    """The per-chain numbers `chainrun report` prints (and returns with --json)."""
    tl = tl or build_timeline(view)
    waits = [s.wait_s for s in view.segment_views if s.wait_s is not None]
    pairs = [(s.predicted_wait_s, s.wait_s) for s in view.segment_views
             if s.predicted_wait_s is not None and s.wait_s is not None]
    span = (view.finished or tl.t1) - view.created
    ran = sum(b.end - b.start for b in tl.bars)
    return {
        "chain": view.id, "name": view.name, "cluster": view.cluster, "policy": view.policy, "status": view.status,
        "reason": view.reason, "segments": view.segments, "segments_ran": len(tl.bars),
        "retries": view.retries_used,
        "crashes": sum(1 for s in view.segment_views if s.outcome == "crash"),
        "total_s": view.total_s, "done_s": view.done_s,
        # payload training time (the progress toward total_s), once the engine records it
        "trained_s": view.done_s if getattr(view, "trained_s", None) is None else view.trained_s,
        "payload_overlaps": list(getattr(view, "payload_overlaps", None) or []),
        "interruption_s": sum(s.seconds for s in tl.gaps), "overlap_s": sum(s.seconds for s in tl.overlaps),
        "gaps": len(tl.gaps), "long_gaps": sum(1 for s in tl.gaps if s.seconds >= LONG_GAP_S),
        "longest_gap_s": max((s.seconds for s in tl.gaps), default=0.0),
        "overlaps": len(tl.overlaps),
        "wait_total_s": sum(waits), "wait_max_s": max(waits, default=0.0),
        "predicted_vs_actual": [{"predicted_s": p, "actual_s": a} for p, a in pairs],
        "prediction_mae_s": (sum(abs(p - a) for p, a in pairs) / len(pairs)) if pairs else None,
        "allocated_s": ran, "wall_s": span,
        # the progress contract: steps, throughput, training ETAs, excluded nodes and request changes
        "pace": dict(getattr(view, "pace", None) or {}),
        "throughput": [{"segment": r.idx, "steps_per_s": r.steps_per_s, "samples_per_s": r.samples_per_s,
                        "steps": r.steps, "nodes": list(r.nodes)} for r in tl.rates],
        # elastic chains (--shapes): each segment's node count, why it was chosen, and the work it counted
        "shapes": [{"segment": s.idx, "nodes": s.shape_nodes, "reason": s.shape_reason, "rate": s.rate,
                    "work_s": s.work_s} for s in view.segment_views if getattr(s, "shape_nodes", None) is not None],
        "created": view.created, "finished": view.finished,
    }
