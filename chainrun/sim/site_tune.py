"""The site margin of ``predicted_multi``, chosen on the past and scored on the rest (issue #26).

The procedure, fixed (with its grid) before any score was seen, as docs/multi-cluster.md states:

1. Every margin of ``MARGINS_S`` runs ``predicted_multi`` on every injection point of the window
   (with ``predicted:<site>`` for each site and ``reactive:<first>``, which gives the load levels).
2. **Split**: the injection window's first ``CHOICE_SHARE`` (by time) is the past. **Choice** chains:
   the points whose every run (every margin and every single-site row) ended before the split.
   **Scored** chains: the points injected from the split on. The two never share a chain.
3. **Pick** on the choice chains: the fewest stuck chains; among the margins that keep the budgets
   (at most ``MOVES_BUDGET`` moves per chain on average, GPU-hours held twice at most
   ``GPU_TWICE_BUDGET``; all margins if none does), the lowest mean completion overhead; every margin
   within ``TIE_H`` of it ties, and ties go to the **largest** margin (the fewest moves). Fewer than
   ``MIN_CHOICE`` choice chains: ``DEFAULT_MARGIN_S``, and the output says so.
4. **Score** the scored chains with the pick: ``chains.policies`` (``predicted_multi`` is the picked
   margin's runs); ``chains.whole_window`` shows every point with the pick (the choice chains are in
   it: not an out-of-sample number), ``chains.site_margin.choice`` every margin on the choice chains.
"""

from __future__ import annotations

from dataclasses import replace

from chainrun.chain.site_choice import SHIPPED_MARGIN_S
from chainrun.sim.chain_replay import LOAD_LEVELS, summarize
from chainrun.sim.chains import PolicySpec

MARGINS_S = (0.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0)
# without enough past: the product's own margin (an hour, the replay's boundary cost TRANSITION_COST_S)
DEFAULT_MARGIN_S = SHIPPED_MARGIN_S
CHOICE_SHARE = 0.5
MIN_CHOICE = 10
TIE_H = 0.05  # 3 minutes of mean overhead per chain
MOVES_BUDGET = 1.0
GPU_TWICE_BUDGET = 0.01
MULTI = "predicted_multi"
RACE = "predicted_multi_race"
HINDSIGHT = "best_single_hindsight"


def multi_name(margin_s: float) -> str:
    return f"{MULTI}@{margin_s / 3600:g}h"


def race_name(margin_s: float) -> str:
    return f"{RACE}@{margin_s / 3600:g}h"


def hindsight(runs: list, names: list[str]) -> list:
    """Per chain, the better of the single-cluster ``predicted`` runs, known afterwards: not a policy,
    the most that picking one cluster per chain could give (a bound to read the others against)."""
    best: dict = {}
    for r in runs:
        if r.policy in {f"predicted:{n}" for n in names} and r.done:
            k = (r.t0, r.nodes)
            if k not in best or r.overhead_s < best[k].overhead_s:
                best[k] = r
    return [replace(r, policy=HINDSIGHT) for r in best.values()]


def policy_rows(runs: list, loads: dict, cfg, names: list[str]) -> dict:
    """``summarize``'s rows for ``names``, with moves and the move cost for the multi-site rows."""
    pols = summarize(runs, loads, cfg, [PolicySpec(n, "reactive") for n in names])["chains"]["policies"]
    for n in names:
        mine = [r for r in runs if r.policy == n and r.done and (not loads or (r.t0, r.nodes) in loads)]
        if mine and hasattr(mine[0], "moves"):
            row = pols[n]
            moves = sum(r.moves for r in mine)
            row["moves"] = moves / len(mine)
            row["max_moves"] = max(r.moves for r in mine)
            row["mean_move_cost_h"] = sum(r.move_cost_s for r in mine) / len(mine) / 3600
            row["lost_work_move_share"] = sum(r.lost_work_moves for r in mine) / moves if moves else None
            row["pending_moves"] = sum(getattr(r, "pending_moves", 0) for r in mine) / len(mine)
            segs: dict = {}
            for r in mine:
                for s in r.sites:
                    segs[s] = segs.get(s, 0) + 1
            row["segments_by_site"] = segs
            if any(getattr(r, "race_duplicates", 0) for r in mine):
                row["race_duplicates"] = sum(r.race_duplicates for r in mine) / len(mine)
        for lv in LOAD_LEVELS:  # the level's mean moves, where it has chains
            at = [r for r in mine if loads.get((r.t0, r.nodes)) == lv and hasattr(r, "moves")]
            if at:
                pols[n]["by_load"][lv]["moves"] = sum(r.moves for r in at) / len(at)
    return pols


def pick(rows: dict[float, dict]) -> float:
    """The procedure's step 3 on {margin: its row on the choice chains}."""
    ok = {m: r for m, r in rows.items() if r.get("n")}
    fewest = min(r.get("stuck", 0) for r in ok.values())
    ok = {m: r for m, r in ok.items() if r.get("stuck", 0) == fewest}
    kept = {m: r for m, r in ok.items() if r.get("moves", 0.0) <= MOVES_BUDGET
            and r.get("gpu_h_twice_share", 0.0) <= GPU_TWICE_BUDGET} or ok
    best = min(r["mean_overhead_h"] for r in kept.values())
    return max(m for m, r in kept.items() if r["mean_overhead_h"] <= best + TIE_H)


def targets(pols: dict, names: list[str]) -> dict:
    """The issue's goals: at medium and heavy load (levels with >= 5 chains) >= 30 % less mean overhead
    than the better single-cluster ``predicted`` at that level; at low load not > 5 % worse; <= 1 move
    per chain; none stuck; GPU-h held twice <= 1 %."""
    m = pols.get(MULTI)
    if not m or not m.get("n"):
        return {}
    out: dict = {}
    for lv in LOAD_LEVELS:
        ml = m["by_load"][lv]
        singles = [(n, pols[f"predicted:{n}"]["by_load"][lv]) for n in names if pols.get(f"predicted:{n}")]
        singles = [(n, r) for n, r in singles if r.get("n")]
        if not ml.get("n") or not singles:
            out[lv] = None
            continue
        bn, br = min(singles, key=lambda nr: nr[1]["mean_overhead_h"])
        b, x = br["mean_overhead_h"], ml["mean_overhead_h"]
        red = (b - x) / b if b > 0 else None
        row = {"n": ml["n"], "better_single": f"predicted:{bn}", "better_single_h": b, "multi_h": x, "reduction": red}
        if lv == "low":
            row["within_5pct"] = x <= 1.05 * b
        elif ml["n"] >= 5:
            row["cut_30pct"] = red is not None and red >= 0.30
        out[lv] = row
    out["moves_per_chain"] = m.get("moves")
    out["moves_ok"] = m.get("moves", 0.0) <= MOVES_BUDGET
    out["stuck"] = m.get("stuck", 0)
    out["gpu_h_twice_ok"] = m.get("gpu_h_twice_share", 0.0) <= GPU_TWICE_BUDGET
    return out


def ended_by_point(runs: list) -> dict:
    """{(t0, nodes): when the last of the point's runs ended}: a point is past once all its runs are."""
    ended: dict = {}
    for r in runs:
        k = (r.t0, r.nodes)
        ended[k] = max(ended.get(k, float("-inf")), r.ended)
    return ended


def _keep(runs: list, keys: set) -> list:
    return [r for r in runs if (r.t0, r.nodes) in keys]


def _with_pick(runs: list, margin_s: float, names: list[str]) -> list:
    """The single-site rows as they are, the picked margin's multi-site runs as ``predicted_multi`` (and
    ``predicted_multi_race``), and the hindsight row."""
    chosen = {multi_name(margin_s): MULTI, race_name(margin_s): RACE}
    out = [replace(r, policy=chosen[r.policy]) if r.policy in chosen else r for r in runs
           if "@" not in r.policy or r.policy in chosen]
    return out + hindsight(runs, names)


def choose_and_score(runs: list, loads: dict, cfg, names: list[str], pts: list, margins: tuple[float, ...], *,
                     fixed: bool, race: bool = False) -> dict:
    """``chains`` of the JSON: policies (scored chains), targets, whole_window, site_margin."""
    singles = [f"reactive:{names[0]}", *(f"predicted:{n}" for n in names)]
    rows = [*singles, MULTI, *([RACE] if race else []), HINDSIGHT]
    all_keys = {(t, k) for t, k in pts}
    if fixed:
        final = _with_pick(runs, margins[0], names)
        pols = policy_rows(final, loads, cfg, rows)
        return {"policies": pols, "targets": targets(pols, names),
                "site_margin": {"margin_s": margins[0], "chosen": False, "note": "fixed by --site-margin"}}
    first, last = pts[0][0], pts[-1][0]
    split = first + CHOICE_SHARE * (last - first)
    choice = {k for k, e in ended_by_point(runs).items() if e < split}
    scored = {k for k in all_keys if k[0] >= split}
    grid = policy_rows(_keep(runs, choice), loads, cfg, [*singles, *(multi_name(m) for m in margins),
                                                         *(race_name(m) for m in (margins if race else ()))])
    n_choice = len([r for r in _keep(runs, choice) if r.policy == multi_name(margins[0]) and r.done])
    if n_choice >= MIN_CHOICE:
        picked, note = pick({m: grid[multi_name(m)] for m in margins}), "chosen on the choice chains"
    else:
        picked, note = DEFAULT_MARGIN_S, f"fewer than {MIN_CHOICE} choice chains: the default margin"
    final = _with_pick(runs, picked, names)
    pols = policy_rows(_keep(final, scored), loads, cfg, rows)
    whole = policy_rows(final, loads, cfg, rows)
    return {
        "policies": pols, "targets": targets(pols, names),
        "whole_window": {"policies": whole, "targets": targets(whole, names),
                         "note": "every point with the picked margin; the choice chains are in it"},
        "site_margin": {
            "margin_s": picked, "chosen": n_choice >= MIN_CHOICE, "note": note, "split": _iso(split),
            "choice_chains": len(choice), "scored_chains": len(scored),
            "procedure": {"grid_s": list(MARGINS_S), "choice_share": CHOICE_SHARE, "tie_h": TIE_H,
                          "ties": "the largest margin", "moves_budget": MOVES_BUDGET,
                          "gpu_h_twice_budget": GPU_TWICE_BUDGET, "min_choice": MIN_CHOICE,
                          "default_margin_s": DEFAULT_MARGIN_S, "module": "chainrun.sim.site_tune"},
            "choice": {n: _brief(grid[n]) for n in grid},
        },
    }


def _brief(row: dict) -> dict:
    keys = ("n", "stuck", "mean_overhead_h", "moves", "gpu_h_twice_share", "mean_move_cost_h")
    out = {k: row.get(k) for k in keys if k in row}
    out["by_load"] = {lv: {"n": v["n"], "mean_overhead_h": v["mean_overhead_h"]} for lv, v in row["by_load"].items()}
    return out


def _iso(t: float) -> str:
    import pandas as pd

    return pd.Timestamp(t, unit="s").strftime("%Y-%m-%dT%H:%M:%S")
