"""The accounting of work and pace: how much of --total a chain has done, at what rate each
segment's training counts, and what a live segment should still deliver.

--total is work at the reference shape (docs/elastic.md): a segment's training counts at its
shape's rate, measured from the progress contract where known. The engine plans with these, and
`status`, `watch`, `report` and the replay (chainrun/sim/chains.py) read the same functions, so a
chain's figures mean one thing everywhere.
"""

from __future__ import annotations

from chainrun.chain import placement, progress
from chainrun.chain.sizing import MIN_SEGMENT_S
from chainrun.state.records import CONTINUE, ENDED, RUNNING, Chain, Segment


def trained_so_far(s: Segment, now: float) -> float:
    """What a live segment has trained by now, in seconds of training: from its payload's start (the
    wrapper's state file; a taken-over segment's wait for the hand-off is not training), else from
    its job's start; nothing while it is known to wait for the hand-off."""
    if s.phase != RUNNING or not s.start:
        return 0.0
    if s.extra.get("payload_start") is not None:
        return max(0.0, now - float(s.extra["payload_start"]))
    return 0.0 if s.extra.get("handoff_waiting") else max(0.0, now - s.start)


def work_done(c: Chain, segs: list[Segment], now: float) -> float:
    """Work toward --total so far, in reference-shape seconds: what ended segments delivered (kept in
    ``credited_s``) plus what the running ones have trained, each at its shape's rate. The one place
    that counts it: the engine, status and the replay use it."""
    running = [s for s in segs if s.phase == RUNNING]
    return c.credited_s + sum(trained_so_far(s, now) * segment_rate(c, s, segs) for s in running)


def segment_rate(c: Chain, s: Segment, segs: list[Segment] | None = None, *, final: bool = False) -> float:
    """The rate a segment's training counts at toward --total: 1.0 on the reference shape (and for
    every chain without --shapes); an ended segment keeps the rate fixed at its end."""
    if not s.extra.get("nodes") or not chain_shapes(c):
        return 1.0
    if not final and s.extra.get("rate") is not None:
        return float(s.extra["rate"])
    return chain_shape_rate(c, segs or [s], int(s.extra["nodes"]))


def chain_shape_rate(c: Chain, segs: list[Segment], nodes: int) -> float:
    """Reference-seconds of work per second of training on ``nodes`` nodes, for this chain now."""
    shapes = chain_shapes(c)
    if not shapes:
        return 1.0
    return shape_rate(nodes, shapes[0], measured=measured_pace(c, segs), efficiency=chain_efficiency(c))


def measured_pace(c: Chain, segs: list[Segment]) -> dict[int, float]:
    """The chain's measured pace (steps/s, progress contract) per node count."""
    return pace_by_shape([(int(s.extra["nodes"]), (s.extra.get("progress") or {}).get("steps_per_s") or 0.0)
                          for s in segs if s.extra.get("nodes")])


def chain_shapes(c: Chain) -> tuple[int, ...]:
    """The chain's node counts (--shapes), the reference first; () for a one-shape chain."""
    return tuple(int(n) for n in c.extra.get("shapes") or ())


def chain_efficiency(c: Chain) -> dict[int, float]:
    return {int(k): float(v) for k, v in (c.extra.get("shape_efficiency") or {}).items()}


def granted_limit(s: Segment) -> float:
    """The limit Slurm really granted a segment: shorter than asked when --time-min let it start early."""
    return min(float(s.time_limit_s), float(s.extra.get("granted_s") or s.time_limit_s))


def expected_training(c: Chain, s: Segment, overhead_s: float | None = None) -> float:
    """How much training a live segment should still deliver toward --total: its limit less the
    chain's per-segment overhead (the signal lead by default; see ``segment_overhead``)."""
    return max(0.0, granted_limit(s) - (c.signal_lead_s if overhead_s is None else overhead_s))


def segment_overhead(c: Chain, segs: list[Segment]) -> float:
    """What a full segment of this chain has lost to the signal lead, an early signal (Slurm sends it
    up to a minute early) and the payload's start, measured on its segments that ran to their
    signal (the largest seen: planning for the worst keeps the successor early; a successor that
    turns out not to be needed is cancelled when the total is reached); never less than the lead."""
    seen = [granted_limit(s) - s.credit_s for s in segs
            if s.phase == ENDED and s.outcome == CONTINUE and s.extra.get("signaled") == "1" and s.credit_s > 0]
    return max([float(c.signal_lead_s)] + seen)


def total_tolerance(c: Chain) -> float:
    """Training still missing that counts as --total reached: a minute, or 5 % of a short total."""
    return min(float(MIN_SEGMENT_S), 0.05 * c.total_s)


def pace_by_shape(paces: list[tuple[int, float]]) -> dict[int, float]:
    """node count -> median measured pace (e.g. steps/s) over the chain's segments of that shape."""
    by: dict[int, list[float]] = {}
    for nodes, pace in paces:
        if nodes and pace and pace > 0:
            by.setdefault(int(nodes), []).append(float(pace))
    return {n: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1:len(v) // 2 + 1]) / 2
            for n, v in by.items()}


def shape_rate(nodes: int, ref_nodes: int, *, measured: dict[int, float] | None = None,
               efficiency: dict[int, float] | None = None) -> float:
    """Reference-seconds of work per wall second of training on ``nodes`` nodes.

    ``measured``: the chain's pace per node count (any unit, e.g. steps/s), where known.
    ``efficiency``: the user's scaling efficiency per node count relative to linear (default 1.0);
    the reference shape is 1.0 by definition.
    """
    eff = efficiency or {}
    measured = {n: float(v) for n, v in (measured or {}).items() if v and v > 0}
    if not measured:
        return (nodes / ref_nodes) * eff.get(nodes, 1.0) / eff.get(ref_nodes, 1.0)

    def pace(n: int) -> float:  # measured, else scaled from the closest measured shape
        if n in measured:
            return measured[n]
        b = min(measured, key=lambda m: (abs(m - n), -m))
        return measured[b] * (n / b) * eff.get(n, 1.0) / eff.get(b, 1.0)

    return pace(nodes) / pace(ref_nodes)


def pace_view(chain, segs: list, now: float, trained_s: float) -> dict:
    """What `status`, `watch` and `report` show of the pace: steps, throughput, training ETAs
    (toward --total and toward the trainer's total steps) from the measured pace, not from
    allocation times; and the placement changes chainrun made."""
    progs = [s.extra["progress"] for s in sorted(segs, key=lambda s: s.idx)
             if (s.extra.get("progress") or {}).get("step") is not None]
    out: dict = {"step": None, "steps_per_s": None, "samples_per_s": None, "total_steps": None, **progress.chain_pace(progs)}
    # how much of the chain's wall time went to training so far (queue waits, hand-offs and signal leads
    # cost the rest): the pace of --total, measured
    starts = [s.start for s in segs if s.start]
    wall = ((chain.finished or now) - min(starts)) if starts else 0.0
    eff = min(1.0, trained_s / wall) if wall >= 60 and trained_s > 0 else None
    active = chain.status == "ACTIVE"
    out["efficiency"] = eff
    out["training_eta"] = now + max(0.0, chain.total_s - trained_s) / eff if active and eff else None
    out["steps_eta"] = None
    sps, total, step = out.get("steps_per_s"), out.get("total_steps"), out.get("step")
    if active and sps and total and step is not None and total > step:
        at = (progs[-1].get("at") or now) if progs else now
        out["steps_eta"] = max(now, at + (total - step) / sps / (eff or 1.0))
    out["adapt"] = not chain.extra.get("no_adapt")
    out["excluded"] = placement.excluded_view(chain)
    out["changes"] = list((chain.extra.get("placement") or {}).get("changes") or [])
    return out


__all__ = ["trained_so_far", "work_done", "segment_rate", "chain_shape_rate", "measured_pace", "chain_shapes",
           "chain_efficiency", "granted_limit", "expected_training", "segment_overhead", "total_tolerance",
           "pace_by_shape", "shape_rate", "pace_view"]
