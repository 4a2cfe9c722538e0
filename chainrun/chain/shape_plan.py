"""Elastic shapes (docs/elastic.md): the node count a planned segment asks for, from the queue
model's and Slurm's `sbatch --test-only` start per shape and the chain's pace (chain/shapes.py
chooses; this asks and records)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chainrun.chain.pace import chain_efficiency, chain_shapes, measured_pace, segment_overhead
from chainrun.chain.shapes import ShapeChoice, choose_filler, choose_shape
from chainrun.errors import SlurmError
from chainrun.state.records import LIVE_PHASES, Chain, Segment

if TYPE_CHECKING:
    from chainrun.chain.tick_context import TickContext

log = logging.getLogger(__name__)


def plan_first_shape(t: TickContext, c: Chain, seg: Segment) -> str:
    """Segment 0's node count, asked by `chainrun submit` (nothing is live yet): the reference shape,
    or another, by the same rules as any segment planned while nothing is live (choose).
    Recorded in ``seg``; returns the event text when it is not the reference ("" otherwise)."""
    return apply_shape(t, c, [], seg, choose(t, c, [], c.total_s, seg.idx))


def choose(t: TickContext, c: Chain, segs: list[Segment], remaining: float, idx: int) -> ShapeChoice | None:
    """The next segment's node count: the shape that finishes the remaining work first (chain/shapes.py);
    with no live segment, a filler if the reference keeps that shape and would only queue meanwhile.
    Asked only here, when a segment is planned: the model once, and one `sbatch --test-only` per shape."""
    shapes = chain_shapes(c)
    if not shapes:
        return None
    ref = shapes[0]
    if len(shapes) == 1:
        return ShapeChoice(ref, f"{ref} nodes: the only shape", ())
    if c.extra.get("no_adapt"):
        return ShapeChoice(ref, f"{ref} nodes: the reference shape (--no-adapt)", ())
    waits, sources = shape_waits(t, c, segs, shapes, idx)
    if waits and ref not in waits:
        # no start for the reference (no model, and test-only refused it: Slurm 22.05 says "Requested node
        # configuration is not available" for a request a future reservation cuts into, though it starts
        # with --time-min): nothing says it waits, so the chain keeps it rather than leave it blind
        return ShapeChoice(ref, f"{ref} nodes (reference): no start estimate for it, kept", ())
    overhead = segment_overhead(c, segs)
    choice = choose_shape(remaining, shapes, waits, segment_s=max(60.0, c.segment_s - overhead),
                          boundary_s=overhead, measured=measured_pace(c, segs),
                          efficiency=chain_efficiency(c), sources=sources)
    if choice.nodes != ref or any(s.phase in LIVE_PHASES for s in segs):
        return choice  # a filler only when nothing is live: it would cut a running segment
    filler = choose_filler(shapes, waits, boundary_s=overhead, measured=measured_pace(c, segs),
                           efficiency=chain_efficiency(c), sources=sources, margin=c.extra.get("filler_margin"))
    return filler or choice


def shape_waits(t: TickContext, c: Chain, segs: list[Segment], shapes: tuple[int, ...],
                 idx: int) -> tuple[dict[int, float], dict[int, str]]:
    """Predicted wait (s) per node count: the queue model's median and Slurm's own `sbatch --test-only`
    start; with both, the later (test-only knows the running jobs' limits and the reservations, the
    model knows how the queue usually moves)."""
    from chainrun.chain.request import segment_args
    from chainrun.chain.segments import wrapper_path

    now = t.clock()
    waits: dict[int, float] = {}
    sources: dict[int, str] = {}
    model = getattr(t.predictor, "shape_waits", None)
    if model is not None:
        probe = next((s for s in reversed(segs) if s.job_id), Segment(chain_id=c.id, idx=idx))
        try:
            for n, w in (model(c, probe, t.queue, list(shapes)) or {}).items():
                waits[int(n)], sources[int(n)] = max(0.0, float(w)), "model"
        except Exception as e:  # a broken model must not stop planning: test-only (or the reference) decides
            log.warning("queue-delay model for the shape choice of %s: %s", c.id, e)
    # asked as the segment will be: with --time-min Slurm may start it sooner with a shorter limit
    tmin = {"time_min_s": min(int(c.extra["time_min_s"]), c.segment_s)} if c.extra.get("time_min_s") else {}
    for n in shapes:
        probe = Segment(chain_id=c.id, idx=idx, time_limit_s=c.segment_s, extra={"nodes": n, **tmin})
        try:
            start = t.slurm.test_only(wrapper_path(c), segment_args(c, probe), script_args=[str(idx)])
        except SlurmError as e:
            log.info("sbatch --test-only (%s nodes) for chain %s: %s", n, c.id, e)
            continue
        if start is None:
            continue
        w = max(0.0, start - now)
        if n in waits:
            waits[n], sources[n] = max(waits[n], w), "model+test-only"
        else:
            waits[n], sources[n] = w, "test-only"
    return waits, sources


def apply_shape(t: TickContext, c: Chain, segs: list[Segment], seg: Segment, choice: ShapeChoice | None) -> str:
    """Record the choice in the segment; the event text when the shape changes ("" otherwise)."""
    if choice is None:
        return ""
    seg.extra["nodes"] = choice.nodes
    seg.extra["shape"] = choice.as_dict()
    if choice.filler:  # the watcher asks for the reference shape as soon as it runs (planning.submit_after_filler)
        seg.extra["filler"] = True
    prev = next((int(s.extra["nodes"]) for s in sorted(segs, key=lambda s: s.idx, reverse=True)
                 if s.extra.get("nodes")), chain_shapes(c)[0])
    if choice.nodes == prev:
        return ""
    return f"segment {seg.idx} asks for {choice.nodes} nodes instead of {prev}: {choice.reason}"
