"""Rolling-origin evaluation: every scored week is chosen for on its own past only.

For every week W of the scored range (``--from`` .. ``--until``) on one fixed grid: 7-day weeks
from the first injection point, with or without a window. The window selects which weeks are
reported and which points are scored (a week that straddles ``--from`` or ``--until`` scores only
its points inside, its ``n``, and says so with ``scored_from``/``scored_until``); the choices and
adoptions run from the grid's first week whatever the window, so a windowed run reports for each of
its weeks the values the run without a window reports for that week:

1. **Past**: the injection points whose chain, under *every* replayed policy (all candidates, the
   fixed leads, reactive and the oracle), ended before W starts (``ChainRun.ended``: finished, or
   stopped as stuck). Everything those chains saw (the queue, the refit models: the replay refits
   on the masked past every week) is before W; so is the priority configuration (a file) and the
   partition's size (a fact of the cluster, ``--nodes``; without it the trace's peak concurrent
   nodes, which a real refresh reads from ``scontrol show node``). Recent points count only when
   every policy finished them before W, i.e. the quick ones: the most recent days of the past lean
   towards light load.
2. **Check**: the past points injected in the ``CHECK_S`` (14 days) before W; **choice**: the
   older ones. Fewer than ``MIN_CHOICE`` choice or ``MIN_CHECK`` check chains: the week keeps the
   shipped values.
3. **Choose** with the one frozen procedure, ``chainrun.sim.tune.pick`` (its criterion, grid and
   tie tolerance unchanged), over ``tune.candidates`` with the floor as a tunable too
   (``FLOORS_S``, at or below 3 h; the share 1.0, which ``pick`` never takes while a bounded share
   is left, is not run); ``best_fixed`` likewise from ``FIXED_LEADS_S`` (adaptive hand-off on).
4. **Adopt** (fixed before any score was seen): the week's choice replaces the values in force
   only when, on the check chains, its mean completion overhead is lower than theirs by more than
   the check's noise: the 90 % bootstrap interval of the paired per-chain difference (in force -
   choice) lies above 0, and it is stuck on no more check chains. The values in force start as the
   shipped ones (``best_fixed``: ``lead_1h``, the ``lead`` policy's default).
5. **Score** the week's chains (exactly the points ``sim --chains --from --until`` scores) under
   the values in force: that is the row ``predicted``; ``best_fixed`` is the fixed lead in force.

Cheap by construction: a chain's replay under one candidate does not depend on any week's choice,
so every candidate runs once on every point that can be past for a scored week, and the weeks
are chosen from those rows; the scored points that cannot be past only run what is in force.
"""

from __future__ import annotations

import time
from dataclasses import replace

from chainrun.chain.policies import MAX_LEAD_SHARE, PREDICTED_FLOOR_S, PREDICTED_RULE, TRANSITION_COST_S
from chainrun.sim import tune
from chainrun.sim.chain_replay import (LOAD_LEVELS, ChainsConfig, bootstrap_ci, chain_points, load_levels,
                                       run_points, setup, summarize)
from chainrun.sim.chains import PolicySpec

WEEK_S = 7 * 86400.0
CHECK_S = 14 * 86400.0  # the newest past: the check, not chosen on
MIN_CHOICE = 20  # chains to choose on; fewer: the week keeps the shipped values
MIN_CHECK = 4  # chains to check on
FLOORS_S = (3600.0, 10800.0)  # the floor as a tunable: the shipped 1 h and 3 h, the grid's old full range
FIXED_LEADS_S = (3600.0, 7200.0, 6 * 3600.0, 12 * 3600.0, 24 * 3600.0, 36 * 3600.0, 48 * 3600.0)
CHECK_LEVEL = 0.90


def grid(segment_s: float) -> list[PolicySpec]:
    """``tune.candidates`` with the floor tuned; bounded shares only (``pick`` never takes 1.0
    while one is left, so its rows would change nothing)."""
    return [s for s in tune.candidates(floors=FLOORS_S, segment_s=segment_s) if s.lead_share < 1.0]


def fixed_specs() -> list[PolicySpec]:
    return [PolicySpec("lead_1h" if s == 3600.0 else f"fixed_{int(s // 3600)}h", "lead", lead_s=s, adaptive=True)
            for s in FIXED_LEADS_S]


def shipped(specs: list[PolicySpec]) -> PolicySpec:
    """The grid point with the shipped values (what `predicted` does without a choice)."""
    for s in specs:
        if (s.rule, s.cost_s, s.lead_s, s.lead_share) == (PREDICTED_RULE, float(TRANSITION_COST_S),
                                                          float(PREDICTED_FLOOR_S), MAX_LEAD_SHARE):
            return s
    raise ValueError("the shipped values are not on the grid")


def values(s: PolicySpec) -> dict:
    return {"rule": s.rule, "transition_cost_s": s.cost_s, "lead_share": s.lead_share, "floor_s": s.lead_s}


def weeks(points: list, start: float | None, until: float | None) -> list[tuple[float, float]]:
    """The fixed 7-day grid of the run without ``--from``/``--until`` (``points``: its injection
    points), from its first point; the weeks that meet [``start``, ``until``) and hold points.
    A window moves which weeks are reported and scored, never where a week starts."""
    if not points:
        return []
    a, end = points[0][0], points[-1][0] + 1
    lo = float("-inf") if start is None else start
    hi = end if until is None else min(until, end)
    out = []
    while a < hi:
        b = min(a + WEEK_S, end)
        if b > lo:
            out.append((a, b))
        a += WEEK_S
    return out


def rows(by_point: dict, keys: list, specs: list[PolicySpec], loads: dict, seed: int) -> dict:
    """What ``tune.pick`` reads, per spec, over the points ``keys``: n, mean overhead, stuck, GPU-h
    twice share and per load level n and mean (and the 90 % interval, computed where read)."""
    out = {}
    for s in specs:
        mine = [by_point[k][s.name] for k in keys]
        done = [r for r in mine if r.done]
        oh = [r.overhead_s / 3600 for r in done]
        work = sum(r.work_s * r.nodes for r in done)
        row = {"n": len(done), "mean_overhead_h": sum(oh) / len(oh) if oh else None,
               "stuck": sum(r.stuck for r in mine),
               "gpu_h_twice_share": sum(r.twice_node_s for r in done) / work if work else 0.0, "by_load": {}}
        for lv in LOAD_LEVELS:
            v = [r.overhead_s / 3600 for r in done if loads.get((r.t0, r.nodes)) == lv]
            row["by_load"][lv] = _Level(n=len(v), mean_overhead_h=sum(v) / len(v) if v else None, values=v, seed=seed)
        out[s.name] = row
    return out


class _Level(dict):
    """A load level's row; its bootstrap interval is computed when ``pick`` reads it (only the
    best candidate's worst level is read, and 2000 resamples for every candidate every week would
    cost more than the choice)."""

    def __init__(self, *, values, seed, **kw) -> None:
        super().__init__(**kw)
        self._values, self._seed = values, seed

    def get(self, key, default=None):
        if key == "ci90_h" and key not in self:
            self[key] = bootstrap_ci(self._values, seed=self._seed)
        return super().get(key, default)

    def __getitem__(self, key):
        if key == "ci90_h":
            return self.get(key)
        return super().__getitem__(key)


def beats(by_point: dict, keys: list, new: str, old: str, seed: int) -> dict:
    """The check: does ``new`` beat ``old`` on these chains by more than their noise?"""
    pairs = [(by_point[k][old], by_point[k][new]) for k in keys]
    d = [(o.overhead_s - n.overhead_s) / 3600 for o, n in pairs if o.done and n.done]
    stuck_new, stuck_old = sum(n.stuck for _, n in pairs), sum(o.stuck for o, _ in pairs)
    lo, hi = bootstrap_ci(d, seed=seed, level=CHECK_LEVEL) if len(d) >= 2 else (None, None)
    ok = new != old and lo is not None and lo > 0 and stuck_new <= stuck_old
    return {"n": len(d), "mean_gain_h": sum(d) / len(d) if d else None, "ci90_h": [lo, hi], "adopt": ok}


def _weeks_in_force(wk, scored, by_point, ended, full, loads, cands, ship, fixed, seed, *, check_s: float,
                    min_choice: int, min_check: int, report_from: float | None = None,
                    report_until: float | None = None) -> tuple[list[dict], dict]:
    """Week by week, the values in force: each chosen only on chains whose replay ended before the
    week starts (the older ones), checked on the newest of those, adopted only when the check says so.
    ``wk`` is the grid from its first week (the values in force carry over from every earlier week,
    scored or not); only the weeks that meet [``report_from``, ``report_until``) are reported.
    Returns the weeks' records and, per scored point, (predicted in force, fixed lead in force)."""
    week_out, force, force_fixed = [], ship, fixed[0]
    plan: dict = {}  # scored point -> (predicted in force, fixed lead in force)
    lo = float("-inf") if report_from is None else report_from
    hi = float("inf") if report_until is None else report_until
    for a, b in wk:
        past = [k for k in by_point if ended[k] < a]
        check = [k for k in past if k[0] >= a - check_s]
        choice = [k for k in past if k[0] < a - check_s]
        entry = {"start": _iso(a), "end": _iso(b), "n": int(sum(a <= t < b for t, _ in scored)),
                 "choice_chains": len(choice), "check_chains": len(check)}
        if len(choice) >= min_choice and len(check) >= min_check:
            pol = rows(by_point, choice, full, loads, seed)
            best = tune.pick(pol, cands)
            best_fixed = tune.pick(pol, fixed)
            chk = beats(by_point, check, best.name, force.name, seed)
            chk_fixed = beats(by_point, check, best_fixed.name, force_fixed.name, seed)
            if chk["adopt"]:
                force = best
            if chk_fixed["adopt"]:
                force_fixed = best_fixed
            entry.update(chosen=values(best), chosen_name=best.name,
                         chosen_on_until=_iso(max(ended[k] for k in past)), adopted=chk["adopt"], check=chk,
                         best_fixed_chosen_lead_s=best_fixed.lead_s, best_fixed_adopted=chk_fixed["adopt"],
                         best_fixed_check=chk_fixed)
        else:  # too little past: the shipped values
            entry.update(chosen=values(ship), chosen_name=ship.name, chosen_on_until=None, adopted=False,
                         note="too little past: the shipped values")
        entry.update(in_force=values(force), in_force_name=force.name, best_fixed_lead_s=force_fixed.lead_s)
        if b <= lo or a >= hi:
            continue  # before the window: chosen (its adoption carries over), not reported
        if a < lo or b > hi:  # the week straddles the window: only its points inside are scored (n)
            entry.update(scored_from=_iso(max(a, lo)), scored_until=_iso(min(b, hi)))
        week_out.append(entry)
        for t, k in scored:
            if a <= t < b:
                plan[(t, k)] = (force, force_fixed)
    return week_out, plan


def rolling(trace, cfg: ChainsConfig, *, check_s: float = CHECK_S, min_choice: int = MIN_CHOICE,
            min_check: int = MIN_CHECK, cands: list[PolicySpec] | None = None) -> dict:
    """The rolling-origin run: ``{"fidelity", "chains": {policies, targets, rolling}, "meta"}``.
    The keywords are for small test traces; ``cands`` must hold the shipped values."""
    t_begin = time.monotonic()
    w, nodes, sizes = setup(trace, replace(cfg, specs=[PolicySpec("reactive", "reactive")]))
    from chainrun.sim import chain_replay

    first = chain_replay._SHARED["first"]
    scored = chain_points(w.jobs[-1][0], first, cfg, sizes)
    every = chain_points(w.jobs[-1][0], first, replace(cfg, inject_from=None, inject_until=None, max_chains=None),
                         sizes)
    # the week grid and the adoptions are those of the run without --from/--until: its weeks from the
    # first, up to the last one reported; the window only selects the weeks reported and scored
    # (the grid's last week ends at the last point: of every point when windowed, so a --max-chains
    # window's points all lie on it)
    windowed = cfg.inject_from is not None or cfg.inject_until is not None
    unwindowed = every if windowed else scored
    shown = weeks(unwindowed, cfg.inject_from, cfg.inject_until)
    wk = [x for x in weeks(unwindowed, None, None) if not shown or x[0] <= shown[-1][0]] if shown else []
    cands = cands or grid(cfg.work.segment_s)
    ship = shipped(cands)
    fixed = fixed_specs()
    refs = [PolicySpec("reactive", "reactive"), PolicySpec("oracle", "oracle")]
    full = cands + fixed + refs
    # every point that can be past for a scored week: its chain takes at least its work
    last = wk[-1][0] if wk else float("-inf")
    past_pts = [p for p in every if p[0] + cfg.work.work_s < last]
    runs, cost = run_points([(t, k, full) for t, k in past_pts], cfg.workers)
    by_point: dict = {}
    for r in runs:
        by_point.setdefault((r.t0, r.nodes), {})[r.policy] = r
    ended = {k: max(r.ended for r in v.values()) for k, v in by_point.items()}
    loads = load_levels(runs)
    week_out, plan = _weeks_in_force(wk, scored, by_point, ended, full, loads, cands, ship, fixed, cfg.seed,
                                     check_s=check_s, min_choice=min_choice, min_check=min_check,
                                     report_from=cfg.inject_from, report_until=cfg.inject_until)
    # the scored points: reuse their rows where they were run, else run what is needed
    need = []
    for (t, k), (pf, ff) in plan.items():
        have = by_point.get((t, k), {})
        want = [s for s in [*refs, ship, pf, *fixed] if s.name not in have]
        want = list({s.name: s for s in want}.values())
        if want:
            need.append((t, k, want))
    more, cost2 = run_points(need, cfg.workers) if need else ([], {})
    for r in more:
        by_point.setdefault((r.t0, r.nodes), {})[r.policy] = r
    for k2, v in cost2.items():
        cost[k2] = round(cost.get(k2, 0) + v, 1)
    out_runs = []
    for (t, k), (pf, ff) in plan.items():
        have = by_point[(t, k)]
        for name, src in (("reactive", "reactive"), ("oracle", "oracle"), ("predicted", pf.name),
                          ("best_fixed", ff.name), ("predicted_shipped", ship.name),
                          *((s.name, s.name) for s in fixed)):
            out_runs.append(replace(have[src], policy=name))
    names = ["reactive", *[s.name for s in fixed], "best_fixed", "predicted_shipped", "predicted", "oracle"]
    score_loads = load_levels(out_runs)
    summary = summarize(out_runs, score_loads, cfg, [PolicySpec(n, "reactive") for n in names])
    ch = summary["chains"]
    ch["rolling"] = {"weeks": week_out, "procedure": "chainrun.sim.rolling", "check_days": check_s / 86400,
                     "min_choice_chains": min_choice, "min_check_chains": min_check,
                     "grid": {"rules": sorted({s.rule for s in cands}), "transition_costs_s": list(tune.COSTS_S),
                              "shares": sorted({s.lead_share for s in cands}), "floors_s": list(FLOORS_S),
                              "fixed_leads_s": list(FIXED_LEADS_S)},
                     "shipped": values(ship), "past_points": len(past_pts)}
    meta = {"nodes": nodes, "jobs": len(w.jobs), "injections": len(scored), "chain_nodes": list(sizes),
            "chains_every_h": cfg.chains_every_s / 3600, "priority": cfg.priority, "cost": cost, "seed": cfg.seed,
            "replayed_chains": len(runs) + len(more), "seconds": round(time.monotonic() - t_begin, 1)}
    return {"fidelity": chain_replay._SHARED["fid"], **summary, "meta": meta}


def _iso(t: float) -> str:
    import pandas as pd

    return pd.Timestamp(t, unit="s").strftime("%Y-%m-%dT%H:%M:%S")
