"""The site margin of a chain spanning clusters, chosen on the past of those clusters (issue #26):
what `chainrun model sites a,b` runs (docs/multi-cluster.md, "The margin in force").

``choose(frames, names, ...)`` is site_rolling's step for one week, run at ``as_of`` instead of at a
week's start, on the clusters' own cached sacct histories:

1. **History**: each cluster's cached rows (all users, every partition) as known at ``as_of`` (the
   oldest of the caches' last refreshes: no cluster is seen past what was read of it), the last
   ``selftune.TUNE_DAYS`` of it, thinned to ``thinning.JOB_BUDGET`` jobs where bigger (cost: cron
   runs it niced, single-threaded). Real clusters share one clock: no shift (two_sites' ``--align``
   is for traces of different times). Each cluster is sized by its history's peak, with age-only
   priority (nothing is asked of Slurm: the choice reads only the caches), and at its declared pace.
2. **Chains** shaped like the user's on the first cluster (``selftune.chain_shape``/``work_for``) are
   injected every 12 h after a 7-day warm-up where every cluster covers their whole life
   (``two_sites.window``); every point runs ``predicted_multi`` at every margin of
   ``site_tune.MARGINS_S`` and the single-cluster rows (``two_sites.run_points``).
3. **Choice**: the points whose every run ended before ``as_of``, with the frozen rule unchanged
   (``site_rolling.week_margin``: ``site_tune.pick`` with its grid, budgets and tie rule, at least
   ``site_tune.MIN_CHOICE`` finished chains, else the default). Fewer chains, a history missing or
   too short on one cluster, or other users' jobs hidden: the margin in force is kept, and the
   outcome's ``reason`` says why in one line.

``refresh_margins(cluster)`` is `chainrun model refresh`'s last step: ``choose_now`` again for every
cluster list already stored that holds the refreshed cluster (pins respected; never raises).

Nothing here changes the procedure: it calls site_tune's, site_rolling's and two_sites' functions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chainrun.errors import ChainrunError
from chainrun.sim import site_tune
from chainrun.sim.selftune import CHAINS_EVERY_S, TUNE_DAYS, WARMUP_S, as_seen_at, work_for

if TYPE_CHECKING:
    import pandas as pd


def recent_known(frame: "pd.DataFrame", as_of: float, days: float = TUNE_DAYS) -> "pd.DataFrame":
    """The jobs submitted in the ``days`` before ``as_of``, as known at ``as_of``."""
    seen = as_seen_at(frame, as_of)
    return seen[seen["submit"].to_numpy(float) >= as_of - days * 86400.0]


def need_s(work_s: float, warmup_s: float, chains_every_s: float) -> float:
    """The history every cluster needs before ``as_of``: the warm-up, MIN_CHOICE injections, and one
    chain's life after the last (two_sites' window ends a life before each history's last job)."""
    from chainrun.sim.chain_replay import chain_life_s

    return warmup_s + site_tune.MIN_CHOICE * chains_every_s + chain_life_s(work_s)


def choose(frames: list["pd.DataFrame"], names: list[str], *, shape: dict, as_of: float,
           paces: dict | None = None, workers: int = 1, predictor=None, warmup_s: float = WARMUP_S,
           chains_every_s: float = CHAINS_EVERY_S, retrain_every_s: float = 7 * 86400.0,
           job_budget: int | None = None, seed: int = 0) -> dict:
    """One choice (the module's docstring). Returns ``chosen`` (bool), ``margin_s`` (None when not
    chosen), ``reason`` (one line), ``as_of``, ``shape``, ``window``, ``rows`` (per margin of the grid,
    on the choice chains: n, stuck, mean overhead, moves, GPU-h held twice), ``notes``. The keywords
    after ``workers`` are for small test histories."""
    from chainrun.sim import two_sites
    from chainrun.sim.chain_replay import ChainsConfig
    from chainrun.sim.site_rolling import week_margin
    from chainrun.sim.thinning import JOB_BUDGET, thin

    t_begin = time.monotonic()
    work = work_for(shape)
    paces = {n: p for n, p in (paces or {}).items() if p != 1.0}
    out: dict = {"clusters": list(names), "as_of": as_of, "shape": shape, "chosen": False, "margin_s": None,
                 "paces": paces, "procedure": "chainrun.sim.site_selftune (site_rolling.week_margin, site_tune.pick)",
                 "notes": ["every cluster sized by its history's peak, age-only priority (only the caches are read)"]}
    need = need_s(work.work_s, warmup_s, chains_every_s)
    seen = []
    for name, f in zip(names, frames):
        f = recent_known(f, as_of)
        ran = f[f["start"].notna()]
        # from its first start to its last submission: what two_sites' window can use
        span = float(f["submit"].max()) - float(ran["start"].min()) if len(ran) else 0.0
        if span < need:
            return {**out, "reason": f"history too short on {name}: {span / 86400:.1f} days of jobs, the "
                                     f"choice needs at least {need / 86400:.1f} ({warmup_s / 86400:g}-day warm-up, "
                                     f"{site_tune.MIN_CHOICE} chains, one chain's life)"}
        budget = JOB_BUDGET if job_budget is None else job_budget
        f, _, thinned = thin(f, None, shape["nodes"], seed=seed, budget=budget)
        if thinned is not None:
            out.setdefault("thinned", {})[name] = thinned
        seen.append(f)
    cfg = ChainsConfig(nodes=None, chains_every_s=chains_every_s, warmup_s=warmup_s, chain_nodes=(shape["nodes"],),
                       work=work, priority="age", workers=workers, predictor=predictor, seed=seed,
                       retrain_every_s=retrain_every_s)
    try:
        sh = two_sites.setup(seen, list(names), [0] * len(names), cfg, two_sites.SitesConfig(), paces)
    except ChainrunError as e:  # e.g. a cluster narrower than the user's chains
        return {**out, "reason": f"cannot replay these histories: {e}"}
    win = two_sites.window(sh["cover"])
    pts = [p for p in (two_sites.points(win, cfg, sh["sizes"]) if win[0] <= win[1] else []) if p[0] < as_of]
    out["fidelity"] = {s["name"]: s["fid"].get("spearman") for s in sh["sites"]}
    out["window"] = {"from": _iso(win[0]), "until": _iso(win[1]), "points": len(pts)}
    if len(pts) < site_tune.MIN_CHOICE:
        return {**out, "reason": f"too little shared history: {len(pts)} chains fit where every cluster's history "
                                 f"covers their life (needs {site_tune.MIN_CHOICE})"}
    runs, cost = two_sites.run_points(pts, site_tune.MARGINS_S, workers)
    loads = two_sites.levels(runs, names[0])
    ended = site_tune.ended_by_point(runs)
    margin, chosen, n_points, n_done, _ = week_margin(runs, loads, cfg, ended, as_of, site_tune.MARGINS_S)
    past = [r for r in runs if ended.get((r.t0, r.nodes), as_of) < as_of]
    grid = site_tune.policy_rows(past, loads, cfg, [site_tune.multi_name(m) for m in site_tune.MARGINS_S])
    out["rows"] = {str(int(m)): _row(grid[site_tune.multi_name(m)]) for m in site_tune.MARGINS_S}
    out["window"].update(choice_chains=n_points, finished=n_done)
    out.update(cost=cost, seconds=round(time.monotonic() - t_begin, 1))
    if not chosen:
        return {**out, "reason": f"{n_done} chains ended before now on every cluster and margin "
                                 f"(fewer than {site_tune.MIN_CHOICE}): too little past to choose on"}
    return {**out, "chosen": True, "margin_s": float(margin),
            "reason": f"chosen on {n_done} chains that ended before now ({out['window']['from'][:10]} .. "
                      f"{out['window']['until'][:10]})"}


def _row(r: dict) -> dict:
    return {k: r.get(k) for k in ("n", "stuck", "mean_overhead_h", "moves", "gpu_h_twice_share")}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def check_names(names: list[str]) -> None:
    """At least two clusters, each known (``local`` or one of config.toml); one-line errors, exit 2."""
    from chainrun import clusters
    from chainrun.errors import UsageError

    if len(names) < 2:
        raise UsageError(f"a site margin is for a chain spanning clusters: got {len(names)} cluster(s)",
                         hint="e.g. chainrun model sites a,b")
    known = {"local", *clusters.load().clusters}
    for n in names:
        if n not in known:
            raise UsageError(f"no cluster {n!r}", hint=f"clusters: {', '.join(sorted(known))}")


def declared_paces(names: list[str]) -> dict[str, float]:
    """Each cluster's declared pace (config.toml ``[clusters.NAME.job] pace``) over the first's, as the
    product's rule weighs a site before it measured one (chain/site_pace.py); undeclared: 1.0."""
    from chainrun import clusters

    cfg = clusters.load()
    d = {n: clusters.site_settings(n, cfg).pace or 1.0 for n in names}
    return {n: d[n] / d[names[0]] for n in names}


def user_shape(cluster: str) -> dict:
    """``selftune.chain_shape`` on the first cluster, for the partition of the user's latest chain there
    (their chains spanning clusters are recorded on the cluster they run on); else its default shape."""
    from chainrun.paths import state_db
    from chainrun.sim.user_chains import chain_shape

    part = ""
    if state_db().exists():
        from chainrun.state.store import Store

        store = Store(state_db())
        try:
            mine = [c for c in store.chains() if c.cluster == cluster]
        finally:
            store.close()
        part = (mine[-1].partition or "") if mine else ""
    return chain_shape(cluster, part, None)


def choose_now(names: list[str], *, workers: int = 1, now: float | None = None, **test_knobs) -> dict:
    """`chainrun model sites a,b`: the choice on the clusters' cached histories (no Slurm call), recorded
    in chain/site_tuned.py; returns the outcome with ``summary`` (one line) and ``in_force``. A choice
    that cannot be made (a history missing, too short or without other users' jobs) keeps what is in
    force and says why; ``test_knobs`` go to ``choose`` (small test histories)."""
    import logging

    from chainrun.chain import site_tuned
    from chainrun.predict import ingest

    check_names(names)
    now = time.time() if now is None else now
    before = site_tuned.in_force(names)
    out: dict = {"clusters": list(names), "chosen": False, "margin_s": None, "previous": before}
    frames, as_of, why = [], now, None
    for n in names:
        hist, info = ingest.load_cache(n)
        if hist is None or hist.empty:
            why = f"no history cached for {n} (run: chainrun model refresh --cluster {n})"
            break
        if not info.get("all_users", True):
            why = f"other users' jobs are hidden on {n} (PrivateData, or only yours in its history): " \
                  "the replay needs the whole queue"
            break
        frames.append(hist)
        as_of = min(as_of, float(info.get("last_refresh") or now))
    if why is None:
        try:
            shape = test_knobs.pop("shape", None) or user_shape(names[0])
            out = {**out, **choose(frames, names, shape=shape, as_of=as_of, paces=declared_paces(names),
                                   workers=workers, **test_knobs)}
        except Exception as err:  # a replay bug must not fail a cron line: keep the margin, say so, log it
            logging.getLogger(__name__).warning("site margin choice for %s failed", ",".join(names), exc_info=True)
            out["reason"] = f"the replay failed ({type(err).__name__}: {err}); kept the margin in force " \
                            "(a chainrun bug: the log has the traceback)"
    else:
        out["reason"] = why
    from chainrun.sim.jsonsafe import finite

    out = finite(out)  # a NaN fidelity (too few jobs to rank) must not reach the JSON file
    out["summary"] = summary_line(out, before, pinned=site_tuned.is_pinned(names))
    entry = site_tuned.record(names, out)
    return {**out, "in_force": entry["in_force"], "pinned": bool(entry.get("pinned")),
            "put_in_force": entry["last"]["put_in_force"]}


def summary_line(res: dict, before: dict, pinned: bool = False) -> str:
    """``chosen 3h: <reason>``, ``kept the shipped margin 1h: <reason>``, or on a pinned list
    ``chosen 3h, recorded; kept the pinned margin 1h (...): <reason>``."""
    if res.get("chosen") and not pinned:
        return f"chosen {_h(res['margin_s'])}: {res['reason']}"
    kept = "the pinned margin" if pinned else "the shipped margin" if before.get("source") == "shipped" \
        else "the margin in force"
    head = f"chosen {_h(res['margin_s'])}, recorded; " if res.get("chosen") else ""
    unpin = f" (chainrun model sites {','.join(res['clusters'])} --unpin lets choices in)" if pinned else ""
    return f"{head}kept {kept} {_h(before['margin_s'])}{unpin}: {res['reason']}"


def refresh_margins(cluster: str, *, workers: int = 1, **test_knobs) -> dict:
    """`model refresh --cluster X`'s last step: re-choose (``choose_now``) the margin of every cluster
    list stored in site_margins.json that holds ``cluster``, pins respected. Never raises (the refresh
    has saved its model): a list whose choice fails keeps its margin and its outcome says why; an
    unreadable file is left alone (``model sites`` sets it aside) and named. Returns ``{"file",
    "lists": {"a,b": outcome with ``summary``}, "unreadable"?}``; ``test_knobs`` go to ``choose_now``."""
    import logging

    from chainrun.chain import site_tuned

    p = site_tuned.path()
    out: dict = {"file": str(p), "lists": {}}
    try:
        doc, why = site_tuned.read(p)
    except Exception as e:  # noqa: BLE001 -- e.g. an unusable CHAINRUN_HOME: the refresh stands
        doc, why = None, f"{type(e).__name__}: {e}"
    if why is not None:
        return {**out, "unreadable": {"why": why, "hint": site_tuned.FIX}}
    for k in sorted(doc["lists"]):
        names = k.split(",")
        if cluster not in names:
            continue
        try:
            out["lists"][k] = choose_now(names, workers=workers, **dict(test_knobs))
        except Exception as err:  # noqa: BLE001 -- e.g. a cluster gone from config.toml: this list keeps its margin
            logging.getLogger(__name__).warning("site margin re-choice for %s failed", k, exc_info=True)
            f = site_tuned.in_force(names)
            res = {"clusters": names, "chosen": False, "margin_s": None, "error": True,
                   "reason": f"not re-chosen ({type(err).__name__}: {err})"}
            out["lists"][k] = {**res, "summary": summary_line(res, f, pinned=site_tuned.is_pinned(names)),
                               "in_force": f, "pinned": site_tuned.is_pinned(names), "put_in_force": False}
    return out


def _h(s: float) -> str:
    return f"{s / 3600:g}h"
