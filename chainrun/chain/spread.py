"""Topology (the MARL row's other half): does spanning switches slow this chain down, and is
``--switches=1@T`` worth asking for?

A user cannot choose switches, but can ask Slurm to wait up to T for an allocation under one leaf
switch (``--switches=1@T``; after T Slurm gives up and places the job anyway). That bound is what
makes the cost known without asking Slurm: the request can cost at most T of extra queue wait. So
chainrun asks it with T = the training time a segment loses when spread, and only then:

- Slurm reports topology (``scontrol show topology``, a topology plugin); else every segment shows
  "switches: not reported" and nothing is decided;
- the chain has a measured multi-node segment within one switch and a later-or-earlier one spread
  over more, each with at least ``placement.MIN_STEPS`` step times on its nodes (the median node's
  figure: spreading slows every rank's all-reduce, a straggler slows one node and has its own rule);
- the spread segment's step time is at least :data:`SPREAD_LOSS` (10 %) slower than the compact
  segments' median, at ``placement.Z_MIN`` standard errors.

Then T = (segment training time) x loss / (1 + loss): waiting longer than that for one switch would
cost more than the spread segment loses. Every decision, either way, is an event.
"""

from __future__ import annotations

import math

from chainrun.chain import placement
from chainrun.chain.progress import per_node_step_s

SPREAD_LOSS = 0.10
MIN_WAIT_S = 60


def segment_figure(progress: dict) -> dict | None:
    """The segment's step time: its median node's (>= MIN_STEPS steps on every node counted)."""
    stats = [s for s in per_node_step_s(progress).values() if s["n"] >= placement.MIN_STEPS]
    if len(stats) < 2:
        return None
    return sorted(stats, key=lambda s: s["step_s"])[len(stats) // 2]


def record_switches(seg, topology) -> None:
    """Once its nodes are known: how many leaf switches the segment spans (None = not reported)."""
    nodes = seg.extra.get("slurm_nodes") or []
    if nodes and "switches" not in seg.extra:
        seg.extra["switches"] = topology.switches_spanned(nodes) if topology is not None else None


def after_segment(chain, segs: list, seg) -> list[tuple[int | None, str, str]]:
    """After a multi-node segment ended: update the chain's spread evidence, decide on --switches."""
    switches = seg.extra.get("switches")
    fig = segment_figure(seg.extra.get("progress") or {})
    if switches is None or fig is None:
        return []
    pl = chain.extra.setdefault("placement", {})
    hist = pl.setdefault("spread", [])
    hist[:] = [h for h in hist if h.get("seg") != seg.idx] + [dict(fig, seg=seg.idx, switches=int(switches))]
    del hist[:-12]
    compact = [h for h in hist if h["switches"] == 1]
    spread = [h for h in hist if h["switches"] > 1]
    if not compact or not spread:
        return []
    last = max(spread, key=lambda h: h["seg"])
    ref = sorted(compact, key=lambda h: h["step_s"])[len(compact) // 2]
    v = placement.compare("spread", last, [ref])
    adapt = chain.extra.setdefault("adapt", {})
    if adapt.get("switches"):
        return []
    key = f"spread-decided:{last['seg']}"
    if pl.get(key):
        return []
    pl[key] = True
    seen = (f"segment {last['seg']} spanned {last['switches']} switches and stepped {(v.ratio - 1) * 100:.0f} % "
            f"{'slower' if v.ratio >= 1 else 'faster'} than the chain's segments within one switch "
            f"({last['step_s']:.3g} s vs {ref['step_s']:.3g} s a step, {v.z:.1f} standard errors)")
    if v.ratio < 1 + SPREAD_LOSS or v.z < placement.Z_MIN:
        return [(seg.idx, "placement", f"{seen}; not asking for --switches: below the rule's "
                                       f"{SPREAD_LOSS * 100:.0f} % at {placement.Z_MIN:.0f} standard errors")]
    loss = v.ratio - 1
    per_segment = max(60.0, chain.segment_s - chain.signal_lead_s)
    wait_s = max(MIN_WAIT_S, int(per_segment * loss / (1 + loss)))
    if not placement.adapt_enabled(chain):
        return [(seg.idx, "placement", f"{seen}; not asking for --switches (--no-adapt)")]
    adapt["switches"] = f"1@{_slurm_minutes(wait_s)}"
    why = (f"{seen}; Slurm will wait at most {_slurm_minutes(wait_s)} for one switch, the ~{wait_s:.0f} s "
           f"a spread segment loses")
    placement._note_change(chain, seg.idx, seg.end, f"--switches={adapt['switches']}: {why}")
    return [(seg.idx, "adapt", f"asking --switches={adapt['switches']} for the next segments: {why}")]


def _slurm_minutes(seconds: float) -> str:
    """Slurm's time format for --switches' max wait: [days-]hours:minutes:seconds."""
    s = int(math.ceil(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"
