"""Elastic shapes in the whole-chain replay (issue #14): `chainrun sim --chains --shapes 4,2,1`.

Chains of the reference shape (the first of ``shapes``) are injected as in chain_replay.py and run
under reactive (it defines the load levels), fixed-shape ``predicted`` and ``predicted_elastic``
(the same policy class and timing; each segment's node count from the watcher's shape rule,
chainrun.chain.shapes.choose_shape, on the model's median wait for every shape). The scaling
efficiency of the other shapes (1.0 = linear in nodes) is both what the simulated segments do and
what the rule is told; a second efficiency gives a sensitivity row (``predicted_elastic_eff80``).

Decide on the past, score on the future (``tune_elastic``): the rule's one tunable here, the margin
another shape must save to be chosen, is picked among ``MARGINS_S`` on chains whose whole life ends
before ``score_from`` (the lowest mean completion overhead at the first efficiency; ties go to the
larger margin, the one that changes the shape less often); every policy is then scored on chains
injected from ``score_from`` on with that margin.
"""

from __future__ import annotations

from dataclasses import replace

from chainrun.chain.shapes import DEFAULT_MARGIN_S
from chainrun.errors import UsageError
from chainrun.sim.chain_replay import ChainsConfig, run_chains
from chainrun.sim.chains import PolicySpec, elastic_specs

MARGINS_S = (DEFAULT_MARGIN_S, 3600.0, 3 * 3600.0)  # candidates: the shipped default, 1 h, 3 h


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
                   margin_s: float = DEFAULT_MARGIN_S) -> ChainsConfig:
    return replace(cfg, chain_nodes=(shapes[0],), specs=elastic_specs(shapes, efficiencies, margin_s))


def _describe(shapes, efficiencies, margin_s: float, gpus_per_node: int) -> dict:
    return {"reference_nodes": shapes[0], "shapes": list(shapes), "gpus_per_node": gpus_per_node,
            "efficiencies": list(efficiencies), "margin_s": margin_s,
            "rate": "reference-work per second on n nodes = n / reference x efficiency (1.0 = linear; the "
                    "reference shape 1.0); the same efficiency is the simulated truth and what the rule is told"}


def run_elastic(trace, cfg: ChainsConfig, shapes: tuple[int, ...], efficiencies=(1.0,),
                margin_s: float = DEFAULT_MARGIN_S) -> dict:
    """``chainrun sim --chains --shapes ... --json`` data: fidelity, chains (with ``elastic``), meta."""
    res = run_chains(trace, elastic_config(cfg, shapes, efficiencies, margin_s))
    data = res.as_json()
    data["chains"]["elastic"] = _describe(shapes, efficiencies, margin_s, cfg.gpus_per_node)
    return {"fidelity": res.fidelity, **data}


def tune_elastic(trace, cfg: ChainsConfig, score_from: float, shapes: tuple[int, ...], efficiencies=(1.0,),
                 margins=MARGINS_S) -> dict:
    """Pick the margin on chains that end before ``score_from``; score every policy after it."""
    from chainrun.sim.replay import _finite

    life = cfg.work.work_s * 1.5 + 2 * 86400.0
    cands = [PolicySpec(f"predicted_elastic_margin{int(m // 60)}m", "predicted", shapes=tuple(shapes),
                        efficiency=efficiencies[0], margin_s=float(m)) for m in margins]
    choose_cfg = replace(cfg, chain_nodes=(shapes[0],), specs=elastic_specs(shapes, ())[:2] + cands,
                         inject_from=None, inject_until=score_from - life)
    chosen = run_chains(trace, choose_cfg)
    pols = chosen.summary["chains"]["policies"]
    ok = [s for s in cands if pols[s.name].get("n")]
    best = min(ok, key=lambda s: (pols[s.name]["mean_overhead_h"], -s.margin_s)) if ok else \
        PolicySpec("default", "predicted", margin_s=DEFAULT_MARGIN_S)
    scored = run_elastic(trace, replace(cfg, inject_from=score_from, inject_until=None), shapes, efficiencies,
                         best.margin_s)
    scored["elastic_tune"] = _finite({
        "procedure": "margin chosen on chains that end before score_from (lowest mean completion overhead at "
                     "the first efficiency), every policy scored on chains injected from it (chainrun.sim.elastic)",
        "score_from": score_from, "inject_until": score_from - life, "picked_margin_s": best.margin_s,
        "injections": chosen.meta["injections"], "meta": chosen.meta,
        "candidates": {s.name: {k: pols[s.name].get(k) for k in ("n", "mean_overhead_h", "mean_segments",
                                                                  "chains_elastic_share", "by_load")}
                       for s in [*choose_cfg.specs]},
    })
    return scored
