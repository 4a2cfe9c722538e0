"""How much any elastic rule could save a fixed-shape chain: an upper bound, from the replay.

A smaller shape can only help where the chain has nothing training: before its first segment
starts (the first wait) and in the gaps where a segment started after its predecessor's
hand-over point. Restarts and hand-offs are paid at every shape, and running *all* the work on
fewer nodes only pays when the reference waits longer than the extra training takes (never for
a week of work behind waits of hours). So, per fixed-shape chain, the most reference work a
filler could add is, for each such idle stretch ``g``, with the best smaller shape's rate ``r``
(n / reference x efficiency):

    gain(g) = max(0, r x (g - restart) - hand-off)

as if that shape started the moment the stretch opened, the reference's start were known in
hindsight and the filler did not delay it (its usage lowers the reference's fair-share
priority in reality). Every assumption favours the filler: the sum over a chain's stretches,
over the sum of overheads at a load level, bounds the reduction any ``predicted_elastic`` rule
could reach against that fixed-shape ``predicted`` (issue #14's target is 30 % at heavy load).
"""

from __future__ import annotations

from chainrun.sim.chains import ChainRun, ChainWork

PARTS = ("first_wait", "gaps", "restarts", "handoffs", "other")


def overhead_parts(run: ChainRun) -> dict[str, float]:
    """Where a finished chain's completion overhead went, in seconds: the first wait, the positive
    boundary gaps (nothing of the chain training), the restarts, the hand-offs, and the rest
    (slower shapes; rounding)."""
    gaps = sum(g for g, _cut in run.boundaries if g > 0)
    out = {"first_wait": run.first_wait_s, "gaps": gaps, "restarts": run.restart_s, "handoffs": run.handoff_s}
    out["other"] = run.overhead_s - sum(out.values())
    return out


def filler_gain(run: ChainRun, work: ChainWork, rates: tuple[float, ...]) -> float:
    """The most reference work (seconds) fillers at ``rates`` could have added to ``run``:
    ``gain(g)`` of the module doc over its first wait and every positive boundary gap."""
    if not rates:
        return 0.0
    r = max(rates)
    stretches = [run.first_wait_s, *(g for g, _cut in run.boundaries if g > 0)]
    return sum(max(0.0, r * (g - work.restart_s) - work.handoff_s) for g in stretches)


def shape_rates(shapes: tuple[int, ...], efficiency: float) -> tuple[float, ...]:
    """Rates of the shapes other than the reference (the first): n / reference x efficiency."""
    ref = shapes[0]
    return tuple(n / ref * efficiency for n in shapes[1:] if n < ref)


def bound_by_level(runs, loads: dict, work: ChainWork, shapes: tuple[int, ...], efficiencies=(1.0,),
                   policy: str = "predicted") -> dict:
    """Per load level: chains, mean overhead and its parts (hours), and per efficiency the
    largest reduction a filler rule could reach (ratio of summed gains to summed overheads)."""
    out = {}
    done = [r for r in runs if r.policy == policy and r.done and (r.t0, r.nodes) in loads]
    for level in sorted({loads[(r.t0, r.nodes)] for r in done}, key=("low", "medium", "heavy").index):
        rs = [r for r in done if loads[(r.t0, r.nodes)] == level]
        over = sum(r.overhead_s for r in rs)
        parts = [overhead_parts(r) for r in rs]
        row = {"n": len(rs), "overhead_h": over / len(rs) / 3600.0,
               "parts_h": {k: sum(p[k] for p in parts) / len(rs) / 3600.0 for k in PARTS},
               "bound": {}}
        for e in efficiencies:
            gain = sum(filler_gain(r, work, shape_rates(shapes, e)) for r in rs)
            row["bound"][f"{e:g}"] = {"gain_h": gain / len(rs) / 3600.0,
                                      "max_reduction": gain / over if over > 0 else None}
        out[level] = row
    return out
