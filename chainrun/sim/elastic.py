"""Elastic shapes in the whole-chain replay (issue #14): `chainrun sim --chains --shapes 4,2,1`.

Chains of the reference shape (the first of ``shapes``) are injected as in chain_replay.py and run
under reactive (it defines the load levels), fixed-shape ``predicted`` and ``predicted_elastic``
(the same policy class and timing; each segment's node count from the watcher's shape rules,
chainrun.chain.shapes.choose_shape and, while nothing is live, choose_filler, on the model's median
wait for every shape). The scaling efficiency of the other shapes (1.0 = linear in nodes) is both
what the simulated segments do and what the rules are told; a second efficiency gives a
sensitivity row (``predicted_elastic_eff80``).

Decide on the past, score on the future (``tune_elastic``): the tunable here is the filler's
margin, the least reference work a filler must gain in segment boundaries
(``chainrun.chain.shapes.choose_filler``), picked among ``FILLER_MARGINS`` and "no filler" on chains whose whole life ends before
``score_from`` (the lowest mean completion overhead at the first efficiency; ties go to the larger
margin, the one that runs fewer fillers, and "no filler" is the largest); every policy is then
scored on chains injected from ``score_from`` on with that margin. The shape rule's own margin
stays at its shipped value (``DEFAULT_MARGIN_S``: its candidates 10 min, 1 h and 3 h tied within
0.01 h on the choice window, see the history of docs/elastic.md).
"""

from __future__ import annotations

from dataclasses import replace

from chainrun.chain.shapes import DEFAULT_MARGIN_S, FILLER_MARGIN
from chainrun.errors import UsageError
from chainrun.sim.chain_replay import LOAD_LEVELS, ChainsConfig, chain_life_s, run_chains
from chainrun.sim.chains import elastic_specs

# candidates, in boundaries (the replay's boundary is the 5-min signal lead: 10 min, 30 min, 1 h); None: no filler
FILLER_MARGINS = (2.0, 6.0, 12.0, None)
NO_FILLER = float("inf")  # how "no filler" sorts among the margins (the largest)


def parse_efficiencies(text: str) -> tuple[float, ...]:
    """``"1,0.8"`` -> (1.0, 0.8): the other shapes' scaling efficiency (the first is the main row)."""
    out = []
    for part in str(text).split(","):
        try:
            e = float(part)
        except ValueError:
            e = -1.0
        if not 0 < e <= 2:
            raise UsageError(f"--efficiency {text!r}: {part.strip()!r} is not a scaling efficiency in (0, 2] "
                             "(1.0 = linear in nodes)")
        out.append(e)
    return tuple(out)


def elastic_config(cfg: ChainsConfig, shapes: tuple[int, ...], efficiencies=(1.0,),
                   margin_s: float = DEFAULT_MARGIN_S,
                   filler_margin: float | None = FILLER_MARGIN) -> ChainsConfig:
    return replace(cfg, chain_nodes=(shapes[0],),
                   specs=elastic_specs(shapes, efficiencies, margin_s, filler_margin))


def _describe(shapes, efficiencies, margin_s: float, filler_margin, gpus_per_node: int) -> dict:
    return {"reference_nodes": shapes[0], "shapes": list(shapes), "gpus_per_node": gpus_per_node,
            "efficiencies": list(efficiencies), "margin_s": margin_s, "filler_margin": filler_margin,
            "rate": "reference-work per second on n nodes = n / reference x efficiency (1.0 = linear; the "
                    "reference shape 1.0); the same efficiency is the simulated truth and what the rule is told"}


def filler_stats(res, specs) -> None:
    """Add to each elastic policy's row of ``res.summary`` how often it ran a filler: the share of
    its chains with one (all, and per load level) and the filler margin it used."""
    pols = res.summary["chains"]["policies"]
    for spec in specs:
        if not spec.shapes or spec.name not in pols:
            continue
        rs = [r for r in res.runs if r.policy == spec.name and r.done and (not res.loads or (r.t0, r.nodes) in res.loads)]
        by = {lv: [r for r in rs if res.loads.get((r.t0, r.nodes)) == lv] for lv in LOAD_LEVELS}
        pols[spec.name].update({
            "filler_margin": spec.filler_margin,
            "chains_filler_share": sum(r.fillers > 0 for r in rs) / len(rs) if rs else None,
            "filler_share_by_load": {lv: (sum(r.fillers > 0 for r in v) / len(v) if v else None) for lv, v in by.items()},
        })


def run_elastic(trace, cfg: ChainsConfig, shapes: tuple[int, ...], efficiencies=(1.0,),
                margin_s: float = DEFAULT_MARGIN_S, filler_margin: float | None = FILLER_MARGIN) -> dict:
    """``chainrun sim --chains --shapes ... --json`` data: fidelity, chains (with ``elastic``), meta."""
    ecfg = elastic_config(cfg, shapes, efficiencies, margin_s, filler_margin)
    res = run_chains(trace, ecfg)
    filler_stats(res, ecfg.specs)
    data = res.as_json()
    data["chains"]["elastic"] = _describe(shapes, efficiencies, margin_s, filler_margin, cfg.gpus_per_node)
    return {"fidelity": res.fidelity, **data}


def _candidate_name(m: float | None) -> str:
    return "predicted_elastic_nofiller" if m is None else f"predicted_elastic_filler{m:g}x"


def tune_elastic(trace, cfg: ChainsConfig, score_from: float, shapes: tuple[int, ...], efficiencies=(1.0,),
                 margins=FILLER_MARGINS) -> dict:
    """Pick the filler margin on chains that end before ``score_from``; score every policy after it."""
    from chainrun.sim.jsonsafe import finite as _finite

    life = chain_life_s(cfg.work.work_s)
    shipped = elastic_specs(shapes, ())[1]  # fixed-shape predicted, as `chainrun submit --policy predicted`
    cands = [replace(shipped, name=_candidate_name(m), shapes=tuple(shapes), efficiency=efficiencies[0],
                     margin_s=DEFAULT_MARGIN_S, filler_margin=m) for m in margins]
    choose_cfg = replace(cfg, chain_nodes=(shapes[0],), specs=elastic_specs(shapes, ())[:2] + cands,
                         inject_from=None, inject_until=score_from - life)
    chosen = run_chains(trace, choose_cfg)
    filler_stats(chosen, choose_cfg.specs)
    pols = chosen.summary["chains"]["policies"]
    ok = [s for s in cands if pols[s.name].get("n")]

    def key(s):  # lowest mean overhead; ties (to the hundredth of an hour) to the larger margin / no filler
        m = NO_FILLER if s.filler_margin is None else s.filler_margin
        return (round(pols[s.name]["mean_overhead_h"], 2), -m)

    picked = min(ok, key=key).filler_margin if ok else FILLER_MARGIN
    scored = run_elastic(trace, replace(cfg, inject_from=score_from, inject_until=None), shapes, efficiencies,
                         DEFAULT_MARGIN_S, picked)
    scored["elastic_tune"] = _finite({
        "procedure": "filler margin chosen on chains that end before score_from (lowest mean completion overhead "
                     "at the first efficiency, to 0.01 h; ties to the larger margin, no filler the largest), every "
                     "policy scored on chains injected from it (chainrun.sim.elastic)",
        "score_from": score_from, "inject_until": score_from - life,
        "picked_filler_margin": picked, "picked": "no filler" if picked is None else f"{picked:g} boundaries",
        "shape_margin_s": DEFAULT_MARGIN_S, "shipped_filler_margin": FILLER_MARGIN,
        "injections": chosen.meta["injections"], "meta": chosen.meta,
        "candidates": {s.name: {k: pols[s.name].get(k) for k in ("n", "mean_overhead_h", "mean_segments",
                                                                  "chains_elastic_share", "chains_filler_share",
                                                                  "filler_margin", "by_load")}
                       for s in [*choose_cfg.specs]},
    })
    return scored
