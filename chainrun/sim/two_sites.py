"""Several clusters at once: ``chainrun sim --chains --trace A --trace B ...`` (issue #26, docs/multi-cluster.md).

Every ``--trace`` is one cluster (order = the user's preference), replayed as its own partition with
its own model (chain_replay.py's setup, once per trace), all on one clock:

- **Alignment**: the first trace keeps its times; every other is shifted by a whole number of weeks
  (weekday and hour patterns kept) so that its last week coincides with the first's (``--align
  end``), or by ``--align Nw`` weeks. The same file given again is a development stand-in for a
  second cluster (named ``<stem>#2``): end-aligned it would replay the very same queue, so it is
  shifted ``DUPLICATE_SHIFT_WEEKS`` later (its week w replays at w + 4 weeks), and ``meta`` says so.
- **Window**: chains are injected every ``--chains-every`` only where *every* shifted trace covers
  the chain's whole life (each trace's warm-up after its first start, to its last submission less
  the life); ``--from``/``--until`` select inside it; ``meta.window`` and each site's shift say where.
- **Policies** at every point: ``reactive:<first>`` (it gives the load level: the level of that
  chain's reactive run on the first trace bins every row), ``predicted:<site>`` for each site alone
  (the ``predicted`` the product runs there, at that site's pace) and ``predicted_multi``
  (site_chain.py) at every margin of ``site_tune.MARGINS_S``; the margin is chosen on the older
  chains and scored on the newer (site_tune.py), and week by week on each week's past
  (site_rolling.py), unless ``--site-margin`` fixes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from chainrun.errors import UsageError
from chainrun.sim.chain_replay import ChainsConfig, chain_life_s, day, fidelity_dict, load_levels, map_chunks, window_text
from chainrun.sim.chains import PolicySpec, default_specs, run_chain
from chainrun.sim.site_chain import CHECKPOINT_EVERY_S, TRANSFER_S, MoveRules, Site, run_site_chain
from chainrun.sim.site_tune import multi_name, race_name

if TYPE_CHECKING:
    import pandas as pd

WEEK_S = 7 * 86400.0
DUPLICATE_SHIFT_WEEKS = 4  # a copy of the same trace: a month later, so the two queues differ
TIME_COLUMNS = ("submit", "eligible", "start", "end")


@dataclass(frozen=True)
class SitesConfig:
    transfer_s: float = TRANSFER_S
    checkpoint_every_s: float = CHECKPOINT_EVERY_S
    paces: tuple = ()  # ((site name, pace), ...) from --pace; the rest 1.0
    align: str = "end"  # "end" or "<N>w"
    margin_s: float | None = None  # None: chosen on the older chains (site_tune.py)
    race: bool = False  # also the race variant, predicted_multi_race (site_chain.py)


def trace_key(spec: str) -> str:
    """What makes two --trace values the same file: the resolved path (a built-in name is its file)."""
    from chainrun.traces import BUILTIN, builtin_path

    p = Path(spec)
    if spec in BUILTIN and not p.exists():
        p = builtin_path(spec)
    try:
        return str(p.resolve())
    except OSError:
        return str(p)


def site_names(specs: list[str]) -> list[str]:
    """A trace's cluster name: its file name up to the first dot (or the built-in name); a name seen
    before gets ``#2``, ``#3``... (the same file given twice: ``<stem>#2``)."""
    out, seen = [], {}
    for s in specs:
        stem = Path(s).name.split(".", 1)[0] or s
        seen[stem] = seen.get(stem, 0) + 1
        name = stem if seen[stem] == 1 else f"{stem}#{seen[stem]}"
        while name in out:  # a file named like a copy (x#2.log beside x.log twice): the next number
            seen[stem] += 1
            name = f"{stem}#{seen[stem]}"
        out.append(name)
    return out


def parse_paces(items: list[str] | None, names: list[str]) -> dict[str, float]:
    """``--pace B=0.6`` (repeatable, or comma-separated): {site: pace}; one-line errors."""
    out: dict[str, float] = {}
    for item in items or []:
        for part in str(item).split(","):
            name, sep, v = part.strip().rpartition("=")
            try:
                pace = float(v)
            except ValueError:
                pace = -1.0
            if not sep or not name or not 0 < pace <= 10:
                raise UsageError(f"--pace {item!r}: {part.strip()!r} is not CLUSTER=PACE (a work rate in (0, 10], "
                                 "1.0 = the reference)", hint=f"clusters: {', '.join(names)}")
            if name not in names:
                raise UsageError(f"--pace {item!r}: no cluster {name!r}", hint=f"clusters: {', '.join(names)}")
            out[name] = pace
    return out


def parse_align(text: str) -> int | None:
    """``end`` -> None; ``4w`` / ``-2w`` -> weeks."""
    t = str(text).strip().lower()
    if t == "end":
        return None
    if t.endswith("w"):
        try:
            return int(t[:-1])
        except ValueError:
            pass
    raise UsageError(f"--align {text!r}: use end (the traces' last weeks coincide) or a whole number of weeks "
                     "to shift every other trace by, e.g. 4w or -2w")


def shift_weeks(frames: list["pd.DataFrame"], keys: list[str], align: str) -> list[int]:
    """Whole weeks each trace is shifted by (the first: 0)."""
    fixed = parse_align(align)
    last0 = float(frames[0]["submit"].max())
    out = [0]
    for i in range(1, len(frames)):
        if fixed is not None:
            out.append(fixed)
        elif keys[i] in keys[:i]:
            out.append(DUPLICATE_SHIFT_WEEKS)
        else:
            out.append(int(round((last0 - float(frames[i]["submit"].max())) / WEEK_S)))
    return out


def shifted(frame: "pd.DataFrame", weeks: int) -> "pd.DataFrame":
    if not weeks:
        return frame
    f = frame.copy()
    for c in TIME_COLUMNS:
        if c in f:
            f[c] = f[c] + weeks * WEEK_S
    return f


def life_s(cfg: ChainsConfig, paces: dict) -> float:
    """How long a chain may live (chain_replay.chain_points's slack), at the slowest pace."""
    slowest = min([1.0, *paces.values()])
    return chain_life_s(cfg.work.work_s / slowest)


def window(cover: list[tuple[float, float]]) -> tuple[float, float]:
    """Where every trace covers a chain's whole life: (first injection, last injection)."""
    return max(a for a, _ in cover), min(b for _, b in cover)


def points(win: tuple[float, float], cfg: ChainsConfig, sizes: tuple[int, ...]) -> list[tuple[float, int]]:
    out, t, i = [], win[0], 0
    while t <= win[1]:
        if (cfg.inject_from is None or t >= cfg.inject_from) and (cfg.inject_until is None or t < cfg.inject_until):
            out.append((t, sizes[i % len(sizes)]))
        t += cfg.chains_every_s
        i += 1
    return out[: cfg.max_chains] if cfg.max_chains is not None else out


_SITES: dict = {}  # what the forked workers read


def setup(frames: list["pd.DataFrame"], names: list[str], weeks: list[int], cfg: ChainsConfig,
          scfg: SitesConfig, paces: dict) -> dict:
    from chainrun.sim.fairshare import priority_terms
    from chainrun.sim.fidelity import replay_alone
    from chainrun.sim.workload import build_workload

    sites, cover, life = [], [], life_s(cfg, paces)
    for frame, name, wk in zip(frames, names, weeks):
        w = build_workload(shifted(frame, wk))
        nodes = int(cfg.nodes or w.peak_nodes)
        widest = max(j[2] for j in w.jobs)
        if widest > nodes:
            raise UsageError(f"{name}: the trace has a {widest}-node job but the replay has only {nodes} nodes",
                             hint=f"use --nodes {widest} or more")
        size_w, fs = priority_terms(cfg.priority, w, cfg.size_weight_s, config=cfg.priority_config)
        starts = replay_alone(w, nodes, bf_depth=cfg.bf_depth, size_weight_s=size_w, fairshare=fs)
        first = w.open_at + cfg.warmup_s
        sites.append(dict(name=name, w=w, nodes=nodes, size_w=size_w, fs=fs, starts=starts, first=first,
                          pace=paces.get(name, 1.0), shift_weeks=wk, fid=fidelity_dict(w, starts, nodes, first)))
        cover.append((first, w.jobs[-1][0] - life))
    sizes = tuple(n for n in cfg.chain_nodes if all(n <= s["nodes"] for s in sites))
    if not sizes:
        raise UsageError(f"a cluster has fewer nodes than every injected chain ({min(cfg.chain_nodes)} nodes)")
    _SITES.clear()
    _SITES.update(sites=sites, cfg=cfg, scfg=scfg, cover=cover, sizes=sizes)
    return _SITES


def specs_for(names: list[str], margins: tuple[float, ...], race: bool = False) -> list[tuple]:
    """(site, spec, margin, race) in the order they run at a point: a site's own chain, or (None, spec,
    margin, race) a multi-site one."""
    pred = next(s for s in default_specs() if s.name == "predicted")  # what `--policy predicted` does
    rows: list = [(names[0], PolicySpec(f"reactive:{names[0]}", "reactive"), None, False)]
    rows += [(n, replace(pred, name=f"predicted:{n}"), None, False) for n in names]
    rows += [(None, replace(pred, name=multi_name(m)), m, False) for m in margins]
    rows += [(None, replace(pred, name=race_name(m)), m, True) for m in (margins if race else ())]
    return rows


def run_points(pts: list, margins: tuple[float, ...], workers: int, race: bool = False) -> tuple[list, dict]:
    """Every point's rows (``rows_for``) on ``workers`` processes: (runs in point order, cost)."""
    return map_chunks(_run_chunk, [(*p, margins, race) for p in pts], workers)


def _run_chunk(chunk):
    from chainrun.sim.adapter import SimWatcher
    from chainrun.sim.knowledge import Knowledge, chainrun_predictor
    from chainrun.sim.scheduler import Scheduler
    from chainrun.sim.trunk import Trunk

    t_begin = time.monotonic()
    cfg, scfg = _SITES["cfg"], _SITES["scfg"]
    live = {}
    for s in _SITES["sites"]:
        k = Knowledge(s["w"].table, s["starts"], factory=cfg.predictor or chainrun_predictor,
                      retrain_every_s=cfg.retrain_every_s, first_retrain=s["first"])
        base = Scheduler(s["nodes"], s["w"].jobs, open_at=s["w"].open_at, bf_depth=cfg.bf_depth,
                         size_weight_s=s["size_w"], fairshare=s.get("fs"))
        live[s["name"]] = (k, SimWatcher(k, gpus_per_node=cfg.gpus_per_node), base, s["pace"])
    names = [s["name"] for s in _SITES["sites"]]
    n_ids = max(len(s["w"].jobs) for s in _SITES["sites"])
    out: list = []
    for i, (t0, nodes, margins, race) in enumerate(chunk):
        for _, _, base, _ in live.values():
            base.run_until(t0)
        jid0 = n_ids + 10_000 * (i + 1)
        trunks = {n: (Trunk() if cfg.share else None) for n in names}
        sites = [Site(n, live[n][2], live[n][1], live[n][3]) for n in names]
        for site, spec, margin, raced in specs_for(names, margins, race):
            if site is None:
                out.append(run_site_chain(sites, t0, nodes, jid0, spec, cfg.work,
                                          MoveRules(margin, scfg.transfer_s, scfg.checkpoint_every_s, raced)))
                continue
            _, watcher, base, pace = live[site]
            out.append(run_chain(base, t0, nodes, jid0, spec, replace(cfg.work, pace=pace), watcher, trunks[site]))
    cost: dict = {"worker_s": time.monotonic() - t_begin, "fallbacks": 0}
    for k, watcher, _, _ in live.values():
        cost["fits"] = cost.get("fits", 0) + k.cost["fits"]
        cost["fit_s"] = cost.get("fit_s", 0) + k.cost["fit_s"]
        cost["predictions"] = cost.get("predictions", 0) + watcher.cost["predictions"]
        cost["fallbacks"] += watcher.fallbacks
    return out, cost


def levels(runs: list, first: str) -> dict:
    """The load level of each point: its reactive chain's on the first trace."""
    return load_levels([replace(r, policy="reactive") for r in runs if r.policy == f"reactive:{first}"])


def _iso(t: float) -> str:
    import pandas as pd

    return pd.Timestamp(t, unit="s").strftime("%Y-%m-%dT%H:%M:%S")


def run_sites(traces: list[str], cfg: ChainsConfig, scfg: SitesConfig | None = None, *,
              pace_args: list[str] | None = None) -> dict:
    """The ``data`` of ``chainrun sim --chains --trace A --trace B ... --json``."""
    from chainrun.sim import site_tune
    from chainrun.sim.workload import check_span
    from chainrun.traces import read_trace, trace_notes

    t_begin = time.monotonic()
    scfg = scfg or SitesConfig()
    if len(traces) < 2:
        raise UsageError("the multi-cluster replay needs two --trace or more")
    names = site_names(traces)
    paces = parse_paces(pace_args, names) if pace_args is not None else dict(scfg.paces)
    keys = [trace_key(t) for t in traces]
    frames = [read_trace(t) for t in traces]
    for name, frame in zip(names, frames):  # before the shifts: a stray year would shift by centuries
        try:
            check_span(frame)
        except UsageError as e:
            raise UsageError(f"{name}: {e.message}", hint=e.hint) from None
    weeks = shift_weeks(frames, keys, scfg.align)
    sh = setup(frames, names, weeks, cfg, scfg, paces)
    win = window(sh["cover"])
    pts = points(win, cfg, sh["sizes"]) if win[0] <= win[1] else []
    if not pts and win[0] <= win[1] and points(win, replace(cfg, inject_from=None, inject_until=None), sh["sizes"]):
        raise UsageError(f"no chain to score {window_text(cfg)}: --from/--until fall outside the traces' shared "
                         f"window {day(win[0])} .. {day(win[1])} (where chains start, every "
                         f"{cfg.chains_every_s / 3600:g} h, after the shifts {weeks} weeks)",
                         hint="--from/--until within it")
    if not pts:
        raise UsageError(f"the traces share no stretch long enough for a chain of {cfg.work.work_s / 3600:g} h "
                         f"(window {_iso(win[0])} .. {_iso(win[1])} after the shifts {weeks} weeks)",
                         hint="shorter --work, --align, or traces that overlap in time")
    margins = (scfg.margin_s,) if scfg.margin_s is not None else site_tune.MARGINS_S
    runs, cost = run_points(pts, margins, cfg.workers, scfg.race)
    loads = levels(runs, names[0])
    chains = site_tune.choose_and_score(runs, loads, cfg, names, pts, margins, fixed=scfg.margin_s is not None,
                                        race=scfg.race)
    if scfg.margin_s is None:  # the margin chosen week by week too (site_rolling.py): the same runs, regrouped
        from chainrun.sim.site_rolling import rolling

        chains["rolling"] = rolling(runs, loads, cfg, names, pts, margins, race=scfg.race)
    w = cfg.work
    chains.update(work_h=w.work_s / 3600, segment_h=w.segment_s / 3600, restart_cost_min=w.restart_s / 60,
                  handoff_min=w.handoff_s / 60, transfer_min=scfg.transfer_s / 60,
                  checkpoint_every_min=scfg.checkpoint_every_s / 60)
    warnings = []
    for name, frame in zip(names, frames):  # what each reader set aside or read as unknown
        warnings += [f"{name}: {n}" for n in trace_notes(frame)]
    if not paces:
        warnings.append("equal pace (1.0) on every cluster: no --pace given; GPUs that differ change the answer")
    for i in range(1, len(names)):
        if keys[i] in keys[:i]:
            warnings.append(f"{names[i]} is a copy of {names[keys.index(keys[i])]} shifted {weeks[i]} weeks: a "
                            "development stand-in for a second cluster (two real clusters' loads are independent; "
                            "co-located ones peak together)")
    meta = {
        "sites": [{"name": s["name"], "trace": t, "shift_weeks": wk, "shift_s": wk * WEEK_S, "nodes": s["nodes"],
                   "jobs": len(s["w"].jobs), "pace": s["pace"], "covers": [_iso(a), _iso(b)]}
                  for s, t, wk, (a, b) in zip(sh["sites"], traces, weeks, sh["cover"])],
        "align": scfg.align, "window": {"from": _iso(win[0]), "until": _iso(win[1])},
        "injections": len(pts), "chain_nodes": list(sh["sizes"]), "chains_every_h": cfg.chains_every_s / 3600,
        "priority": cfg.priority, "warnings": warnings, "cost": cost, "seed": cfg.seed,
        "seconds": round(time.monotonic() - t_begin, 1),
    }
    return {"fidelity": {s["name"]: s["fid"] for s in sh["sites"]}, "chains": chains, "meta": meta}
